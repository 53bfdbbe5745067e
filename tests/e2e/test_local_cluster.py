"""The whole system on one machine (``local_cluster.py``): real components as processes, stand-ins for
kube-scheduler and kubelet. One cluster (2 nodes x 2 small fake GPUs) serves the scenarios of this module in order.

Budget: a few minutes on two shared cores; the jobs are tiny (``jobs.py``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from jobs import (  # noqa: E402
    EXAMPLES,
    generated_small_jobs,
    small_job,
    tiny_entrypoint_example,
    tiny_example,
    too_big_job,
)
from local_cluster import (  # noqa: E402
    ClusterOptions,
    InputError,
    LocalCluster,
    XidInjection,
    committed_series,
    gnnjob_table,
    parse_xid_injection,
)

from gnnsched.contract import ANN_GPU  # noqa: E402

pytestmark = pytest.mark.slow
SCRIPT = HERE / "local_cluster.py"
GiB = 2**30


def metrics(port: int) -> dict[str, float]:
    """Prometheus text format: ``name{labels}`` -> value, and ``name`` -> the sum over its label sets."""
    out: dict[str, float] = {}
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)", line)
        if m:
            value = float(m.group(3))
            out[m.group(1) + (m.group(2) or "")] = value
            if m.group(2):
                out[m.group(1)] = out.get(m.group(1), 0.0) + value
    return out


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # 1.5 GiB GPUs with 256 MiB reserved: two small jobs (~490 MiB admit each, mostly CUDA overheads) per GPU, and
    # room for the GAT example (~1.07 GiB admit) alone, so ten jobs queue at the gates.
    opts = ClusterOptions(nodes=2, gpus="fake:2x1536Mi", reserve="256Mi", policy="lmcf", timeout=420,
                          keep=tmp_path_factory.mktemp("lc"))
    with LocalCluster(opts) as c:
        c.start()
        yield c
    assert c.pids() == []  # nothing left running
    assert c.sockets() == []


def test_examples_and_queued_jobs_all_succeed(cluster: LocalCluster) -> None:
    # the examples: built-in archs, PyG model classes, a layer stack and the user's own model (a probe pod first)
    docs = [tiny_example(p) for p in EXAMPLES] + [tiny_entrypoint_example()] + [small_job(f"small-{i}")
                                                                               for i in range(6)]
    names = {d["metadata"]["name"] for d in docs}
    seen: dict[str, Any] = {"groups": set(), "scraped": False, "queued_at_gate": 0, "uuids": {}}

    def tick(c: LocalCluster) -> None:
        assert c.api is not None
        for j in c.jobs():  # fail now, not at the timeout, when the job sizes no longer fit these GPUs
            reasons = {cond.get("reason") for cond in (j.get("status") or {}).get("conditions") or []}
            assert "PredictedPeakExceedsGPU" not in reasons, j["status"]
        for g in c.api.items("/apis/gnnsched.io/v1alpha1/gpunodes"):
            seen["uuids"][g["metadata"]["name"]] = {gpu["uuid"] for gpu in (g.get("status") or {}).get("gpus") or []}
            for gpu in (g.get("status") or {}).get("gpus") or []:
                if gpu.get("running"):
                    seen["groups"].add((g["metadata"]["name"], gpu["uuid"], len(gpu["running"])))
                seen["queued_at_gate"] = max(seen["queued_at_gate"], len(gpu.get("queued") or []))
        admitted = sum(1 for p in c.pods() if ANN_GPU in ((p["metadata"].get("annotations")) or {}))
        if admitted >= 2 and not seen["scraped"]:
            seen["scraped"] = True
            pods = c.pods()  # before the scrape: every count below can only have grown since
            # a probe pod requests no GPU share: kube-scheduler binds it itself, not through the extender
            gpu_pods = [p for p in pods if (p["metadata"].get("labels") or {}).get("gnnsched.io/role") != "probe"]
            seen["mid"] = {
                "pods": len(pods),
                "bound": sum(1 for p in gpu_pods if (p.get("spec") or {}).get("nodeName")),
                "admitted": sum(1 for p in pods if ANN_GPU in ((p["metadata"].get("annotations")) or {})),
                "extender": metrics(c.extender_metrics_port),
                "operator": metrics(c.operator_metrics_port),
                "agents": [metrics(n.metrics_port) for n in c.nodes],
                "capacity": c.capacity(),
            }
            seen["mid"]["scheduler_calls"] = dict(c.scheduler.stats.extender_calls)  # after the scrape

    cluster.submit(docs)
    jobs = cluster.wait_jobs(names, tick=tick)
    table = gnnjob_table(jobs)
    phases = {j["metadata"]["name"]: (j.get("status") or {}).get("phase") for j in jobs}
    assert phases == dict.fromkeys(names, "Succeeded"), table
    for j in jobs:
        st = j["status"]
        assert st["node"] in ("node-1", "node-2") and st["gpu"].startswith("GPU-"), st
        assert st["observedPeakBytes"] > 0 and st["attempts"] == 1, st
    result = cluster.report(jobs)
    assert result["violations"] == []
    assert 0 < result["max_committed_fraction"] <= 1.0
    # the entrypoint job was sized by its probe pod (CPU only: it never reached a gate) before its GPU pod existed
    mine = next(j for j in jobs if j["spec"]["model"].get("entrypoint"))
    assert mine["status"]["probe"]["state"] == "Succeeded", mine["status"]
    assert mine["status"]["pmcBytes"] == mine["status"]["probe"]["result"]["pmc"] > 0
    probe = next(p for p in cluster.pods() if p["metadata"]["name"] == f"{mine['metadata']['name']}-probe")
    assert probe["status"]["phase"] == "Succeeded" and ANN_GPU not in probe["metadata"].get("annotations", {})
    # groups were visible in GPUNode status while jobs ran, and some job waited at a gate
    assert seen["groups"], "no GPUNode ever showed a running group"
    # two nodes' fake GPUs have distinct UUIDs, as real GPUs do (a job's status names its GPU by UUID alone)
    assert len(seen["uuids"]) == 2 and not set.intersection(*seen["uuids"].values()), seen["uuids"]
    assert seen["queued_at_gate"] >= 1, "no job ever queued at a gate"
    # /metrics mid-run agree with what the stand-ins saw
    mid = seen["mid"]
    calls = mid["scheduler_calls"]
    ext = mid["extender"]
    binds_ok = ext.get('gnnsched_extender_requests_total{outcome="ok",verb="bind"}', 0)
    assert mid["bound"] <= binds_ok <= calls.get("bind", 0), (mid["bound"], binds_ok, calls)
    filters = sum(v for k, v in ext.items() if k.startswith("gnnsched_extender_requests_total{") and
                  'verb="filter"' in k)
    assert 1 <= filters <= calls.get("filter", 0), (filters, calls)
    assert ext.get("gnnsched_extender_cache_nodes") == 2
    admissions = sum(a.get("gnnsched_gate_admissions_total", 0) for a in mid["agents"])
    assert admissions >= mid["admitted"] >= 1, mid
    for node, agent in zip(cluster.nodes, mid["agents"], strict=True):
        for gpu, cap in mid["capacity"][node.name].items():
            committed = next(v for k, v in agent.items() if k.startswith("gnnsched_gpu_memory_committed_bytes{")
                             and f'gpu="{gpu}"' in k)
            assert 0 <= committed <= cap
    assert mid["operator"].get("gnnsched_operator_pods_created_total", 0) >= mid["pods"] >= 1, mid["operator"]


def test_generated_small_jobs_all_succeed(cluster: LocalCluster) -> None:
    """"Any set of small GNNJobs": random ones of every architecture and mode (``E2E_SEED`` replays a set)."""
    seed = int(os.environ.get("E2E_SEED", "16"))
    docs = generated_small_jobs(seed, 8)
    names = {d["metadata"]["name"] for d in docs}
    cluster.submit(docs)
    jobs = cluster.wait_jobs(names)
    phases = {j["metadata"]["name"]: (j.get("status") or {}).get("phase") for j in jobs}
    assert phases == dict.fromkeys(names, "Succeeded"), f"E2E_SEED={seed}\n{gnnjob_table(jobs)}"
    for j in jobs:
        assert j["status"]["observedPeakBytes"] > 0 and j["status"]["attempts"] == 1, j["status"]
    assert cluster.report(jobs)["violations"] == []


def test_unschedulable_job_says_why(cluster: LocalCluster) -> None:
    assert cluster.api is not None
    cluster.submit([too_big_job("too-big")])
    deadline = time.monotonic() + 120
    job: dict[str, Any] = {}
    while time.monotonic() < deadline:
        job = cluster.api.get("/apis/gnnsched.io/v1alpha1/namespaces/default/gnnjobs/too-big")
        if (job.get("status") or {}).get("phase") in ("Unschedulable", "Failed"):
            break
        time.sleep(0.5)
    st = job.get("status") or {}
    assert st.get("phase") == "Unschedulable", st
    reasons = {c.get("reason") for c in st.get("conditions") or []}
    assert "PredictedPeakExceedsGPU" in reasons, st
    events = [e for e in cluster.api.items("/api/v1/namespaces/default/events")
              if (e.get("involvedObject") or {}).get("name") == "too-big"]
    assert any("exceeds the largest GPU" in (e.get("message") or "") for e in events), events


def test_pod_no_node_fits_gets_the_schedulers_reason(cluster: LocalCluster) -> None:
    """A job that fits a GPU but asks more CPU than any node has: kube-scheduler's own filter rejects every node;
    the FailedScheduling event and the pod's condition say why, and the operator carries it into the GNNJob."""
    assert cluster.api is not None
    doc = small_job("too-many-cores")
    doc["spec"]["resources"] = {"cpu": "64", "memory": "1Gi"}
    doc["spec"]["scaling"] = {"enabled": False}
    cluster.submit([doc])
    expected = "0/2 nodes are available: 2 Insufficient cpu."
    deadline = time.monotonic() + 120
    job: dict[str, Any] = {}
    while time.monotonic() < deadline:
        job = cluster.api.get("/apis/gnnsched.io/v1alpha1/namespaces/default/gnnjobs/too-many-cores")
        if (job.get("status") or {}).get("phase") == "Unschedulable":
            break
        time.sleep(0.5)
    st = job.get("status") or {}
    assert st.get("phase") == "Unschedulable", st
    cond = next(c for c in st["conditions"] if c["type"] == "Schedulable")
    assert cond["status"] == "False" and cond["message"] == expected, cond
    events = [e for e in cluster.api.items("/api/v1/namespaces/default/events")
              if (e.get("involvedObject") or {}).get("name") == "too-many-cores-0"]
    assert any(e["reason"] == "FailedScheduling" and e["message"] == expected and e["type"] == "Warning"
               for e in events), events
    cluster.api.delete("/apis/gnnsched.io/v1alpha1/namespaces/default/gnnjobs/too-many-cores")


