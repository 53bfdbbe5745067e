"""The CUDA caching-allocator model against totals worked out by hand from PyTorch's C++ rules (v2.6.0
``c10/cuda/CUDACachingAllocator.cpp``; the rule numbers are those of ``gnnsched.cuda_allocator``), and the estimator's
use of it: ``cuda_reserved_bytes`` in whole 2 MiB units, at least the traced peak, within ``admit_bytes``."""

from __future__ import annotations

import json
import math
from collections.abc import Hashable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gnnsched.cli import app
from gnnsched.cuda_allocator import CachingAllocatorModel, allocation_size, replay, round_size
from gnnsched.estimator import _pair_reused_frees, cuda_allocation_events, estimate, trace_step
from gnnsched.spec import load_job

MiB = 1 << 20
KiB = 1 << 10
ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
runner = CliRunner()


def _alloc(*sizes: int) -> list[tuple[int, int, int]]:
    return [(1, k, n) for k, n in enumerate(sizes)]


# --- rule 1: zero-byte requests ---------------------------------------------------------------------------------


def test_zero_byte_requests_reserve_nothing() -> None:
    model = CachingAllocatorModel()
    assert model.malloc(0) is None
    peak = replay([(1, "a", 0), (-1, "a", 0)])
    assert (peak.reserved_bytes, peak.allocated_bytes, peak.segments) == (0, 0, 0)


# --- rule 2: rounding to 512 bytes ------------------------------------------------------------------------------


def test_requests_round_up_to_512_bytes() -> None:
    assert [round_size(n) for n in (1, 511, 512, 513, 1024, 1025)] == [512, 512, 512, 1024, 1024, 1536]
    model = CachingAllocatorModel()
    a, b = model.malloc(1), model.malloc(513)
    assert a is not None and b is not None and (a.size, b.size) == (512, 1024)
    # Both carved from one 2 MiB small segment: 512 + 1024 allocated, 2 MiB reserved.
    assert (model.allocated, model.reserved, model.segments) == (1536, 2 * MiB, 1)


# --- rules 3 and 4: pools and segment sizes ---------------------------------------------------------------------


def test_small_requests_pack_into_2mib_segments() -> None:
    # 4 x 512 KiB fill one 2 MiB segment exactly (the last takes the 512 KiB remainder whole); the fifth opens another.
    assert replay(_alloc(*[512 * KiB] * 4)).reserved_bytes == 2 * MiB
    peak = replay(_alloc(*[512 * KiB] * 5))
    assert (peak.reserved_bytes, peak.segments, peak.allocated_bytes) == (4 * MiB, 2, 5 * 512 * KiB)


def test_one_mib_is_small_but_one_mib_plus_one_byte_is_large() -> None:
    # 1 MiB -> small pool, 2 MiB segment, 1 MiB left in it. 1 MiB + 1 rounds to 1 MiB + 512: large pool, so the
    # small segment's free MiB cannot serve it and a 20 MiB segment is made: 22 MiB reserved.
    peak = replay(_alloc(MiB, MiB + 1))
    assert (peak.reserved_bytes, peak.segments) == (22 * MiB, 2)


def test_a_small_request_never_uses_a_large_pool_block() -> None:
    # 4 MiB -> 20 MiB segment, split (16 MiB free in the large pool); 1 KiB still opens a 2 MiB small segment.
    assert replay(_alloc(4 * MiB, KiB)).reserved_bytes == 22 * MiB


@pytest.mark.parametrize(
    ("request_bytes", "segment"),
    [
        (MiB + 512, 20 * MiB),  # just large: kLargeBuffer
        (5 * MiB, 20 * MiB),
        (10 * MiB - 512, 20 * MiB),  # still under kMinLargeAlloc
        (10 * MiB, 10 * MiB),  # kMinLargeAlloc itself: rounded to 2 MiB, here exact
        (11 * MiB + 1, 12 * MiB),  # 11 MiB + 512 rounded up to 2 MiB units
        (100 * MiB + 3, 102 * MiB),
    ],
)
def test_segment_size_of_a_new_large_allocation(request_bytes: int, segment: int) -> None:
    assert allocation_size(round_size(request_bytes)) == segment
    assert replay(_alloc(request_bytes)).reserved_bytes == segment


