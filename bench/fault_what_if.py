"""Where issue 27's mean-JCT target (within 1.2x of the fault-free run) is out of reach, and how far: the Done-when
runs of ``bench/closed_loop.py``, each again with rules the system does not have, up to a clairvoyant scheduler.

Each variant runs the same jobs, seeds, hardware faults and estimate errors as the Done-when run
(``--estimate-error lognormal:0.2 --hw-fault-rate 1 --buggy-jobs 0.05``, 1 x 4 V100-32GB), and its mean JCT is
divided by the same fault-free run's, over the jobs both completed that are not buggy (``common_ratio`` of
``bench/closed_loop.py``, less the buggy jobs, which every variant fails or drops). "no retries alone" and "first,
retried" split the gain of "first fault" in two; the others each keep the rule of the one before:

``as built``
    the system's rules: the Done-when figure.
``victims resume``
    every innocent attempt a fault kills resumes where it stopped, as if it had checkpointed the instant before it
    died (no lost work). No gnnsched component checkpoints; this bounds what checkpointing could buy.
``no retries alone``
    victims resume, and a buggy job that the system's rule sends to run alone (after its second fault) fails there
    instead of spending its ``backoffLimit`` on attempts alone.
``first, retried``
    victims resume, and a buggy job's first fault names it (below), but it is still retried alone, charged, until its
    ``backoffLimit`` is used.
``first fault``
    victims resume, and a buggy job's first fault names it: its neighbours are requeued uncharged and never
    suspected, and it fails there. Every rule pays that first fault, since nothing tells a buggy job apart before it
    faults (on the H100 every client of a faulted MPS server got the same error, docs/gpu-measurements.md); this
    bounds any rule that needs more faults to find the culprit, the system's included (it needs two, then runs the
    job alone for its ``backoffLimit``).
``buggy known``
    victims resume, and a clairvoyant knows which jobs are buggy and fails each as it arrives: it never runs, so it
    never kills a neighbour, never needs a GPU alone, never drains one. No scheduler can know this before a job's
    first fault; this bounds what any rule for buggy jobs could buy.
``capacity only``
    buggy known, and no estimate error: all that is left is the GPUs a hardware repair keeps out of the pool
    (``--hw-repair-seconds``, 600 s by the issue).

The variants change the engine by subclassing :class:`~gnnsched.simulator.engine.Simulation` here: each class below
overrides one rule, so the figures differ from the system's by that rule alone.

    python bench/fault_what_if.py [--workloads "cognn-mix;gnnsched-mix-high;BURST"] [--seeds 0,...,9]
        [--hw-repair-seconds 600]

It prints one line per workload, seed and variant (the ratio of each gnnsched policy), then per variant the cells
above 1.2 and the largest ratio.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import Any

from gnnsched.simulator.adapters import Integrations
from gnnsched.simulator.cli import default_data_dir, fits_on
from gnnsched.simulator.cluster import parse_cluster
from gnnsched.simulator.engine import GpuState, Run, RunResult, Simulation
from gnnsched.simulator.faults import (
    DEFAULT_REPAIR_S,
    NO_ERROR,
    buggy_points,
    parse_estimate_error,
    parse_faults,
)
from gnnsched.simulator.metrics import completed_jcts
from gnnsched.simulator.model import SimJob
from gnnsched.simulator.policyspec import parse_policies
from gnnsched.simulator.runner import materialise, run
from gnnsched.simulator.workloads import resolve_workload

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from closed_loop import BURST, CLUSTER  # noqa: E402  (bench/ is not a package)
from robustness import chart_default_policy  # noqa: E402

TARGET = 1.2
GNNSCHED = ("base", "lmcf", "bmc", "sqtf", "bqt", chart_default_policy())


class VictimsResume(Simulation):
    """An innocent attempt that a fault or a resize ends keeps the GPU work it had done: its next attempt runs only
    the rest (start-up is paid again). A buggy job's attempts gain nothing: they fault at the same point anyway."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.done_s: dict[int, float] = {}

    def _end_attempt(self, run: Run) -> None:
        buggy = self.loop is not None and run.job.id in self.loop.buggy
        if not buggy and not run.starting:
            left = run.remaining - run.rate * (self.now - run.last)  # ``remaining`` is brought up to date lazily
            # ``work`` is this attempt's (what the earlier ones left): the job's done work grows by what it ran
            self.done_s[run.job.id] = self.done_s.get(run.job.id, 0.0) + max(0.0, run.work - max(0.0, left))
        super()._end_attempt(run)

    def _start(self, job: SimJob, gpu: GpuState, rerate: bool = True) -> bool:
        started = super()._start(job, gpu, rerate=False)
        done = self.done_s.get(job.id, 0.0)
        if started and done > 0.0:
            run = gpu.running[-1]  # the attempt just started
            run.remaining = run.work = max(1e-3, run.work - done)
        if started and rerate:
            self._rerate(gpu)
        return started


class NoRetriesAlone(VictimsResume):
    """Victims resume, and a buggy job that the system's rule sends to run alone fails there instead of spending its
    ``backoffLimit`` on attempts alone: what those attempts cost the queue."""

    def _next_attempt(self, job: SimJob, ahead: bool) -> None:
        if self.loop is not None and job.id in self.loop.alone and job.id in self.loop.buggy:
            self._give_up(job, "NoRetriesAlone")
            return
        super()._next_attempt(job, ahead)


