"""Shortest-predicted-first queue classes (gnnsched.queue_order) and the simulator's ``+sjf`` policies."""

from __future__ import annotations

import math
from itertools import pairwise

import pytest

from gnnsched.contract import QUEUE_CLASS_PREFIX, QUEUE_PRIORITY_BASE
from gnnsched.gpu.catalogue import GiB, get_gpu_model
from gnnsched.queue_order import (
    DOUBLINGS,
    MAX_USER_PRIORITY,
    MIN_SECONDS,
    QueueOrder,
    QueueOrderError,
)
from gnnsched.simulator.adapters import Integrations
from gnnsched.simulator.cluster import uniform_cluster
from gnnsched.simulator.engine import Simulation
from gnnsched.simulator.model import JobProfile, SimJob
from gnnsched.simulator.policyspec import PolicyError, parse_policy

V100 = "V100-32GB"
CAP = get_gpu_model(V100).memory_bytes


# ------------------------------------------------------------------------------------------------ buckets
def test_bucket_bounds_and_resolution():
    q = QueueOrder()
    assert q.buckets == 2 * DOUBLINGS + 1 == 33
    assert q.bucket(0) == q.bucket(1.0) == q.bucket(MIN_SECONDS) == 0
    assert q.bucket(MIN_SECONDS + 1e-6) == 1
    # bucket k's upper bound is 60 * 2**(k/2), inclusive, even though sqrt(2) is irrational
    for k in range(1, q.buckets - 1):
        bound = q.upper_seconds(k)
        assert bound == pytest.approx(MIN_SECONDS * math.sqrt(2) ** k)
        assert q.bucket(bound) == k
        assert q.bucket(bound * (1 + 1e-6)) == k + 1
    assert q.upper_seconds(q.buckets - 1) is None
    assert q.bucket(1e12) == q.bucket(math.inf) == q.buckets - 1
    assert QueueOrder(per_doubling=8).buckets == 129
    assert QueueOrder(per_doubling=8).bucket(120.0) == 8


def test_bucket_is_monotone_and_priority_decreases_with_runtime():
    q = QueueOrder()
    runtimes = [0.0, 1.0, 59.0, 61.0, 90.0, 600.0, 3600.0, 7200.0, 86400.0, 30 * 86400.0, 1e9]
    buckets = [q.bucket(s) for s in runtimes]
    assert buckets == sorted(buckets)
    values = [q.class_for(s).value for s in runtimes]
    assert values == sorted(values, reverse=True)
    assert values[0] == QUEUE_PRIORITY_BASE + q.buckets - 1 and values[-1] == QUEUE_PRIORITY_BASE
    fine = [QueueOrder(per_doubling=4).bucket(s) for s in sorted(runtimes + [100.0, 101.0, 5000.0])]
    assert fine == sorted(fine)


def test_classes_are_unique_contiguous_and_describe_their_range():
    q = QueueOrder(base=5000)
    classes = q.classes()
    assert [c.bucket for c in classes] == list(range(q.buckets))
    assert len({c.name for c in classes}) == q.buckets
    assert [c.value for c in classes] == list(range(5000 + q.buckets - 1, 4999, -1))
    assert classes[0].name == f"{QUEUE_CLASS_PREFIX}000" and classes[-1].name == f"{QUEUE_CLASS_PREFIX}032"
    for prev, cur in pairwise(classes):
        assert cur.lower_seconds == pytest.approx(prev.upper_seconds)
    assert "up to 1 min" in classes[0].description and "never preempts" in classes[0].description
    assert "above" in classes[-1].description and "up to" not in classes[-1].description
    c = q.class_for(100.0)
    assert c.lower_seconds < 100.0 <= c.upper_seconds


@pytest.mark.parametrize("bad", [-1.0, math.nan, "60", None, True])
def test_bad_runtime_names_the_field(bad):
    with pytest.raises(QueueOrderError) as err:
        QueueOrder().bucket(bad)
    assert err.value.field == "predictedRuntimeSeconds"


@pytest.mark.parametrize("kwargs, field", [
    ({"base": MAX_USER_PRIORITY}, "queuePriority.base"),  # the band's top would be above the user range
    ({"base": -2**31 - 1}, "queuePriority.base"),
    ({"base": 1.5}, "queuePriority.base"),
    ({"prefix": "system-runtime-"}, "queuePriority.prefix"),
    ({"prefix": "Upper-"}, "queuePriority.prefix"),
    ({"prefix": ""}, "queuePriority.prefix"),
    ({"prefix": "x" * 61}, "queuePriority.prefix"),
    ({"per_doubling": 0}, "queuePriority.perDoubling"),
    ({"per_doubling": 9}, "queuePriority.perDoubling"),
])
def test_bad_configuration_names_the_field(kwargs, field):
    with pytest.raises(QueueOrderError) as err:
        QueueOrder(**kwargs)
    assert err.value.field == field


