"""Trust domains (issue 39, finding 5): pods share a GPU only within their domain, in every place co-location is
decided; job pods have memory limits; the MPS /dev/shm is bounded and cleaned at daemon start.

The rule's core (``gnnsched.trust.domain``) is unit-tested; the node agent's gate is a real ``gnnsched node-agent``
process on fake GPUs, spoken to over its unix socket; the extender is real HTTP on loopback; the simulator runs
whole workloads; the chart is rendered with the Helm SDK and validated against the Kubernetes schemas."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

import helm_python
import httpx
import kubernetes_validate
import pytest
import yaml
from fake_mps import kill_fake_mps, start_agent, stop_agent
from gate_helpers import GiB, gnnsched_command, job_pod, write_pods
from test_extender_cache import gpu, make_pod, status

from gnnsched.colocation.interference import load_default
from gnnsched.contract import ANN_RESERVATION, GPUJob
from gnnsched.extender import create_app
from gnnsched.extender.binder import FakeBinder
from gnnsched.extender.cache import ClusterCache
from gnnsched.extender.testing import LoopbackServer
from gnnsched.policies import Client, GPUFree, Task, plan_decision
from gnnsched.trust.domain import DomainResolver, domain_of, may_join, may_share, mixed, parse_trust_domain

ROOT = Path(__file__).resolve().parents[1]
FAKES = Path(__file__).parent / "fakes"

# --- the core rule ----------------------------------------------------------------------------------------------


def test_settings_parse_and_bad_ones_name_the_field() -> None:
    assert str(parse_trust_domain("namespace")) == "namespace"
    assert str(parse_trust_domain(" cluster ")) == "cluster"
    lab = parse_trust_domain("label:gnnsched.io/tenant")
    assert lab.kind == "label" and lab.label_key == "gnnsched.io/tenant"
    for bad in ("", "namespaces", "label:", "label:-bad", "label:a/b/c", "label:" + "x" * 64, 3):
        with pytest.raises(ValueError, match="^--trust-domain: "):
            parse_trust_domain(bad, "--trust-domain")  # type: ignore[arg-type]


def test_domain_of_each_setting() -> None:
    ns, cl, lab = (parse_trust_domain(t) for t in ("namespace", "cluster", "label:tenant"))
    assert domain_of(ns, "team-a", {"tenant": "x"}) == "ns:team-a"
    assert domain_of(cl, "team-a", None) is None
    assert domain_of(lab, "team-a", {"tenant": "x"}) == domain_of(lab, "team-b", {"tenant": "x"}) == "label:x"
    # unlabelled or unreadable: the namespace alone, never a wider domain; a namespace named like a value never meets it
    assert domain_of(lab, "team-c", {}) == "ns:team-c" and domain_of(lab, "team-c", None) == "ns:team-c"
    assert domain_of(lab, "x", {}) != domain_of(lab, "y", {"tenant": "x"})


def test_who_may_share() -> None:
    assert may_share("ns:a", "ns:a") and not may_share("ns:a", "ns:b")
    assert may_share(None, "ns:a") and may_share("ns:a", None)
    assert may_join("ns:a", ["ns:a", "ns:a"]) and not may_join("ns:a", ["ns:a", "ns:b"]) and may_join("ns:a", [])
    assert not mixed(["ns:a", None, "ns:a"]) and mixed(["ns:a", "ns:b"]) and not mixed([])


def test_resolver_caches_label_reads_and_falls_back_to_the_namespace() -> None:
    reads: list[str] = []
    labels = {"team-a": {"tenant": "blue"}, "team-b": {"tenant": "blue"}}
    clock = [0.0]

    def read(ns: str) -> dict[str, str] | None:
        reads.append(ns)
        if ns == "down":
            raise ConnectionError("API server unreachable")
        return labels.get(ns)

    r = DomainResolver("label:tenant", read, ttl=60, clock=lambda: clock[0])
    assert r.of("team-a") == r.of("team-b") == "label:blue" and r.of("team-a") == "label:blue"
    assert reads == ["team-a", "team-b"]  # the second team-a came from the cache
    assert r.of("down") == "ns:down" and r.of("gone") == "ns:gone"
    labels["team-a"] = {"tenant": "red"}  # relabelled: seen once the cached value is older than the ttl
    assert r.of("team-a") == "label:blue"
    clock[0] = 61
    assert r.of("team-a") == "label:red"
    with pytest.raises(ValueError, match="trustDomain"):
        DomainResolver("label:tenant")  # no way to read labels
    assert not DomainResolver("cluster").enabled and DomainResolver().of("x") == "ns:x"
    import asyncio

    assert asyncio.run(r.of_async("team-b")) == "label:blue" and asyncio.run(DomainResolver().of_async("y")) == "ns:y"


def test_the_gates_policies_never_group_two_domains() -> None:
    """``plan_decision`` (the gate's and the simulator's decision): a task joins neither a GPU with a client of
    another domain nor a group being formed with one, under every planning path."""
    a1, a2, b1 = (Task(key=k, bytes=GiB, seq=i, qt_seconds=60, domain=d)
                  for i, (k, d) in enumerate((("a1", "ns:a"), ("a2", "ns:a"), ("b1", "ns:b"))))
    busy = GPUFree(0, 70 * GiB, 4, 80 * GiB, running=(Client("memory", 300, "ns/x", domain="ns:a"),))
    for spread in (False, True):
        for bypass in (0, 4):
            plan = plan_decision("base", [b1], [busy], bypass, spread=spread)
            assert plan.admissions == [], (spread, bypass)
            plan = plan_decision("base", [a1, b1, a2], [busy], bypass, spread=spread)
            placed = {t.key for adm in plan.admissions for t in adm.tasks}
            assert "b1" not in placed and "a1" in placed, (spread, bypass, plan)
        # two idle GPUs: one group per domain, never mixed
        idle = [GPUFree(i, 70 * GiB, 4, 80 * GiB) for i in range(2)]
        plan = plan_decision("base", [a1, b1, a2], idle, 4, spread=spread)
        for adm in plan.admissions:
            assert len({t.domain for t in adm.tasks}) == 1, plan
    # without domains (cluster) the same queue shares the busy GPU
    plain = [Task(key=t.key, bytes=t.bytes, seq=t.seq, qt_seconds=60) for t in (a1, b1, a2)]
    free = GPUFree(0, 70 * GiB, 4, 80 * GiB, running=(Client("memory", 300, "ns/x"),))
    assert {t.key for adm in plan_decision("base", plain, [free], 0).admissions for t in adm.tasks} == \
        {"a1", "b1", "a2"}


def test_the_array_form_is_the_apart_rules_ranking() -> None:
    """``placement.domain_blocked`` / ``blocked_costs`` (the extender's trust-domain path) block the GPUs
    ``apart_blocked`` with a domain blocks, and rank them as ``apart_costs`` does."""
    import numpy as np

    from gnnsched import placement as pl

    dom = np.array([[-1, 0, 1], [-2, 1, -1]], dtype=np.int32)  # -1: no client, -2: clients of several domains
    mask = pl.domain_blocked(dom, 1)
    assert mask.tolist() == [[False, True, False], [True, False, False]]
    assert pl.domain_blocked(dom, -1).tolist() == [[False, True, True], [True, True, False]]  # a new domain
    cost = np.array([[1.0, 1.5, 2.0], [1.2, 3.0, 1.1]], dtype=np.float32)
    leave = np.where(mask, 500.0, -np.inf)
    clear, waiting = pl.blocked_costs(cost, mask, leave, 100.0, now=300.0)
    cells = {(int(s), int(c)): 500.0 for s, c in zip(*np.nonzero(mask), strict=True)}
    ref_clear, ref_waiting = pl.apart_costs(cost, cells, 100.0, 300.0)
    assert np.array_equal(clear, ref_clear) and np.allclose(waiting, ref_waiting)
    occupants = [((0, 1), [pl.Occupant(None, frozenset(), 500.0, "ns:a")]), ((0, 2), [pl.Occupant(None, frozenset(),
                 500.0, "ns:b")])]
    assert pl.apart_blocked(None, frozenset(), occupants, "ns:b") == {(0, 1): 500.0}


# --- the node agent's gate: a real agent on fake GPUs -----------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class OneGPUAgent:
    """``gnnsched node-agent`` on one fake 80 GiB GPU with the fake MPS daemon, pods from a file."""

    def __init__(self, tmp: Path, trust: str | None) -> None:
        self.tmp, self.sock, self.pods = tmp, tmp / "gate.sock", tmp / "pods.json"
        env = dict(os.environ, PATH=f"{FAKES}{os.pathsep}{os.environ['PATH']}")
        cmd = gnnsched_command() + [
            "node-agent", "--gpus", "fake:1x80Gi", "--node-name", "node-a", "--gate-socket", str(self.sock),
            "--pods-file", str(self.pods), "--status-file", str(tmp / "status.json"), "--policy", "base",
            "--reserve-bytes", "2Gi", "--mps", "on", "--mps-pipe-dir", str(tmp / "mps"), "--mps-log-dir",
            str(tmp / "mps-log"), "--peer-check", "off", "--recovery-grace", "0", "--status-interval", "0.5",
            "--state-dir", str(tmp / "state"), "--jobs-uid", str(os.getuid()), "--metrics-port",
            str(_free_port()), "--metrics-addr", "127.0.0.1", "--log-level", "warning",
        ] + (["--trust-domain", trust] if trust is not None else [])
        self.proc = start_agent(cmd, env, tmp, self.sock, tmp / "agent.log", tmp / "mps")

    def stop(self) -> None:
        stop_agent(self.proc, self.tmp / "mps")

    def admit(self, pod: dict) -> socket.socket:
        s = socket.socket(socket.AF_UNIX)
        s.connect(str(self.sock))
        m = pod["metadata"]
        s.sendall(json.dumps({"op": "admit", "podUid": m["uid"], "podName": m["name"],
                              "podNamespace": m["namespace"]}).encode() + b"\n")
        return s

    @staticmethod
    def status_of(conn: socket.socket, wait: float) -> str:
        """The last reply within ``wait`` seconds: ``admitted``, ``queued`` or ``rejected``."""
        conn.settimeout(0.1)
        deadline, last, buf = time.monotonic() + wait, "", b""
        while time.monotonic() < deadline:
            try:
                chunk = conn.recv(4096)
            except TimeoutError:
                continue
            if not chunk:
                break
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                last = json.loads(line)["status"]
                if last in ("admitted", "rejected"):
                    return last
        return last


def _three_pods(tmp: Path, namespaces: list[dict] | None = None) -> tuple[dict, dict, dict]:
    a, ja = job_pod("a", 10 * GiB, runtime=60, namespace="team-a")
    b, jb = job_pod("b", 10 * GiB, runtime=60, namespace="team-b")
    c, jc = job_pod("c", 10 * GiB, runtime=60, namespace="team-a")
    write_pods(tmp / "pods.json", [a, b, c], [ja, jb, jc])
    if namespaces is not None:
        data = json.loads((tmp / "pods.json").read_text())
        data["namespaces"] = namespaces
        (tmp / "pods.json").write_text(json.dumps(data))
    return a, b, c


@pytest.mark.timeout(120)
@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="Linux pidfd")
def test_real_agent_keeps_another_namespace_off_a_gpu_until_it_is_free(tmp_path: Path) -> None:
    """Default (namespace): team-b's pod waits while team-a runs on the node's one GPU, though 68 GiB are free;
    another team-a pod joins at once; team-b's is admitted when team-a's clients have exited."""
    a, b, c = _three_pods(tmp_path)
    agent = OneGPUAgent(tmp_path, None)
    try:
        ca = agent.admit(a)
        assert agent.status_of(ca, 10) == "admitted"
        cb = agent.admit(b)
        assert agent.status_of(cb, 1.5) == "queued"
        cc = agent.admit(c)
        assert agent.status_of(cc, 10) == "admitted"  # same domain: shares the GPU
        assert agent.status_of(cb, 0.5) == ""  # still waiting
        ca.close()
        assert agent.status_of(cb, 1.0) == ""  # team-a's c still runs there
        cc.close()
        assert agent.status_of(cb, 10) == "admitted"
        cb.close()
    finally:
        agent.stop()


@pytest.mark.timeout(120)
@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="Linux pidfd")
@pytest.mark.parametrize("trust, namespaces", [
    ("cluster", None),
    ("label:tenant", [{"metadata": {"name": "team-a", "labels": {"tenant": "blue"}}},
                      {"metadata": {"name": "team-b", "labels": {"tenant": "blue"}}}]),
])
def test_real_agent_shares_across_namespaces_when_the_setting_says_so(tmp_path: Path, trust: str,
                                                                     namespaces: list[dict] | None) -> None:
    a, b, _ = _three_pods(tmp_path, namespaces)
    agent = OneGPUAgent(tmp_path, trust)
    try:
        ca = agent.admit(a)
        assert agent.status_of(ca, 10) == "admitted"
        cb = agent.admit(b)
        assert agent.status_of(cb, 10) == "admitted"
        ca.close()
        cb.close()
    finally:
        agent.stop()


def test_agent_refuses_a_bad_setting_in_one_line(tmp_path: Path) -> None:
    cp = subprocess.run(gnnsched_command() + ["node-agent", "--gpus", "fake:1x1Gi", "--trust-domain", "tenant"],
                        capture_output=True, text=True, timeout=60)
    assert cp.returncode == 2 and "--trust-domain" in cp.stderr and "Traceback" not in cp.stderr, cp.stderr


# --- the extender: real HTTP on loopback -----------------------------------------------------------------------


def _running(uid: str, namespace: str, gib: float = 8, remaining: float = 300.0) -> GPUJob:
    return GPUJob(pod_uid=uid, namespace=namespace, name=uid, bytes=int(gib * GiB),
                  predicted_remaining_seconds=remaining)


def _pod_in(namespace: str, name: str = "p", gib: float = 8) -> dict:
    pod = make_pod(name, gib)
    pod["metadata"]["namespace"] = namespace
    return pod


def _extender(cache: ClusterCache) -> tuple[LoopbackServer, FakeBinder]:
    binder = FakeBinder()
    return LoopbackServer(create_app(cache, binder)), binder


def _cache(trust: str, *statuses) -> ClusterCache:  # type: ignore[no-untyped-def]
    cache = ClusterCache(load_default(), domains=DomainResolver(trust))
    now = datetime.now(tz=timezone.utc)
    for st in statuses:
        st.updated_at = now
        cache.upsert_gpunode(st)
    return cache


def _decide(client: httpx.Client, pod: dict, nodes: list[str]) -> tuple[dict, dict[str, int]]:
    f = client.post("/filter", json={"Pod": pod, "NodeNames": nodes, "Nodes": None})
    assert f.status_code == 200, f.text
    p = client.post("/prioritize", json={"Pod": pod, "NodeNames": nodes})
    assert p.status_code == 200, p.text
    return f.json(), {x["Host"]: x["Score"] for x in p.json()}


def test_extender_sends_a_pod_to_its_own_domains_gpu() -> None:
    """``other``'s GPU runs team-b's pod, ``own``'s runs team-a's. A team-a pod is sent to ``own`` and bound there;
    ``other`` fails the filter with the trust-domain reason. Without the rule (cluster) both nodes pass equally."""
    statuses = (status("other", gpu(0, running=[_running("b0", "team-b")])),
                status("own", gpu(0, running=[_running("a0", "team-a")])))
    server, binder = _extender(_cache("namespace", *statuses))
    with server as srv, httpx.Client(base_url=srv.url, timeout=10) as client:
        body, scores = _decide(client, _pod_in("team-a"), ["other", "own"])
        assert body["NodeNames"] == ["own"], body
        assert "another trust domain" in body["FailedNodes"]["other"], body
        assert not body["FailedAndUnresolvableNodes"], body  # resolvable: team-b's pod finishes
        assert scores == {"other": 0, "own": 10}
        b = client.post("/bind", json={"PodName": "p", "PodNamespace": "team-a", "PodUID": "uid-p",
                                       "Node": "own"}).json()
        assert b["Error"] == "", b
        (bound,) = binder.pods()
        assert json.loads(bound["metadata"]["annotations"][ANN_RESERVATION])["node"] == "own"
    server, _ = _extender(_cache("cluster", *statuses))
    with server as srv, httpx.Client(base_url=srv.url, timeout=10) as client:
        body, scores = _decide(client, _pod_in("team-a"), ["other", "own"])
        assert body["NodeNames"] == ["other", "own"] and not body["FailedNodes"], body
        assert scores["other"] == scores["own"] == 10


def test_extender_counts_its_own_reservations_and_a_nodes_other_gpu() -> None:
    """A reservation of team-b (bound, not yet reported by the agent) holds its GPU for team-b; on a node with two
    GPUs, one held by another domain, the free one takes the pod."""
    cache = _cache("namespace", status("two", gpu(0, running=[_running("b0", "team-b")]), gpu(1)),
                   status("one", gpu(0)))
    server, _ = _extender(cache)
    with server as srv, httpx.Client(base_url=srv.url, timeout=10) as client:
        body, _ = _decide(client, _pod_in("team-b", "r"), ["one"])
        assert body["NodeNames"] == ["one"], body
        b = client.post("/bind", json={"PodName": "r", "PodNamespace": "team-b", "PodUID": "uid-r",
                                       "Node": "one"}).json()
        assert b["Error"] == "", b
        body, scores = _decide(client, _pod_in("team-a", "p"), ["two", "one"])
        assert body["NodeNames"] == ["two"] and "another trust domain" in body["FailedNodes"]["one"], body
        b = client.post("/bind", json={"PodName": "p", "PodNamespace": "team-a", "PodUID": "uid-p",
                                       "Node": "two"}).json()
        assert b["Error"] == "", b
        (usage,) = [u for u in cache.gpu_usage("two") if u["index"] == 1]
        assert usage["clients"] == 1  # reserved on the GPU free of team-b, not beside it


def test_extender_when_every_gpu_holds_another_domain_the_pod_still_gets_a_node() -> None:
    """Filtering every candidate would leave the pod unschedulable though the others finish: all pass, and the one
    whose other-domain pods leave first ranks best (as the apart rule, docs/faults.md)."""
    cache = _cache("namespace", status("late", gpu(0, running=[_running("b0", "team-b", remaining=3000)])),
                   status("soon", gpu(0, running=[_running("c0", "team-c", remaining=60)])))
    server, _ = _extender(cache)
    with server as srv, httpx.Client(base_url=srv.url, timeout=10) as client:
        body, scores = _decide(client, _pod_in("team-a"), ["late", "soon"])
        assert body["NodeNames"] == ["late", "soon"] and not body["FailedNodes"], body
        assert scores["soon"] == 10 and scores["late"] < 10, scores


def test_extender_refuses_a_bad_setting(tmp_path: Path) -> None:
    cp = subprocess.run(gnnsched_command() + ["extender", "--fake-cluster", "1x1xA100-80GB", "--trust-domain",
                                              "label:"], capture_output=True, text=True, timeout=60)
    assert cp.returncode == 2 and "--trust-domain" in cp.stderr and "Traceback" not in cp.stderr, cp.stderr


# --- the simulator ---------------------------------------------------------------------------------------------


def test_simulator_never_puts_two_domains_on_a_gpu() -> None:
    """The same 24 jobs in 3 namespaces on one node of 2 GPUs: under ``namespace`` no GPU ever holds clients of two
    namespaces at once; under ``cluster`` some GPU does (so the rule, not the workload, keeps them apart)."""
    from dataclasses import replace

    from gnnsched.simulator.adapters import Integrations
    from gnnsched.simulator.cli import default_data_dir, fits_on
    from gnnsched.simulator.cluster import parse_cluster
    from gnnsched.simulator.engine import Simulation
    from gnnsched.simulator.policyspec import parse_policies
    from gnnsched.simulator.runner import materialise
    from gnnsched.simulator.workloads import builtin_workload

    cl = parse_cluster("1x2xV100-32GB")
    ix = Integrations()
    wl = builtin_workload("gen:load=1.5,arrival=burst,mix=train,size=small,jobs=24", 0, default_data_dir(),
                          fits=fits_on(cl, ix))
    jobs = [replace(j, namespace=f"team-{j.id % 3}") for j in materialise(wl, cl, ix, scaling=False)]
    (spec,) = parse_policies("sqtf+bypass4+spread")

    class Watched(Simulation):
        mixed_seen = 0

        def _start(self, job, gpu, rerate=True):  # type: ignore[no-untyped-def]
            started = super()._start(job, gpu, rerate)
            if started and len({r.job.namespace for r in gpu.running}) > 1:
                Watched.mixed_seen += 1
            return started

    seen = {}
    for trust in ("namespace", "cluster"):
        Watched.mixed_seen = 0
        result = Watched(jobs, cl, spec, ix, trust_domain=trust).run()
        assert sum(1 for o in result.outcomes if o.status == "completed") == len(jobs)
        seen[trust] = Watched.mixed_seen
    assert seen["namespace"] == 0 and seen["cluster"] > 0, seen


# --- job pods' memory limits -----------------------------------------------------------------------------------


def test_job_pods_get_a_memory_limit_from_their_right_sized_request() -> None:
    from gnnsched.errors import FieldError
    from gnnsched.operator.planning import Plan
    from gnnsched.operator.podspec import DEFAULT_MEMORY_LIMIT_FACTOR, JobPodSettings, build_pod, job_pod_settings
    from gnnsched.spec import parse_spec

    spec = parse_spec(yaml.safe_load(sorted((ROOT / "examples").glob("*.yaml"))[0].read_text())["spec"])
    job = {"metadata": {"name": "j", "namespace": "team-a", "uid": "u"}}
    plan = Plan(pmc_bytes=GiB, admit_bytes=2 * GiB, predicted_runtime_seconds=1.5, runtime_source="analytic-prior",
                runtime_gpu_model="A100-40GB", scaled_cpu="2", scaled_memory="3Gi")

    def limits(settings: JobPodSettings | None) -> dict:
        pod = build_pod(job, spec, plan, 0, "img", settings=settings)
        return pod["spec"]["containers"][0]["resources"]

    res = limits(None)
    assert DEFAULT_MEMORY_LIMIT_FACTOR == 2.0
    assert res["requests"]["memory"] == "3Gi" and res["limits"]["memory"] == str(6 * GiB)
    assert limits(JobPodSettings(memory_limit_factor=1.25))["limits"]["memory"] == str(int(3.75 * GiB))
    assert "memory" not in limits(JobPodSettings(memory_limit_factor=0))["limits"]  # 0: no limit (the old pods)
    for bad in (0.5, -1):
        with pytest.raises(FieldError, match="--memory-limit-factor"):
            job_pod_settings(memory_limit_factor=bad)


# --- the MPS /dev/shm: cleaned at daemon start ------------------------------------------------------------------


def _daemon(tmp: Path, shm: Path | None):  # type: ignore[no-untyped-def]
    from gnnsched.node_agent.mps import MPSConfig, MPSManager
    from gnnsched.node_agent.mps_daemon import MPSDaemonService

    cfg = MPSConfig(pipe_directory=tmp / "pipe", log_directory=tmp / "log", devices=[0], uuids=["GPU-0"],
                    compute_mode=None, owner_uid=None, start_timeout=10)
    return MPSDaemonService(MPSManager(cfg), tmp / "state", None, None, shm_mount=shm)


def _run_once(service) -> None:  # type: ignore[no-untyped-def]
    import threading

    t = threading.Thread(target=service.run, args=(0.1,))
    t.start()
    deadline = time.monotonic() + 20
    while not service.manager.healthy:
        assert time.monotonic() < deadline, service.manager.message
        time.sleep(0.05)
    service.stop()
    t.join(10)


def test_daemon_start_empties_the_shared_shm_and_a_running_daemon_keeps_it(tmp_path: Path, monkeypatch) -> None:
    """What an earlier run left in the shared tmpfs (a stale MPS file, a tenant's segment and directory) is gone
    once the daemon starts; when a daemon already answers (its clients may be live) nothing is touched."""
    monkeypatch.setenv("PATH", f"{FAKES}{os.pathsep}{os.environ['PATH']}")
    shm = tmp_path / "shm"  # stands in for the tmpfs at /dev/shm
    shm.mkdir()
    (shm / "cuda.shm.0.1f.1").write_bytes(b"\0" * 4096)
    (shm / "torch_1234_seg").write_bytes(b"x" * 1000)
    (shm / "leftover").mkdir()
    (shm / "leftover" / "f").write_text("y")
    try:
        _run_once(_daemon(tmp_path, shm))
        assert list(shm.iterdir()) == []
        (shm / "live-client-segment").write_text("in use")
        _run_once(_daemon(tmp_path, shm))  # the first daemon still answers on the pipe directory
        assert [p.name for p in shm.iterdir()] == ["live-client-segment"]
    finally:
        kill_fake_mps(tmp_path / "pipe")


# --- the chart ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chart():  # type: ignore[no-untyped-def]
    loaded = helm_python.Chart.load(str(ROOT / "charts" / "gnnsched"))
    yield loaded
    loaded.close()


def _render(chart, values: dict) -> list[dict]:  # type: ignore[no-untyped-def]
    out = chart.render(values or None, name="gs", namespace="gnnsched", is_install=True)
    return [d for name, text in out.items() if name.endswith(".yaml") for d in yaml.safe_load_all(text) if d]


def _container(docs: list[dict], name: str) -> dict:
    for d in docs:
        if d["kind"] in ("Deployment", "DaemonSet"):
            for c in d["spec"]["template"]["spec"]["containers"] + d["spec"]["template"]["spec"].get(
                    "initContainers", []):
                if c["name"] == name:
                    return c
    raise AssertionError(f"no container {name}")


def _arg(c: dict, flag: str) -> str | None:
    return next((a.split("=", 1)[1] for a in c.get("args", []) if a.startswith(flag + "=")), None)


def _env(c: dict, name: str) -> str | None:
    return next((e.get("value") for e in c.get("env", []) if e["name"] == name), None)


def _namespace_readers(docs: list[dict]) -> set[str]:
    return {d["metadata"]["labels"]["app.kubernetes.io/component"] for d in docs if d["kind"] == "ClusterRole"
            for r in d["rules"] if "namespaces" in r["resources"] and "get" in r["verbs"]
            and d["metadata"]["labels"]["app.kubernetes.io/component"] in ("node", "scheduler")}


def test_chart_defaults_namespace_domains_bounded_shm_and_memory_limits(chart) -> None:  # type: ignore[no-untyped-def]
    docs = _render(chart, {})
    assert _arg(_container(docs, "agent"), "--trust-domain") == "namespace"
    assert _arg(_container(docs, "extender"), "--trust-domain") == "namespace"
    assert _namespace_readers(docs) == set()  # the namespace is on the pod: no Namespace reads needed
    assert _arg(_container(docs, "mount-shm"), "--shm-size") == "1Gi"
    assert _arg(_container(docs, "mps-daemon"), "--clean-shm") == "/dev/shm"
    assert _env(_container(docs, "operator"), "GNNSCHED_JOB_MEMORY_LIMIT_FACTOR") == "2"


def test_chart_renders_label_domains_and_validates(chart) -> None:  # type: ignore[no-untyped-def]
    values = {"sharing": {"trustDomain": "label:example.com/tenant"}, "node": {"mps": {"shmSize": "2Gi"}},
              "jobs": {"memoryLimitFactor": 1.5}}
    docs = _render(chart, values)
    assert _arg(_container(docs, "agent"), "--trust-domain") == "label:example.com/tenant"
    assert _arg(_container(docs, "extender"), "--trust-domain") == "label:example.com/tenant"
    assert _namespace_readers(docs) == {"node", "scheduler"}  # get on namespaces, nothing more
    assert _arg(_container(docs, "mount-shm"), "--shm-size") == "2Gi"
    assert _env(_container(docs, "operator"), "GNNSCHED_JOB_MEMORY_LIMIT_FACTOR") == "1.5"
    version = ".".join(kubernetes_validate.latest_version().split(".")[:2])
    for doc in docs:
        if not doc["apiVersion"].startswith("monitoring.coreos.com/"):
            kubernetes_validate.validate(doc, version, strict=True)
    for bad in ({"sharing": {"trustDomain": "everyone"}}, {"sharing": {"trustDomain": "label:"}},
                {"jobs": {"memoryLimitFactor": 0.5}}, {"node": {"mps": {"shmSize": "lots"}}}):
        with pytest.raises(helm_python.HelmValuesError):
            chart.validate_schema(bad)
    chart.validate_schema({"jobs": {"memoryLimitFactor": 0}})
