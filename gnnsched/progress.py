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

import math
from dataclasses import dataclass

from gnnsched.portable.progress import MIN_PROGRESS_STEPS, REPORT_INTERVAL_S, StepReporter

__all__ = ["MIN_PROGRESS_STEPS", "REPORT_INTERVAL_S", "StepProgress", "StepReporter", "seconds_left"]


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
