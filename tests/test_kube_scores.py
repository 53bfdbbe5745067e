"""kube-scheduler's CPU/memory score plugins as the simulator plays them, and the bin packing they give."""

from __future__ import annotations

import numpy as np
import pytest
from test_simulator import V100, job

from gnnsched.gpu.catalogue import GiB
from gnnsched.scheduler_config import LEAST_ALLOCATED, MOST_ALLOCATED
from gnnsched.simulator import kube_scores
from gnnsched.simulator.adapters import Integrations
from gnnsched.simulator.cluster import uniform_cluster
from gnnsched.simulator.engine import Simulation
from gnnsched.simulator.policyspec import PolicyError, parse_policy


def test_scores_by_hand() -> None:
    cap_cpu, cap_mem = np.array([10_000.0, 10_000.0]), np.array([100.0, 100.0])
    free_cpu, free_mem = np.array([6_000.0, 10_000.0]), np.array([50.0, 100.0])
    # node 0 after the pod (2 cores, 10 bytes): CPU 6000/10000, memory 60/100 requested -> balanced 100
    # node 1 after the pod: 2000/10000 and 10/100 -> fractions .2 and .1, std .05 -> balanced 95
    least = kube_scores.host_scores(LEAST_ALLOCATED, free_cpu, cap_cpu, free_mem, cap_mem, 2_000, 10)
    most = kube_scores.host_scores(MOST_ALLOCATED, free_cpu, cap_cpu, free_mem, cap_mem, 2_000, 10)
    assert least.tolist() == [40 + 100, 85 + 95]  # (80 + 90) // 2 = 85 on the empty node
    assert most.tolist() == [60 + 100, 15 + 95]
    # fractions .75 and .25: std .25
    assert kube_scores.balanced_allocation(np.array([3.0]), np.array([4.0]), np.array([1.0]),
                                           np.array([4.0])).tolist() == [75]
    # kube-scheduler's integer arithmetic on whole numbers held as floats: 1 of 3 cores is 33, not 33.33
    assert kube_scores.resource_fit(MOST_ALLOCATED, np.array([1.0]), np.array([3.0]), np.array([2.0]),
                                    np.array([3.0])).tolist() == [(33 + 66) // 2]
    with pytest.raises(ValueError, match="strategy"):
        kube_scores.resource_fit("Random", cap_cpu, cap_cpu, cap_mem, cap_mem)
    assert kube_scores.extender_points(np.array([10, 3]), 5).tolist() == [500, 150]


@pytest.mark.parametrize("strategy", [LEAST_ALLOCATED, MOST_ALLOCATED])
def test_one_node_score_is_the_vector_score(strategy: str) -> None:
    # the engine re-scores changed nodes one at a time in Python integers; both must give kube-scheduler's integers
    rng = np.random.default_rng(7)
    cpu_cap = rng.integers(1, 400_000, 2000)
    mem_cap = rng.integers(1, 2**44, 2000)
    pod_cpu, pod_mem = 1500, 6 * GiB
    cpu_free = np.minimum(cpu_cap, pod_cpu + rng.integers(0, 400_000, 2000))
    mem_free = np.minimum(mem_cap, pod_mem + rng.integers(0, 2**44, 2000))
    fits = (cpu_free >= pod_cpu) & (mem_free >= pod_mem)
    vector = kube_scores.host_scores(strategy, cpu_free[fits].astype(float), cpu_cap[fits].astype(float),
                                     mem_free[fits].astype(float), mem_cap[fits].astype(float), pod_cpu, pod_mem)
    one = [kube_scores.host_score(strategy, int(a), int(b), int(c), int(d), pod_cpu, pod_mem)
           for a, b, c, d in zip(cpu_free[fits], cpu_cap[fits], mem_free[fits], mem_cap[fits], strict=True)]
    assert fits.sum() > 1000 and vector.tolist() == one


def test_policy_suffixes_pick_the_profile() -> None:
    assert parse_policy("lmcf").scoring_strategy == LEAST_ALLOCATED  # gnnsched's profile spreads by default
    assert parse_policy("lmcf+sjf+pack").scoring_strategy == MOST_ALLOCATED
    assert parse_policy("srtf").scoring_strategy == LEAST_ALLOCATED  # kube-scheduler's default profile spreads
    assert parse_policy("exclusive+pack+scaling").scoring_strategy == MOST_ALLOCATED
    with pytest.raises(PolicyError, match="unknown suffix"):
        parse_policy("bqt+scatter")  # not a suffix (+spread is one: the gate's round-robin plan)


def _big_job_wait(policy: str) -> float:
    """Two 4-core jobs, then one 12-core job, on two 12-core nodes with two GPUs each: packing puts the small ones
    on one node and the big one starts at once; spreading leaves 8 cores on each node and it waits."""
    jobs = [job(0, 0.1, solo=100.0, arrival=0.0, cpu=4000), job(1, 0.1, solo=100.0, arrival=1.0, cpu=4000),
            job(2, 0.1, solo=10.0, arrival=2.0, cpu=12_000)]
    cluster = uniform_cluster(2, 2, V100, cpu_milli=12_000, memory_bytes=64 * GiB)
    res = Simulation(jobs, cluster, parse_policy(policy), Integrations(), startup_s=0.0).run()
    big = next(o for o in res.outcomes if o.job.id == 2)
    assert big.status == "completed" and big.first_start is not None
    return big.first_start - big.job.arrival


@pytest.mark.parametrize("base", ["lmcf", "bqt", "exclusive"])
def test_packing_keeps_a_node_free_for_a_large_pod(base: str) -> None:
    assert _big_job_wait(base + "+pack") == pytest.approx(0.0, abs=1e-6)
    assert _big_job_wait(base) >= 90.0  # until a 4-core job ends at t = 100


def test_fast_placement_path_picks_what_the_exact_score_sum_picks(monkeypatch) -> None:
    """``PlacementView._cheapest`` computes exact costs only for the candidates whose waiting GPUs could change the
    lowest cost or their own score; its pick (node and GPU) must be the one every candidate's exact cost and host
    score give."""
    from gnnsched.simulator.adapters import PlacementView

    fast = PlacementView._cheapest
    seen = {"checks": 0, "ties_broken_by_host": 0}

    def checked(self, cands, cols, demand, out):
        got = fast(self, cands, cols, demand, out)
        cost, good = self._costs(cands, cols, demand)
        keep = np.flatnonzero(self.state["known"][cols] & np.logical_or.reduce(good, axis=0))
        if keep.size == 0:
            assert got == ()
            return got
        best = np.minimum.reduce(cost, axis=0).take(keep)
        col = int(keep[int(np.argmax(self._totals(cands.take(keep), self.pl.normalise_scores(best), out)))])
        assert got == (col, int(np.argmin(cost[:, col]))), (self.sim.policy.text, self.sim.now, got, col)
        seen["checks"] += 1
        seen["ties_broken_by_host"] += int(col != int(keep[int(np.argmin(best))]))
        return got

    monkeypatch.setattr(PlacementView, "_cheapest", checked)
    policies = ("bmc+pack", "sqtf+pack", "lmcf-interference+pack", "bqt", "base-interference")
    # A light load on 4 x 2 GPUs; a heavy one on 6 x 1 where pods often wait for a GPU; and two found by searching
    # for loads where a shortcut changes a pick: on 4 x 1, skipping the second round of exact costs (a waiting GPU
    # raised a node's score and the host scores then made it win); on 6 x 3, reserving the winner's fit-now GPU
    # without checking its waiting ones.
    for gap, peak, count, nodes, gpus, solo, step, cpu_unit, cpu_mod in (
            (3.0, 0.3, 80, 4, 2, 40.0, 17.0, 1000, 9), (0.5, 0.6, 200, 6, 1, 40.0, 17.0, 1000, 9),
            (1.0, 0.3, 150, 4, 1, 20.0, 37.0, 500, 24), (2.0, 0.45, 150, 6, 3, 20.0, 37.0, 500, 24)):
        jobs = [job(i, 0.05 + peak * ((i * 5) % 7) / 7, solo=solo + step * (i % 5), arrival=gap * i,
                    intensity=("memory", "compute")[i % 2], cpu=cpu_unit * (1 + (i * 7) % cpu_mod))
                for i in range(count)]
        cluster = uniform_cluster(nodes, gpus, V100, cpu_milli=24_000, memory_bytes=128 * GiB)
        for policy in policies:
            res = Simulation(jobs, cluster, parse_policy(policy), Integrations(), startup_s=0.0).run()
            assert all(o.status == "completed" for o in res.outcomes), policy
    assert seen["checks"] >= 580 * len(policies)
    assert seen["ties_broken_by_host"] > 0  # the host scores decided some picks, so the check covers them
