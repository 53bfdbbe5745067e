"""The workload's side of progress reporting: step counts written on the gate's progress pipe.

Why here (``gnnsched.portable``): the built-in worker and the portable step runner (``runner.py``, in the user's own
image where no gnnsched is installed) report the same lines, so this imports the standard library only. The reading
side (the gate's keeper, the node agent, ``gnnsched.progress.seconds_left``) is elsewhere.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Mapping

ENV_PROGRESS_FD = "GNNSCHED_PROGRESS_FD"
"""``gnnsched.contract.ENV_PROGRESS_FD``, spelled out (this module runs where gnnsched is not importable)."""

MIN_PROGRESS_STEPS = 3
"""Steps a job must have reported before its measured pace replaces its prediction: the first step carries one-off
work (the optimiser's state, the allocator's first segments, lazy initialisation), so one or two steps overstate the
pace of the rest."""

REPORT_INTERVAL_S = 5.0
"""The most often a worker reports its progress (and the most often the gate client forwards it): a job of 100,000
short steps sends a line every five seconds, not one per step. The node agent decides every few seconds anyway."""


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