# --- rule 5: best fit -------------------------------------------------------------------------------------------


def test_best_fit_takes_the_smallest_cached_block_that_fits() -> None:
    # Two exact segments, 12 MiB and 16 MiB, both freed. 11 MiB takes the 12 MiB block (best fit; the 1 MiB
    # remainder is not > 1 MiB, so unsplit), leaving the 16 MiB block for 15 MiB: nothing new is reserved.
    # Worst fit would split 16 for 11 and need a new 16 MiB segment for 15.
    events = [(1, "a", 12 * MiB), (1, "b", 16 * MiB), (-1, "a", 0), (-1, "b", 0), (1, "c", 11 * MiB),
              (1, "d", 15 * MiB)]
    peak = replay(events)
    assert (peak.reserved_bytes, peak.segments, peak.allocated_bytes) == (28 * MiB, 2, 28 * MiB)


def test_equal_sizes_reuse_the_lowest_address_first() -> None:
    model = CachingAllocatorModel()
    a, b = model.malloc(12 * MiB), model.malloc(12 * MiB)
    assert a is not None and b is not None and a.addr < b.addr
    model.free(b)
    model.free(a)
    again = model.malloc(12 * MiB)
    assert again is a and model.reserved == 24 * MiB


# --- rule 6: splitting ------------------------------------------------------------------------------------------


def test_large_block_splits_only_when_more_than_1mib_remains() -> None:
    # 19 MiB gets a 20 MiB segment (rounded to 2 MiB units) and leaves exactly 1 MiB: not split, the whole 20 MiB is
    # handed out (and counts as allocated); 2 MiB then needs a second segment.
    model = CachingAllocatorModel()
    block = model.malloc(19 * MiB)
    assert block is not None and block.size == 20 * MiB and model.allocated == 20 * MiB
    model.malloc(2 * MiB)
    assert model.reserved == 40 * MiB
    # A cached 20 MiB block (a 5 MiB request's kLargeBuffer segment, freed) serving 18 MiB leaves 2 MiB: split, and
    # a 2 MiB request fits the remainder.
    events = [(1, "a", 5 * MiB), (-1, "a", 0), (1, "b", 18 * MiB), (1, "c", 2 * MiB)]
    peak = replay(events)
    assert (peak.reserved_bytes, peak.segments, peak.allocated_bytes) == (20 * MiB, 1, 20 * MiB)


def test_small_block_splits_down_to_a_512_byte_remainder() -> None:
    # 1 MiB, then 1 MiB - 512 (leaves 512: split, since >= 512), then 512 fills the segment: one 2 MiB segment.
    peak = replay(_alloc(MiB, MiB - 512, 512))
    assert (peak.reserved_bytes, peak.allocated_bytes, peak.segments) == (2 * MiB, 2 * MiB, 1)


# --- rule 7: merging within a segment ---------------------------------------------------------------------------


def test_freed_neighbours_merge_within_a_segment() -> None:
    # [4 | 4 | 12 free] in one 20 MiB segment; freeing both 4 MiB blocks merges all three into 20 MiB, which then
    # serves 18 MiB (2 MiB left, split). Without merging, 18 MiB would be an 18 MiB segment of its own.
    events = [(1, "a", 4 * MiB), (1, "b", 4 * MiB), (-1, "a", 0), (-1, "b", 0), (1, "c", 18 * MiB)]
    peak = replay(events)
    assert (peak.reserved_bytes, peak.segments) == (20 * MiB, 1)


def test_merging_with_the_previous_block_keeps_its_address() -> None:
    model = CachingAllocatorModel()
    a, b = model.malloc(4 * MiB), model.malloc(4 * MiB)
    assert a is not None and b is not None
    model.free(a)
    model.free(b)  # merges into a's free block and the 12 MiB remainder
    whole = model.malloc(20 * MiB - 512)
    assert whole is not None and whole.addr == a.addr and whole.size == 20 * MiB and model.segments == 1


