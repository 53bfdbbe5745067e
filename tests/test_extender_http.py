"""The extender over real HTTP (uvicorn on loopback), with kube-scheduler's JSON."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from datetime import datetime, timezone
from pathlib import Path

import httpx
import pytest
import yaml
from test_extender_cache import NOW, gpu, make_pod, status

from gnnsched.colocation.interference import load_default
from gnnsched.contract import ANN_ADMIT_BYTES, ANN_EXCLUSIVE, ANN_GPU_MEMORY, ANN_RESERVATION
from gnnsched.extender import create_app
from gnnsched.extender.binder import FakeBinder
from gnnsched.extender.cache import ClusterCache
from gnnsched.extender.server import ExtenderOptions, OptionError, build_app
from gnnsched.extender.testing import LoopbackServer
from gnnsched.gpu.catalogue import GiB
from gnnsched.scheduler_config import scheduler_config

NODES = [f"node-{i}" for i in range(40)]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    state = tmp_path_factory.mktemp("fake") / "state.json"
    # the fake cluster's pods run in namespace "fake": these tests are about the verbs, not the trust-domain rule
    app = build_app(ExtenderOptions(fake_cluster="40x4", fake_state=state, trust_domain="cluster"))
    with LoopbackServer(app) as srv, httpx.Client(base_url=srv.url, timeout=10) as client:
        yield client


def node_obj(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"zone": "z1"}},
            "status": {"allocatable": {"cpu": "96", "memory": "1Ti"}}}


def test_filter_names_only(server: httpx.Client) -> None:
    args = {"Pod": make_pod("a", 8), "NodeNames": NODES + ["not-a-node"], "Nodes": None}
    r = server.post("/filter", json=args)
    assert r.status_code == 200
    body = r.json()
    assert body["Error"] == "" and body["Nodes"] is None
    assert set(body["NodeNames"]) <= set(NODES) and len(body["NodeNames"]) >= 35
    assert "not-a-node" in body["FailedNodes"]
    assert "no GPUNode status" in body["FailedNodes"]["not-a-node"]
    assert set(body["NodeNames"]).isdisjoint(body["FailedNodes"])
    assert len(body["NodeNames"]) + len(body["FailedNodes"]) == len(NODES) + 1


def test_filter_full_nodelist(server: httpx.Client) -> None:
    items = [node_obj(n) for n in NODES[:10]]
    args = {"Pod": make_pod("b", 8), "Nodes": {"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": items}}
    body = server.post("/filter", json=args).json()
    assert body["Error"] == "" and body["NodeNames"] is None
    passed = body["Nodes"]["items"]
    assert passed and all(p in items for p in passed)  # the Node objects come back unchanged
    assert len(passed) + len(body["FailedNodes"]) == 10
    scores = server.post("/prioritize", json=args).json()
    assert [s["Host"] for s in scores] == NODES[:10]


def test_prioritize_scores(server: httpx.Client) -> None:
    args = {"Pod": make_pod("c", 8, intensity="memory"), "NodeNames": NODES + ["ghost"]}
    r = server.post("/prioritize", json=args)
    assert r.status_code == 200
    scores = r.json()
    assert [s["Host"] for s in scores] == NODES + ["ghost"]
    assert all(0 <= s["Score"] <= 10 and isinstance(s["Score"], int) for s in scores)
    assert max(s["Score"] for s in scores) == 10 and scores[-1]["Score"] == 0


def test_job_that_fits_nowhere_is_unresolvable(server: httpx.Client) -> None:
    body = server.post("/filter", json={"Pod": make_pod("big", 500), "NodeNames": NODES[:5]}).json()
    assert body["NodeNames"] == [] and body["FailedNodes"] == {}
    assert set(body["FailedAndUnresolvableNodes"]) == set(NODES[:5])
    assert "largest GPU in the cluster" in body["FailedAndUnresolvableNodes"]["node-0"]


BAD_BODIES = [
    b"",
    b"{",
    b'{"Pod": {"metadata": {"name": "x", "annotations": {"gnnsched.io/admit-bytes": "10"}}}, "NodeNames": ["no',
    b"[]",
    b"null",
    b'"just a string"',
    b"\xff\xfe\x00garbage",
    json.dumps({"NodeNames": NODES}).encode(),
    json.dumps({"Pod": None, "NodeNames": NODES}).encode(),
    json.dumps({"Pod": "pod", "NodeNames": NODES}).encode(),
    json.dumps({"Pod": make_pod("x", 1), "NodeNames": [1, 2, 3]}).encode(),
    json.dumps({"Pod": make_pod("x", 1), "NodeNames": "node-1"}).encode(),
    json.dumps({"Pod": make_pod("x", 1)}).encode(),
    json.dumps({"Pod": make_pod("x", 1), "Nodes": {"items": [{"metadata": {}}]}}).encode(),
    json.dumps({"Pod": make_pod("x", 1), "Nodes": {"items": "x"}}).encode(),
    json.dumps({"Pod": {"metadata": {"name": 5}}, "NodeNames": NODES}).encode(),
]

#: Well-formed requests for a pod whose gnnsched fields are missing or unparsable: no node can ever take it.
POD_LEVEL_ERRORS = [
    {"Pod": make_pod("x"), "NodeNames": NODES},
    {"Pod": make_pod("x", annotations={ANN_ADMIT_BYTES: "1e400"}), "NodeNames": NODES},
    {"Pod": make_pod("x", annotations={ANN_GPU_MEMORY: "-3Gi"}), "NodeNames": NODES},
    {"Pod": make_pod("x", 1, annotations={ANN_EXCLUSIVE: "maybe"}), "NodeNames": NODES},
    {"Pod": make_pod("x", 1, cpu="many"), "NodeNames": NODES},
    {"Pod": {"metadata": {"name": "x", "annotations": ["a"]}}, "NodeNames": NODES},
    {"Pod": make_pod("x"), "Nodes": {"items": [{"metadata": {"name": n}} for n in NODES[:3]]}},
]


@pytest.mark.parametrize("args", POD_LEVEL_ERRORS)
def test_pod_level_filter_errors_are_unresolvable_on_every_node(server: httpx.Client, args: dict) -> None:
    """kube-scheduler records the reason and does not try preemption for UnschedulableAndUnresolvable nodes; an
    Error would be retried as a scheduling error and a plain failure would invite preemption to no avail."""
    r = server.post("/filter", json=args)
    assert r.status_code == 200
    f = r.json()
    names = args.get("NodeNames") or [i["metadata"]["name"] for i in args["Nodes"]["items"]]
    assert f["Error"] == "" and f["FailedNodes"] == {}
    assert set(f["FailedAndUnresolvableNodes"]) == set(names)
    (reason,) = set(f["FailedAndUnresolvableNodes"].values())
    assert reason
    if "NodeNames" in args:
        assert f["NodeNames"] == [] and f["Nodes"] is None
    else:
        assert f["Nodes"]["items"] == [] and f["NodeNames"] is None
    # the same body is still an error for prioritize (ignored by the scheduler) and bind
    assert server.post("/prioritize", json=args).status_code == 400


@pytest.mark.parametrize("body", BAD_BODIES)
def test_bad_requests_never_5xx(server: httpx.Client, body: bytes) -> None:
    r = server.post("/filter", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 200
    f = r.json()
    assert f["Error"] and f["NodeNames"] is None
    r = server.post("/prioritize", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["Error"]
    r = server.post("/bind", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 200 and r.json()["Error"]


def test_errors_name_the_field(server: httpx.Client) -> None:
    def err(args: dict) -> str:
        body = server.post("/filter", json=args).json()
        return body["Error"] or next(iter(body["FailedAndUnresolvableNodes"].values()))

    assert err({"NodeNames": NODES}).startswith("Pod:")
    e = err({"Pod": make_pod("x"), "NodeNames": NODES})
    assert ANN_ADMIT_BYTES in e and ANN_GPU_MEMORY in e
    assert ANN_ADMIT_BYTES in err({"Pod": make_pod("x", annotations={ANN_ADMIT_BYTES: "-1"}), "NodeNames": NODES})
    assert err({"Pod": make_pod("x", 1), "NodeNames": [1]}).startswith("NodeNames:")
    assert "resources.requests" in err({"Pod": make_pod("x", 1, mem="lots"), "NodeNames": NODES})


def test_bind_unknown_pod_and_unknown_node(server: httpx.Client) -> None:
    r = server.post("/bind", json={"PodName": "never-seen", "PodNamespace": "ns", "PodUID": "u", "Node": "node-1"})
    assert r.status_code == 200 and "not found" in r.json()["Error"]
    server.post("/filter", json={"Pod": make_pod("seen", 4), "NodeNames": NODES})
    r = server.post("/bind", json={"PodName": "seen", "PodNamespace": "ns", "PodUID": "uid-seen", "Node": "nowhere"})
    assert "not in the gnnsched cache" in r.json()["Error"]
    r = server.post("/bind", json={"PodName": "seen", "PodNamespace": "ns", "PodUID": "other", "Node": "node-1"})
    assert "PodUID" in r.json()["Error"]


def test_health_ready_metrics(server: httpx.Client) -> None:
    assert server.get("/healthz").json() == {"status": "ok"}
    ready = server.get("/readyz")
    assert ready.status_code == 200 and ready.json()["nodes"] == 40
    server.post("/filter", json={"Pod": make_pod("m", 8), "NodeNames": NODES + ["ghost"]})
    text = server.get("/metrics").text
    assert 'gnnsched_extender_requests_total{outcome="ok",verb="filter"}' in text
    assert 'gnnsched_extender_nodes_filtered_out_total{reason="unknown_node"}' in text
    assert 'gnnsched_extender_request_seconds_bucket{le="0.01",verb="filter"}' in text
    assert "gnnsched_extender_cache_nodes 40.0" in text


def _single_gpu_app(binder: FakeBinder):
    cache = ClusterCache(load_default())
    now = datetime.now(tz=timezone.utc).timestamp()
    st = status("solo", gpu(0))
    st.updated_at = datetime.fromtimestamp(now, tz=timezone.utc)
    cache.upsert_gpunode(st)
    return create_app(cache, binder), cache


def test_concurrent_filter_and_bind_over_http_never_double_book() -> None:
    binder = FakeBinder()
    app, cache = _single_gpu_app(binder)
    n = 20
    with LoopbackServer(app) as srv:
        barrier = threading.Barrier(n)
        errors: list[str] = []

        def worker(i: int) -> None:
            with httpx.Client(base_url=srv.url, timeout=10) as c:
                pod = make_pod(f"r{i}", 10)
                barrier.wait()
                f = c.post("/filter", json={"Pod": pod, "NodeNames": ["solo"]}).json()
                assert f["NodeNames"] == ["solo"], f
                c.post("/prioritize", json={"Pod": pod, "NodeNames": ["solo"]})
                b = c.post("/bind", json={"PodName": f"r{i}", "PodNamespace": "ns", "PodUID": f"uid-r{i}",
                                          "Node": "solo"}).json()
                if b["Error"]:
                    errors.append(b["Error"])

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
    res = cache.reservations()
    assert len(res) == n and len({r.uid for r in res}) == n
    immediate = sum(r.bytes for r in res if r.immediate)
    usage = cache.gpu_usage("solo")[0]
    assert immediate == 7 * 10 * GiB and usage["used"] <= usage["capacity"]
    pods = binder.pods()
    assert len(pods) == n
    for p in pods:
        ann = json.loads(p["metadata"]["annotations"][ANN_RESERVATION])
        assert set(ann) == {"node", "gpu", "bytes", "at"} and ann["node"] == "solo" and ann["bytes"] == 10 * GiB
        assert p["spec"]["nodeName"] == "solo"


def test_restarted_extender_rebuilds_reservations_and_decides_the_same(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    opts = ExtenderOptions(fake_cluster="12x2xA100-40GB", fake_state=state)
    probe = {"Pod": make_pod("probe", 9, intensity="memory"), "NodeNames": NODES[:12]}
    with LoopbackServer(build_app(opts)) as srv, httpx.Client(base_url=srv.url, timeout=10) as c:
        for i in range(10):
            pod = make_pod(f"w{i}", 12 + i, intensity="memory" if i % 2 else "compute")
            f = c.post("/filter", json={"Pod": pod, "NodeNames": NODES[:3]}).json()
            target = f["NodeNames"][0]
            assert c.post("/bind", json={"PodName": f"w{i}", "PodNamespace": "ns", "PodUID": f"uid-w{i}",
                                         "Node": target}).json()["Error"] == ""
        before_scores = c.post("/prioritize", json=probe).json()
        before_filter = c.post("/filter", json=probe).json()
        before_res = [(r.uid, r.node, r.gpu, r.bytes, r.immediate) for r in srv.app.state.service.cache.reservations()]
    assert len(before_res) == 10
    with LoopbackServer(build_app(opts)) as srv, httpx.Client(base_url=srv.url, timeout=10) as c:
        after_res = [(r.uid, r.node, r.gpu, r.bytes, r.immediate) for r in srv.app.state.service.cache.reservations()]
        assert after_res == before_res
        assert c.post("/prioritize", json=probe).json() == before_scores
        assert c.post("/filter", json=probe).json() == before_filter


def test_build_app_rejects_bad_options(tmp_path: Path) -> None:
    with pytest.raises(OptionError) as err:
        build_app(ExtenderOptions(fake_cluster="5000xlots"))
    assert err.value.option == "--fake-cluster"
    bad = tmp_path / "s.json"
    bad.write_text("{broken")
    with pytest.raises(OptionError) as err:
        build_app(ExtenderOptions(fake_cluster="2", fake_state=bad))
    assert err.value.option == "--fake-state"


def test_cli_bad_option_exit_2_one_line() -> None:
    p = subprocess.run([sys.executable, "-m", "gnnsched.cli", "extender", "--fake-cluster", "0x3"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert p.stderr.startswith("--fake-cluster:") and p.stderr.count("\n") == 1


def test_cli_prints_scheduler_config() -> None:
    p = subprocess.run([sys.executable, "-m", "gnnsched.cli", "extender", "--print-scheduler-config",
                        "--url-prefix", "http://ext.gnnsched.svc:8888"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    cfg = yaml.safe_load(p.stdout)
    assert cfg == scheduler_config("http://ext.gnnsched.svc:8888")
    assert cfg["apiVersion"] == "kubescheduler.config.k8s.io/v1" and cfg["kind"] == "KubeSchedulerConfiguration"
    (profile,) = cfg["profiles"]
    assert profile["schedulerName"] == "gnnsched-scheduler"
    (fit,) = profile["pluginConfig"]
    assert fit["name"] == "NodeResourcesFit"
    assert fit["args"]["scoringStrategy"] == {"type": "LeastAllocated", "resources": [{"name": "cpu", "weight": 1},
                                                                                     {"name": "memory", "weight": 1}]}
    (ext,) = cfg["extenders"]
    assert ext["nodeCacheCapable"] is True and ext["bindVerb"] == "bind" and ext["filterVerb"] == "filter"
    # kube-scheduler also counts the slots against allocatable (a lagging GPUNode cannot overbook a node)
    assert ext["managedResources"] == [{"name": "gnnsched.io/gpu-share", "ignoredByScheduler": False}]
    assert profile["percentageOfNodesToScore"] == 100
    assert ext["weight"] >= 1 and ext["httpTimeout"].endswith("s")
    with pytest.raises(ValueError, match="weight"):
        scheduler_config(weight=0)
    bad = subprocess.run([sys.executable, "-m", "gnnsched.cli", "extender", "--print-scheduler-config",
                          "--url-prefix", "ftp://x"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    pack = subprocess.run([sys.executable, "-m", "gnnsched.cli", "extender", "--print-scheduler-config",
                           "--scoring-strategy", "MostAllocated"], capture_output=True, text=True, timeout=60)
    assert pack.returncode == 0, pack.stderr
    assert yaml.safe_load(pack.stdout) == scheduler_config(scoring_strategy="MostAllocated")
    wrong = subprocess.run([sys.executable, "-m", "gnnsched.cli", "extender", "--print-scheduler-config",
                            "--scoring-strategy", "Balanced"], capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 2 and wrong.stderr.startswith("--scoring-strategy:") and "Balanced" in wrong.stderr
    named = subprocess.run([sys.executable, "-m", "gnnsched.cli", "extender", "--print-scheduler-config",
                            "--scheduler-name", "acme-gnn"], capture_output=True, text=True, timeout=60)
    assert yaml.safe_load(named.stdout) == scheduler_config(scheduler_name="acme-gnn")
    bad_name = subprocess.run([sys.executable, "-m", "gnnsched.cli", "extender", "--print-scheduler-config",
                               "--scheduler-name", "Acme_GNN"], capture_output=True, text=True, timeout=60)
    assert bad_name.returncode == 2 and bad_name.stderr.startswith("--scheduler-name:")


_ = NOW


def test_cli_serves_verbs_and_a_separate_metrics_port() -> None:
    import signal
    import socket
    import time

    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    port, mport = ports
    proc = subprocess.Popen(
        [sys.executable, "-m", "gnnsched.cli", "extender", "--host", "127.0.0.1", "--port", str(port),
         "--metrics-host", "127.0.0.1", "--metrics-port", str(mport), "--fake-cluster", "6x2", "--log-level",
         "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{mport}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else ""
            time.sleep(0.1)
        body = httpx.post(f"http://127.0.0.1:{port}/filter",
                          json={"Pod": make_pod("cli", 2), "NodeNames": NODES[:6]}).json()
        assert body["Error"] == "" and body["NodeNames"]
        assert httpx.get(f"http://127.0.0.1:{mport}/healthz").json() == {"status": "ok"}
        metrics = httpx.get(f"http://127.0.0.1:{mport}/metrics").text
        assert 'gnnsched_extender_requests_total{outcome="ok",verb="filter"} 1.0' in metrics
        assert httpx.post(f"http://127.0.0.1:{mport}/filter", json={}).status_code in (404, 405)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
    # uvicorn shuts down gracefully, then re-raises SIGTERM (the exit status Kubernetes expects)
    assert proc.returncode in (0, -signal.SIGTERM), proc.stderr.read()
    assert "Traceback" not in proc.stderr.read()


@pytest.mark.parametrize(
    "values",
    [{}, {"scheduler": {"name": "acme-gnn-scheduler", "extender": {"port": 9000, "weight": 3, "ignorable": True}}}],
)
def test_chart_renders_exactly_the_generated_scheduler_config(values: dict) -> None:
    """gnnsched.scheduler_config is the source of truth; the chart's template must render the same document."""
    helm_python = pytest.importorskip("helm_python")
    chart_dir = Path(__file__).resolve().parents[1] / "charts" / "gnnsched"
    chart = helm_python.Chart.load(str(chart_dir))
    try:
        out = chart.render(values or None, name="gs", namespace="gnnsched", is_install=True)
    finally:
        chart.close()
    docs = [d for name, text in out.items() if name.endswith(".yaml") for d in yaml.safe_load_all(text) if d]
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and "scheduler-config.yaml" in d.get("data", {})]
    rendered = yaml.safe_load(cm["data"]["scheduler-config.yaml"])
    sched = values.get("scheduler", {})
    ext = sched.get("extender", {})
    expected = scheduler_config(
        f"http://127.0.0.1:{ext.get('port', 8888)}", weight=ext.get("weight", 5), namespace="gnnsched",
        scheduler_name=sched.get("name", "gnnsched-scheduler"), ignorable=ext.get("ignorable", False),
    )
    assert rendered == expected


