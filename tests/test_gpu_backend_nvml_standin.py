"""NVMLBackend through the real ``pynvml`` binding, against a stand-in ``libnvidia-ml.so.1`` built here with gcc
(tests/fake_nvml/fake_nvml.c). Checks what a pure-Python fake cannot: ctypes signatures and struct layouts, NVML
error codes (NOT_SUPPORTED utilisation, INSUFFICIENT_SIZE process lists, TIMEOUT event waits), and the device
plugin's ``--gpus nvml`` path end to end. The library must be on LD_LIBRARY_PATH at process start, so every check
runs in a subprocess."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from dp_test_kubelet import TestKubelet
from kubernetes.client.rest import ApiException
from test_extender_cache import make_pod
from test_extender_cluster import _clients, _wait
from test_extender_cluster import api as emulated_api  # noqa: F401 - a fixture: the emulated API server
from test_fault_domain_processes import _free_port

from gnnsched.contract import GROUP, VERSION

SOURCE = Path(__file__).parent / "fake_nvml" / "fake_nvml.c"
U0 = "GPU-11111111-2222-3333-4444-555555555555"
U1 = "GPU-aaaaaaaa-2222-3333-4444-555555555555"
STATE = f"""\
gpu {U0} NVIDIA-A100-SXM4-80GB 85899345920 1073741824 37 12
gpu {U1} NVIDIA-A100-SXM4-80GB 85899345920 0 -1 -1
proc 0 4242 536870912 mps
proc 0 4243 -1 compute
"""


@pytest.fixture(scope="module")
def libdir(tmp_path_factory):
    if shutil.which("gcc") is None:
        pytest.skip("gcc not available")
    d = tmp_path_factory.mktemp("nvml")
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", str(d / "libnvidia-ml.so.1"), str(SOURCE)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return d


def _env(libdir: Path, state: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = f"{libdir}:{env['LD_LIBRARY_PATH']}" if env.get("LD_LIBRARY_PATH") else str(libdir)
    env["GNNSCHED_FAKE_NVML_STATE"] = str(state)
    return env


def test_nvml_backend_reads_devices_processes_and_xids(libdir, tmp_path):
    state = tmp_path / "state"
    state.write_text(STATE + "xid 1 13\n")
    script = textwrap.dedent(f"""
        import dataclasses, json
        from gnnsched.gpu.backend import open_backend
        b = open_backend("nvml")
        out = {{"devices": [dataclasses.asdict(d) for d in b.devices()],
               "procs0": [dataclasses.asdict(p) for p in b.processes(0)],
               "procs1": [dataclasses.asdict(p) for p in b.processes(1)],
               "events1": [(e.index, e.xid, e.critical) for e in b.health_events(0.05)],
               "events_none": [(e.index, e.xid) for e in b.health_events(0.05)]}}
        open({str(state)!r}, "a").write("xid 1 79\\n")
        out["events2"] = [(e.index, e.xid, e.critical) for e in b.health_events(1.0)]
        out["after"] = dataclasses.asdict(b.devices()[1])
        b.close(); b.close()
        print(json.dumps(out))
    """)
    r = subprocess.run([sys.executable, "-c", script], env=_env(libdir, state), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    d0, d1 = out["devices"]
    assert (d0["uuid"], d0["name"], d0["total_bytes"], d0["used_bytes"]) == (
        U0,
        "NVIDIA-A100-SXM4-80GB",
        80 * 2**30,
        2**30,
    )
    assert (d0["utilization_gpu_percent"], d0["utilization_memory_percent"]) == (37, 12)
    assert (d1["utilization_gpu_percent"], d1["healthy"]) == (None, True)  # NOT_SUPPORTED -> None, not an error
    assert out["procs0"] == [{"pid": 4242, "used_bytes": 2**29, "kind": "mps"},
                             {"pid": 4243, "used_bytes": None, "kind": "compute"}]
    assert out["procs1"] == []
    assert out["events1"] == [[1, 13, False]] and out["events_none"] == []
    assert out["events2"] == [[1, 79, True]]
    assert out["after"]["healthy"] is False and out["after"]["health_reason"] == "Xid 79"


def test_device_plugin_on_nvml_standin(libdir, tmp_path):
    state = tmp_path / "state"
    state.write_text(STATE)
    kubelet = TestKubelet(tmp_path)
    kubelet.start()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gnnsched.cli", "device-plugin", f"--plugin-dir={tmp_path}", "--gpus=nvml",
         "--slots-per-gpu=2", "--mps-status-file=none", "--poll-interval=0.1", "--log-level=warning"],
        env=_env(libdir, state), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert kubelet.wait_for(lambda: kubelet.lists, timeout=30), "plugin never registered"
        assert kubelet.latest() == {f"{U0}-slot-00": "Healthy", f"{U0}-slot-01": "Healthy",
                                    f"{U1}-slot-00": "Healthy", f"{U1}-slot-01": "Healthy"}
        with state.open("a") as f:
            f.write("xid 1 79\n")
        assert kubelet.wait_for(lambda: kubelet.latest().get(f"{U1}-slot-00") == "Unhealthy", timeout=10)
        assert kubelet.latest()[f"{U0}-slot-00"] == "Healthy"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kubelet.stop()


def test_one_xid_is_seen_alike_by_the_agent_the_device_plugin_and_the_extender(libdir, tmp_path,
                                                                             emulated_api):  # noqa: F811
    """The same Xid on the stand-in driver, read by each component through its own ``pynvml``: the node agent (its
    GPUNode status through the emulated API server, its metrics over HTTP), the device plugin (ListAndWatch to a
    kubelet over gRPC) and the extender (watching GPUNodes, asked over HTTP). An application Xid (13) leaves the GPU in
    service once drained; a hardware Xid (79, then 48) takes it out of all three and keeps it out, until an admin's
    ``gnnsched node-agent return-to-service`` brings it back in all three, the agent still running."""
    from gnnsched.extender.server import ExtenderOptions, build_app
    from gnnsched.extender.testing import LoopbackServer

    url, kubeconfig, _, _ = emulated_api
    core, custom = _clients(url)
    node: Any = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"},
                 "status": {"allocatable": {"cpu": "16", "memory": "64Gi"}}}
    core.create_node(node)
    state = tmp_path / "nvml"
    state.write_text("".join(line + "\n" for line in STATE.splitlines() if line.startswith("gpu ")))  # idle GPUs
    env = {**_env(libdir, state), "KUBECONFIG": str(kubeconfig)}
    node_state, plugin_dir, pods = tmp_path / "node-state", tmp_path / "dp", tmp_path / "pods.json"
    plugin_dir.mkdir()
    pods.write_text(json.dumps({"pods": [], "gnnjobs": []}))
    port = _free_port()
    kubelet = TestKubelet(plugin_dir)
    kubelet.start()
    gnnsched = [sys.executable, "-m", "gnnsched.cli"]
    logs = [(tmp_path / "agent.log").open("w"), (tmp_path / "plugin.log").open("w")]
    procs = [
        subprocess.Popen([*gnnsched, "node-agent", "--gpus=nvml", "--node-name=n1",
                          f"--gate-socket={tmp_path / 'g.sock'}", f"--pods-file={pods}", f"--state-dir={node_state}",
                          "--mps=off", "--peer-check=off", "--no-node-check", f"--jobs-uid={os.getuid()}",
                          "--status-interval=0.3", f"--metrics-port={port}", "--metrics-addr=127.0.0.1",
                          "--log-level=warning"],
                         env=env, stdout=subprocess.DEVNULL, stderr=logs[0]),
        subprocess.Popen([*gnnsched, "device-plugin", f"--plugin-dir={plugin_dir}", "--gpus=nvml", "--slots-per-gpu=2",
                          f"--state-dir={node_state}", "--poll-interval=0.1", "--log-level=warning"],
                         env=env, stdout=subprocess.DEVNULL, stderr=logs[1]),
    ]

    def gpus() -> list[dict]:
        try:
            obj: Any = custom.get_cluster_custom_object(GROUP, VERSION, "gpunodes", "n1")
        except ApiException as exc:  # the agent has not created its GPUNode yet
            assert exc.status == 404, exc
            return []
        return obj.get("status", {}).get("gpus") or []

    def slots(uuid: str) -> set[str]:
        return {h for sid, h in kubelet.latest().items() if sid.startswith(uuid)}

    def metric(text: str) -> float | None:
        for line in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text.splitlines():
            if line.startswith(text + " "):
                return float(line.rsplit(" ", 1)[1])
        return None

    def xid(index: int, number: int) -> None:
        with state.open("a") as f:
            f.write(f"xid {index} {number}\n")

    pod = {"Pod": make_pod("p", 30, intensity="memory", uid="u-p"), "NodeNames": ["n1"]}
    try:
        with LoopbackServer(build_app(ExtenderOptions(kubeconfig=str(kubeconfig)))) as srv, \
                httpx.Client(base_url=srv.url, timeout=10) as ext:
            offered = lambda: ext.post("/filter", json=pod).json()["NodeNames"] == ["n1"]  # noqa: E731
            _wait(lambda: len(gpus()) == 2 and slots(U0) == slots(U1) == {"Healthy"} and offered(), "start", 60)

            xid(0, 13)  # an application Xid: the GPU drains (no client here), then is back everywhere
            _wait(lambda: metric('gnnsched_gpu_faults_by_class_total{class="application"}') == 1, "the drain", 30)
            _wait(lambda: gpus()[0]["healthy"] and gpus()[0]["mpsHealthy"] and slots(U0) == {"Healthy"} and offered(),
                  "GPU 0 back", 30)

            xid(1, 79)  # a hardware Xid: GPU 1 out in the agent, the plugin and the extender; GPU 0 still offered
            _wait(lambda: not gpus()[1]["healthy"] and slots(U1) == {"Unhealthy"}, "GPU 1 out", 30)
            assert (gpus()[1]["unhealthyXid"], gpus()[1]["unhealthyReason"]) == (79, "Xid 79")
            assert custom.get_cluster_custom_object(GROUP, VERSION, "gpunodes", "n1")["status"]["unhealthyGpus"] == 1
            _wait(lambda: metric(f'gnnsched_gpu_unhealthy{{gpu="1",uuid="{U1}",xid="79"}}') == 1, "the metric", 30)
            assert slots(U0) == {"Healthy"} and offered()

            xid(0, 48)  # and GPU 0: no GPU of the node is offered any more
            _wait(lambda: not gpus()[0]["healthy"] and slots(U0) == {"Unhealthy"}, "GPU 0 out", 30)
            _wait(lambda: not offered(), "the extender to filter n1 out", 30)
            failed = ext.post("/filter", json=pod).json()["FailedNodes"]["n1"]
            assert "none of the node's 2 GPUs is healthy" in failed, failed
            time.sleep(1.5)  # several samples and publishes later, nothing came back by itself
            assert not any(g["healthy"] for g in gpus()) and slots(U0) == slots(U1) == {"Unhealthy"}
            # counted when the fault's drain ends (the agent's next pass over its drains): waited for, not assumed
            _wait(lambda: metric('gnnsched_gpu_faults_by_class_total{class="hardware"}') == 2, "the count", 30)

            # GPU 1 repaired: the admin's command brings it back in the running agent, in the plugin (whose NVML
            # still holds its own mark of Xid 79) and in the extender; GPU 0 stays out
            time.sleep(0.05)  # the request's mtime (a coarse clock) after the Xid's time
            back = subprocess.run([*gnnsched, "node-agent", "return-to-service", U1, f"--state-dir={node_state}",
                                   "--wait=60"], env=env, capture_output=True, text=True, timeout=120)
            assert back.returncode == 0 and f"GPU 1 ({U1}) is back in service" in back.stdout, back
            _wait(lambda: gpus()[1]["healthy"] and slots(U1) == {"Healthy"} and offered(), "GPU 1 back", 30)
            assert "returnedToServiceAt" in gpus()[1] and "unhealthyXid" not in gpus()[1]
            assert slots(U0) == {"Unhealthy"} and not gpus()[0]["healthy"]
            _wait(lambda: metric(f'gnnsched_gpu_returned_to_service_total{{gpu="1",uuid="{U1}"}}') == 1, "count", 30)
            assert metric(f'gnnsched_gpu_unhealthy{{gpu="1",uuid="{U1}",xid=""}}') == 0
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for handle in logs:
            handle.close()
        kubelet.stop()