def test_blocks_of_different_segments_never_merge() -> None:
    # Two freed 12 MiB segments hold 24 MiB free, but not contiguous: 20 MiB needs a new 20 MiB segment.
    events = [(1, "a", 12 * MiB), (1, "b", 12 * MiB), (-1, "a", 0), (-1, "b", 0), (1, "c", 20 * MiB)]
    peak = replay(events)
    assert (peak.reserved_bytes, peak.segments) == (44 * MiB, 3)


# --- rule 8: segments are never released ------------------------------------------------------------------------


def test_cached_segments_are_never_released() -> None:
    # 100 MiB freed stays reserved: 50 MiB is carved from it, and 200 MiB adds a segment on top.
    events = [(1, "a", 100 * MiB), (-1, "a", 0), (1, "b", 50 * MiB), (-1, "b", 0), (1, "c", 200 * MiB)]
    peak = replay(events)
    assert (peak.reserved_bytes, peak.segments, peak.allocated_bytes) == (300 * MiB, 2, 200 * MiB)


# --- replay input -----------------------------------------------------------------------------------------------


def test_replay_rejects_a_free_of_something_not_allocated() -> None:
    with pytest.raises(ValueError, match="not allocated"):
        replay([(1, "a", 512), (-1, "a", 0), (-1, "a", 0)])
    with pytest.raises(ValueError, match="made twice"):
        replay([(1, "a", 512), (1, "a", 512)])


def test_a_reused_buffer_free_frees_the_last_never_freed_storage_of_its_size() -> None:
    # "out" was counted in "in"'s buffer (its allocation cancelled, "in"'s free cancelled): out's free frees "in".
    events: list[tuple[int, Hashable, int]] = [
        (1, "x", 4 * MiB), (1, "in", 4 * MiB), (1, "y", 8 * MiB), (-1, "y", 0), (-1, "out", 4 * MiB),
    ]
    assert _pair_reused_frees(events)[-1] == (-1, "in", 4 * MiB)
    # No never-freed storage of that size: the free is dropped (a dropped free can only raise the replayed use).
    assert _pair_reused_frees([(1, "x", 512), (-1, "x", 0), (-1, "out", 512)]) == [(1, "x", 512), (-1, "x", 0)]


# --- the estimator's use ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_reserved_is_whole_2mib_units_at_least_the_peak_and_within_admit(path: Path) -> None:
    spec = load_job(path).spec
    cuda = estimate(spec, device="cuda")
    assert cuda.cuda_reserved_bytes is not None and cuda.cuda_allocated_bytes is not None
    assert cuda.cuda_reserved_bytes % (2 * MiB) == 0
    assert cuda.pmc_bytes <= cuda.cuda_allocated_bytes <= cuda.cuda_reserved_bytes <= cuda.admit_bytes
    assert cuda.admit_bytes == math.ceil((cuda.pmc_bytes + cuda.device_overhead_bytes) * cuda.safety_factor)
    cpu = estimate(spec)
    assert cpu.cuda_reserved_bytes is None and cpu.admit_bytes == math.ceil(cpu.pmc_bytes * cpu.safety_factor)


def _workspace_allocations(events: list) -> list:
    return [(k[1], n) for sign, k, n in events if sign > 0 and isinstance(k, tuple) and k[0] == "workspace"]


def test_training_takes_a_cublas_workspace_on_each_of_its_two_threads() -> None:
    """Measured on an H100: 64 MiB of cuBLAS workspace for a training job (forward on the main thread, backward on
    the autograd engine's thread), 32 MiB for inference; the cuBLASLt workspace once, at the first ``addmm``."""
    spec = load_job(ROOT / "examples" / "gcn-train-cora.yaml").spec
    trace, _, _ = trace_step(spec, device="cuda")
    markers = sorted(r.marker for r in trace.records if r.marker is not None)
    assert markers == ["cublas-workspace:backward", "cublas-workspace:forward"]  # GCN's linear has no bias: no Lt
    without = replay(cuda_allocation_events(trace)).reserved_bytes
    events = cuda_allocation_events(trace, 1, 8 * MiB + 128 * KiB, MiB)
    assert sorted(n for _, n in _workspace_allocations(events)) == [8 * MiB + 128 * KiB] * 2
    # each 1-10 MiB workspace may reuse cached space or add a 20 MiB segment, never more
    assert without <= replay(events).reserved_bytes <= without + 2 * 20 * MiB


