"""A running job's seconds left: measured from the steps it reports, else predicted.

Why: every load-aware rule at the gate (the spread rule's "least work left", :func:`gnnsched.policies.share_pays`
and with it QoS admission) and the extender's view of a GPU (``GPUJob.predicted_remaining_seconds``) read how long the
clients already running there still need. From the prediction alone that is the predicted runtime minus the time
since the start, which is as wrong as the prediction: a job predicted 60 s that really needs 300 s looks finished
after a minute and keeps attracting work to its GPU. A job that reports its steps (the built-in worker does, through
its gate connection, ``node_agent.protocol.ProgressReport``) shows its real pace after a few of them: seconds per step
so far × steps left, which includes whatever slowdown its neighbours cause. A container that reports nothing keeps the
(calibrated) prediction.

:func:`seconds_left` is the one estimator: the node agent's books, the status it publishes and the simulator all call
it, so the simulator measures the rule the agent runs.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gnnsched.contract import ENV_PROGRESS_FD

MIN_PROGRESS_STEPS = 3
"""Steps a job must have reported before its measured pace replaces its prediction: the first step carries one-off
work (the optimiser's state, the allocator's first segments, lazy initialisation), so one or two steps overstate the
pace of the rest."""

REPORT_INTERVAL_S = 5.0
"""The most often a worker reports its progress (and the most often the gate client forwards it): a job of 100,000
short steps sends a line every five seconds, not one per step. The node agent decides every few seconds anyway."""


@dataclass(frozen=True, slots=True)
class StepProgress:
    """What a running job last reported: ``steps`` done of ``total``, in ``seconds`` of step time (from its first step
    to the report), received at ``at`` (the receiver's clock: the agent's wall clock, the simulator's time)."""

    steps: int
    total: int
    seconds: float
    at: float

    def usable(self, min_steps: int = MIN_PROGRESS_STEPS) -> bool:
        """Whether the pace can be measured: enough steps, a known total and a positive, finite time."""
        return (self.total > 0 and min_steps <= self.steps <= self.total and self.seconds > 0
                and math.isfinite(self.seconds))

    @property
    def work_started_at(self) -> float:
        """When the job's first step began, on the receiver's clock."""
        return self.at - self.seconds


def seconds_left(predicted_end: float | None, now: float, progress: StepProgress | None = None,
                 min_steps: int = MIN_PROGRESS_STEPS) -> float:
    """A running job's seconds left at ``now``, at least 0.

    With usable ``progress`` (:meth:`StepProgress.usable`): measured seconds per step × steps left, less the time since
    the report. Otherwise from the prediction: ``predicted_end`` (``policies.predicted_end``: its GPU work's predicted
    start plus its predicted runtime) minus ``now``; 0 without a prediction."""
    if progress is not None and progress.usable(min_steps):
        per_step = progress.seconds / progress.steps
        return max(0.0, per_step * (progress.total - progress.steps) - max(0.0, now - progress.at))
    return 0.0 if predicted_end is None else max(0.0, predicted_end - now)


class StepReporter:
    """The workload's side: writes its progress on ``$GNNSCHED_PROGRESS_FD`` (the pipe ``gnnsched gate`` gives it)
    at a bounded rate, for the gate's keeper to forward to the node agent.

    A line goes out once the job has done ``min_steps`` steps, then at most every ``interval`` seconds, and at the
    last step. Writing never blocks or fails the job: the pipe is non-blocking, a full pipe drops the line (a newer
    one follows), and a closed one (the keeper is gone) ends the reports."""

    def __init__(self, fd: int, interval: float = REPORT_INTERVAL_S, min_steps: int = MIN_PROGRESS_STEPS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.fd: int | None = fd
        self.interval = interval
        self.min_steps = min_steps
        self.clock = clock
        self.total = 0
        self.steps = 0
        self.began: float | None = None
        self.sent_at: float | None = None
        self.lines = 0
        with contextlib.suppress(OSError):
            os.set_blocking(fd, False)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> StepReporter | None:
        """The reporter for ``$GNNSCHED_PROGRESS_FD``, or None when it is unset; a value that is not a descriptor
        number is a ``ValueError`` naming the variable."""
        raw = environ.get(ENV_PROGRESS_FD, "").strip()
        if not raw:
            return None
        if not raw.isdigit():
            raise ValueError(f"{ENV_PROGRESS_FD}: not a file descriptor number: {raw!r}")
        return cls(int(raw))

    def start(self, total: int) -> None:
        """The job is about to run its first of ``total`` steps: the step time counts from now."""
        self.total = int(total)
        self.steps = 0
        self.began = self.clock()

    def advance(self, n: int = 1) -> None:
        """``n`` more steps are done; writes a line when one is due."""
        if self.began is None:
            self.start(self.total)
        self.steps += n
        now = self.clock()
        due = self.steps >= self.min_steps and (self.sent_at is None or now - self.sent_at >= self.interval)
        if due or (self.total and self.steps >= self.total):
            self._write(now)

    def _write(self, now: float) -> None:
        if self.fd is None or self.began is None or self.total < 1:
            return
        line = json.dumps({"steps": min(self.steps, self.total), "total": self.total,
                           "seconds": round(max(0.0, now - self.began), 6)}).encode() + b"\n"
        try:
            os.write(self.fd, line)  # under PIPE_BUF: written whole or not at all
        except BlockingIOError:
            return
        except OSError:  # the keeper is gone: nobody reads
            self.close()
            return
        self.sent_at = now
        self.lines += 1

    def close(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None
