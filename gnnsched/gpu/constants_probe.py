"""Measure this GPU's device constants as a job's process meets them: ``python -m gnnsched.gpu.constants_probe --json``.

Why: the catalogue's context and workspace sizes are written once per architecture and most were never measured on the
board, the driver or the torch a node runs (the H100's catalogue context was 30 % low, docs/gpu-measurements.md §2).
The node agent runs this probe once per GPU model on its node, as an MPS client set up as its jobs are
(``CUDA_VISIBLE_DEVICES`` = the GPU's UUID, the pipe directory, the active-thread share), and publishes what it prints
in ``GPUStatus.measured`` (``gnnsched.node_agent.constants``).

What it measures, in one fresh process:

* the **context**: NVML's used memory of this process minus the allocator's reserved bytes, after a matmul forward
  and backward ran on two threads and one training and one inference step of each built-in GNN (GCN, GraphSAGE,
  GIN, GAT) ran on a tiny graph (:func:`gnn_steps`), so the kernels a GNN job loads lazily are in: on the H100 the
  context was 676 MiB after a matmul and 742 MiB after GNN training steps. A job that runs kernels none of these
  load (a custom extension) can take more; the closed loop corrects that from what NVML observes. Under MPS
  it scales with ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (740 MiB at 100 %, 216 MiB at 10 % on an H100). Where NVML
  does not list this process (another PID namespace), limit − free − reserved under an MPS memory limit stands in:
  the driver reports a client's free memory as its limit minus what it holds;
* the **cuBLAS workspace**: the allocator's allocated bytes grow by it (beyond the product's own block) at a thread's
  first matmul; one per thread that runs cuBLAS;
* the **cuBLASLt workspace**: the same at the first ``addmm`` with a bias (torch's cuBLASLt epilogue path);
* the **allocator's rounding**: a few test allocations, each on a fresh stream (whose pools are empty, so each needs
  a segment of its own), whose allocated and reserved growth must follow ``gnnsched.cuda_allocator``'s rules (512-byte
  blocks; 2 MiB, 20 MiB or 2 MiB-rounded segments). ``expandable_segments`` or another allocator backend break them.

Everything but :func:`main`'s torch calls is plain Python over recorded figures, so it is tested without a GPU. torch
is imported only in :func:`main`: the agent imports this module to parse the output.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from pydantic import ValidationError

from gnnsched.contract import GPUMeasurement
from gnnsched.cuda_allocator import allocation_size, is_small, round_size, should_split

MiB = 1 << 20

ALLOCATED = "allocated_bytes.all.current"
RESERVED = "reserved_bytes.all.current"
"""The ``torch.cuda.memory_stats()`` keys the probe reads (bytes of live blocks, bytes of segments)."""

TEST_ALLOCATIONS: tuple[int, ...] = (1, MiB + 1, 11 * MiB)
"""Requests that each exercise one rule: a small block split off a 2 MiB segment, a just-large one split off a shared
20 MiB segment, and one past 10 MiB in a segment of its size rounded to 2 MiB (12 MiB), handed out whole because the
1 MiB left over is not more than 1 MiB."""

MATMUL_N = 1024
"""The square fp32 matmul the probe runs: large enough for cuBLAS to take its workspace, small next to any GPU."""

OUTPUT_PREFIX = "gnnsched-gpu-constants: "
"""The probe prints its one JSON line after this prefix, so the agent finds it among whatever torch or the driver
write on stdout."""


class ProbeOutputError(ValueError):
    """The probe's output held no valid measurement; the message says what was wrong (logged by the agent)."""


@dataclass(frozen=True, slots=True)
class AllocationSample:
    """One test allocation of ``requested`` bytes on a fresh stream: how the allocator's counters grew."""

    requested: int
    allocated_delta: int
    reserved_delta: int


def stat(stats: Mapping[str, Any], key: str) -> int:
    """One counter of a ``torch.cuda.memory_stats()`` dict (0 when absent: a counter never touched is not listed)."""
    value = stats.get(key, 0)
    return int(value) if isinstance(value, int | float) else 0