class CulpritAtFirstFault(VictimsResume):
    """Victims resume, and a buggy job's first fault names it: its neighbours are requeued uncharged (ahead, as
    victims are) and never suspected, and the job fails there. Every rule must pay that first fault (no scheduler
    knows a job is buggy before it faults); this bounds any rule that needs more faults to find the culprit.
    ``retry_alone``: the job is not failed at once but retried alone, charged, until its ``backoffLimit`` is used."""

    retry_alone = False

    def _kill_group(self, gpu: GpuState, xid: int, culprit: int | None, until: float) -> None:
        if culprit is None:  # a hardware fault: the system's rule (every client requeued uncharged)
            super()._kill_group(gpu, xid, culprit, until)
            return
        assert self.loop is not None  # buggy jobs exist only in a closed-loop run
        runs = self._end_group(gpu, culprit, until)  # the system's end of the group and drain; only charges differ
        for r in runs:
            if r.job.id != culprit:
                self._next_attempt(r.job, ahead=True)
            elif not self.retry_alone:
                self._give_up(r.job, "CulpritAtFirstFault")
            else:
                self.loop.alone.add(culprit)
                charged = self.loop.charged[culprit] = self.loop.charged.get(culprit, 0) + 1
                if charged > r.job.backoff_limit:
                    self._give_up(r.job, "CulpritAtFirstFault: charged, backoffLimit used")
                else:
                    self._next_attempt(r.job, ahead=False)


class CulpritAtFirstFaultRetried(CulpritAtFirstFault):
    """:class:`CulpritAtFirstFault`, the culprit then retried alone within its ``backoffLimit``."""

    retry_alone = True


class BuggyKnown(VictimsResume):
    """A clairvoyant that fails every buggy job as it arrives: it never runs, so it costs its neighbours nothing."""

    def _arrive(self, job: SimJob) -> None:
        if self.loop is not None and job.id in self.loop.buggy:
            self.outcomes[job.id].status = "pending"
            self._give_up(job, "BuggyKnown")
            return
        super()._arrive(job)


@dataclass(frozen=True)
class Variant:
    name: str
    engine: type[Simulation]
    estimate_error: bool


VARIANTS = (
    Variant("as built", Simulation, True),
    Variant("victims resume", VictimsResume, True),
    Variant("no retries alone", NoRetriesAlone, True),
    Variant("first, retried", CulpritAtFirstFaultRetried, True),
    Variant("first fault", CulpritAtFirstFault, True),
    Variant("buggy known", BuggyKnown, True),
    Variant("capacity only", BuggyKnown, False),
)


def ratio_without(plain: RunResult, loop: RunResult, skip: set[int]) -> float:
    """Mean JCT of ``loop`` / ``plain`` over the jobs both completed, less ``skip``."""
    a, b = completed_jcts(loop), completed_jcts(plain)
    both = (a.keys() & b.keys()) - skip
    den = sum(b[i] for i in both)
    return sum(a[i] for i in both) / den if den else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default=f"cognn-mix;gnnsched-mix-high;{BURST}", help="separated by ;")
    ap.add_argument("--seeds", default="0,1,2,3,4,5,6,7,8,9")
    ap.add_argument("--hw-repair-seconds", type=float, default=DEFAULT_REPAIR_S)
    args = ap.parse_args()
    ix = Integrations()
    data = default_data_dir()
    cl = parse_cluster(CLUSTER, data)
    noisy = parse_estimate_error("lognormal:0.2")
    faults = parse_faults(1.0, args.hw_repair_seconds, 0.05)
    policies = parse_policies(",".join(GNNSCHED))
    print(f"cluster {CLUSTER}; --estimate-error lognormal:0.2 --hw-fault-rate 1 --hw-repair-seconds "
          f"{faults.hw_repair_s:g} --buggy-jobs 0.05; mean JCT / the fault-free run's, buggy jobs left out")
    print(f"{'workload':18s} {'seed':>4s} {'variant':16s} " + " ".join(f"{p[:10]:>10s}" for p in GNNSCHED))
    worst: dict[str, tuple[float, str]] = {v.name: (0.0, "") for v in VARIANTS}
    over: dict[str, int] = {v.name: 0 for v in VARIANTS}
    cells = 0
    for name in args.workloads.split(";"):
        short = name if len(name) <= 18 else "burst"
        for seed in (int(s) for s in args.seeds.split(",")):
            wl = resolve_workload(name, seed, data, fits=fits_on(cl, ix))
            jobs = materialise(wl, cl, ix, scaling=False)
            buggy = set(buggy_points(jobs, faults.buggy_fraction, seed))
            plain = run(wl, cl, policies, seed, ix, jobs=jobs, record_timeline=False)
            cells += len(GNNSCHED)
            for v in VARIANTS:
                loop = run(wl, cl, policies, seed, ix, jobs=jobs, record_timeline=False, faults=faults,
                           estimate_error=noisy if v.estimate_error else NO_ERROR, engine=v.engine)
                ratios = [ratio_without(plain.results[p.text], loop.results[p.text], buggy) for p in policies]
                for p, r in zip(GNNSCHED, ratios, strict=True):
                    over[v.name] += r > TARGET
                    worst[v.name] = max(worst[v.name], (r, f"{short} seed {seed} {p}"))
                print(f"{short:18s} {seed:4d} {v.name:16s} " + " ".join(f"{r:10.2f}" for r in ratios), flush=True)
    print()
    for v in VARIANTS:
        r, where = worst[v.name]
        print(f"{v.name:16s} cells above {TARGET}: {over[v.name]} of {cells}; largest {r:.2f} ({where})")


if __name__ == "__main__":
    main()