def test_a_workspace_is_taken_where_the_first_cublas_operator_ran_and_kept() -> None:
    from gnnsched.spec import parse_spec

    spec = parse_spec({"mode": "infer", "model": {"arch": "sage", "layers": 3, "hidden": 64},
                       "graph": {"nodes": 4000, "edges": 30000, "features": 32, "classes": 5}})
    trace, _, _ = trace_step(spec, device="cuda")
    kinds = {r.marker: i for i, r in enumerate(trace.records) if r.marker is not None}
    assert set(kinds) == {"cublas-workspace:forward", "cublaslt-workspace"}  # SAGE's linear has a bias: addmm
    events = cuda_allocation_events(trace, 1, 32 * MiB, MiB)
    taken = _workspace_allocations(events)
    assert sorted(n for _, n in taken) == [MiB, 32 * MiB]
    # not at the step's start: after the first storages of the step
    first_ws = next(i for i, (sign, k, _) in enumerate(events) if isinstance(k, tuple) and k[0] == "workspace")
    pre_step = sum(1 for ev in trace.events[: trace.window_start] if ev is not None)
    assert first_ws > pre_step
    # never freed, and taken in the first step only
    assert not any(sign < 0 and isinstance(k, tuple) and k[0] == "workspace" for sign, k, _ in events)


def test_parallel_workers_each_take_their_own_workspace() -> None:
    spec = load_job(ROOT / "examples" / "gat-infer-parallel.yaml").spec
    trace, _, _ = trace_step(spec, device="cuda")
    events = cuda_allocation_events(trace, spec.parallelism, 32 * MiB, MiB)
    assert sum(1 for _, n in _workspace_allocations(events) if n == 32 * MiB) == spec.parallelism


def test_later_steps_free_what_the_step_before_kept() -> None:
    """Three steps of training end with the same live bytes as one: each step frees the gradients the step before
    kept (matched by size) and keeps its own."""
    from gnnsched.cuda_allocator import CachingAllocatorModel

    spec = load_job(ROOT / "examples" / "gcn-train-cora.yaml").spec
    trace, _, _ = trace_step(spec, device="cuda")

    def live_after(steps: int) -> int:
        model = CachingAllocatorModel()
        blocks: dict = {}
        for sign, key, nbytes in cuda_allocation_events(trace, steps=steps):
            if sign > 0:
                blocks[key] = model.malloc(nbytes)
            else:
                block = blocks.pop(key)
                if block is not None:
                    model.free(block)
        return model.allocated

    assert live_after(1) == live_after(3) > 0


def test_parallel_inference_replays_every_worker_at_once() -> None:
    spec = load_job(ROOT / "examples" / "gat-infer-parallel.yaml").spec
    assert spec.mode == "infer" and spec.parallelism > 1
    est = estimate(spec, device="cuda")
    # All workers' working sets live together (the estimate's worst case): allocated covers the N-worker PMC.
    assert est.cuda_allocated_bytes is not None and est.cuda_allocated_bytes >= est.pmc_bytes
    trace, _, _ = trace_step(spec, device="cuda")
    assert replay(cuda_allocation_events(trace)).allocated_bytes < est.cuda_allocated_bytes