def workspace_bytes(before: Mapping[str, Any], after: Mapping[str, Any], result_bytes: int) -> int:
    """What a library kept allocated across one call: the allocated bytes' growth less the block of the call's own
    result (rounded as the allocator rounds it). Never negative."""
    grown = stat(after, ALLOCATED) - stat(before, ALLOCATED)
    return max(0, grown - (round_size(result_bytes) if result_bytes > 0 else 0))


def context_bytes(nvml_used: int | None, reserved: int, mps_limit: int | None = None,
                  free: int | None = None) -> int | None:
    """The context as the driver charges it: NVML's used memory of the process minus what its allocator reserved; or,
    where NVML does not list the process, limit − free − reserved under an MPS memory limit. None when neither is
    known."""
    if nvml_used is not None:
        return max(0, nvml_used - reserved)
    if mps_limit is not None and free is not None:
        return max(0, mps_limit - free - reserved)
    return None


def parse_mps_limit(value: str | None) -> int | None:
    """``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` for device 0 in bytes (``0=4096M`` -> 4 GiB), or None."""
    for part in (value or "").split(","):
        dev, _, amount = part.partition("=")
        if dev.strip() != "0" or not amount:
            continue
        amount = amount.strip().upper()
        units = {"K": 1 << 10, "M": MiB, "G": 1 << 30}
        try:
            if amount[-1] in units:
                return int(float(amount[:-1]) * units[amount[-1]])
            return int(amount)
        except ValueError:
            return None
    return None


def check_allocator(samples: Sequence[AllocationSample], alloc_conf: str = "",
                    backend: str = "native") -> tuple[bool, str]:
    """Whether the allocator behaved as ``gnnsched.cuda_allocator`` models it, and a short account of it.

    Each sample was made on a fresh stream, so it needed a segment of its own: the reserved bytes grow by that
    segment (``allocation_size`` of the rounded request) and the allocated bytes by the rounded request, or by the
    whole segment when the rest is too small to split off (``should_split``). ``alloc_conf`` is
    ``PYTORCH_CUDA_ALLOC_CONF`` and ``backend`` torch's allocator backend: expandable segments or another backend
    are named even when the samples happen to agree."""
    problems: list[str] = []
    if backend != "native":
        problems.append(f"allocator backend {backend!r}, not native")
    conf = alloc_conf.replace(" ", "").lower()
    if "expandable_segments:true" in conf:
        problems.append("PYTORCH_CUDA_ALLOC_CONF turns on expandable_segments")
    for s in samples:
        rounded = round_size(s.requested)
        want_reserved = allocation_size(rounded)
        want_alloc = rounded if should_split(want_reserved, rounded, is_small(rounded)) else want_reserved
        if s.allocated_delta != want_alloc or s.reserved_delta != want_reserved:
            problems.append(f"{s.requested} B: allocated +{s.allocated_delta} reserved +{s.reserved_delta}, "
                            f"model +{want_alloc} +{want_reserved}")
    if not samples:
        problems.append("no test allocation was made")
    if problems:
        return False, "; ".join(problems)[:512]
    return True, f"{len(samples)} test allocations rounded and segmented as modelled"


