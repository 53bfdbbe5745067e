"""The GPU models gnnsched knows: memory, bandwidth, peak FP32 rate, SM count and per-process device overheads.

Memory, bandwidth, FP32 peak and SM count are the vendor's datasheet figures (total memory as ``nvidia-smi`` reports it
for the board). They feed the analytic runtime prior, the extender's fake clusters and the simulator.

The device-overhead constants (CUDA context, cuBLAS workspace, caching-allocator rounding, MPS per-client cost) are what
the estimator adds on top of the traced peak of live tensors when the job runs on a GPU. Only the H100-80GB entry is
measured (``overheads_verified``: an H100 80GB HBM3 lent once, docs/gpu-measurements.md); every other entry is a
documented engineering estimate, and ``GPUModel.overheads_verified`` says so in every output that uses them. The H100's
measured context (742 MiB) was 43 % above the estimate it replaced (520 MiB), so the other entries probably err low;
the calibration loop (``gnnsched.closed_loop``) corrects them from what NVML observes, and ``gnnsched worker``
measures its own context on the GPU instead of using these constants.

Where each device-overhead constant comes from (unverified except for the H100):

* ``context_bytes``: the CUDA context PyTorch creates on first use (driver state, loaded kernel images). Widely
  reported at roughly 250-550 MiB depending on the GPU generation and CUDA version; lazy module loading
  (``CUDA_MODULE_LOADING=LAZY``, the default since CUDA 12.2) loads kernels as they first run, so it grows with what
  the job runs: on the H100, 610 MiB after the first tensor, 676 after the first matmul, 742 after GNN training
  steps (torch 2.11, CUDA 13). The same 610 MiB is charged to an MPS client's memory limit. Not visible to
  ``torch.cuda.max_memory_allocated``, but it occupies the GPU, so the gate must reserve it per process.
* ``cublas_workspace_bytes``: PyTorch's default cuBLAS workspace per (handle, stream), ``CUBLAS_WORKSPACE_CONFIG``
  ``:4096:2:16:8`` = 2 x 4 MiB + 8 x 16 KiB; 32 MiB on Hopper. Allocated through the caching allocator (so the
  estimator replays it through its allocator model, where an 8 MiB workspace opens a 20 MiB segment or reuses cached
  space); one per thread that runs cuBLAS (PyTorch keeps a cuBLAS handle per thread), so parallel inference pays it
  per worker and training twice (the autograd engine runs the backward on its own device thread): measured on the
  H100 as 32 MiB taken at the forward's first matmul and 32 MiB at the backward's.
* ``cublaslt_workspace_bytes``: the cuBLASLt workspace PyTorch takes at the first ``addmm`` with a bias (a linear
  layer with a bias); 1 MiB, measured on the H100, kept for the process.
* ``mps_client_bytes``: 0. Under Volta-and-later MPS each client owns its own GPU address space and context, so
  NVIDIA's MPS documentation notes the context-storage saving of MPS is "to a much lesser degree" than pre-Volta;
  the client's cost is therefore its own ``context_bytes``. The MPS server's context is a per-GPU cost that belongs
  in the node agent's reserve, not in any one job's admission.
* ``allocator_overhead_fraction``: 0. The caching allocator's reserved memory (block rounding, segment sizes,
  splitting, fragmentation across segments) is predicted by replaying the trace through a model of the allocator
  (``gnnsched.cuda_allocator``); this fraction is an extra allowance on that reserved peak, left at 0 until a GPU
  measures a gap the model misses.

The openb trace names two models only by code (``G2``, ``G3``); their specs are undisclosed, so the entries below are
assumptions (``assumed=True``) sized from the nodes that carry them, and every figure derived from them says so.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

MiB = 2**20
GiB = 2**30


class GPUModel(BaseModel):
    """A GPU model's capacity and the constants the estimator and the runtime prior need."""

    model_config = ConfigDict(frozen=True)

    name: str
    memory_bytes: int = Field(gt=0)
    bandwidth_bytes_per_s: float = Field(gt=0)
    fp32_flops_per_s: float = Field(gt=0)
    sm_count: int = Field(gt=0)
    max_mps_clients: int = Field(default=48, gt=0)
    context_bytes: int = Field(default=300 * MiB, ge=0)
    cublas_workspace_bytes: int = Field(default=8 * MiB + 8 * 16 * 1024, ge=0)
    cublaslt_workspace_bytes: int = Field(default=MiB, ge=0)
    mps_client_bytes: int = Field(default=0, ge=0)
    allocator_overhead_fraction: float = Field(default=0.0, ge=0, lt=1)
    overheads_verified: bool = False
    assumed: bool = False
    aliases: tuple[str, ...] = ()
    source: str = ""


def _model(**kwargs: Any) -> GPUModel:
    return GPUModel(**kwargs)


