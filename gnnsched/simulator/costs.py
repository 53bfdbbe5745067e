"""The parts of the cost model that are the simulator's own: oversubscription under MPS, and start-up time.

Everything else (solo runtime, peak memory, co-location slowdown) comes from the core modules through
:mod:`gnnsched.simulator.adapters`.

**UVM paging.** With unified memory enabled (the papers' MPS baselines), a GPU whose co-located working sets exceed
its memory keeps the excess in host memory and pages it over the host link. If a fraction ``f`` of the bytes the
jobs touch lives on the host, and the jobs are memory-bound (GNN aggregation is), the time per step grows from
``1`` to ``(1 - f) + f * hbm / link``: device bandwidth over host-link bandwidth. On a V100 (900 GB/s HBM2 behind
PCIe 3.0 x16, 15.75 GB/s) 15 % oversubscription costs ~9x, the magnitude CoGNN measured (9.87x for GAT pairs under
MPS with UVM, seed 002 section II-C). Without UVM the allocation that does not fit fails: the job is OOM-killed
after its start-up (the process has to import torch, create its CUDA context and load the graph before it allocates
its working set), and Kubernetes restarts it after a back-off (10 s, doubling, at most 6 min, as kubelet's
CrashLoopBackOff).

**Host links** are the datasheet figures of the host interface each catalogue model ships with (PCIe generation x16,
one direction).

**Start-up.** A pod that gets a whole GPU (Kubernetes default) pays its process start-up (interpreter, torch and PyG
imports, CUDA context) before its first step while holding the GPU; PipeSwitch-like temporal sharing pre-initialises
workers and pipelines the next job's start-up behind the current one, so it pays none. Under MPS co-location a
start-up overlaps other jobs' compute but still delays the job itself. The default figure is measured, see
``STARTUP_S``.
"""

from __future__ import annotations

from gnnsched.policies import STARTUP_SECONDS

# Host-interface bandwidth per direction (bytes/s): PCIe 3.0 x16 = 15.75 GB/s, 4.0 = 31.5 GB/s, 5.0 = 63 GB/s.
_PCIE3 = 15.75e9
_PCIE4 = 31.5e9
_PCIE5 = 63.0e9
HOST_LINK_BYTES_PER_S: dict[str, float] = {
    "V100-16GB": _PCIE3, "V100-32GB": _PCIE3, "P100-16GB": _PCIE3, "T4": _PCIE3, "G2": _PCIE3, "G3": _PCIE3,
    "A100-40GB": _PCIE4, "A100-80GB": _PCIE4, "A10": _PCIE4, "L4": _PCIE4, "H100-80GB": _PCIE5,
}

STARTUP_S = STARTUP_SECONDS
"""Process start-up before a job's first step, seconds. Measured on this project's CPU machine as the wall time of
``python -c "import torch, torch_geometric"`` (4.37 s and 4.79 s, load average 4.3 on 2 cores); a GPU adds CUDA context
creation on top, which is
not measured here, so this is a lower bound."""


def host_link(gpu_model: str) -> float:
    """Host-link bandwidth of a catalogue model (PCIe 3.0 when unknown: the slowest, so the penalty is not hidden)."""
    return HOST_LINK_BYTES_PER_S.get(gpu_model, _PCIE3)


def uvm_slowdown(used_bytes: int, total_bytes: int, device_bw: float, link_bw: float) -> float:
    """Slowdown of every job on a GPU whose working sets (``used_bytes``) exceed ``total_bytes`` under UVM."""
    if used_bytes <= total_bytes or used_bytes <= 0:
        return 1.0
    host_fraction = (used_bytes - total_bytes) / used_bytes
    return (1.0 - host_fraction) + host_fraction * (device_bw / link_bw)