def test_exclusive_pod_passes_only_nodes_with_an_empty_gpu_and_books_the_whole_gpu() -> None:
    """An exclusive pod (gnnsched.io/exclusive: "true") whose admit bytes exceed a GPU's shareable capacity is not
    unresolvable: it needs one empty GPU, as the node agent's gate admits it, and its reservation is the whole GPU."""
    from test_extender_cache import job

    from gnnsched.contract import ANN_EXCLUSIVE

    binder = FakeBinder()
    cache = ClusterCache(load_default())
    now = datetime.now(tz=timezone.utc).timestamp()
    for st in (status("busy", gpu(0, running=[job("x", 1, 100)])), status("empty", gpu(0), gpu(1))):
        st.updated_at = datetime.fromtimestamp(now, tz=timezone.utc)
        cache.upsert_gpunode(st)
    app = create_app(cache, binder)
    pod = make_pod("alone", 85.2, annotations={ANN_EXCLUSIVE: "true"})  # > 79 GiB shareable on an A100-80GB
    with LoopbackServer(app) as srv, httpx.Client(base_url=srv.url, timeout=10) as c:
        f = c.post("/filter", json={"Pod": pod, "NodeNames": ["busy", "empty"]}).json()
        # Both nodes can hold it once a GPU is empty (the filter asks "ever", the gate waits), none is unresolvable
        assert f["Error"] == "" and f["NodeNames"] == ["busy", "empty"] and not f["FailedAndUnresolvableNodes"], f
        scores = {x["Host"]: x["Score"] for x in c.post("/prioritize", json={"Pod": pod,
                                                                             "NodeNames": ["busy", "empty"]}).json()}
        assert scores["empty"] > scores["busy"], scores  # only there does it start now
        b = c.post("/bind", json={"PodName": "alone", "PodNamespace": "ns", "PodUID": "uid-alone",
                                  "Node": "empty"}).json()
        assert b["Error"] == "", b
        bound = next(p for p in binder.pods() if p["metadata"]["name"] == "alone")
        assert json.loads(bound["metadata"]["annotations"][ANN_RESERVATION])["bytes"] == 79 * GiB
        # Without the annotation the same bytes fit no GPU anywhere: unresolvable, as before.
        shared = make_pod("shared", 85.2)
        f2 = c.post("/filter", json={"Pod": shared, "NodeNames": ["busy", "empty"]}).json()
        assert f2["NodeNames"] == [] and set(f2["FailedAndUnresolvableNodes"]) == {"busy", "empty"}, f2
        bad = make_pod("bad", 1, annotations={ANN_EXCLUSIVE: "yes"})
        f3 = c.post("/filter", json={"Pod": bad, "NodeNames": ["empty"]}).json()
        assert "exclusive" in (f3["Error"] + json.dumps(f3["FailedAndUnresolvableNodes"])), f3