def test_retry_class_sits_just_above_the_band_and_may_reach_the_user_maximum():
    q = QueueOrder(base=MAX_USER_PRIORITY - 33)
    assert q.retry_value == MAX_USER_PRIORITY == q.classes()[0].value + 1
    assert q.retry_name == "gnnsched-runtime-retry" and q.retry_name not in {c.name for c in q.classes()}
    with pytest.raises(QueueOrderError):
        q.value(33)
    with pytest.raises(QueueOrderError) as err:  # one more and the retry class would leave the user range
        QueueOrder(base=MAX_USER_PRIORITY - 32)
    assert err.value.field == "queuePriority.base"


# ------------------------------------------------------------------------------------------------ simulator
def _job(i: int, solo: float, arrival: float, cpu: int) -> SimJob:
    peak = int(CAP * 0.05)
    prof = JobProfile(admit_bytes=int(peak * 1.1), peak_bytes=peak, solo_s=solo, predicted_s=solo, sm_util=0.3,
                      mem_util=0.2, intensity="memory")
    return SimJob(id=i, name=f"j{i}", arrival=arrival, mode="train", cpu_milli=cpu, memory_bytes=4 * GiB,
                  profiles={V100: prof})


def _start_order(policy: str) -> list[str]:
    # One node with 8 cores: a blocker holds all of them, then four jobs that each need all of them queue up and run
    # one at a time, so the order they start in is the order the scheduler's queue tried them.
    cluster = uniform_cluster(1, 4, V100, cpu_milli=8000)
    jobs = [
        _job(0, 100.0, 0.0, 8000),     # blocker
        _job(1, 5000.0, 1.0, 8000),    # bucket 13 (60*2**6 < 5000 <= 60*2**6.5)
        _job(2, 4700.0, 2.0, 8000),    # bucket 13 too, shorter but later: FIFO within the bucket
        _job(3, 70.0, 3.0, 8000),      # bucket 1: first
        _job(4, 2500.0, 4.0, 8000),    # bucket 11
    ]
    sim = Simulation(jobs, cluster, parse_policy(policy), Integrations(), startup_s=0.0)
    result = sim.run()
    started = sorted((o for o in result.outcomes if o.job.id), key=lambda o: o.first_start)
    return [o.job.name for o in started]


def test_sjf_orders_pending_pods_like_prioritysort_over_the_queue_classes():
    q = QueueOrder()
    assert [q.bucket(s) for s in (5000.0, 4700.0, 70.0, 2500.0)] == [13, 13, 1, 11]
    # kube-scheduler's PrioritySort: class value descending, then enqueue (arrival) order
    assert _start_order("lmcf+sjf") == ["j3", "j4", "j1", "j2"]
    # 8 buckets per doubling split 4700 (bucket 51) from 5000 (bucket 52): the shorter goes first
    q8 = QueueOrder(per_doubling=8)
    assert (q8.bucket(4700.0), q8.bucket(5000.0)) == (51, 52)
    assert _start_order("lmcf+sjf8") == ["j3", "j4", "j2", "j1"]
    # without +sjf the queue is FIFO
    assert _start_order("lmcf") == ["j1", "j2", "j3", "j4"]


def test_sjf_policy_names():
    assert parse_policy("lmcf+scaling+sjf").sjf == 2
    assert parse_policy("bqt+sjf8@4").sjf == 8 and parse_policy("bqt+sjf8@4").max_clients == 4
    assert parse_policy("lmcf").sjf == 0
    for bad in ("srtf+sjf", "exclusive+sjf", "lmcf+sjf0", "lmcf+sjf9"):
        with pytest.raises(PolicyError):
            parse_policy(bad)


# ------------------------------------------------------------------------------------------------ spec and CLI
def test_spec_priority_class_name_is_a_kubernetes_name():
    from gnnsched.spec import SpecError, parse_spec

    base = {"mode": "train", "model": {"arch": "gcn", "layers": 2, "hidden": 16}, "graph": {"dataset": "cora"}}
    assert parse_spec({**base, "priorityClassName": "team-a.batch"}).priority_class_name == "team-a.batch"
    assert parse_spec(base).priority_class_name is None
    for bad in ("Team_A", "", "-x", "x" * 254):
        with pytest.raises(SpecError) as err:
            parse_spec({**base, "priorityClassName": bad})
        assert "priorityClassName" in str(err.value)


@pytest.mark.parametrize("args, flag", [
    (("--queue-priority-base", "999999990"), "--queue-priority-base"),
    (("--queue-priority-prefix", "system-q-"), "--queue-priority-prefix"),
    (("--queue-priority-per-doubling", "0"), "--queue-priority-per-doubling"),
])
def test_operator_cli_rejects_a_bad_queue_flag_in_one_line(args, flag):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "gnnsched.cli", "operator", "--queue-priority", *args],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0], proc.stderr
