"""The start-up-first gate's hand-off: how a workload that started before its admission learns it was admitted.

Why: a pod's process start-up (interpreter, torch and PyG imports, loading the graph, building the model) is CPU work
that needs no GPU; the plain gate (``gnnsched gate -- CMD``) runs it only after the node agent admits the job, so a
job that waited at the gate then pays its whole start-up on top of the wait. ``gnnsched gate --prestart -- CMD`` starts
the workload at once and lets a keeper process wait at the gate for it; the workload does its CPU-side start-up, then
blocks on :func:`await_admission` before it touches a GPU. The reservation semantics do not change: nothing reaches a
GPU before admission, the keeper holds the gate connection (its end is the release) exactly as after a plain gate.

The hand-off is one JSON line (:class:`Handoff`) on a pipe whose descriptor number is in ``$GNNSCHED_GATE_HANDOFF_FD``
(``gnnsched.contract.ENV_GATE_HANDOFF_FD``). Until it arrives the workload runs with ``CUDA_VISIBLE_DEVICES`` empty and
``PYTORCH_NVML_BASED_CUDA_CHECK=1`` (set by the gate): a library that probes CUDA during its import sees no GPU and does
not initialise the driver (``torch.cuda.is_available()`` asks NVML instead of calling ``cuInit``). The CUDA driver
reads ``CUDA_VISIBLE_DEVICES`` when it initialises and MPS reads its limits when the context is created, so applying
the admitted environment to ``os.environ`` (which calls ``putenv``) before either happens puts the admitted GPU and
limits in force exactly as an ``exec`` with them would. :func:`apply_admission` refuses when torch has already
initialised CUDA in this process, since the limits could then no longer apply.

Torch-free: the worker imports this before it knows whether it needs torch at all.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Literal, NoReturn

from pydantic import BaseModel, ConfigDict, ValidationError

from gnnsched.contract import ENV_GATE_HANDOFF_FD, ENV_PRESTART_FALLBACK

NVML_CHECK_ENV = "PYTORCH_NVML_BASED_CUDA_CHECK"
"""torch's switch that makes ``torch.cuda.is_available()`` ask NVML instead of initialising the CUDA driver."""

EXIT_NO_ADMISSION = 4
"""The keeper ended without an admission (no agent, or the keeper died): the same status as the gate's no-agent."""

MAX_HANDOFF = 64 * 1024


class Handoff(BaseModel):
    """The keeper's one line to the workload.

    ``admitted``: apply ``env`` (the admitted GPU, MPS limits, group; what the plain gate would have exec'd with) and
    remove the names in ``unset`` (the pre-admission guards the gate added). Anything else: exit with ``exit_code``
    after printing ``message``."""

    model_config = ConfigDict(extra="forbid")

    status: Literal["admitted", "rejected", "no-agent"]
    env: dict[str, str] = {}
    unset: list[str] = []
    exit_code: int = 0
    message: str = ""

    def line(self) -> bytes:
        return self.model_dump_json().encode() + b"\n"


class NotAdmitted(Exception):
    """The gate did not admit this workload; ``exit_code`` is the status to exit with, the message says why."""

    def __init__(self, exit_code: int, message: str) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def handoff_fd(environ: dict[str, str] | None = None) -> int | None:
    """The hand-off descriptor when this process was started by ``gnnsched gate --prestart``, else None.

    Raises :class:`NotAdmitted` (exit 2) when the variable is set but not a descriptor number: a workload that cannot
    hear its admission must not run."""
    env = os.environ if environ is None else environ
    raw = env.get(ENV_GATE_HANDOFF_FD, "").strip()
    if not raw:
        return None
    if not raw.isdigit():
        raise NotAdmitted(2, f"{ENV_GATE_HANDOFF_FD}: not a file descriptor number: {raw!r}")
    return int(raw)


def read_handoff(fd: int) -> Handoff:
    """Block until the keeper's line arrives on ``fd`` (closing it). A keeper that ended without one (EOF) or wrote
    something else means no admission: :class:`NotAdmitted`."""
    buf = b""
    try:
        while b"\n" not in buf and len(buf) <= MAX_HANDOFF:
            try:
                chunk = os.read(fd, 4096)
            except InterruptedError:
                continue
            except OSError as exc:
                raise NotAdmitted(EXIT_NO_ADMISSION, f"{ENV_GATE_HANDOFF_FD}: cannot read the gate's hand-off: {exc}"
                                  ) from None
            if not chunk:
                break
            buf += chunk
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
    if b"\n" not in buf:
        raise NotAdmitted(EXIT_NO_ADMISSION, "gate: the keeper ended before the node agent admitted this workload")
    try:
        return Handoff.model_validate_json(buf.split(b"\n", 1)[0])
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err.get("loc", ())) or "handoff"
        raise NotAdmitted(EXIT_NO_ADMISSION, f"gate hand-off: {where}: {err.get('msg', 'invalid')}") from None


