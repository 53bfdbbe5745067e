"""The pre-admission CUDA guard: while a prestarted worker waits at the gate, nothing in it may initialise CUDA.

Why: ``gnnsched gate --prestart`` runs the workload's CPU-side start-up with ``CUDA_VISIBLE_DEVICES`` empty, and the
CUDA driver reads that variable exactly once, at ``cuInit``. Whatever calls ``cuInit`` before admission latches "no
device" for the life of the process; the admitted GPU can then never become visible (measured on an H100,
docs/gpu-measurements.md section 7). torch itself keeps a second latch: ``c10::cuda::device_count()`` caches the
count of its first call in a function-local static. A failed initialisation leaves ``torch.cuda.is_initialized()``
False, so checking it at admission cannot tell.

What reached the driver was ``import torch_geometric``: ``torch_geometric/typing.py`` computes
``NO_MKL = 'USE_MKL=OFF' in torch.__config__.show()``, and ``torch.__config__.show()`` is ``torch._C._show_config()``,
whose C++ (``at::show_config``) asks ``at::hasCUDA()`` before it prints the CUDA section: on a CUDA build that is
``at::cuda::is_available()`` -> ``c10::cuda::device_count()`` -> ``cudaGetDeviceCount`` -> ``cuInit``, and no
``PYTORCH_NVML_BASED_CUDA_CHECK`` applies there (only the Python ``torch.cuda.is_available``/``device_count`` read it).

:class:`PreAdmissionGuard` replaces, for the pre-admission phase only, every Python-visible torch entry point that
reaches ``cuInit`` on a CUDA build:

- ``torch._C._show_config`` answers a driver-free text (:func:`driver_free_config`) whose build settings carry the
  flags that decide them (``USE_MKL`` among them, so PyG's import-time ``NO_MKL`` is what it would be after admission);
- ``torch._C._cuda_getDeviceCount`` answers 0, the true count of a process with ``CUDA_VISIBLE_DEVICES`` empty, without
  asking the runtime;
- ``torch.cuda._lazy_init`` (which the C++ calls by name before a CUDA tensor or stream is made),
  ``torch._C._cuda_init`` and the device, stream and memory calls of ``torch._C._cuda_*``/``torch._C._accelerator_*``
  raise :class:`CudaInitBlocked`, naming the call and its caller: loud, and the driver was never reached.

Only attributes that exist are replaced (on a CPU build ``torch._C`` has no ``_cuda_getDeviceCount``, and
``torch.cuda._is_compiled()`` looks for it), and :meth:`PreAdmissionGuard.remove` puts every original back, after which
torch behaves exactly as unguarded: torch caches no device count before CUDA initialises (``torch.cuda.device_count``
keeps its answer only once ``_initialized``, which the guard prevents), and PyG caches only ``NO_MKL`` at import.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from types import ModuleType, TracebackType
from typing import Any

RAISING_C_CALLS = (
    "_cuda_init", "_cuda_getDevice", "_cuda_setDevice", "_cuda_exchangeDevice", "_cuda_maybeExchangeDevice",
    "_cuda_synchronize", "_cuda_getCurrentStream", "_cuda_getDefaultStream", "_cuda_setStream",
    "_cuda_getCurrentRawStream", "_cuda_getCurrentBlasHandle", "_cuda_getCurrentSolverHandle", "_cuda_emptyCache",
    "_cuda_memoryStats", "_cuda_memorySnapshot", "_cuda_canDeviceAccessPeer", "_cuda_isCurrentStreamCapturing",
    "_cuda_ipc_collect", "_cuda_sleep", "_cuda_resetPeakMemoryStats", "_cuda_resetAccumulatedMemoryStats",
    "_accelerator_getDeviceIndex", "_accelerator_setDeviceIndex", "_accelerator_exchangeDevice",
    "_accelerator_maybeExchangeDevice", "_accelerator_synchronizeDevice", "_accelerator_getStream",
    "_accelerator_setStream", "_accelerator_getDeviceCapability", "_accelerator_getMemoryInfo",
    "_accelerator_getDeviceStats", "_accelerator_emptyCache", "_accelerator_resetPeakStats",
    "_accelerator_resetAccumulatedStats",
)
"""``torch._C`` calls that create or query a CUDA device, stream or allocator: each needs an initialised driver
(``cudaGetDevice``/``cudaSetDevice`` and the rest call ``cuInit`` first), so before admission they raise instead."""

EXCHANGE_C_CALLS = frozenset({"_cuda_exchangeDevice", "_cuda_maybeExchangeDevice", "_accelerator_exchangeDevice",
                               "_accelerator_maybeExchangeDevice"})
"""Of those, the ones that return -1 for a negative index before touching CUDA (``torch.cuda.device(-1)``, what
``torch.cuda.device_of`` gives a CPU tensor): a negative index goes through to torch's own function."""

