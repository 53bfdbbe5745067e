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
from pathlib import Path

import pytest
from dp_test_kubelet import TestKubelet

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
        from gnnsched.gpu_backend import open_backend
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
