"""Calibration one namespace cannot move for another (issue 39, finding 4), and the samples it records.

Covered: a namespace that forges 5, 50 or 500 samples (exact ratios at the cap, memory-exceeded lower bounds far
above it, ratios at the floor) moves another namespace's memory and runtime factor by at most 5 %, whether that
namespace has no samples, too few or enough of its own (``bench/calibration_isolation.py`` prints the figure);
under the old single cluster table the same forgery moved it to the cap; a single honest namespace calibrates as
before; the peak and runtime the operator records are the node agent's and the kubelet's, never the container's
own termination message."""

from __future__ import annotations

import json

from bench_modules import load

from gnnsched.closed_loop import (
    DEFAULT_CALIBRATION,
    DEFAULT_RUNTIME_CALIBRATION,
    CalibrationClass,
    CalibrationTable,
)
from gnnsched.contract import ANN_ADMITTED_AT, ANN_FINISHED_AT, ANN_OBSERVED_PEAK_BYTES, ANN_STARTED_AT
from gnnsched.operator.status import measured_peak, measured_runtime
from gnnsched.trust.tenant_calibration import PRIOR_BAND, prior_band, tenant_table

CLS = CalibrationClass(gpu_model="A100-40GB", arch="gcn", mode="train")


def _forged(n: int, exceeded: bool) -> CalibrationTable:
    t = CalibrationTable()
    for _ in range(n):
        t = t.record(CLS, 100.0 if exceeded else 2.0, exceeded=exceeded)
    return t


def test_forged_samples_move_another_namespace_by_at_most_five_percent() -> None:
    bench = load("calibration_isolation")
    for policy in (DEFAULT_CALIBRATION, DEFAULT_RUNTIME_CALIBRATION):
        worst, lines = bench.worst_move(policy)
        assert len(lines) == 4 * 3 * 4  # victims x (5, 50, 500) x forgeries
        assert worst <= PRIOR_BAND - 1 + 1e-9, "\n".join(lines)
        low, high = prior_band(policy)
        assert high / low <= PRIOR_BAND + 1e-12


def test_the_old_cluster_table_let_five_forged_attempts_set_the_cap() -> None:
    """The finding as it was: one table for the cluster, five forged attempts (or two forged lower bounds against
    twenty honest samples) set the class's factor to the 2.0 cap for everyone; per namespace, the victim keeps its
    own factor and a newcomer gets at most the prior's 5 %."""
    honest = CalibrationTable()
    for r in [1.02, 1.05, 1.08, 1.1, 1.04] * 4:
        honest = honest.record(CLS, r)
    shared = honest
    for r in _forged(2, exceeded=True).exceeded[CLS.key()]:
        shared = shared.record(CLS, r, exceeded=True)
    assert shared.factor(CLS).factor == DEFAULT_CALIBRATION.cap  # old: everyone's factor at the cap
    own = tenant_table({"victim": honest, "forger": _forged(2, exceeded=True)}, "victim").factor(CLS)
    assert own.factor == honest.factor(CLS).factor and own.source == "class"
    for n in (5, 50, 500):
        newcomer = tenant_table({"newcomer": CalibrationTable(), "forger": _forged(n, exceeded=False)}, "newcomer")
        got = newcomer.factor(CLS)
        assert got.source == "prior" and got.factor <= DEFAULT_CALIBRATION.static_factor * PRIOR_BAND


def test_a_single_honest_namespace_calibrates_as_before() -> None:
    t = CalibrationTable()
    for r in [1.3, 1.25, 1.28, 1.31, 1.27]:
        t = t.record(CLS, r)
    assert tenant_table({"team": t}, "team").factor(CLS) == t.factor(CLS)
    assert tenant_table({"team": t}, "team").factor(CLS, DEFAULT_RUNTIME_CALIBRATION) == \
        t.factor(CLS, DEFAULT_RUNTIME_CALIBRATION)


def test_a_forged_termination_message_peak_is_not_recorded() -> None:
    """Finding 4: the peak came from the container's own termination message when the agent had measured none, and
    the runtime from its result line. The operator records only the agent's NVML peak and the agent's (or the
    kubelet's) times."""
    line = json.dumps({"outcome": "succeeded", "observed_peak_bytes": 10**13, "runtimeSeconds": 0.001})
    status = {"containerStatuses": [{"name": "gnn", "state": {"terminated": {"exitCode": 0, "message": line}}}]}
    forged = {"metadata": {"name": "p", "annotations": {}}, "status": status}
    assert measured_peak(forged) is None and measured_runtime(forged) is None
    measured = {"metadata": {"name": "p", "annotations": {
        ANN_OBSERVED_PEAK_BYTES: str(3 * 2**30), ANN_ADMITTED_AT: "2026-01-01T10:00:00Z",
        ANN_STARTED_AT: "2026-01-01T10:00:02Z", ANN_FINISHED_AT: "2026-01-01T10:01:02Z"}}, "status": status}
    assert measured_peak(measured) == 3 * 2**30 and measured_runtime(measured) == 60.0