_CATALOGUE: tuple[GPUModel, ...] = (
    _model(
        name="V100-16GB", memory_bytes=16160 * MiB, bandwidth_bytes_per_s=900e9, fp32_flops_per_s=15.7e12,
        sm_count=80, context_bytes=305 * MiB, aliases=("V100M16", "Tesla V100-SXM2-16GB", "V100"),
        source="NVIDIA V100 datasheet (SXM2)",
    ),
    _model(
        name="V100-32GB", memory_bytes=32510 * MiB, bandwidth_bytes_per_s=900e9, fp32_flops_per_s=15.7e12,
        sm_count=80, context_bytes=305 * MiB, aliases=("V100M32", "Tesla V100-SXM2-32GB", "V100S"),
        source="NVIDIA V100 datasheet (SXM2)",
    ),
    _model(
        name="A100-40GB", memory_bytes=40960 * MiB, bandwidth_bytes_per_s=1555e9, fp32_flops_per_s=19.5e12,
        sm_count=108, context_bytes=420 * MiB, aliases=("A100", "NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB"),
        source="NVIDIA A100 datasheet (SXM4 40GB)",
    ),
    _model(
        name="A100-80GB", memory_bytes=81920 * MiB, bandwidth_bytes_per_s=2039e9, fp32_flops_per_s=19.5e12,
        sm_count=108, context_bytes=420 * MiB, aliases=("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"),
        source="NVIDIA A100 datasheet (SXM4 80GB)",
    ),
    _model(
        name="H100-80GB", memory_bytes=81559 * MiB, bandwidth_bytes_per_s=3.35e12, fp32_flops_per_s=67e12,
        # Measured (docs/gpu-measurements.md): NVML's per-process used memory minus torch's reserved bytes after
        # GCN/SAGE/GIN/GAT training steps, torch 2.11.0+cu130, driver 580.159.04; 32 MiB cuBLAS workspace per
        # thread and a 1 MiB cuBLASLt workspace, from the allocator's own event history.
        sm_count=132, context_bytes=742 * MiB, cublas_workspace_bytes=32 * MiB, cublaslt_workspace_bytes=MiB,
        overheads_verified=True,
        aliases=("H100", "NVIDIA H100 80GB HBM3", "H100-SXM5-80GB"),
        source="NVIDIA H100 datasheet (SXM5)",
    ),
    _model(
        name="T4", memory_bytes=15360 * MiB, bandwidth_bytes_per_s=320e9, fp32_flops_per_s=8.1e12,
        sm_count=40, context_bytes=260 * MiB, aliases=("Tesla T4",),
        source="NVIDIA T4 datasheet",
    ),
    _model(
        name="P100-16GB", memory_bytes=16280 * MiB, bandwidth_bytes_per_s=732e9, fp32_flops_per_s=10.6e12,
        sm_count=56, max_mps_clients=16, context_bytes=280 * MiB, aliases=("P100", "Tesla P100-SXM2-16GB"),
        source="NVIDIA P100 datasheet (SXM2); pre-Volta MPS allows 16 clients",
    ),
    _model(
        name="A10", memory_bytes=23028 * MiB, bandwidth_bytes_per_s=600e9, fp32_flops_per_s=31.2e12,
        sm_count=72, context_bytes=400 * MiB, aliases=("NVIDIA A10",),
        source="NVIDIA A10 datasheet",
    ),
    _model(
        name="L4", memory_bytes=23034 * MiB, bandwidth_bytes_per_s=300e9, fp32_flops_per_s=30.3e12,
        sm_count=58, context_bytes=400 * MiB, aliases=("NVIDIA L4",),
        source="NVIDIA L4 datasheet",
    ),
    _model(
        name="G2", memory_bytes=16160 * MiB, bandwidth_bytes_per_s=900e9, fp32_flops_per_s=15.7e12,
        sm_count=80, assumed=True,
        source="openb trace code, specs undisclosed; assumed V100-16GB-class",
    ),
    _model(
        name="G3", memory_bytes=32510 * MiB, bandwidth_bytes_per_s=900e9, fp32_flops_per_s=15.7e12,
        sm_count=80, assumed=True,
        source="openb trace code, specs undisclosed; assumed V100-32GB-class",
    ),
)

DEFAULT_GPU_MODEL = "A100-80GB"


def _key(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


def gpu_models() -> tuple[GPUModel, ...]:
    """Every catalogued model, in a stable order."""
    return _CATALOGUE


def get_gpu_model(name: str) -> GPUModel:
    """Look a model up by its name or an alias (case-insensitive); ``KeyError`` lists the known names."""
    wanted = _key(name)
    for model in _CATALOGUE:
        if wanted == _key(model.name) or wanted in {_key(alias) for alias in model.aliases}:
            return model
    known = ", ".join(m.name for m in _CATALOGUE)
    raise KeyError(f"unknown GPU model {name!r}; known models: {known}")


def match_device_name(device_name: str, total_bytes: int | None = None) -> GPUModel | None:
    """Best catalogue match for a name NVML reports (``NVIDIA A100-SXM4-80GB``), using memory to break ties."""
    try:
        return get_gpu_model(device_name)
    except KeyError:
        pass
    lowered = device_name.lower()
    candidates = [m for m in _CATALOGUE if not m.assumed and m.name.split("-")[0].lower() in lowered]
    if not candidates:
        return None
    if total_bytes is None:
        return candidates[0]
    return min(candidates, key=lambda m: abs(m.memory_bytes - total_bytes))