def test_restarts_lose_nothing_and_run_nothing_twice(cluster: LocalCluster) -> None:
    docs = [small_job(f"restart-{i}", epochs=6) for i in range(6)]
    names = {d["metadata"]["name"] for d in docs}
    done: set[str] = set()

    def tick(c: LocalCluster) -> None:
        pods = [p for p in c.pods() if p["metadata"]["name"].startswith("restart-")]
        admitted = [p for p in pods if ANN_GPU in (p["metadata"].get("annotations") or {})]
        if "agent" not in done and admitted:
            node = next(n for n in c.nodes if n.name == admitted[0]["spec"]["nodeName"])
            assert node.agent is not None
            c.restart(node.agent)
            done.add("agent")
        elif "agent" in done and "operator" not in done:
            assert c.operator is not None
            c.restart(c.operator)
            done.add("operator")
        elif "operator" in done and "extender" not in done:
            assert c.extender is not None
            c.restart(c.extender)
            done.add("extender")

    cluster.submit(docs)
    jobs = cluster.wait_jobs(names, tick=tick)
    assert done == {"agent", "operator", "extender"}
    phases = {j["metadata"]["name"]: (j.get("status") or {}).get("phase") for j in jobs}
    assert phases == dict.fromkeys(names, "Succeeded"), gnnjob_table(jobs)
    pods = [p for p in cluster.pods() if p["metadata"]["name"].startswith("restart-")]
    assert sorted(p["metadata"]["name"] for p in pods) == sorted(f"{n}-0" for n in names)  # one pod per job
    # each workload ran once: one result line per pod log, one admission per pod in the gate logs
    for node in cluster.nodes:
        for log in (node.dir / "pods").glob("*/containers/*/0.log"):
            assert log.read_text().count('"observed_peak_bytes"') <= 1, log
    admissions: dict[str, int] = {}
    for node in cluster.nodes:
        for line in node.event_log.read_text().splitlines():
            ev = json.loads(line)
            if ev.get("event") == "admitted":
                for key in ev["keys"]:
                    admissions[key] = admissions.get(key, 0) + 1
    assert all(v == 1 for v in admissions.values()), admissions
    assert cluster.report(jobs)["violations"] == []