def test_a_pods_facts_come_from_its_gnnjobs_status_never_its_own_annotations() -> None:
    """Issue 39, finding 3 at the extender: a pod that writes ``admit-bytes``, a tiny predicted runtime and a GNNJob
    ownerReference on itself gets no credit for them; a pod its GNNJob's status names is placed and reserved by the
    status's facts, whatever its annotations claim. The job is read over the binder (the API server) when the
    cache's watch has not brought it yet."""
    from gnnsched.trust.job_facts import STATUS_FIELD, facts_status

    binder = FakeBinder()
    app, cache = _single_gpu_app(binder)
    job_meta = {"name": "job-real", "namespace": "ns", "uid": "juid-real"}
    ref = [{"apiVersion": "gnnsched.io/v1alpha1", "kind": "GNNJob", "name": "job-real", "uid": "juid-real"}]
    real = make_pod("real", None, runtime=40.0)
    real["metadata"]["annotations"][ANN_ADMIT_BYTES] = str(6 * GiB)
    real["metadata"]["ownerReferences"] = ref
    binder.add_gnnjob({"metadata": job_meta, "status": {STATUS_FIELD: facts_status(real)}})
    real["metadata"]["annotations"][ANN_ADMIT_BYTES] = str(GiB)  # a later hand edit of its own annotation
    forger = make_pod("forger", None, runtime=0.001)
    forger["metadata"]["annotations"][ANN_ADMIT_BYTES] = str(GiB)
    forger["metadata"]["ownerReferences"] = ref  # names the real job, which does not name this pod
    with LoopbackServer(app) as srv, httpx.Client(base_url=srv.url, timeout=10) as c:
        refused = c.post("/filter", json={"Pod": forger, "NodeNames": ["solo"]}).json()
        assert "declares no GPU memory" in refused["FailedAndUnresolvableNodes"]["solo"], refused
        forger["metadata"]["annotations"][ANN_GPU_MEMORY] = "3Gi"  # what it may declare about itself
        for pod in (real, forger):
            assert c.post("/filter", json={"Pod": pod, "NodeNames": ["solo"]}).json()["NodeNames"] == ["solo"]
            b = c.post("/bind", json={"PodName": pod["metadata"]["name"], "PodNamespace": "ns",
                                      "PodUID": pod["metadata"]["uid"], "Node": "solo"}).json()
            assert b["Error"] == "", b
    booked = {r.name: (r.bytes, r.runtime, r.job) for r in cache.reservations()}
    assert booked == {"real": (6 * GiB, 40.0, "ns/job-real"), "forger": (3 * GiB, 600.0, None)}
