"""The estimator against what real GPUs measured, re-estimated here on the CPU (no GPU needed).

The tables are the raw outputs of ``bench/pmc_accuracy.py --device cuda`` on an H200 (2026-11-28, torch 2.11 +
CUDA 13, copied into ``docs/measurements/h200-2026-11-28/``) and an H100 (2026-11-25). Each case is rebuilt from its
printed label (``pmc_accuracy.case_for_label``) and estimated with the current code and the GPU's catalogue entry,
found by the name NVML reports. Issue 36's bar on the H200: never under in allocated bytes, median |error| at most
1 % in reserved and allocated bytes, and never under in reserved bytes except the gaps pinned below."""

from __future__ import annotations

import statistics
from pathlib import Path

import bench_modules
import pytest

ROOT = Path(__file__).resolve().parent.parent
H200 = ROOT / "docs" / "measurements" / "h200-2026-11-28"
H100 = ROOT / "docs" / "measurements" / "h100-2026-11-25"
MiB = 2**20

# Reserved-byte gaps the model still has on the H200, as measured against this code: case -> (predicted - measured).
# PNA training's extra 132 MiB is a GPU-side allocation pattern no trace here shows (its allocated peak is exact;
# docs/gpu-measurements.md, section 10); the admission's 1.09 factor covers it (2,093 MiB admitted for
# 2,052 MiB of context plus reserved). GATv2 training is one 2 MiB small-pool segment short. A change that closes a gap
# fails here until the gap is removed from this list; a change that widens one, or opens another, fails too.
H200_RESERVED_GAPS = {
    "PNA train L=3  h=16  aggregators=['mean', 'min', 'max', 'std' n=20000 e=200000 f=128 c=16": -132 * MiB,
    "GAT train L=2  h=16  heads=4,v2=True n=20000 e=200000 f=128 c=16": -2 * MiB,
}


bench = bench_modules.load("pmc_accuracy")
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def h200() -> list:
    """The 39 cases of the H200's quick and PyG-model tables (Hopper constants run), estimated for "NVIDIA H200"."""
    results = []
    for name in ("pmc_accuracy_hopper_constants.txt",):
        rows, _ = bench.against(str(H200 / name), "NVIDIA H200")
        results.extend(rows)
    return results


def test_the_h200_tables_are_all_rebuilt(h200: list) -> None:
    assert len(h200) == 39
    assert {r.kind for r in h200} == {"grid", "real", "models"}


def test_h200_allocated_bytes_are_never_under_and_their_median_error_is_under_one_percent(h200: list) -> None:
    under = [(r.case, r.allocated_predicted - r.allocated_measured) for r in h200
             if r.allocated_predicted < r.allocated_measured]
    assert under == []
    assert statistics.median(abs(r.allocated_rel_error) for r in h200) <= 0.01
    # Dropout traced as CUDA runs it: no training case carries the CPU's float noise any more (it was +6.9 %).
    assert max(r.allocated_rel_error for r in h200) < 0.001


def test_h200_reserved_bytes_are_never_under_but_for_the_pinned_gaps(h200: list) -> None:
    gaps = {r.case: r.reserved_predicted - r.reserved_measured for r in h200
            if r.reserved_predicted < r.reserved_measured}
    assert gaps == H200_RESERVED_GAPS
    assert statistics.median(abs(r.reserved_rel_error) for r in h200) <= 0.01


def test_every_measured_case_stays_inside_the_admission_margin(h200: list) -> None:
    """What a job is admitted with (context + reserved, times the static factor) covers what it takes on the GPU even
    where the reserved model is short, on every case of both GPUs; and the factor is what the measurements ask for
    (docs/estimator.md, "Why 1.09"): the largest need is PNA training's on the H200, about 1.069, and the factor
    covers it with at least 1 % and at most 3 % to spare, so a change to the model or to the factor that moves
    either side fails here."""
    from gnnsched.estimator import DEFAULT_SAFETY_FACTOR_CUDA
    from gnnsched.gpu.catalogue import get_gpu_model

    h100, _ = bench.against(str(H100 / "pmc_accuracy_cuda.json"), "NVIDIA H100 80GB HBM3")
    needs = []
    for rows, name in ((h200, "NVIDIA H200"), (h100, "NVIDIA H100 80GB HBM3")):
        context = get_gpu_model(name).context_bytes
        for r in rows:
            need = (context + r.reserved_measured) / (context + r.reserved_predicted)
            assert need <= DEFAULT_SAFETY_FACTOR_CUDA, r.case
            needs.append((need, r.case))
    largest, case = max(needs)
    assert case.startswith("PNA train") and largest == pytest.approx(1.069, abs=0.001)
    assert 1.01 <= DEFAULT_SAFETY_FACTOR_CUDA / largest <= 1.03


def test_the_kernel_scratch_allowance_covers_every_h200_and_h100_gap_but_two(h200: list) -> None:
    """What a job is charged on the GPU beyond its reserved bytes includes ``kernel_scratch_bytes`` (two small-pool
    segments): with it, every measured reserved figure of both GPUs is covered but PNA training's on the H200 and
    one six-layer SAGE training case on the H100 (a 20 MiB large segment and a small one)."""
    from gnnsched.gpu.catalogue import get_gpu_model

    h100, _ = bench.against(str(H100 / "pmc_accuracy_cuda.json"), "NVIDIA H100 80GB HBM3")
    uncovered = set()
    for rows, gpu in ((h200, get_gpu_model("NVIDIA H200")), (h100, get_gpu_model("NVIDIA H100 80GB HBM3"))):
        assert gpu.kernel_scratch_bytes == 4 * MiB
        uncovered |= {r.case for r in rows if r.reserved_predicted + gpu.kernel_scratch_bytes < r.reserved_measured}
    assert uncovered == {
        "PNA train L=3  h=16  aggregators=['mean', 'min', 'max', 'std' n=20000 e=200000 f=128 c=16",
        "sage train L=6  h=64  n=40000 e=300000 f=128 c=3",
    }


def test_the_catalogue_default_the_h200_once_fell_back_to_is_gone() -> None:
    """The run on the A100's constants (the H200 was not catalogued) under-predicted every case; the H200 now has its
    own Hopper entry, and that run's measured figures (a second measurement of the same 39 cases) are met by it but
    for the same pinned gaps."""
    from gnnsched.gpu.catalogue import get_gpu_model

    assert get_gpu_model("NVIDIA H200").architecture == "Hopper"
    rows, summary = bench.against(str(H200 / "pmc_accuracy_catalogue_default.txt"), "NVIDIA H200")
    assert len(rows) == 39
    assert summary["allocated_under_predicted"] == 0
    assert {r.case for r in rows if r.reserved_predicted < r.reserved_measured} <= set(H200_RESERVED_GAPS)


def test_h100_allocated_bytes_are_exact_where_dropout_was_the_difference() -> None:
    """The H100's 84 cases: allocated within 0.5 % on every full-batch case (the training cases that carried float
    dropout noise were up to +20 % over; mini-batch and parallel cases are bounds), reserved median within 1 %."""
    rows, _ = bench.against(str(H100 / "pmc_accuracy_cuda.json"), "NVIDIA H100 80GB HBM3")
    assert len(rows) == 84
    exact = [r for r in rows if "minibatch" not in r.case and "par=" not in r.case]
    assert max(abs(r.allocated_rel_error) for r in exact) < 0.005
    assert statistics.median(abs(r.reserved_rel_error) for r in rows) <= 0.01