def parse_output(text: str) -> GPUMeasurement:
    """The measurement in a probe's stdout: the last line starting with :data:`OUTPUT_PREFIX`, or else the last line
    that is a JSON object. Raises :class:`ProbeOutputError` naming what is missing or invalid."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    marked = [line[len(OUTPUT_PREFIX):] for line in lines if line.startswith(OUTPUT_PREFIX)]
    candidates = marked or [line for line in lines if line.startswith("{")]
    if not candidates:
        tail = lines[-1][:200] if lines else "nothing"
        raise ProbeOutputError(f"no measurement line in the probe's output (last line: {tail!r})")
    try:
        obj = json.loads(candidates[-1])
    except json.JSONDecodeError as exc:
        raise ProbeOutputError(f"the measurement line is not JSON: {exc}") from None
    try:
        return GPUMeasurement.model_validate(obj)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err.get("loc", ())) or "measurement"
        raise ProbeOutputError(f"the measurement is invalid: {where}: {err.get('msg', 'invalid')}") from None


def output_line(measurement: GPUMeasurement) -> str:
    """The one line the probe prints (what :func:`parse_output` reads back)."""
    return OUTPUT_PREFIX + json.dumps(measurement.wire(), sort_keys=True)


GNN_ARCHS = ("gcn", "sage", "gin", "gat")
"""The built-in architectures whose kernels the probe loads before it reads the context."""


def gnn_steps(device: str) -> int:
    """One training and one inference step of each built-in architecture on a tiny synthetic graph on ``device``
    (what loads the scatter, gather, index and softmax kernels a GNN job's context holds); returns the steps run.
    Runs on any device, so it is tested on the CPU."""
    from gnnsched.models import build_model, make_graph
    from gnnsched.portable.step import run_step
    from gnnsched.spec import parse_spec

    steps = 0
    for arch in GNN_ARCHS:
        for mode in ("train", "infer"):
            model_spec: dict[str, object] = {"arch": arch, "layers": 2, "hidden": 16}
            if arch == "gat":
                model_spec["heads"] = 2
            spec = parse_spec({"mode": mode, "model": model_spec,
                               "graph": {"nodes": 256, "edges": 1024, "features": 16, "classes": 4}})
            graph = make_graph(spec, 0)
            model = build_model(spec, graph=graph, device=device)
            run_step(model, graph.to(device), mode)
            steps += 1
    return steps


# --- the part that needs a GPU ---------------------------------------------------------------------------------


def _nvml_used(pid: int) -> tuple[int | None, str | None, str | None]:  # pragma: no cover - needs a GPU
    """NVML's used memory of ``pid`` on the one visible GPU, the driver version and the CUDA driver version."""
    try:
        import pynvml
    except ImportError:
        return None, None, None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None, None, None
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else str(driver)
        cuda = None
        try:
            v = int(pynvml.nvmlSystemGetCudaDriverVersion())
            cuda = f"{v // 1000}.{v % 1000 // 10}"
        except pynvml.NVMLError:
            pass
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
        try:
            handle = (pynvml.nvmlDeviceGetHandleByUUID(visible) if visible.startswith(("GPU-", "MIG-"))
                      else pynvml.nvmlDeviceGetHandleByIndex(int(visible or 0)))
        except (pynvml.NVMLError, ValueError):
            return None, driver, cuda
        used: int | None = None
        for fn in (pynvml.nvmlDeviceGetComputeRunningProcesses, pynvml.nvmlDeviceGetMPSComputeRunningProcesses):
            try:
                for p in fn(handle):
                    if int(p.pid) == pid and p.usedGpuMemory is not None:
                        used = max(used or 0, int(p.usedGpuMemory))
            except pynvml.NVMLError:
                continue
        return used, driver, cuda
    finally:
        pynvml.nvmlShutdown()


def measure(now: Callable[[], datetime] | None = None) -> GPUMeasurement:  # pragma: no cover - needs a GPU
    """Run the measurement on the one visible GPU (see the module's docstring)."""
    import threading

    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("torch sees no CUDA device (CUDA_VISIBLE_DEVICES="
                           f"{os.environ.get('CUDA_VISIBLE_DEVICES', '')!r})")
    dev = torch.device("cuda", 0)
    torch.zeros(1, device=dev)
    torch.cuda.synchronize()

    def stats() -> dict[str, Any]:
        torch.cuda.synchronize()
        return dict(torch.cuda.memory_stats(dev))

    a = torch.randn(MATMUL_N, MATMUL_N, device=dev)
    b = torch.randn(MATMUL_N, MATMUL_N, device=dev)
    before = stats()
    c = a @ b
    cublas = workspace_bytes(before, stats(), c.numel() * c.element_size())
    del c
    bias = torch.randn(MATMUL_N, device=dev)
    before = stats()
    d = torch.addmm(bias, a, b)
    cublaslt = workspace_bytes(before, stats(), d.numel() * d.element_size())
    del d

    errors: list[BaseException] = []

    def step() -> None:  # a forward and backward on this thread: its own cuBLAS handle, workspace and kernels
        try:
            w = torch.randn(MATMUL_N, MATMUL_N, device=dev, requires_grad=True)
            loss = torch.relu(torch.addmm(bias, a, w)).sum()
            loss.backward()
            torch.cuda.synchronize()
        except BaseException as exc:  # re-raised on the main thread
            errors.append(exc)

    step()
    worker = threading.Thread(target=step, name="probe-second-thread")
    worker.start()
    worker.join()
    if errors:
        raise errors[0]
    gnn_steps("cuda")
    torch.cuda.synchronize()
    reserved = int(torch.cuda.memory_reserved(dev))
    used, driver, cuda_driver = _nvml_used(os.getpid())
    free, _ = torch.cuda.mem_get_info(dev)
    context = context_bytes(used, reserved, parse_mps_limit(os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")),
                            int(free))
    if context is None:
        raise RuntimeError("NVML does not list this process and no MPS memory limit is set: the context cannot be "
                           "told apart from the rest of the GPU's memory")

    samples: list[AllocationSample] = []
    for n in TEST_ALLOCATIONS:
        stream = torch.cuda.Stream(dev)  # fresh pools: the request needs a segment of its own
        with torch.cuda.stream(stream):
            before = stats()
            t = torch.empty(n, dtype=torch.uint8, device=dev)
            after = stats()
            samples.append(AllocationSample(n, stat(after, ALLOCATED) - stat(before, ALLOCATED),
                                            stat(after, RESERVED) - stat(before, RESERVED)))
            del t
    backend_name = "native"
    get_backend = getattr(torch.cuda.memory, "get_allocator_backend", None)
    if callable(get_backend):
        backend_name = str(get_backend())
    matches, detail = check_allocator(samples, os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""), backend_name)
    major, minor = torch.cuda.get_device_capability(dev)
    atp = os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "").strip()
    return GPUMeasurement(
        source="nvml", measured_at=(now or (lambda: datetime.now(tz=timezone.utc)))(), context_bytes=context,
        cublas_workspace_bytes=cublas, cublaslt_workspace_bytes=cublaslt, allocator_matches_model=matches,
        allocator_detail=detail, active_thread_percentage=int(atp) if atp.isdigit() and 1 <= int(atp) <= 100 else None,
        driver_version=driver, cuda_version=torch.version.cuda or cuda_driver, torch_version=torch.__version__,
        compute_capability=f"{major}.{minor}",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Measure and print; exit 1 with the reason on stderr when the measurement cannot be made."""
    parser = argparse.ArgumentParser(prog="python -m gnnsched.gpu.constants_probe", description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print the measurement as one JSON line (the agent's "
                                                            "form); without it, also a readable summary")
    args = parser.parse_args(argv)
    try:
        m = measure()
    except Exception as exc:  # pragma: no cover - needs a GPU
        print(f"gnnsched.gpu.constants_probe: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(output_line(m), flush=True)  # pragma: no cover - needs a GPU
    if not args.json:  # pragma: no cover - needs a GPU
        print(f"context {m.context_bytes / MiB:.0f} MiB at {m.active_thread_percentage or 100} % active threads, "
              f"cuBLAS workspace {m.cublas_workspace_bytes / MiB:.2f} MiB, "
              f"cuBLASLt {m.cublaslt_workspace_bytes / MiB:.2f} MiB, allocator: {m.allocator_detail}")
    return 0  # pragma: no cover - needs a GPU


if __name__ == "__main__":
    raise SystemExit(main())
