"""The co-location loop in the simulator: the slowdowns a cluster learns from progress reports, replayed.

In a cluster the node agent sees each pod's seconds per step from its progress reports and knows whom it ran beside;
the observed slowdown goes into :class:`gnnsched.colocation.learned.SlowdownBook` per GPU model and class pair, and
the gate's share rule decides with the learned value (issue 37 item 2). Here the engine calls :meth:`ColocLoop.rerated`
whenever a GPU's set of running jobs changes: a job that ran in one group for at least a report interval (the worker
reports at most every :data:`gnnsched.progress.REPORT_INTERVAL_S`) gives one sample, its true slowdown there as
progress measures it: step time in the group over its step time alone where it has run alone, else over its
calibrated solo prediction (so a mispredicted runtime shows up in the sample, as in the cluster:
:func:`~gnnsched.colocation.learned.observed_slowdown`). The prior is the interference model's slowdown of the
classes the gate knows (the pod's intensity), so the factor also absorbs what the gate cannot see (the mode).
On with ``+progress`` (the reports are its input); the share rule (``+pays``) reads :meth:`slowdown_fn`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gnnsched.colocation.interference import SlowdownModel
from gnnsched.colocation.learned import FactorBook, SlowdownBook, SlowdownFn, factor_book, observed_slowdown
from gnnsched.progress import REPORT_INTERVAL_S


@dataclass
class ColocLoop:
    """One run's learned slowdowns and the segment each running job is in."""

    model: SlowdownModel
    report_interval_s: float = REPORT_INTERVAL_S
    book: SlowdownBook = field(default_factory=SlowdownBook)
    # job id -> (since, true slowdown, its class, co-runner classes, GPU model) of the group it runs in now
    segments: dict[int, tuple[float, float, str | None, tuple[str | None, ...], str]] = field(default_factory=dict)
    alone: set[int] = field(default_factory=set)  # jobs whose progress measured them alone (their solo pace)
    samples: int = 0
    _fns: dict[str, SlowdownFn] = field(default_factory=dict)
    _factors: FactorBook | None = None

    def rerated(self, runs: list[Any], slowdowns: list[float], gpu_model: str, now: float) -> None:
        """The GPU's running jobs (past start-up) now run at ``slowdowns``: close each job's last segment (a sample
        when it lasted a report interval beside co-runners) and open the new one."""
        classes = [r.intensity for r in runs]
        for i, (r, s) in enumerate(zip(runs, slowdowns, strict=True)):
            jid = r.job.id
            seg = self.segments.get(jid)
            others = tuple(classes[:i] + classes[i + 1:])
            if seg is not None:
                self._close(r, seg, now)
            self.segments[jid] = (now, s, r.intensity, others, gpu_model)

    def ended(self, run: Any, now: float) -> None:
        """The job's attempt ended (completed or killed): its last segment closes."""
        seg = self.segments.pop(run.job.id, None)
        if seg is not None:
            self._close(run, seg, now)

    def _close(self, run: Any, seg: tuple[float, float, str | None, tuple[str | None, ...], str], now: float
               ) -> None:
        since, s, cls, others, gpu_model = seg
        if now - since < self.report_interval_s:
            return
        if not others:
            self.alone.add(run.job.id)
            return
        prof = run.job.profile(gpu_model)
        # what progress measures: true step time in the group (solo x s) over the solo pace it saw, or over the
        # calibrated prediction (prof.predicted_s is the attempt's, runtime factor included)
        solo = prof.solo_s if run.job.id in self.alone else None
        observed = observed_slowdown(prof.solo_s * s, solo, prof.predicted_s)
        if observed is None:
            return
        prior = self.model.slowdown(self.model.profile_for(cls), [self.model.profile_for(o) for o in others])
        self.book = self.book.record(gpu_model, cls, others, observed, prior)
        self._fns.clear()
        self._factors = None
        self.samples += 1

    def slowdown_fn(self, gpu_model: str) -> SlowdownFn:
        """The learned slowdowns on ``gpu_model``, as the share rule asks (cached until the next sample)."""
        fn = self._fns.get(gpu_model)
        if fn is None:
            fn = self._fns[gpu_model] = self.book.slowdown_fn(gpu_model, self.model)
        return fn

    def factors(self) -> FactorBook:
        """The learned factors as the extender reads them from the GPUNode status (``factor_book`` of the published
        entries), cached until the next sample."""
        if self._factors is None:
            self._factors = factor_book(self.book.entries(self.model))
        return self._factors

    def summary(self) -> dict:
        return {"slowdown_samples": self.samples, "learned_slowdowns": self.book.learned(self.model)}