ZERO_COUNT_C_CALL = "_cuda_getDeviceCount"
"""Answers 0 under the guard: it is what ``cudaGetDeviceCount`` would say with no visible device, minus the latch."""

CONFIG_C_CALL = "_show_config"
"""``torch.__config__.show()``: its C++ calls ``at::hasCUDA()`` (``cudaGetDeviceCount``) before the CUDA section."""


class CudaInitBlocked(RuntimeError):
    """Something tried to initialise CUDA before the gate admitted this process; it was stopped before the driver."""


def _caller() -> str:
    """``file:line in function`` of the first frame outside this module and torch's own wrappers: who asked."""
    frame = sys._getframe(1)
    here = __file__
    torch_dir = os.sep + "torch" + os.sep
    fallback = ""
    while frame is not None:
        name = frame.f_code.co_filename
        if name != here:
            where = f"{name}:{frame.f_lineno} in {frame.f_code.co_name}"
            fallback = fallback or where
            if torch_dir not in name:
                return where
        frame = frame.f_back  # type: ignore[assignment]
    return fallback or "unknown"


def _flag(value: object) -> str:
    return "ON" if value else "OFF"


def driver_free_config(torch: ModuleType) -> str:
    """What ``torch.__config__.show()`` answers before admission: built from compile-time flags only.

    The real text's build settings come from CMake; each one given here is the flag torch compiled in for the same
    option (``USE_MKL`` is ``AT_MKL_ENABLED``, exposed as ``torch._C.has_mkl``), so a caller that looks for
    ``USE_MKL=OFF`` (PyG's ``NO_MKL``) reads the same answer now as from the full text after admission. The first
    line says this is the pre-admission text; the full one (CUDA section included) comes back with the guard's
    removal."""
    c = torch._C
    settings = {
        "TORCH_VERSION": str(torch.__version__).split("+", 1)[0],
        "USE_CUDA": _flag(torch.version.cuda),
        "CUDA_VERSION": str(torch.version.cuda or ""),
        "USE_CUDNN": _flag(getattr(c, "_has_cudnn", False)),
        "USE_MKL": _flag(getattr(c, "has_mkl", False)),
        "USE_MKLDNN": _flag(getattr(c, "_has_mkldnn", False)),
        "USE_OPENMP": _flag(getattr(c, "has_openmp", False)),
        "USE_LAPACK": _flag(getattr(c, "has_lapack", False)),
    }
    joined = "".join(f"{key}={value}, " for key, value in settings.items() if value)
    return ("PyTorch built with:\n"
            "  - (gnnsched gate --prestart: compile-time flags only until this process is admitted; no CUDA driver "
            "query)\n"
            f"  - Build settings: {joined}\n")


