"""The GPU models gnnsched knows: capacity, throughput, architecture, and the per-process device constants the
memory estimate adds on top of the traced tensors.

Two kinds of figure live here, with different standing:

* **Datasheet figures** (memory, bandwidth, FP32 peak, SM count, compute capability): NVIDIA's published numbers for
  the board; total memory as ``nvidia-smi`` reports it where known. They feed the analytic runtime prior, the
  extender's fake clusters and the simulator.
* **Device constants** (CUDA context, cuBLAS and cuBLASLt workspaces): what a job's process takes on the GPU beyond
  its tensors. They are a property of the *architecture* (the compute capability: which kernels load, which cuBLAS
  workspace PyTorch picks) and of the torch version, not of one board, so each entry takes them from its
  :class:`Architecture` unless it was measured itself. ``GPUModel.provenance`` says, per constant, whether it was
  measured (and on what) or assumed; every output that uses an assumed constant can say so.

Why architecture rules and not a default model: on 2026-11-28 an H200 (not in the catalogue then) silently took the
default A100's constants and every job was under-predicted by 15-72 % (``docs/gpu-measurements.md``); with Hopper's
constants the same tables were within the estimate's margin. A GPU whose name the catalogue does not know is never
given another model's constants: :func:`match_device_name` returns ``None`` and the node agent's own measurement
(``gnnsched.gpu.measured``) plans it, or its jobs run alone until one exists.

Where the architecture constants come from:

* ``context_bytes``: the CUDA context PyTorch creates on first use, measured as NVML's per-process used memory minus
  ``torch.cuda.memory_reserved()`` after GNN training steps. Measured on the H100 80GB HBM3 (742 MiB, torch 2.11 +
  CUDA 13, driver 580.159.04); it grows with lazily loaded kernels (610 MiB after the first tensor) and, under MPS,
  with the client's active-thread share (216 MiB at 10 %). The other architectures' values are engineering
  estimates from before any measurement (the H100's estimate was 30 % low), so they are marked assumed and the node
  agent's measurement replaces them on a real node.
* ``cublas_workspace_bytes``: PyTorch's cuBLAS workspace per (handle, stream), one handle per thread that runs cuBLAS
  (a training step has two: the forward's and the autograd engine's device thread). PyTorch picks ``:4096:8``
  (32 MiB) on compute capability 9.0 and later and ``:4096:2:16:8`` (8 MiB + 128 KiB) before
  (``aten/src/ATen/cuda/CublasHandlePool.cpp``, ``getChosenWorkspaceSize``); measured 32 MiB on the H100 and the
  H200 (torch 2.11, the allocator's event history and the allocated-bytes tables). Torch releases before 2.3 used
  the 8 MiB default everywhere (``workspace_rule``).
* ``cublaslt_workspace_bytes``: the cuBLASLt workspace PyTorch takes at the first ``addmm`` with a bias; 1 MiB
  (``CUBLASLT_WORKSPACE_SIZE`` default), measured on the H100 and the H200.
* ``mps_client_bytes``: 0. Under Volta-and-later MPS each client owns its own context (NVIDIA's MPS documentation:
  the saving of context storage is "to a much lesser degree" than pre-Volta), so a client's cost is its own
  ``context_bytes``; the MPS server's context belongs in the node agent's per-GPU reserve.
* ``allocator_overhead_fraction``: 0. The caching allocator's reserved memory is predicted by replaying the trace
  through a model of the allocator (``gnnsched.cuda_allocator``); this is an extra allowance on that peak, kept at 0
  while no GPU measures a proportional gap the model misses.
* ``kernel_scratch_bytes``: 4 MiB, two of the allocator's 2 MiB small-pool segments. CUDA kernels take scratch from the
  caching allocator that no trace of tensors shows (a reduction's global buffer and semaphores,
  ``aten/src/ATen/native/cuda/Reduce.cuh``; CUB's temporary storage), and when the small pool is full at that
  moment the allocator opens a segment the model does not. Measured: after the dropout fix, 9 of the 11 cases whose
  reserved bytes the model under-predicted on the H100 and the H200 (123 cases) were short by one or two small
  segments (docs/gpu-measurements.md, section 10). Part of the device overhead, not of ``cuda_reserved_bytes`` (which
  stays the model's prediction of ``max_memory_reserved``).

The openb trace names two models only by code (``G2``, ``G3``); their specs are undisclosed, so those entries are
assumptions (``assumed=True``) sized from the nodes that carry them.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

MiB = 2**20
GiB = 2**30

Constant = Literal["context", "cublas_workspace", "cublaslt_workspace"]
CONSTANTS: tuple[Constant, ...] = ("context", "cublas_workspace", "cublaslt_workspace")

_SMALL_WORKSPACE = 8 * MiB + 8 * 16 * 1024  # ``:4096:2:16:8``: 2 x 4 MiB + 8 x 16 KiB
_HOPPER_WORKSPACE = 32 * MiB  # ``:4096:8``


class Architecture(BaseModel):
    """A GPU architecture: the compute capabilities it covers and the device constants every model of it shares
    unless the model was measured itself. ``measured`` maps each measured constant to where it was measured."""

    model_config = ConfigDict(frozen=True)

    name: str
    compute_capabilities: tuple[tuple[int, int], ...]
    context_bytes: int = Field(ge=0)
    cublaslt_workspace_bytes: int = Field(default=MiB, ge=0)
    measured: dict[str, str] = Field(default_factory=dict)


ARCHITECTURES: tuple[Architecture, ...] = (
    Architecture(name="Pascal", compute_capabilities=((6, 0), (6, 1)), context_bytes=280 * MiB),
    Architecture(name="Volta", compute_capabilities=((7, 0),), context_bytes=305 * MiB),
    Architecture(name="Turing", compute_capabilities=((7, 5),), context_bytes=260 * MiB),
    Architecture(name="Ampere", compute_capabilities=((8, 0), (8, 6), (8, 7)), context_bytes=420 * MiB),
    Architecture(name="Ada", compute_capabilities=((8, 9),), context_bytes=420 * MiB),
    Architecture(
        name="Hopper", compute_capabilities=((9, 0),), context_bytes=742 * MiB,
        measured={
            "context": "H100 80GB HBM3, torch 2.11.0+cu130, driver 580.159.04, 2026-11-25 (docs/gpu-measurements.md)",
            "cublas_workspace": "H100 80GB HBM3 and H200, torch 2.11.0+cu130, 2026-11-25 and 2026-11-28",
            "cublaslt_workspace": "H100 80GB HBM3 and H200, torch 2.11.0+cu130, 2026-11-25 and 2026-11-28",
        },
    ),
    # Blackwell loads more kernel images per context than Hopper (more SMs, sm_100 / sm_120 cubins); unmeasured, so
    # Hopper's measured context plus a margin until a node measures one.
    Architecture(name="Blackwell", compute_capabilities=((10, 0), (10, 3), (12, 0)), context_bytes=800 * MiB),
)


def architecture(name: str) -> Architecture:
    """The architecture named ``name`` (case-insensitive); ``KeyError`` lists the known ones."""
    for arch in ARCHITECTURES:
        if arch.name.lower() == name.strip().lower():
            return arch
    raise KeyError(f"unknown GPU architecture {name!r}; known: {', '.join(a.name for a in ARCHITECTURES)}")


def architecture_of(compute_capability: tuple[int, int]) -> Architecture | None:
    """The architecture of a compute capability (NVML's ``nvmlDeviceGetCudaComputeCapability``), or None."""
    for arch in ARCHITECTURES:
        if tuple(compute_capability) in arch.compute_capabilities:
            return arch
    return None


def _torch_release(torch_version: str | None) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", torch_version or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def workspace_rule(compute_capability: tuple[int, int], torch_version: str | None = None) -> int:
    """The cuBLAS workspace PyTorch takes per (handle, stream) on this compute capability with this torch:
    32 MiB (``:4096:8``) on 9.0 and later from torch 2.3, else 8 MiB + 128 KiB (``:4096:2:16:8``). An unknown torch
    version is taken as a current one (the larger workspace where it applies: never an under-estimate there)."""
    release = _torch_release(torch_version)
    if tuple(compute_capability) >= (9, 0) and (release is None or release >= (2, 3)):
        return _HOPPER_WORKSPACE
    return _SMALL_WORKSPACE


class GPUModel(BaseModel):
    """A GPU model's capacity and the constants the estimator and the runtime prior need.

    ``provenance`` maps each device constant (``context``, ``cublas_workspace``, ``cublaslt_workspace``) to
    ``"measured: <where>"`` (on this model), ``"architecture: ..."`` (its architecture's value, measured on another
    model of it) or ``"assumed: ..."`` (never measured); ``nvml_names`` are the exact names NVML reports for the board
    (matched case-insensitively by :func:`match_device_name`)."""

    model_config = ConfigDict(frozen=True)

    name: str
    memory_bytes: int = Field(gt=0)
    bandwidth_bytes_per_s: float = Field(gt=0)
    fp32_flops_per_s: float = Field(gt=0)
    sm_count: int = Field(gt=0)
    compute_capability: tuple[int, int] = (8, 0)
    architecture: str = "Ampere"
    max_mps_clients: int = Field(default=48, gt=0)
    context_bytes: int = Field(default=300 * MiB, ge=0)
    cublas_workspace_bytes: int = Field(default=_SMALL_WORKSPACE, ge=0)
    cublaslt_workspace_bytes: int = Field(default=MiB, ge=0)
    mps_client_bytes: int = Field(default=0, ge=0)
    allocator_overhead_fraction: float = Field(default=0.0, ge=0, lt=1)
    kernel_scratch_bytes: int = Field(default=4 * MiB, ge=0)
    provenance: dict[str, str] = Field(default_factory=dict)
    assumed: bool = False
    aliases: tuple[str, ...] = ()
    nvml_names: tuple[str, ...] = ()
    source: str = ""

    @property
    def overheads_verified(self) -> bool:
        """Every device constant was measured on this very model."""
        return all(self.provenance.get(c, "").startswith("measured") for c in CONSTANTS)

    def unmeasured(self) -> list[str]:
        """The device constants not measured on this model (what ``gnnsched doctor`` and the estimate's note name)."""
        return [c for c in CONSTANTS if not self.provenance.get(c, "").startswith("measured")]


def _model(
    *, name: str, memory_mib: int, bandwidth: float, fp32: float, sms: int, cc: tuple[int, int], nvml: tuple[str, ...],
    source: str, aliases: tuple[str, ...] = (), context_mib: int | None = None, measured: dict[str, str] | None = None,
    **extra: Any,
) -> GPUModel:
    """A catalogue entry whose device constants come from its architecture (``cc``) and the current torch, except
    those ``measured`` on this very model (``context_mib`` then gives the measured context)."""
    arch = architecture_of(cc)
    if arch is None:
        raise ValueError(f"{name}: compute capability {cc} belongs to no architecture")
    own = dict(measured or {})
    provenance: dict[str, str] = {}
    for constant in CONSTANTS:
        if constant in own:
            provenance[constant] = f"measured: {own[constant]}"
        elif constant in arch.measured:
            provenance[constant] = f"architecture: {arch.name}'s value, measured on {arch.measured[constant]}"
        else:
            provenance[constant] = f"assumed: {arch.name}'s default, never measured"
    context = context_mib * MiB if context_mib is not None else arch.context_bytes
    return GPUModel(
        name=name, memory_bytes=memory_mib * MiB, bandwidth_bytes_per_s=bandwidth, fp32_flops_per_s=fp32,
        sm_count=sms, compute_capability=cc, architecture=arch.name, context_bytes=context,
        cublas_workspace_bytes=workspace_rule(cc), cublaslt_workspace_bytes=arch.cublaslt_workspace_bytes,
        provenance=provenance, aliases=aliases, nvml_names=nvml, source=source, **extra,
    )


_CATALOGUE: tuple[GPUModel, ...] = (
    _model(name="V100-16GB", memory_mib=16160, bandwidth=900e9, fp32=15.7e12, sms=80, cc=(7, 0),
           nvml=("Tesla V100-SXM2-16GB", "Tesla V100-PCIE-16GB"), aliases=("V100M16", "V100"),
           source="NVIDIA V100 datasheet (SXM2)"),
    _model(name="V100-32GB", memory_mib=32510, bandwidth=900e9, fp32=15.7e12, sms=80, cc=(7, 0),
           nvml=("Tesla V100-SXM2-32GB", "Tesla V100-PCIE-32GB", "Tesla V100S-PCIE-32GB"), aliases=("V100M32", "V100S"),
           source="NVIDIA V100 datasheet (SXM2)"),
    _model(name="P100-16GB", memory_mib=16280, bandwidth=732e9, fp32=10.6e12, sms=56, cc=(6, 0),
           nvml=("Tesla P100-SXM2-16GB", "Tesla P100-PCIE-16GB"), aliases=("P100",), max_mps_clients=16,
           source="NVIDIA P100 datasheet (SXM2); pre-Volta MPS allows 16 clients"),
    _model(name="T4", memory_mib=15360, bandwidth=320e9, fp32=8.1e12, sms=40, cc=(7, 5),
           nvml=("Tesla T4",), source="NVIDIA T4 datasheet"),
    _model(name="A100-40GB", memory_mib=40960, bandwidth=1555e9, fp32=19.5e12, sms=108, cc=(8, 0),
           nvml=("NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB"), aliases=("A100", "A100-SXM4-40GB"),
           source="NVIDIA A100 datasheet (SXM4 40GB)"),
    _model(name="A100-80GB", memory_mib=81920, bandwidth=2039e9, fp32=19.5e12, sms=108, cc=(8, 0),
           nvml=("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"), aliases=("A100-SXM4-80GB",),
           source="NVIDIA A100 datasheet (SXM4 80GB)"),
    _model(name="A30", memory_mib=24576, bandwidth=933e9, fp32=10.3e12, sms=56, cc=(8, 0),
           nvml=("NVIDIA A30",), source="NVIDIA A30 datasheet"),
    _model(name="A10", memory_mib=23028, bandwidth=600e9, fp32=31.2e12, sms=72, cc=(8, 6),
           nvml=("NVIDIA A10",), source="NVIDIA A10 datasheet"),
    _model(name="L4", memory_mib=23034, bandwidth=300e9, fp32=30.3e12, sms=58, cc=(8, 9),
           nvml=("NVIDIA L4",), source="NVIDIA L4 datasheet"),
    _model(name="L20", memory_mib=46068, bandwidth=864e9, fp32=59.8e12, sms=92, cc=(8, 9),
           nvml=("NVIDIA L20",), source="NVIDIA L20 product brief"),
    _model(name="L40S", memory_mib=46068, bandwidth=864e9, fp32=91.6e12, sms=142, cc=(8, 9),
           nvml=("NVIDIA L40S",), source="NVIDIA L40S datasheet"),
    _model(name="RTX-6000-Ada", memory_mib=49140, bandwidth=960e9, fp32=91.1e12, sms=142, cc=(8, 9),
           nvml=("NVIDIA RTX 6000 Ada Generation",), aliases=("RTX 6000 Ada",),
           source="NVIDIA RTX 6000 Ada Generation datasheet"),
    _model(name="H100-80GB", memory_mib=81559, bandwidth=3.35e12, fp32=67e12, sms=132, cc=(9, 0),
           nvml=("NVIDIA H100 80GB HBM3",), aliases=("H100", "H100-SXM5-80GB"), context_mib=742,
           measured={c: "H100 80GB HBM3, torch 2.11.0+cu130, driver 580.159.04, 2026-11-25 "
                        "(docs/gpu-measurements.md)" for c in CONSTANTS},
           source="NVIDIA H100 datasheet (SXM5)"),
    _model(name="H100-PCIe", memory_mib=81559, bandwidth=2.0e12, fp32=51.2e12, sms=114, cc=(9, 0),
           nvml=("NVIDIA H100 PCIe",), source="NVIDIA H100 datasheet (PCIe)"),
    _model(name="H100-NVL", memory_mib=95830, bandwidth=3.9e12, fp32=60e12, sms=132, cc=(9, 0),
           nvml=("NVIDIA H100 NVL",), source="NVIDIA H100 NVL datasheet"),
    _model(name="H200", memory_mib=143771, bandwidth=4.8e12, fp32=67e12, sms=132, cc=(9, 0),
           nvml=("NVIDIA H200",), aliases=("H200-141GB", "H200-SXM-141GB"),
           measured={"cublas_workspace": "H200, torch 2.11.0+cu130, driver 580.159.04, 2026-11-28 "
                                         "(the allocated-bytes tables, docs/measurements/h200-2026-11-28)",
                     "cublaslt_workspace": "H200, torch 2.11.0+cu130, driver 580.159.04, 2026-11-28"},
           source="NVIDIA H200 datasheet (SXM); memory as nvidia-smi reported it on 2026-11-28"),
    _model(name="H200-NVL", memory_mib=143771, bandwidth=4.8e12, fp32=60e12, sms=132, cc=(9, 0),
           nvml=("NVIDIA H200 NVL",), source="NVIDIA H200 NVL datasheet"),
    _model(name="GH200", memory_mib=97871, bandwidth=4.0e12, fp32=67e12, sms=132, cc=(9, 0),
           nvml=("NVIDIA GH200 480GB",), aliases=("GH200-96GB",),
           source="NVIDIA GH200 Grace Hopper datasheet (96 GB HBM3)"),
    _model(name="GH200-144GB", memory_mib=146331, bandwidth=4.9e12, fp32=67e12, sms=132, cc=(9, 0),
           nvml=("NVIDIA GH200 144G HBM3e",), source="NVIDIA GH200 Grace Hopper datasheet (144 GB HBM3e)"),
    _model(name="H20", memory_mib=97871, bandwidth=4.0e12, fp32=44e12, sms=78, cc=(9, 0),
           nvml=("NVIDIA H20",), source="NVIDIA H20 product brief"),
    _model(name="B200", memory_mib=183359, bandwidth=8.0e12, fp32=80e12, sms=148, cc=(10, 0),
           nvml=("NVIDIA B200",), source="NVIDIA DGX B200 / HGX B200 datasheet (per GPU)"),
    _model(name="RTX-PRO-6000", memory_mib=97887, bandwidth=1.79e12, fp32=125e12, sms=188, cc=(12, 0),
           nvml=("NVIDIA RTX PRO 6000 Blackwell Server Edition", "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
                 "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition"),
           aliases=("RTX PRO 6000", "RTX-PRO-6000-Blackwell"),
           source="NVIDIA RTX PRO 6000 Blackwell datasheet"),
    _model(name="G2", memory_mib=16160, bandwidth=900e9, fp32=15.7e12, sms=80, cc=(7, 0), nvml=(), assumed=True,
           source="openb trace code, specs undisclosed; assumed V100-16GB-class"),
    _model(name="G3", memory_mib=32510, bandwidth=900e9, fp32=15.7e12, sms=80, cc=(7, 0), nvml=(), assumed=True,
           source="openb trace code, specs undisclosed; assumed V100-32GB-class"),
)

DEFAULT_GPU_MODEL = "A100-80GB"
"""The model a plan assumes before any GPU has reported (the runtime prior's and the fake clusters' default). Never
used for the memory of a GPU that reported another name."""


def _key(name: str) -> str:
    return re.sub(r"[\s_]+", "-", name.strip().lower())


def gpu_models() -> tuple[GPUModel, ...]:
    """Every catalogued model, in a stable order."""
    return _CATALOGUE


_BY_NAME: dict[str, GPUModel] = {
    _key(n): model for model in reversed(_CATALOGUE) for n in (model.name, *model.aliases, *model.nvml_names)
}
"""Every name, alias and NVML name (normalised by ``_key``) -> its entry, built once and never changed: the planner and
the extender look a GPU's model up per reported GPU. Reversed so that an earlier entry wins a shared name."""


def find_gpu_model(name: str) -> GPUModel | None:
    """The model called ``name`` (catalogue name, alias or exact NVML name, case-insensitive), or None."""
    return _BY_NAME.get(_key(name))


def get_gpu_model(name: str) -> GPUModel:
    """Look a model up by catalogue name, alias or NVML name; ``KeyError`` names the unknown one and lists the known."""
    model = find_gpu_model(name)
    if model is None:
        known = ", ".join(m.name for m in _CATALOGUE)
        raise KeyError(f"unknown GPU model {name!r}; known models: {known} (or the NVML name of any of them, "
                       f"e.g. 'NVIDIA H200')")
    return model


def match_device_name(device_name: str, total_bytes: int | None = None) -> GPUModel | None:
    """The catalogue entry of a device NVML reports (``NVIDIA A100-SXM4-80GB``), or None when the name is not
    catalogued. No family or prefix guess: a GPU outside the catalogue never takes another model's constants (an H200
    once ran on the A100's and every job was under-predicted). ``total_bytes`` is accepted for callers that have it
    and ignored: NVML's name tells the board apart (memory variants have names of their own)."""
    del total_bytes
    return find_gpu_model(device_name)