def test_committed_series_counts_overlap(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    lines = [{"t": 1, "event": "start"}, {"t": 2, "event": "admitted", "gpu": 0, "keys": ["a", "b"],
                                          "bytes": [600, 500]},
             {"t": 3, "event": "released", "key": "a", "gpu": 0, "bytes": 600},
             {"t": 4, "event": "start"}, {"t": 5, "event": "resumed", "key": "b", "gpu": 0, "bytes": 500},
             {"t": 6, "event": "admitted", "gpu": 0, "keys": ["c"], "bytes": [700]}]
    log.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = committed_series({"n": log}, {"n": {0: 1000}})
    assert out["max_committed_fraction"] == 1.2
    assert [(v["t"], v["committed"]) for v in out["violations"]] == [(2, 1100), (6, 1200)]


def test_kubelet_resolves_resource_field_refs_as_kubelet_does() -> None:
    from kubelet_standin import resource_field_ref

    pod = {"spec": {"containers": [{"name": "job", "resources": {"requests": {"cpu": "1500m", "memory": "1Gi"}}}]}}
    node = {"cpu": "32", "memory": "128Gi"}
    assert resource_field_ref(pod, {"containerName": "job", "resource": "requests.cpu", "divisor": "1"}, node) == "2"
    assert resource_field_ref(pod, {"resource": "requests.cpu", "divisor": "1m"}, node) == "1500"
    assert resource_field_ref(pod, {"resource": "requests.memory", "divisor": "1Mi"}, node) == "1024"
    assert resource_field_ref(pod, {"resource": "limits.cpu"}, node) == "32"  # no limit: the node's allocatable
    bare = {"spec": {"containers": [{"name": "job"}]}}
    assert resource_field_ref(bare, {"resource": "requests.cpu", "divisor": "1"}, node) == "0"
    with pytest.raises(ValueError, match="unsupported resourceFieldRef"):
        resource_field_ref(pod, {"resource": "requests.nvidia.com/gpu"}, node)
    with pytest.raises(ValueError, match="no container"):
        resource_field_ref(pod, {"containerName": "other", "resource": "requests.cpu"}, node)


def _run_script(args: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60, **kw)


@pytest.mark.parametrize(("args", "needle"), [
    (["/nonexistent/job.yaml"], "/nonexistent/job.yaml: cannot read"),
    (["{example}", "--gpus", "fake:2"], "--gpus"),
    (["{example}", "--gpus", "nvml"], "--gpus"),
    (["{example}", "--gpus", "fake:2x1Gi"], "each node reserves 1Gi"),  # no memory left after the reserve
    (["{example}", "--nodes", "0"], "--nodes"),
    (["{example}", "--json", "/nonexistent/dir/out.json"], "--json"),
    (["{example}", "--inject-xid", "node-1:0:79"], "--inject-xid 'node-1:0:79': expected NODE:GPU:XID@SECONDS"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], needle: str) -> None:
    args = [a.replace("{example}", str(EXAMPLES[0])) for a in args]
    proc = _run_script(args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr


@pytest.mark.parametrize(("text", "needle"), [
    ("node-1:0:79", "expected NODE:GPU:XID@SECONDS"),
    ("node-1:79@3", "expected NODE:GPU:XID@SECONDS"),
    ("node-3:0:79@3", "no node 'node-3' (the nodes are node-1..node-2)"),
    ("node-1:2:79@3", "GPU must be an index 0..1, got '2'"),
    ("node-1:x:79@3", "GPU must be an index 0..1"),
    ("node-1:0:0@3", "XID must be a positive integer"),
    ("node-1:0:-4@3", "XID must be a positive integer"),
    ("node-1:0:79@soon", "SECONDS must be a number >= 0, got 'soon'"),
    ("node-1:0:79@-1", "SECONDS must be a number >= 0"),
    ("node-1:0:79@nan", "SECONDS must be a number >= 0"),
])
def test_inject_xid_bad_values_name_the_flag(text: str, needle: str) -> None:
    with pytest.raises(InputError) as err:
        parse_xid_injection(text, nodes=2, gpus=2)
    assert str(err.value).startswith(f"--inject-xid {text!r}: ") and needle in str(err.value)


def test_inject_xid_parses() -> None:
    assert parse_xid_injection("node-2:1:48@2.5", nodes=2, gpus=2) == XidInjection("node-2", 1, 48, 2.5)


def _ours(marker: str) -> list[int]:
    """Processes whose environment names ``marker`` (every process of a local cluster has its kubeconfig there)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            if marker.encode() in Path(f"/proc/{pid}/environ").read_bytes():
                found.append(int(pid))
        except OSError:
            continue
    return found


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_or_sigterm_leaves_no_process_or_socket(tmp_path: Path, sig: int, code: int) -> None:
    job = tmp_path / "job.yaml"
    import yaml

    job.write_text(yaml.safe_dump(small_job("interrupted", epochs=500)))
    keep = Path(tempfile.mkdtemp(prefix="e2e-"))  # short: unix socket paths are limited to 107 bytes
    request_cleanup = keep
    try:
        _interrupt_mid_run(job, keep, sig, code)
    finally:
        shutil.rmtree(request_cleanup, ignore_errors=True)


def test_a_failed_run_leaves_no_process_or_socket(tmp_path: Path) -> None:
    """The failure path (``--timeout`` passed with a job still running): exit 1, and nothing left behind."""
    import yaml

    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(small_job("too-slow", epochs=100000)))
    keep = Path(tempfile.mkdtemp(prefix="e2e-"))
    try:
        proc = subprocess.run([sys.executable, str(SCRIPT), str(job), "--nodes", "1", "--timeout", "20", "--keep",
                               str(keep)], capture_output=True, text=True, timeout=240)
        assert proc.returncode == 1, proc.stderr[-3000:]
        assert "too-slow" in proc.stdout  # the table is printed on failure too
        run_dir = next(keep.glob("run-*"))
        time.sleep(0.5)
        assert _ours(str(run_dir)) == []
        assert [p for p in run_dir.rglob("*") if p.is_socket()] == []
    finally:
        shutil.rmtree(keep, ignore_errors=True)


def _interrupt_mid_run(job: Path, keep: Path, sig: int = signal.SIGINT, code: int = 130) -> None:
    proc = subprocess.Popen([sys.executable, str(SCRIPT), str(job), "--nodes", "1", "--keep", str(keep)],
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stderr is not None
    lines = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        lines.append(line)
        if "running  pod" in line or not line:
            break
    run_dir = next(keep.glob("run-*"))
    assert _ours(str(run_dir)), "no process of the cluster found while it runs"
    if sig == signal.SIGINT:
        os.killpg(proc.pid, sig)  # what Ctrl-C in a terminal sends: the whole foreground group
    else:
        proc.send_signal(sig)  # what a supervisor sends: the harness alone, which must stop everything it started
    proc.wait(timeout=60)
    assert proc.returncode == code, "".join(lines)
    time.sleep(0.5)
    assert _ours(str(run_dir)) == []
    assert [p for p in run_dir.rglob("*") if p.is_socket()] == []