def test_cli_json_has_cuda_reserved_bytes() -> None:
    result = runner.invoke(app, ["estimate", str(ROOT / "examples" / "gcn-train-cora.yaml"), "--device", "cuda",
                                 "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["cuda_reserved_bytes"] % (2 * MiB) == 0 and data["cuda_reserved_bytes"] <= data["admit_bytes"]
    assert data["calibration"] is None and data["safety_factor"] == 1.09


# --- --calibration ----------------------------------------------------------------------------------------------


def _cli_estimate(*extra: str) -> tuple[int, str, str]:
    result = runner.invoke(app, ["estimate", str(ROOT / "examples" / "gcn-train-cora.yaml"), "--device", "cuda",
                                 "--json", *extra])
    return result.exit_code, result.stdout, result.stderr


def test_calibration_file_replaces_the_static_safety_factor(tmp_path: Path) -> None:
    table = tmp_path / "calib.json"
    ratios = [1.2 + i / 100 for i in range(19, -1, -1)]  # 1.39 .. 1.20
    table.write_text(json.dumps({"ratios": {"A100-80GB.gcn.train.builtin": ratios,
                                            "A100-80GB.gat.train.builtin": [3.0] * 10}}))
    code, out, err = _cli_estimate("--calibration", str(table))
    assert code == 0, err
    data = json.loads(out)
    # Nearest-rank 0.95 quantile of 20 ratios: the 19th smallest, 1.38, below the largest: as it is.
    assert data["safety_factor"] == 1.38
    assert data["calibration"] == {"class": "A100-80GB.gcn.train.builtin", "factor": 1.38, "samples": 20,
                                   "calibrated": True, "source": "class", "pool": "A100-80GB.*.train.builtin",
                                   "pool_samples": 0, "lower_bounds": 0, "censored": False, "padded": False}
    assert data["admit_bytes"] == math.ceil((data["pmc_bytes"] + data["device_overhead_bytes"]) * 1.38)
    # Six of them: the quantile is their largest, a lower bound on it: 1.39 x the static factor 1.09.
    table.write_text(json.dumps({"ratios": {"A100-80GB.gcn.train.builtin": ratios[:6]}}))
    code, out, err = _cli_estimate("--calibration", str(table))
    assert code == 0, err
    data = json.loads(out)
    assert data["safety_factor"] == 1.5151 and data["calibration"]["padded"] is True


def test_calibration_for_another_gpu_model_and_too_few_samples_keep_the_static_factor(tmp_path: Path) -> None:
    table = tmp_path / "calib.yaml"
    # A ConfigMap as kubectl prints it: data values are strings.
    table.write_text("apiVersion: v1\nkind: ConfigMap\ndata:\n  ratios: '{\"V100-32GB.gcn.train.builtin\": [1.5, 1.5,"
                     " 1.5, 1.5, 1.5, 1.5], \"T4.gcn.train.builtin\": [1.3, 1.3]}'\n")
    code, out, err = _cli_estimate("--calibration", str(table), "--gpu-model", "V100-32GB")
    assert code == 0, err
    assert json.loads(out)["safety_factor"] == 1.635  # the largest of 6 ratios x 1.09
    code, out, err = _cli_estimate("--calibration", str(table), "--gpu-model", "T4")
    assert code == 0, err
    data = json.loads(out)
    assert data["safety_factor"] == 1.09 and data["calibration"]["samples"] == 2
    assert data["calibration"]["calibrated"] is False and data["calibration"]["source"] == "static"


def test_calibration_file_pool_serves_an_architecture_without_samples(tmp_path: Path) -> None:
    """gcn has no ratios of its own on V100-32GB train: its pool (sage and gat there) gives the factor."""
    table = tmp_path / "calib.json"
    table.write_text(json.dumps({"ratios": {"V100-32GB.sage.train.builtin": [1.2, 1.3, 1.25],
                                            "V100-32GB.gat.train.builtin": [1.35, 1.3],
                                            "V100-32GB.gcn.infer.builtin": [2.0] * 6}}))
    code, out, err = _cli_estimate("--calibration", str(table), "--gpu-model", "V100-32GB")
    assert code == 0, err
    data = json.loads(out)
    assert data["safety_factor"] == 1.4715  # the pool's largest of 5 ratios, 1.35, x 1.09
    assert data["calibration"]["source"] == "pool" and data["calibration"]["pool_samples"] == 5


def test_calibration_file_with_only_lower_bounds_sizes_above_them(tmp_path: Path) -> None:
    """The GNNCalibration object after a class's first attempts overran: only ``status.exceeded``. The estimate's
    factor is the largest bound times the static factor (1.12 x 1.09), not the static 1.09 that failed."""
    table = tmp_path / "calib.yaml"
    table.write_text("apiVersion: gnnsched.io/v1alpha1\nkind: GNNCalibration\nmetadata: {name: default}\n"
                     "status:\n  exceeded: {A100-80GB.gcn.train.builtin: [1.1, 1.12]}\n")
    code, out, err = _cli_estimate("--calibration", str(table))
    assert code == 0, err
    data = json.loads(out)
    assert data["safety_factor"] == 1.2208
    assert data["calibration"]["censored"] is True and data["calibration"]["lower_bounds"] == 2
    assert data["admit_bytes"] == math.ceil((data["pmc_bytes"] + data["device_overhead_bytes"]) * 1.2208)


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (None, "cannot read"),
        ("{not: [valid", "is not JSON or YAML"),
        ('{"ratios": {"A100-80GB.gcn.train.builtin": [-1.0]}}', "positive finite"),
        ('{"ratios": {"nonsense": [1.2]}}', "expected <gpu-model>"),
        ("[1, 2]", "expected a mapping"),
    ],
)
def test_bad_calibration_file_is_one_line_naming_the_option(tmp_path: Path, content: str | None,
                                                            fragment: str) -> None:
    path = tmp_path / "calib.json"
    if content is not None:
        path.write_text(content)
    code, out, err = _cli_estimate("--calibration", str(path))
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "--calibration" in lines[0] and fragment in lines[0], err
    assert "Traceback" not in err