class PreAdmissionGuard:
    """Installed for the pre-admission phase of ``gnnsched gate --prestart`` and removed at admission.

    ``attempts`` lists every blocked call (``name (caller)``), also those a library caught and ignored: the worker
    reports them at admission. One per process at a time, which :meth:`install` enforces by refusing to install over
    another guard's replacements."""

    def __init__(self, torch: ModuleType | None = None) -> None:
        if torch is None:
            import torch as _torch

            torch = _torch
        self.torch = torch
        self.attempts: list[str] = []
        self._saved: list[tuple[Any, str, Any]] = []

    @property
    def installed(self) -> bool:
        """Whether torch's functions are replaced now."""
        return bool(self._saved)

    def _replace(self, owner: Any, name: str, replacement: Callable[..., Any]) -> None:
        original = getattr(owner, name)
        replacement.__gnnsched_guard__ = True  # type: ignore[attr-defined]
        if getattr(original, "__gnnsched_guard__", False):
            raise RuntimeError(f"a pre-admission CUDA guard is already installed on {name}")
        self._saved.append((owner, name, original))
        setattr(owner, name, replacement)

    def _blocker(self, what: str, original: Callable[..., Any] | None = None) -> Callable[..., Any]:
        """A replacement that raises; with ``original``, an exchange call with a negative index goes to it."""

        def blocked(*args: object, **kwargs: object) -> Any:
            if original is not None and args and isinstance(args[0], int) and args[0] < 0:
                return original(*args, **kwargs)
            caller = _caller()
            self.attempts.append(f"{what} ({caller})")
            raise CudaInitBlocked(
                f"gnnsched gate --prestart: {what} would initialise CUDA before this process was admitted "
                f"(called from {caller}); the admitted GPU could then never become visible to it. Move the call "
                "after admission, or run this command behind the plain gate")

        return blocked

    def _zero_count(self) -> Callable[..., Any]:
        def no_device(*_args: object, **_kwargs: object) -> int:
            self.attempts.append(f"torch._C.{ZERO_COUNT_C_CALL} answered 0 ({_caller()})")
            return 0

        return no_device

    def _config(self) -> Callable[..., Any]:
        torch = self.torch

        def config(*_args: object, **_kwargs: object) -> str:
            return driver_free_config(torch)

        return config

    def install(self) -> PreAdmissionGuard:
        """Replace torch's CUDA entry points (those this torch has); raises if CUDA is already initialised, since the
        guard could then not keep the process clean."""
        torch = self.torch
        if torch.cuda.is_initialized():
            raise CudaInitBlocked("gnnsched gate --prestart: CUDA was initialised before the pre-admission guard")
        c = torch._C
        try:
            if hasattr(c, CONFIG_C_CALL):
                self._replace(c, CONFIG_C_CALL, self._config())
            if hasattr(c, ZERO_COUNT_C_CALL):
                self._replace(c, ZERO_COUNT_C_CALL, self._zero_count())
            for name in RAISING_C_CALLS:
                if hasattr(c, name):
                    passes = getattr(c, name) if name in EXCHANGE_C_CALLS else None
                    self._replace(c, name, self._blocker(f"torch._C.{name}", passes))
            self._replace(torch.cuda, "_lazy_init", self._blocker("torch.cuda._lazy_init (CUDA initialisation)"))
        except BaseException:
            self.remove()
            raise
        return self

    def remove(self) -> None:
        """Put torch's own functions back (admission: the admitted environment is in force, CUDA may initialise)."""
        while self._saved:
            owner, name, original = self._saved.pop()
            setattr(owner, name, original)

    def __enter__(self) -> PreAdmissionGuard:
        return self.install()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.remove()


def runtime_device_count(torch: ModuleType) -> int:
    """How many CUDA devices the CUDA runtime gives this process: the check, after admission, that the driver did not
    latch "no device" before it (through a path :class:`PreAdmissionGuard` does not cover).

    Why this call: ``torch.cuda.device_count()`` asks NVML while CUDA is not initialised (``_device_count_nvml``,
    whatever ``PYTORCH_NVML_BASED_CUDA_CHECK`` says), and NVML sees the admitted GPU even where the driver latched
    nothing; ``torch.cuda.is_available()`` goes to the runtime only without that variable. ``torch._C.
    _cuda_getDeviceCount`` is ``cudaGetDeviceCount`` through ``c10::cuda::device_count()``: the runtime's own answer,
    the one CUDA tensors will meet. It initialises the driver, which is right once the admitted environment is in
    force, and caches its answer in a C++ static for this process only: a wrong (latched) answer dies with the process
    image when the worker re-executes (``gnnsched.gate_handoff.reexec_admitted``), and the new process asks afresh.
    torch's Python ``device_count`` keeps nothing before CUDA is initialised (``_cached_device_count`` is only set once
    ``_initialized``). A torch without CUDA (no ``_cuda_getDeviceCount``) sees 0 devices. Call only after the guard's
    removal (under it the answer is always 0)."""
    count = getattr(torch._C, ZERO_COUNT_C_CALL, None)
    if count is None:
        return 0
    if getattr(count, "__gnnsched_guard__", False):
        raise RuntimeError("runtime_device_count: the pre-admission guard is still installed")
    return int(count())
