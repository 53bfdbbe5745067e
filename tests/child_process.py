"""Child processes of test harnesses and benchmarks that die with their parent.

A harness killed from outside (``timeout``, a CI job's cancel, ``kill``) runs no clean-up of its own; without this its
operator, API server or node processes were left running, holding ports and CPU on a shared machine.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent() -> None:
    """Popen's ``preexec_fn``: the child gets SIGKILL when the thread that started it exits (Linux
    ``prctl(PR_SET_PDEATHSIG)``; SIGKILL because the children install their own SIGTERM handlers)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