def test_calibration_needs_device_cuda(tmp_path: Path) -> None:
    path = tmp_path / "calib.json"
    path.write_text('{"ratios": {}}')
    result = runner.invoke(app, ["estimate", str(ROOT / "examples" / "gcn-train-cora.yaml"), "--calibration",
                                 str(path)])
    assert result.exit_code == 2 and "--calibration: applies only with --device cuda" in result.stderr


def test_pmc_accuracy_cuda_says_it_skipped_without_a_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    import bench_modules
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: bench/pmc_accuracy.py --device cuda measures instead of skipping")
    bench = bench_modules.load("pmc_accuracy")
    assert bench.main(["--device", "cuda", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "SKIPPED --device cuda: no CUDA device" in out and "unmeasured" in out


@pytest.mark.parametrize(("arch", "mode"), [("gcn", "train"), ("gat", "train"), ("gin", "infer")])
def test_a_spliced_trace_reserves_what_the_full_trace_reserves(arch: str, mode: str) -> None:
    from gnnsched.spec import parse_spec

    model: dict[str, object] = {"arch": arch, "layers": 8, "hidden": 64}
    if arch == "gat":
        model["heads"] = 2
    spec = parse_spec({"mode": mode, "model": model,
                       "graph": {"nodes": 3000, "edges": 30000, "features": 32, "classes": 8}})
    spliced, _, _ = trace_step(spec, device="cuda")
    full, _, _ = trace_step(spec, device="cuda", splice=False)
    assert spliced.traced_layers is not None and full.traced_layers is None
    workspace = 8 * MiB + 128 * KiB
    assert replay(cuda_allocation_events(spliced, 1, workspace)) == replay(cuda_allocation_events(full, 1, workspace))


def test_table_output_shows_reserved_and_the_calibrated_factor(tmp_path: Path) -> None:
    table = tmp_path / "calib.json"
    table.write_text(json.dumps({"ratios": {"T4.gcn.train.builtin": [1.2] * 5}}))
    result = runner.invoke(app, ["estimate", str(ROOT / "examples" / "gcn-train-cora.yaml"), "--device", "cuda",
                                 "--gpu-model", "T4", "--calibration", str(table)])
    assert result.exit_code == 0, result.output
    assert "cuda reserved:" in result.stdout and "see below for which constants were measured" in result.stdout
    assert "not measured on this model: context, cublas_workspace, cublaslt_workspace" in result.stdout
    assert "safety factor:    1.308 (T4.gcn.train.builtin, 5 samples, calibrated)" in result.stdout
