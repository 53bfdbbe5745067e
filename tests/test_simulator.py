"""Simulator engine, cluster/policy/workload parsing and the CLI's error handling (fast: tiny workloads)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from shared_data import DATA

from gnnsched.gpu.catalogue import GiB, get_gpu_model
from gnnsched.simulator.adapters import Integrations
from gnnsched.simulator.cluster import ClusterError, parse_cluster, uniform_cluster
from gnnsched.simulator.engine import Simulation, feasible_nodes_to_find
from gnnsched.simulator.metrics import summarise
from gnnsched.simulator.model import JobProfile, SimJob
from gnnsched.simulator.policyspec import GNNSCHED_POLICIES, PolicyError, parse_policies, parse_policy
from gnnsched.simulator.workloads import WorkloadError, load_workload_file

V100 = "V100-32GB"
CAP = get_gpu_model(V100).memory_bytes


def job(i: int, peak_frac: float, solo: float, arrival: float = 0.0, intensity: str = "memory",
        cpu: int = 2000) -> SimJob:
    """A job whose real peak is ``peak_frac`` of a V100-32GB and whose gate reservation is 10 % above it."""
    peak = int(CAP * peak_frac)
    prof = JobProfile(admit_bytes=int(peak * 1.1), peak_bytes=peak, solo_s=solo, predicted_s=solo,
                      sm_util=0.5, mem_util=0.4, intensity=intensity)
    return SimJob(id=i, name=f"j{i}", arrival=arrival, mode="train", cpu_milli=cpu, memory_bytes=4 * GiB,
                  profiles={V100: prof}, backoff_limit=2)


def simulate(jobs, policy: str, cluster=None, horizon=None, max_clients=None):
    cluster = cluster or uniform_cluster(1, 1, V100)
    sim = Simulation(jobs, cluster, parse_policy(policy), Integrations(), horizon=horizon,
                     max_clients=max_clients, startup_s=0.0)
    return sim.run()


# ------------------------------------------------------------------------------------------------ parsing
def test_cluster_shapes():
    c = parse_cluster("4x2xV100-32GB")
    assert len(c.nodes) == 4 and c.gpu_count == 8 and {n.gpu_model for n in c.nodes} == {V100}
    assert parse_cluster("3").gpu_count == 3
    assert parse_cluster("2x8xa100").nodes[0].gpu_model == "A100-40GB"
    pai = parse_cluster("pai32")
    assert pai.gpu_count == 32 and sum(n.cpu_milli for n in pai.nodes) == 384_000
    for bad in ("0x1", "4x0", "2x2xNOPE", "banana"):
        with pytest.raises(ClusterError) as err:
            parse_cluster(bad)
        assert err.value.field == "cluster"


def test_cluster_file(tmp_path: Path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"nodes": [{"count": 2, "gpus": 4, "model": "T4", "cpu": 32, "memoryGi": 128}]}))
    c = parse_cluster(str(path))
    assert c.gpu_count == 8 and c.nodes[0].cpu_milli == 32_000
    path.write_text(yaml.safe_dump({"nodes": [{"gpus": 1, "model": "Z9"}]}))
    with pytest.raises(ClusterError) as err:
        parse_cluster(str(path))
    assert err.value.field == "cluster.nodes[0].model"


def test_policy_names():
    p = parse_policy("lmcf+scaling-interference@3")
    assert (p.base, p.scaling, p.interference, p.max_clients, p.is_gnnsched) == ("lmcf", True, False, 3, True)
    assert parse_policy("mps-naive+uvm").uvm
    assert [s.base for s in parse_policies("exclusive, bqt")] == ["exclusive", "bqt"]
    for bad in ("nope", "exclusive+uvm", "temporal-interference", "lmcf@0", "lmcf+fast", ""):
        with pytest.raises(PolicyError):
            parse_policy(bad)
    with pytest.raises(PolicyError):
        parse_policies("lmcf,lmcf")


def test_bypass_suffix():
    from gnnsched.policies import DEFAULT_BYPASS_LIMIT

    assert parse_policy("sqtf+bypass3").effective_bypass_limit == 3
    assert parse_policy("lmcf+bypass0@3").effective_bypass_limit == 0
    assert parse_policy("lmcf+bypass0@3").max_clients == 3
    assert parse_policy("bqt").effective_bypass_limit == DEFAULT_BYPASS_LIMIT
    for bad in ("lmcf+bypass", "lmcf+bypass-1", "mps-naive+bypass2", "sqtf-paper+bypass1", "exclusive+bypass0"):
        with pytest.raises(PolicyError):
            parse_policy(bad)


def test_kube_scheduler_nodes_to_score():
    assert feasible_nodes_to_find(50) == 50
    assert feasible_nodes_to_find(1000) == 420  # 50 - 1000/125 = 42 %
    assert feasible_nodes_to_find(5000) == 500  # floor of 5 % would be 250; kube-scheduler keeps >= 100 nodes


def test_workload_file_format(tmp_path: Path):
    manifest: dict[str, Any] = {"apiVersion": "gnnsched.io/v1alpha1", "kind": "GNNJob", "metadata": {"name": "a"},
                "spec": {"mode": "train", "model": {"arch": "gcn"}, "graph": {"dataset": "cora"},
                         "resources": {"cpu": "500m", "memory": "1Gi"}}, "arrival": 12.5}
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump([manifest]))
    wl = load_workload_file(path)
    t = wl.templates[0]
    assert (t.name, t.arrival, t.cpu_milli, t.memory_bytes) == ("a", 12.5, 500, GiB)
    cases: list[tuple[Any, str]] = [
        ({k: v for k, v in manifest.items() if k != "arrival"}, "workload[0].arrival"),
        ({**manifest, "arrival": -1}, "workload[0].arrival"),
        ({**manifest, "spec": {**manifest["spec"], "model": {"arch": "gcn", "layers": 99}}},
         "workload[0].spec.model.layers"),
    ]
    for item, field in cases:
        path.write_text(yaml.safe_dump([item]))
        with pytest.raises(WorkloadError) as err:
            load_workload_file(path)
        assert err.value.field == field


# ------------------------------------------------------------------------------------------------ engine
def test_exclusive_runs_jobs_one_after_another():
    jobs = [job(i, 0.3, solo=10.0 * (i + 1)) for i in range(3)]
    res = simulate(jobs, "exclusive")
    m = summarise(res)
    solos = [10.0, 20.0, 30.0]
    finishes = [sum(solos[: i + 1]) for i in range(3)]  # FIFO, one at a time, no start-up in this test
    assert [o.finish for o in res.outcomes] == pytest.approx(finishes)
    assert m["makespan_s"] == pytest.approx(sum(solos))
    assert m["jct_mean_s"] == pytest.approx(sum(finishes) / 3, abs=1e-3)
    assert m["oom_kills"] == 0 and m["completed"] == 3


def test_naive_mps_oom_kills_on_oversubscription():
    # four jobs of 40 % each arrive together: MPS without a gate admits them all, memory runs out
    jobs = [job(i, 0.4, solo=20.0) for i in range(4)]
    m = summarise(simulate(jobs, "mps-naive"))
    assert m["oom_kills"] > 0
    assert m["completed"] < 4 or m["makespan_s"] > 20.0


def test_naive_mps_with_uvm_pays_paging_instead():
    jobs = [job(i, 0.4, solo=20.0) for i in range(4)]
    res = simulate(jobs, "mps-naive+uvm")
    m = summarise(res)
    assert m["oom_kills"] == 0 and m["completed"] == 4
    assert m["max_slowdown"] > 2.0  # 60 % of the working set behind PCIe
    assert m["makespan_s"] > summarise(simulate(jobs, "exclusive"))["makespan_s"]


def test_run_ends_at_its_last_completion_not_at_a_replanned_one():
    # j0 runs alone, slows down when j1 joins (its first completion is re-planned later), speeds up again when j1
    # ends (re-planned earlier): the completion planned while both ran is stale after j0 ends and must not move the
    # clock, or the utilisation would be averaged over a run longer than the jobs'
    jobs = [job(0, 0.3, solo=100.0), job(1, 0.3, solo=10.0, arrival=10.0)]
    res = simulate(jobs, "lmcf")
    last = max(o.finish for o in res.outcomes)
    assert res.outcomes[1].finish < last and res.outcomes[0].slowdown_max > 1.0  # they did share the GPU
    assert res.end_time == pytest.approx(last) and res.timeline[-1][0] == pytest.approx(last)
    m = summarise(res)
    busy = sum(o.job.profile(V100).peak_bytes * (o.finish - o.start) for o in res.outcomes)
    assert m["gpu_mem_util"] == pytest.approx(busy / CAP / last, abs=1e-4)


@pytest.mark.parametrize("policy", GNNSCHED_POLICIES)
def test_gnnsched_policies_never_oom(policy: str):
    pytest.importorskip("gnnsched.colocation.interference")
    jobs = [job(i, frac, solo=5.0 + 3 * i, arrival=float(i % 3), intensity=("memory", "compute")[i % 2])
            for i, frac in enumerate([0.4, 0.4, 0.1, 0.6, 0.2, 0.3, 0.05, 0.5])]
    res = simulate(jobs, policy, cluster=uniform_cluster(1, 2, V100), max_clients=4)
    m = summarise(res)
    assert m["oom_kills"] == 0 and m["completed"] == len(jobs)
    assert res.gate_checks > 0
    for g in res.groups:
        assert g.committed <= g.capacity and g.used <= g.capacity
    # co-location happened and slowed jobs down (the interference model is in the loop)
    assert max(g.jobs for g in res.groups) >= 2
    assert m["max_slowdown"] > 1.0


def test_gate_backfill_in_the_engine():
    """A 0.6-GPU job waits behind a running 0.5 one; four small jobs arrive after it. Strict prefix: they all wait
    behind it. ``+bypass2``: exactly two start ahead of it, the other two wait behind it (FIFO order)."""
    pytest.importorskip("gnnsched.colocation.interference")

    def jobs():
        return ([job(0, 0.5, solo=20.0, cpu=500), job(1, 0.6, solo=5.0, arrival=1.0, cpu=500)]
                + [job(i, 0.03, solo=2.0, arrival=float(i), cpu=500) for i in range(2, 6)])

    starts = {}
    for policy in ("base+bypass0", "base+bypass2"):
        res = simulate(jobs(), policy)
        m = summarise(res)
        assert m["oom_kills"] == 0 and m["completed"] == 6
        assert all(g.committed <= g.capacity for g in res.groups)
        starts[policy] = {o.job.id: o.first_start for o in res.outcomes}
    strict, backfill = starts["base+bypass0"], starts["base+bypass2"]
    assert strict[1] >= 20.0 and all(strict[i] >= strict[1] for i in range(2, 6))
    # the two that passed it share the GPU with job 0 for a while, which slows job 0 (interference): job 1 starts a
    # little later than under the strict prefix -- the price the bypass limit bounds
    assert strict[1] < backfill[1] < strict[1] + 5.0
    assert backfill[2] == 2.0 and backfill[3] == 3.0
    assert all(backfill[i] >= backfill[1] for i in (4, 5))


def test_gnnsched_marks_jobs_larger_than_any_gpu_unschedulable():
    pytest.importorskip("gnnsched.colocation.interference")
    jobs = [job(0, 0.95, solo=5.0), job(1, 0.2, solo=5.0)]  # admit = 1.045 x capacity: the gate can never admit it
    m = summarise(simulate(jobs, "lmcf"))
    assert m["unschedulable"] == 1 and m["completed"] == 1 and m["oom_kills"] == 0


def test_horizon_stops_the_clock():
    jobs = [job(i, 0.3, solo=100.0, arrival=10.0 * i) for i in range(5)]
    res = simulate(jobs, "exclusive", horizon=250.0)
    m = summarise(res)
    assert m["makespan_s"] == pytest.approx(250.0)
    assert m["completed"] == 2 and m["deployed"] == 3
    assert m["completion_rate"] == pytest.approx(2 / 5)


def test_cpu_requests_bound_placement():
    # 2 nodes x 1 GPU, 12 cores each; jobs ask 8 cores: one per node at a time even under MPS
    cluster = uniform_cluster(2, 1, V100)
    jobs = [job(i, 0.1, solo=10.0, cpu=8000) for i in range(4)]
    m = summarise(simulate(jobs, "mps-naive", cluster=cluster))
    assert m["makespan_s"] == pytest.approx(20.0, rel=0.05)
    assert m["cpu_alloc_util"] <= 1.0


# ------------------------------------------------------------------------------------------------ CLI
def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gnnsched.cli", "simulate", *args], capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("args, field", [
    (("--cluster", "0x1"), "cluster"),
    (("--policies", "fastest"), "policies"),
    (("--workload", "cognn-nope"), "workload"),
    (("--json", "/dev/null/out.json"), "--json"),  # checked before the run: its parent cannot be a folder
    (("--plots", "/dev/null"), "--plots"),
])
def test_cli_bad_input_is_one_line_exit_2(args, field):
    out = _cli(*args, "--no-progress")
    assert out.returncode == 2, out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and field in lines[0]
    assert "Traceback" not in out.stderr


def test_cli_list():
    out = _cli("--list")
    assert out.returncode == 0 and "cognn-mix" in out.stdout and "pai32" in out.stdout


# ------------------------------------------------------------------------------------------------ openb / FGD
def _tiny_openb():
    from gnnsched.simulator.cluster import ClusterSpec, NodeSpec
    from gnnsched.simulator.openb import Pod

    nodes = tuple(NodeSpec(f"n{i}", g, "T4", 32_000, 128 * GiB) for i, g in enumerate((1, 2, 4, 8)))
    pods = [Pod(4000, 8 * GiB, 1, m) for m in (250, 500, 700, 1000)] + [Pod(8000, 16 * GiB, 2, 1000),
                                                                           Pod(2000, 4 * GiB, 0, 0)]
    return ClusterSpec("tiny", nodes), pods


@pytest.mark.parametrize("policy", ["best-fit", "fgd"])
def test_openb_incremental_fragmentation_matches_recomputation(policy: str):
    import numpy as np

    from gnnsched.simulator.openb import Classes, OpenbCluster

    cluster, pods = _tiny_openb()
    state = OpenbCluster(cluster)
    cl = Classes(pods)
    state.init_frag(cl)
    rng = np.random.default_rng(1)
    placed = 0
    for _ in range(40):
        placed += state.place(pods[int(rng.integers(len(pods)))], policy, cl)
        assert (state.free >= 0).all() and (state.cpu >= 0).all() and (state.mem >= 0).all()
        fresh = OpenbCluster(cluster)
        fresh.free, fresh.cpu, fresh.mem = state.free.copy(), state.cpu.copy(), state.mem.copy()
        fresh.init_frag(cl)
        assert state.fcache == pytest.approx(fresh.fcache)
    assert placed > 0


def test_openb_fgd_leaves_no_more_fragment_than_best_fit_on_the_trace():
    from gnnsched.simulator.cluster import parse_cluster
    from gnnsched.simulator.openb import load_pods, replay

    data = DATA
    if not (data / "traces" / "openb_pod_list_default.csv").exists():
        pytest.skip("shared openb trace not available")
    cluster = parse_cluster("openb", data)
    pods = load_pods(data)
    bf = replay(cluster, pods, "best-fit", seed=0, until=0.3)
    fgd = replay(cluster, pods, "fgd", seed=0, until=0.3)
    assert fgd["pods_arrived"] == bf["pods_arrived"]  # same draw of pods
    assert fgd["fragmented_gpus"] <= bf["fragmented_gpus"]


def test_an_oom_kill_costs_the_start_up_and_the_restart_back_off():
    # Two 60 % jobs under naive MPS: the second is killed when it allocates, which is after its start-up, and
    # Kubernetes restarts it after 10 s, then 20 s (CrashLoopBackOff), until the first one has finished.
    jobs = [job(i, 0.6, solo=20.0) for i in range(2)]
    sim = Simulation(jobs, uniform_cluster(1, 1, V100), parse_policy("mps-naive"), Integrations(), startup_s=5.0)
    first, second = sim.run().outcomes
    assert first.finish == pytest.approx(25.0) and first.oom_kills == 0
    # killed at 0 (+5 start-up +10 back-off) and at 15 (+5 +20): the third attempt at 40 fits
    assert second.oom_kills == 2 and second.attempts == 3
    assert second.start == pytest.approx(40.0) and second.finish == pytest.approx(65.0)
