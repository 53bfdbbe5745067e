"""Probation (``gnnsched.attempts.probation``): the core rule, and what it changes in a faulted run of the simulator.

The gate's side (an attempt held alone on an idle GPU until its report passes its step) is in tests/test_gate.py, the
operator's (the step written on the next attempt, in the job's own PriorityClass) in tests/test_operator_queue.py.
"""

from __future__ import annotations

from typing import Any

from gnnsched.attempts import probation as prob
from gnnsched.policies import Task
from gnnsched.simulator.adapters import Integrations
from gnnsched.simulator.cli import default_data_dir, fits_on
from gnnsched.simulator.cluster import parse_cluster
from gnnsched.simulator.engine import Simulation
from gnnsched.simulator.faults import APP_FAULT_XID, buggy_points, parse_estimate_error, parse_faults
from gnnsched.simulator.policyspec import parse_policies
from gnnsched.simulator.runner import materialise, run
from gnnsched.simulator.workloads import resolve_workload


def test_an_undecided_fault_with_a_known_step_starts_probation_and_passing_it_ends_it() -> None:
    assert prob.probation_step(True, 37, False, None) == 37
    assert prob.probation_step(True, 12, False, 37) == 37  # the larger step: both faults' culprits must pass
    assert prob.probation_step(True, None, False, 5) == 5  # a container that reports no step: nothing to pass
    assert prob.probation_step(True, 37, True, None) is None  # runs alone for good anyway
    assert prob.probation_step(False, 37, False, None) is None  # a hardware fault, a victim of 810, a charge
    assert prob.probation_step(False, 37, False, 37) == 37 and prob.probation_step(False, 38, False, 37) is None
    assert prob.probation_step(True, 50, False, 37) == 50  # passed 37, undecided again further on
    assert prob.on_probation(37, None) and prob.on_probation(37, 37) and not prob.on_probation(37, 38)
    assert not prob.on_probation(None, None)
    assert prob.passed(37, 38) and not prob.passed(37, 37) and not prob.passed(None, 99) and not prob.passed(37, None)
    assert prob.choice(True) == "alone" and prob.choice(False) == "share"
    tasks = [Task(key="a", bytes=1, seq=1), Task(key="b", bytes=2, seq=2)]
    assert prob.planned_tasks(tasks, {"b"}, True, 99) == ([tasks[0], Task(key="b", bytes=99, seq=2)], {"b"})
    assert prob.planned_tasks(tasks, {"b"}, False, 99) == (tasks, set())  # no GPU idle: it shares


def test_a_suspects_probation_is_planned_alone_whether_or_not_a_gpu_is_idle() -> None:
    """A suspect's fault is certainly its own: its retry waits for a GPU of its own (planned at the whole GPU's
    bytes, so the bounded bypass bounds its wait) instead of sharing, where an undecided attempt shares."""
    assert prob.choice(False, suspect=True) == "alone" and prob.choice(True, suspect=True) == "alone"
    tasks = [Task(key="a", bytes=1, seq=1), Task(key="b", bytes=2, seq=2), Task(key="c", bytes=3, seq=3)]
    planned, alone = prob.planned_tasks(tasks, {"b", "c"}, False, 99, suspects={"c"})
    assert alone == {"c"} and planned == [tasks[0], tasks[1], Task(key="c", bytes=99, seq=3)]
    planned, alone = prob.planned_tasks(tasks, {"b", "c"}, True, 99, suspects={"c"})
    assert alone == {"b", "c"} and [t.bytes for t in planned] == [1, 99, 99]
    assert prob.planned_tasks(tasks, set(), False, 99, suspects={"c"}) == (tasks, set())  # not on probation
    # the suspect's own fault starts it, as an undecided one does; the fault that sets the step decides the kind
    assert prob.after_fault(True, 12, False, None, False, suspect=True) == (12, True)
    assert prob.after_fault(False, 5, False, 12, True, suspect=False) == (12, True)  # a hardware fault: it stands
    assert prob.after_fault(True, 20, False, 12, True, suspect=False) == (20, False)  # passed 12, undecided at 20
    assert prob.after_fault(True, 20, True, None, False, suspect=True) == (None, False)  # runs alone for good
    assert prob.after_fault(False, 30, False, 20, True, suspect=False) == (None, False)  # passed: over


class _Faults(Simulation):
    """Records each application fault's clients (job ids)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.app_faults: list[list[int]] = []

    def _kill_group(self, gpu: Any, xid: int, culprit: int | None, until: float) -> None:
        if xid == APP_FAULT_XID:
            self.app_faults.append([r.job.id for r in gpu.running])
        super()._kill_group(gpu, xid, culprit, until)


class _WithoutProbation(_Faults):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        assert self.loop is not None
        self.loop.probation_rule = False


def test_a_culprits_second_fault_is_alone_and_fails_it() -> None:
    """cognn-mix seed 6 on 1 x 4 V100 under sqtf (issue 38's cell: one buggy job, whose first fault kills a neighbour
    too), checkpointing every 10 s. With probation the buggy job faults twice, the second time alone (a GPU was idle
    when it came back, and the gate booked all of it), and fails there (RepeatedFault); before probation its second
    fault killed a new neighbour and only its third, alone, failed it. (Where no GPU is idle, as under bmc in this
    cell, the attempt shares as before probation, and its second fault is shared.)"""
    engines: dict[str, Any] = {}

    def capture(cls: type[_Faults]) -> type[_Faults]:
        class Captured(cls):  # type: ignore[valid-type,misc]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                engines[cls.__name__] = self
        return Captured

    ix = Integrations()
    data = default_data_dir()
    cl = parse_cluster("1x4xV100-32GB", data)
    wl = resolve_workload("cognn-mix", 6, data, fits=fits_on(cl, ix))
    jobs = materialise(wl, cl, ix, scaling=False)
    buggy = set(buggy_points(jobs, 0.05, 6))
    faults = parse_faults(1.0, 600.0, 0.05, 10.0, 0.06)
    kw: dict[str, Any] = {"jobs": jobs, "record_timeline": False, "faults": faults,
                          "estimate_error": parse_estimate_error("lognormal:0.2")}
    policy = "sqtf"
    policies = parse_policies(policy)
    with_p = run(wl, cl, policies, 6, ix, engine=capture(_Faults), **kw).results[policy]
    without = run(wl, cl, policies, 6, ix, engine=capture(_WithoutProbation), **kw).results[policy]
    now, before = engines["_Faults"].app_faults, engines["_WithoutProbation"].app_faults
    assert len(buggy) == 1 and all(buggy <= set(fault) for fault in now + before)
    assert len(now) == 2 and len(now[0]) >= 2 and len(now[1]) == 1  # shared, then alone
    assert len(before) == 3 and len(before[1]) >= 2 and len(before[2]) == 1  # shared, shared, alone
    for result in (with_p, without):
        culprit = next(o for o in result.outcomes if o.job.id in buggy)
        assert culprit.status == "failed" and culprit.reason.startswith("RepeatedFault")
        assert result.extra["jobs_lost"] == 0
    assert with_p.extra["probation_alone"] >= 1  # the culprit's second attempt: the gate booked it the whole GPU
    assert without.extra["probation_alone"] == 0
