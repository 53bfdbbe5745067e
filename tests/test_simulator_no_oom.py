"""The simulator's headline guarantee, checked on every built-in workload: no gnnsched policy ever OOM-kills a job.

Each workload runs under its own policy list (the baselines and gnnsched's policies it ships with) plus gnnsched's
variants that change what the gate sees (scaled requests, the strict prefix, no interference term, packing,
shortest-first), on the cluster it names and on the A100 for the CoGNN queues, as the paper ran them. The baselines
are run beside them so the guarantee is not vacuous: on GNNSched's high-load queues naive MPS must OOM-kill jobs.
"""

from __future__ import annotations

import pytest
from shared_data import DATA

from gnnsched.simulator.adapters import Integrations
from gnnsched.simulator.cli import fits_on
from gnnsched.simulator.cluster import parse_cluster
from gnnsched.simulator.policyspec import parse_policies, parse_policy
from gnnsched.simulator.runner import run
from gnnsched.simulator.workloads import BUILTIN, builtin_workload, default_cluster

VARIANTS = ("base", "lmcf", "bmc", "sqtf", "bqt", "bqt+scaling", "sqtf+bypass0", "bmc-interference",
            "lmcf+scaling+sjf+pack", "sqtf+sjf2+bypass4+spread", "sqtf+spread+pays")
#: Workloads where naive MPS oversubscribes the GPU (GNNSched's high-load queues, seed 0: 14, 24 and 35 OOM kills).
OVERFLOWING = ("gnnsched-gcn-high", "gnnsched-sage-high", "gnnsched-gin-high")
CASES = [(name, default_cluster(name)) for name in BUILTIN if name != "openb"] + \
    [(f"cognn-{q}", "a100") for q in ("gcn", "mix")]


@pytest.fixture(scope="module")
def ix() -> Integrations:
    return Integrations()


@pytest.mark.parametrize(("workload", "cluster"), CASES, ids=[f"{w}@{c}" for w, c in CASES])
def test_no_gnnsched_policy_oom_kills(workload: str, cluster: str, ix: Integrations):
    if workload == "resource-demand" and not (DATA / "traces" / "openb_pod_list_default.csv").exists():
        pytest.skip("shared openb trace not available")
    cl = parse_cluster(cluster, DATA)
    wl = builtin_workload(workload, 0, DATA, fits=fits_on(cl, ix))
    names = list(dict.fromkeys([*wl.policies, *VARIANTS]))
    report = run(wl, cl, parse_policies(",".join(names)), 0, ix, record_timeline=False)
    ours = [n for n in names if parse_policy(n).is_ours]
    assert len(ours) >= len(VARIANTS)
    for name in ours:
        m = report.policies[name]
        assert m["oom_kills"] == 0, (workload, name)
        assert m["failed"] == 0, (workload, name)
        assert m["deployed"] > 0, (workload, name)
        if workload != "resource-demand":  # no horizon: everything that arrives and fits a GPU must finish
            refused = [o for o in report.results[name].outcomes if o.status == "unschedulable"]
            # a job whose admit bytes exceed every GPU (after the node reserve) is refused up front, never lost midway
            assert all(o.reason.startswith("PredictedPeakExceedsGPU") for o in refused), (workload, name)
            assert m["completed"] + len(refused) == m["arrived"], (workload, name)
        for group in report.results[name].groups:
            assert group.committed <= group.capacity, (workload, name)
    if workload in OVERFLOWING:  # the same jobs do overflow a GPU when nothing guards it
        assert sum(m["oom_kills"] for n, m in report.policies.items() if parse_policy(n).base == "mps-naive") > 0