def cuda_initialised() -> bool:
    """Whether torch (if this process imported it) has initialised CUDA: then the admitted GPU and MPS limits can no
    longer apply to this process, only to a new one."""
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_initialized())


def apply_admission(handoff: Handoff, *, reexec: bool = False) -> None:
    """Put the admitted environment in force in this process (before CUDA initialises), or raise
    :class:`NotAdmitted` for a rejection.

    ``reexec``: the caller will re-execute itself (:func:`reexec_admitted`) instead of touching a GPU here, so CUDA
    having been initialised already is no reason to refuse: the admitted environment is for the new process."""
    if handoff.status != "admitted":
        raise NotAdmitted(handoff.exit_code or EXIT_NO_ADMISSION, handoff.message or f"gate: {handoff.status}")
    if not reexec and cuda_initialised():
        raise NotAdmitted(EXIT_NO_ADMISSION, "gate: CUDA was initialised before admission; the admitted GPU and MPS "
                                             "limits cannot apply to this process")
    for name in handoff.unset:
        os.environ.pop(name, None)
    os.environ.update(handoff.env)
    os.environ.pop(ENV_GATE_HANDOFF_FD, None)


def await_admission(fd: int) -> Handoff:
    """Wait for the gate and apply what it says: returns the admission (its environment now in ``os.environ``), or
    raises :class:`NotAdmitted`."""
    handoff = read_handoff(fd)
    apply_admission(handoff)
    return handoff


EXIT_REEXEC_FAILED = 127
"""The fallback's ``exec`` of this interpreter failed (the same status as the gate's failed exec)."""

MAX_FALLBACK_REASON = 512


def reexec_command() -> list[str]:
    """The command line that started this interpreter, to run it again: this interpreter's absolute path, then every
    argument it was given (interpreter options, ``-m``/``-c``/script, the command's own arguments).

    ``sys.orig_argv`` rather than ``sys.argv``: ``argv`` loses the interpreter and its options (``-X``, ``-u``,
    ``-m pkg``). Through a console script (``gnnsched worker ...``) the kernel ran the script's shebang, so
    ``orig_argv`` is ``[python, /path/bin/gnnsched, worker, ...]``. Its first item can be a bare name resolved through
    ``$PATH`` (``python -m gnnsched ...``); ``sys.executable`` is the interpreter that actually runs, so it replaces
    it."""
    return [sys.executable, *sys.orig_argv[1:]]


def reexec_admitted(reason: str) -> NoReturn:
    """Replace this process by a fresh run of the same command, as a plain, already-admitted worker.

    Why: a prestarted worker whose start-up tried to initialise CUDA before admission (stopped by the guard), or whose
    CUDA driver latched "no device" through a path the guard does not cover, cannot use its admitted GPU in this
    process. ``exec`` gives a fresh process image, hence a fresh CUDA driver and a fresh torch, with the admitted
    environment (already in ``os.environ``, :func:`apply_admission`) in force from its first instruction. The pid stays
    the same, which is what the gate's keeper watches (a pidfd: readable only when the process exits), so the
    reservation is held across the exec exactly as across the start-up; descriptors this process opened without
    inheritance (Python's default, and the hand-off pipe, closed by :func:`read_handoff`) close with the old image.

    ``$GNNSCHED_GATE_HANDOFF_FD`` is gone from the environment, so the new process takes the plain path and cannot fall
    back again; ``$GNNSCHED_PRESTART_FALLBACK`` carries ``reason`` for its log and result line. A process that already
    is a fallback refuses (``RuntimeError``): no loop, whatever the environment says. Raises :class:`NotAdmitted`
    (exit 127) when the exec itself fails."""
    if os.environ.get(ENV_PRESTART_FALLBACK):
        raise RuntimeError(f"{ENV_PRESTART_FALLBACK}: already a re-executed worker; it does not re-execute again")
    if ENV_GATE_HANDOFF_FD in os.environ:
        raise RuntimeError(f"{ENV_GATE_HANDOFF_FD}: still set; re-execute only after the admission is applied")
    one_line = " ".join(reason.split())[:MAX_FALLBACK_REASON] or "unspecified"
    os.environ[ENV_PRESTART_FALLBACK] = one_line
    argv = reexec_command()
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(argv[0], argv, dict(os.environ))
    except OSError as exc:
        os.environ.pop(ENV_PRESTART_FALLBACK, None)
        raise NotAdmitted(EXIT_REEXEC_FAILED, f"gnnsched worker: cannot re-execute {argv[0]}: {exc}") from None
