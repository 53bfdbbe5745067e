"""A trap for every call that would initialise the CUDA driver on a CUDA build of torch, usable on a CPU build.

Why: the CI machines have no GPU and a CPU torch, where none of these calls reaches a driver; on a GPU node the same
calls made before admission latched "no device" for the life of the worker (docs/gpu-measurements.md section 7). The
trap wraps each entry point that, by torch's source, reaches ``cuInit`` on a CUDA build, and appends one JSON line per
call to a file, saying whether the gate had admitted the process yet (``$GNNSCHED_GATE_HANDOFF_FD`` is in the
environment until the hand-off is applied) and who called:

- ``torch._C._show_config`` (``torch.__config__.show()``): ``at::show_config`` asks ``at::hasCUDA()`` ->
  ``c10::cuda::device_count()`` -> ``cudaGetDeviceCount``;
- ``torch._C._cuda_getDeviceCount``, ``torch._C._cuda_init`` and the device/stream calls (only where this torch has
  them: a CPU build has none, and adding one would make ``torch.cuda._is_compiled()`` true);
- ``torch.cuda._lazy_init``, which the C++ calls by name before it makes a CUDA tensor;
- ``torch.cuda.is_available``/``device_count`` when they would fall back to the runtime (no
  ``PYTORCH_NVML_BASED_CUDA_CHECK=1``, or a device made visible);
- ``ctypes.CDLL`` loads of ``libcuda`` (a library calling ``cuInit`` itself).

The trap sits under anything the worker installs later: a call that the pre-admission guard answers itself never
reaches it, which is the point. ``install(path)`` also records the admission (with whether PyG was imported before it
and the ``NO_MKL`` it cached) and, at exit, what the real ``torch.__config__.show()`` says about MKL.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

DRIVER_C_CALLS = ("_show_config", "_cuda_getDeviceCount", "_cuda_init", "_cuda_getDevice", "_cuda_setDevice",
                  "_cuda_synchronize", "_cuda_getCurrentStream", "_accelerator_getDeviceIndex",
                  "_accelerator_setDeviceIndex", "_accelerator_synchronizeDevice", "_accelerator_getStream")
HANDOFF_ENV = "GNNSCHED_GATE_HANDOFF_FD"


def _runtime_fallback_possible() -> bool:
    """Whether ``torch.cuda.is_available()``/``device_count()`` would call ``cudaGetDeviceCount`` on a CUDA build."""
    if os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK") != "1":
        return True
    return os.environ.get("CUDA_VISIBLE_DEVICES") != ""


def install(path: str) -> None:
    """Wrap the entry points above; every call appends a record to ``path``."""
    import torch

    def record(entry: dict[str, Any]) -> None:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(entry) + "\n")

    def call_record(name: str) -> None:
        stack = [f"{f.filename}:{f.lineno} in {f.name}" for f in traceback.extract_stack()[:-2]]
        record({"event": "call", "call": name, "pre_admission": HANDOFF_ENV in os.environ, "stack": stack[-8:]})

    def wrap(name: str, original: Callable[..., Any], when: Callable[[], bool] | None = None) -> Callable[..., Any]:
        def trapped(*args: Any, **kwargs: Any) -> Any:
            if when is None or when():
                call_record(name)
            return original(*args, **kwargs)

        return trapped

    real_config = torch._C._show_config
    for name in DRIVER_C_CALLS:
        if hasattr(torch._C, name):
            setattr(torch._C, name, wrap(f"torch._C.{name}", getattr(torch._C, name)))
    torch.cuda._lazy_init = wrap("torch.cuda._lazy_init", torch.cuda._lazy_init)  # type: ignore[method-assign]
    torch.cuda.is_available = wrap("torch.cuda.is_available", torch.cuda.is_available,  # type: ignore[method-assign]
                                   _runtime_fallback_possible)
    torch.cuda.device_count = wrap("torch.cuda.device_count", torch.cuda.device_count,  # type: ignore[method-assign]
                                   _runtime_fallback_possible)

    cdll_init = ctypes.CDLL.__init__

    def cdll(self: ctypes.CDLL, name: str | None, *args: Any, **kwargs: Any) -> None:
        if name and "libcuda" in os.path.basename(str(name)):
            call_record(f"ctypes.CDLL({name})")
        cdll_init(self, name, *args, **kwargs)

    ctypes.CDLL.__init__ = cdll  # type: ignore[method-assign]

    import gnnsched.gate_handoff as handoff

    apply = handoff.apply_admission

    def admission(h: Any, **kwargs: Any) -> None:
        pyg = sys.modules.get("torch_geometric.typing")
        record({"event": "admission", "torch_geometric": "torch_geometric" in sys.modules,
                "no_mkl": getattr(pyg, "NO_MKL", None)})
        apply(h, **kwargs)

    handoff.apply_admission = admission  # type: ignore[assignment]

    def at_exit() -> None:
        # torch's own text (not through the trap, nor a guard still installed): what PyG would have read unguarded
        record({"event": "exit", "use_mkl_off": "USE_MKL=OFF" in real_config()})

    atexit.register(at_exit)
