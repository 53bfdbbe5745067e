"""Checkpoint and resume of a job's steps: the model, the optimizer, the step and the RNG state, saved atomically.

Why here: the step loop runs in the user's image too (the package's docstring), so the saving imports only the
standard library and torch. The contract (docs/operator.md, "Checkpoints"): the operator mounts a volume at
``$GNNSCHED_CHECKPOINT_DIR`` and sets ``$GNNSCHED_CHECKPOINT_EVERY_S``; the job saves there every that many
seconds and when it is asked to stop (SIGTERM, a graceful drain), and an attempt that finds a checkpoint resumes
from it. A custom command follows the same contract with its own code.

Atomic: the state is written to a temporary file in the same directory, flushed to disk, then renamed over
:data:`FILE_NAME` (``os.replace``, atomic on POSIX within one filesystem), and the directory is synced, so a fault or
a kill during a save leaves the previous checkpoint whole. A reader never sees a half-written file.

GPU memory: ``torch.save`` copies each storage of a CUDA tensor to host memory, one storage at a time, before writing
it (``torch/serialization.py``, ``_save``: ``storage.cpu()``, or a pinned host buffer); it allocates nothing on the
device. Loading maps to the CPU and copies into the existing parameters (``load_state_dict``: ``param.copy_``); the
optimizer's state moves to the parameters' device, the same tensors its first step would have allocated. So a
checkpoint adds no device memory to the job's peak, and the estimator adds none; the host holds at most one storage's
copy at a time while saving, and the state's host copy while resuming.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

ENV_DIR = "GNNSCHED_CHECKPOINT_DIR"
ENV_EVERY_S = "GNNSCHED_CHECKPOINT_EVERY_S"
FILE_NAME = "checkpoint.pt"
FORMAT = 1
EXIT_DRAINED = 143
"""The exit status of an attempt that SIGTERM stopped after its save: a process that SIGTERM ended exits 128 + 15, so
the pod reads as drained (not as the job's own failure) with or without the save."""


class CheckpointError(ValueError):
    """The directory holds a ``checkpoint.pt`` that is not a checkpoint of this format (truncated, foreign, another
    version): the message names the file. Bad input, not a fault: resuming from it would silently train another
    model, and starting over would overwrite what may be the user's."""


class Drained(Exception):
    """The job was asked to stop (SIGTERM) and has saved its checkpoint: the attempt ends here, to resume later."""

    def __init__(self, step: int) -> None:
        super().__init__(f"stopped by SIGTERM after step {step}; checkpoint saved")
        self.step = step


@dataclass
class Checkpoint:
    """What a checkpoint holds beyond the tensors: the step to resume from and when it was saved (epoch seconds)."""

    step: int
    saved_at: float


def path_in(directory: str) -> str:
    return os.path.join(directory, FILE_NAME)


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    py = state.get("python")
    if py is not None:
        random.setstate((py[0], tuple(py[1]), py[2]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save(directory: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, step: int) -> float:
    """Save the state after ``step`` finished steps into ``directory`` (write, fsync, rename); returns the seconds it
    took."""
    started = time.perf_counter()
    final = path_in(directory)
    tmp = f"{final}.tmp-{os.getpid()}"
    state = {"format": FORMAT, "step": int(step), "saved_at": time.time(), "model": model.state_dict(),
             "optimizer": optimizer.state_dict() if optimizer is not None else None, "rng": _rng_state()}
    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    with contextlib.suppress(OSError):  # the rename's directory entry, on filesystems that support it
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return time.perf_counter() - started


def load(directory: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> Checkpoint | None:
    """Restore the last checkpoint in ``directory`` into ``model`` and ``optimizer`` and the RNG; None when there is
    none. A file that is not a checkpoint of this format raises :class:`CheckpointError` naming the file."""
    final = path_in(directory)
    if not os.path.exists(final):
        return None
    try:
        state = torch.load(final, map_location="cpu", weights_only=True)
    except Exception as exc:  # a truncated or foreign file: say which, never resume from it
        raise CheckpointError(f"{final}: not a readable checkpoint ({type(exc).__name__}: {exc})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT or not isinstance(state.get("step"), int):
        raise CheckpointError(f"{final}: not a gnnsched checkpoint of format {FORMAT}")
    model.load_state_dict(state["model"])
    if optimizer is not None and state.get("optimizer") is not None:
        optimizer.load_state_dict(state["optimizer"])
    if isinstance(state.get("rng"), dict):
        _set_rng_state(state["rng"])
    return Checkpoint(step=state["step"], saved_at=float(state.get("saved_at", 0.0)))


class Checkpointer:
    """The step loop's side of the contract: resume once, then after each step save when ``every_s`` seconds passed
    since the last save (or since the attempt began) or when SIGTERM asked the job to stop (then raise
    :class:`Drained`). Keeps what the attempt reports: the step it resumed from, the last step saved, and the seconds
    of steps since the last save (the work a failure now would lose)."""

    def __init__(self, directory: str, every_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if every_s <= 0:
            raise ValueError(f"{ENV_EVERY_S}: must be a number of seconds > 0, got {every_s!r}")
        os.makedirs(directory, exist_ok=True)
        self.directory = directory
        self.every_s = float(every_s)
        self.clock = clock
        self.resumed_from_step = 0
        self.saved_step: int | None = None
        self.saves = 0
        self.save_seconds = 0.0
        self.last = clock()
        self.stop_requested = False

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Checkpointer | None:
        """The checkpointer the pod's environment asks for; None when the job does not checkpoint."""
        env = os.environ if environ is None else environ
        directory = env.get(ENV_DIR)
        if not directory:
            return None
        raw = env.get(ENV_EVERY_S, "")
        try:
            every = float(raw)
        except ValueError:
            raise ValueError(f"{ENV_EVERY_S}: must be a number of seconds > 0, got {raw!r}") from None
        return cls(directory, every)

    def install_sigterm(self) -> None:
        """SIGTERM (a drain, a deletion with grace) asks for a save at the end of the current step."""
        def _ask(signum: int, frame: Any) -> None:
            self.stop_requested = True
        signal.signal(signal.SIGTERM, _ask)

    def resume(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> int:
        """Restore the last checkpoint (if any); returns the number of steps already done (0: start from the
        beginning). The interval runs from here."""
        found = load(self.directory, model, optimizer)
        self.resumed_from_step = found.step if found is not None else 0
        self.saved_step = found.step if found is not None else None
        self.last = self.clock()
        return self.resumed_from_step

    def after_step(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, done: int) -> None:
        """Call after each finished step (``done``: steps finished in all, resumed ones included)."""
        if self.stop_requested or self.clock() - self.last >= self.every_s:
            self.save_now(model, optimizer, done)
        if self.stop_requested:
            raise Drained(done)

    def save_now(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, done: int) -> None:
        self.save_seconds += save(self.directory, model, optimizer, done)
        self.saves += 1
        self.saved_step = done
        self.last = self.clock()

    def lost_seconds(self) -> float:
        """Seconds of steps since the last save (or since the attempt resumed): what a failure now loses."""
        return max(0.0, self.clock() - self.last)

    def report(self) -> dict[str, Any]:
        """The attempt's checkpoint figures for its result line."""
        out: dict[str, Any] = {"resumed_from_step": self.resumed_from_step, "checkpoint_saves": self.saves,
                               "checkpoint_seconds": round(self.save_seconds, 6)}
        if self.saved_step is not None:
            out["checkpoint_step"] = self.saved_step
        return out

    def result_fields(self, succeeded: bool) -> dict[str, Any]:
        """:meth:`report` and the work the attempt lost: none when it succeeded, else the seconds of steps since its
        last save. The built-in worker and the portable runner put exactly these keys on their result line."""
        lost = 0.0 if succeeded else round(self.lost_seconds(), 3)
        return {**self.report(), "lost_seconds": lost}


def checkpointed_steps(checkpointer: Checkpointer | None, model: torch.nn.Module,
                       optimizer: torch.optim.Optimizer | None, stream: Iterator[Any], total: int,
                       progress: Callable[[int], None] | None = None) -> Iterator[int]:
    """The indices of the steps a serial step loop runs, with the contract around them: the one loop of the built-in
    worker and of the portable runner.

    Before the first index it resumes (restores the last checkpoint, skips the inputs of the steps it holds on
    ``stream``, since mini-batches are drawn in a fixed order per epoch, and reports them done through ``progress``);
    the caller's body runs step ``i`` on the next input of ``stream``; when the body is done the next index saves if
    the interval passed, or on SIGTERM saves and raises :class:`Drained`. Nothing is saved after the last step: the
    job is done. Without ``checkpointer`` it is ``range(total)``."""
    first = min(checkpointer.resume(model, optimizer), total) if checkpointer is not None else 0
    for _ in range(first):
        next(stream)
    if first and progress is not None:
        progress(first)
    for index in range(first, total):
        yield index
        if checkpointer is not None and index + 1 < total:
            checkpointer.after_step(model, optimizer, index + 1)
