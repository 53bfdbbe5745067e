"""The closed loop's shared rules: outcome recognition, the resize rule and calibration."""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gnnsched import estimator
from gnnsched.closed_loop import (
    DEFAULT_CALIBRATION,
    DEFAULT_RUNTIME_CALIBRATION,
    AttemptResult,
    CalibrationClass,
    CalibrationPolicy,
    CalibrationTable,
    FaultRecord,
    ResizePolicy,
    censored_quantile,
    classify_log,
    failed_request_bytes,
    grown,
    high_quantile,
    is_mps_victim_text,
    load_calibration_file,
    next_reservation,
    padded_quantile,
    runtime_class,
    size_bucket,
)
from gnnsched.errors import FieldError

GiB = 2**30
MiB = 2**20

TORCH_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 79.15 GiB"
    " of which 3.19 MiB is free. Process 1 has 2.00 GiB memory in use."
)


@pytest.mark.parametrize(
    ("text", "outcome"),
    [
        (TORCH_OOM, "memory-exceeded"),
        (
            "RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported",
            "memory-exceeded",
        ),
        ("RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`", "memory-exceeded"),
        ("RuntimeError: CUDA error: an illegal memory access was encountered", "fault"),
        ("cudaErrorMpsClientTerminated: the MPS client has been terminated by the server", "fault"),
        ("ValueError: shapes do not match", None),
        ("", None),
    ],
)
def test_classify_log(text: str, outcome: str | None) -> None:
    assert classify_log(text) == outcome


def test_oom_wins_over_the_fault_it_caused() -> None:
    assert classify_log(TORCH_OOM + "\nCUDA error: unspecified launch failure") == "memory-exceeded"


def test_victim_text_and_failed_request() -> None:
    assert is_mps_victim_text("error 810 cudaErrorMpsClientTerminated")
    assert not is_mps_victim_text("CUDA error: an illegal memory access was encountered")
    assert failed_request_bytes(TORCH_OOM) == 20 * MiB
    assert failed_request_bytes("Tried to allocate 1.50 GiB") == int(1.5 * GiB)
    assert failed_request_bytes("no size here") is None


def test_attempt_result_line_round_trips_and_needed_bytes() -> None:
    oom = AttemptResult(outcome="memory-exceeded", limit_bytes=4 * GiB, held_bytes=4 * GiB - MiB,
                        requested_bytes=20 * MiB, observed_peak_bytes=4 * GiB - MiB)
    again = AttemptResult.model_validate(json.loads(oom.line()))
    assert again == oom
    assert again.needed_bytes() == 4 * GiB - MiB + 20 * MiB
    ok = AttemptResult(observed_peak_bytes=3 * GiB, seconds=1.5, steps=10)
    assert ok.outcome == "succeeded" and ok.needed_bytes() == 3 * GiB
    # The old result line (no outcome key) still parses, as a success.
    assert AttemptResult.model_validate({"observed_peak_bytes": 5, "seconds": 1.0, "steps": 2}).outcome == "succeeded"


def test_fault_record_requires_gpu_and_role() -> None:
    record = FaultRecord(gpu="GPU-1", role="victim", reason="MpsClientTerminated", at=datetime.now(timezone.utc))
    assert FaultRecord.model_validate_json(record.model_dump_json()) == record
    with pytest.raises(ValueError, match="role"):
        FaultRecord.model_validate({"gpu": "GPU-1", "role": "bystander", "reason": "x", "at": "2026-01-01T00:00:00Z"})


def test_resize_takes_the_larger_of_need_times_margin_and_growth() -> None:
    policy = ResizePolicy(margin=1.2, growth=1.5)
    # Need dominates: 10 GiB reserved, 14 GiB needed -> 16.8 GiB (growth alone would give 15 GiB).
    assert next_reservation(10 * GiB, 14 * GiB, 80 * GiB, policy) == math.ceil(14 * GiB * 1.2)
    # Growth dominates when the need is barely over.
    assert next_reservation(10 * GiB, 10 * GiB + MiB, 80 * GiB, policy) == 15 * GiB
    # Unknown need: growth alone.
    assert next_reservation(10 * GiB, None, 80 * GiB, policy) == 15 * GiB
    # Capped at the largest GPU; once there, or when the need exceeds it, no resize can help.
    assert next_reservation(60 * GiB, 70 * GiB, 80 * GiB, policy) == 80 * GiB
    assert next_reservation(80 * GiB, None, 80 * GiB, policy) is None
    assert next_reservation(10 * GiB, 81 * GiB, 80 * GiB, policy) is None


@given(old=st.integers(1, 200 * GiB), need=st.one_of(st.none(), st.integers(0, 200 * GiB)),
       largest=st.integers(1, 200 * GiB))
def test_resize_always_grows_and_never_passes_the_largest_gpu(old: int, need: int | None, largest: int) -> None:
    new = next_reservation(old, need, largest)
    if new is None:
        assert old >= largest or (need is not None and need > largest)
    else:
        assert old < new <= largest


def test_quantile_is_an_observed_value_rounded_up() -> None:
    assert high_quantile([1.0, 1.1, 1.2, 1.3], 0.95) == 1.3
    assert high_quantile([1.0, 1.1, 1.2, 1.3], 0.5) == 1.1
    with pytest.raises(ValueError):
        high_quantile([], 0.9)


def test_calibration_static_until_enough_samples_then_quantile_with_floor_and_cap() -> None:
    cls = CalibrationClass(gpu_model="V100-32GB", arch="gcn", mode="train")
    policy = CalibrationPolicy(min_samples=3, window=4, cap=1.5)
    table = CalibrationTable()
    for ratio in (1.2, 1.25):
        table = table.record(cls, ratio, policy)
    assert table.factor(cls, policy).model_dump() == {"factor": 1.09, "samples": 2, "calibrated": False,
                                                      "source": "static", "pool_samples": 2, "lower_bounds": 0,
                                                      "censored": False, "padded": False}
    table = table.record(cls, 1.3, policy)
    got = table.factor(cls, policy)  # 3 ratios cannot place a 0.95 quantile below their largest: 1.3 x 1.09
    assert (got.factor, got.calibrated, got.padded) == (1.417, True, True)
    assert table.factor(cls, policy.model_copy(update={"quantile": 0.6})).factor == 1.25  # below the largest
    # Over-estimates never shrink the factor below 1.0; a runaway class is capped.
    low = CalibrationTable()
    for _ in range(3):
        low = low.record(cls, 0.6, policy)
    assert low.factor(cls, policy).factor == 1.0
    high = CalibrationTable()
    for _ in range(3):
        high = high.record(cls, 3.0, policy)
    assert high.factor(cls, policy).factor == 1.5
    # The window keeps the newest ratios only.
    for ratio in (1.0, 1.0, 1.0, 1.0):
        table = table.record(cls, ratio, policy)
    assert table.ratios[cls.key()] == [1.0] * 4 and table.factor(cls, policy).factor == 1.09  # exact: the static
    # Classes are separate.
    other = CalibrationClass(gpu_model="V100-32GB", arch="gcn", mode="train", container="custom")
    assert table.factor(other, policy).calibrated is False


def test_calibration_pool_serves_a_class_with_too_few_samples() -> None:
    """A class with fewer than min_samples ratios uses the high quantile of its pool (same GPU model, mode and
    container, any architecture) once the pool has min_samples; its own ratios take over at min_samples; other GPU
    models, modes and containers are not in the pool; ``pooled=False`` keeps the static factor."""
    policy = CalibrationPolicy(min_samples=3, quantile=0.95)
    gcn = CalibrationClass(gpu_model="V100-32GB", arch="gcn", mode="train")
    sage = CalibrationClass(gpu_model="V100-32GB", arch="sage", mode="train")
    gat = CalibrationClass(gpu_model="V100-32GB", arch="gat", mode="train")
    table = CalibrationTable().record(gcn, 1.30, policy).record(sage, 1.25, policy)
    got = table.factor(gat, policy)
    assert (got.source, got.factor, got.samples, got.pool_samples) == ("static", 1.09, 0, 2)
    table = table.record(sage, 1.40, policy)
    got = table.factor(gat, policy)
    # the pool's largest of 3 ratios times the static factor (3 cannot place a 0.95 quantile below it)
    assert (got.source, got.factor, got.calibrated, got.samples, got.pool_samples) == ("pool", 1.526, True, 0, 3)
    assert gat.pool_key() == "V100-32GB.*.train.builtin"
    # Not in the pool: another GPU model, mode or container.
    for other in (CalibrationClass(gpu_model="A100-80GB", arch="gat", mode="train"),
                  CalibrationClass(gpu_model="V100-32GB", arch="gat", mode="infer"),
                  CalibrationClass(gpu_model="V100-32GB", arch="gat", mode="train", container="custom")):
        assert table.factor(other, policy).source == "static"
    # The class's own ratios win once it has min_samples, even when the pool says more.
    for _ in range(3):
        table = table.record(gat, 1.05, policy)
    got = table.factor(gat, policy)
    assert (got.source, got.factor, got.samples) == ("class", 1.1445, 3)
    # Pooling off: a class is on its own.
    off = CalibrationPolicy(min_samples=3, pooled=False)
    assert table.factor(CalibrationClass(gpu_model="V100-32GB", arch="gin", mode="train"), off).source == "static"


@given(values=st.lists(st.floats(0.5, 3.0), min_size=1, max_size=40), q=st.floats(0.51, 1.0))
def test_censored_quantile_without_lower_bounds_is_the_nearest_rank_one(values: list[float], q: float) -> None:
    assert censored_quantile(values, [], q) == high_quantile(values, q)


def test_censored_quantile_by_hand() -> None:
    """Kaplan-Meier, worked by hand. Exact 1.0, 1.2, 1.4, 1.6 and a lower bound 1.1: at 1.0 all 5 are at risk
    (S = 4/5); the bound leaves the risk set above 1.1, so at 1.2 3 are (S = 4/5 x 2/3 = 8/15), at 1.4 2 (4/15), at
    1.6 1 (0). F: 0.2, 0.467, 0.733, 1. So q=0.5 -> 1.4 (nearest rank over the exact ratios alone would give 1.2) and
    q=0.95 -> 1.6."""
    assert censored_quantile([1.0, 1.2, 1.4, 1.6], [1.1], 0.5) == 1.4
    assert censored_quantile([1.0, 1.2, 1.4, 1.6], [1.1], 0.95) == 1.6
    assert high_quantile([1.0, 1.2, 1.4, 1.6], 0.5) == 1.2
    # A bound equal to an exact ratio counts above it (it wanted more): at 1.2 the bound is still at risk.
    assert censored_quantile([1.2, 1.3], [1.2], 0.5) == 1.3  # S(1.2) = 2/3: F = 1/3 < 0.5
    # Bounds above every exact ratio keep their weight unplaced: 2 of 4 -> F stops at 0.5.
    assert censored_quantile([1.0, 1.05], [1.1, 1.1], 0.5) == 1.05
    assert censored_quantile([1.0, 1.05], [1.1, 1.1], 0.95) is None
    assert censored_quantile([], [1.1], 0.5) is None
    with pytest.raises(ValueError):
        censored_quantile([], [], 0.9)


def test_grown_is_the_resize_rule() -> None:
    policy = ResizePolicy(margin=1.2, growth=1.5)
    assert grown(10.0, 9.0, policy) == 15.0 and grown(10.0, 20.0, policy) == 24.0 and grown(10.0, None, policy) == 15
    assert next_reservation(10 * GiB, 20 * GiB, 80 * GiB, policy) == math.ceil(grown(10 * GiB, 20 * GiB, policy))


def test_a_class_of_lower_bounds_only_is_sized_above_them() -> None:
    """Every first attempt of a class at the static factor overran: the bounds (about 1.1) are not ratios, and the
    factor is the largest bound times the static factor, from the first bound on, for first attempts of the class and,
    through the pool, of the other architectures; exact ratios above the bounds then decide."""
    cls = CalibrationClass(gpu_model="V100-32GB", arch="gcn", mode="train")
    sage = CalibrationClass(gpu_model="V100-32GB", arch="sage", mode="train")
    table = CalibrationTable().record(cls, 1.1, exceeded=True)
    assert table.ratios == {} and table.exceeded == {cls.key(): [1.1]}
    one = table.factor(cls)
    assert (one.factor, one.censored, one.padded, one.calibrated, one.lower_bounds, one.samples) \
        == (1.199, True, True, True, 1, 1)
    assert table.factor(sage).factor == 1.199 and table.factor(sage).source == "pool"
    assert table.factor(cls, CalibrationPolicy(pooled=False)).factor == 1.199
    assert table.factor(sage, CalibrationPolicy(pooled=False)).factor == 1.09  # not its class, no pool
    for _ in range(6):
        table = table.record(cls, 1.1, exceeded=True)
    table = table.record(cls, 1.2, exceeded=True)  # a retry at 1.199 overran too
    got = table.factor(cls)
    assert (got.source, got.factor, got.censored, got.samples) == ("class", 1.308, True, 8)
    # A factor above the cap is capped like any other.
    assert table.factor(cls, CalibrationPolicy(static_factor=1.9)).factor == DEFAULT_CALIBRATION.cap
    # The retries complete at about 1.3: every bound is below them, the quantile is known again, but three exact
    # ratios cannot place it below their largest.
    for ratio in (1.3, 1.32, 1.28):
        table = table.record(cls, ratio)
    got = table.factor(cls)
    assert (got.factor, got.censored, got.padded, got.lower_bounds) == (1.4388, False, True, 8)
    # Recorded as exact ratios, the same bounds would have kept the factor at about the one that failed.
    biased = CalibrationTable(ratios={cls.key(): [1.1] * 8})
    assert biased.factor(cls).factor == 1.199


def test_lower_bounds_that_exact_ratios_resolve_leave_the_quantile() -> None:
    """Unbiased errors: most attempts fit (exact ratios below the factor), a few overrun it. Once the exact ratios
    above the bounds carry them, the factor is the quantile; a lone bound above 19 exact ratios is within 5 %."""
    cls = CalibrationClass(gpu_model="V100-32GB", arch="gcn", mode="train")
    table = CalibrationTable(ratios={cls.key(): [0.9, 0.95, 1.0, 1.02, 1.05]}, exceeded={cls.key(): [1.1]})
    got = table.factor(cls)  # 1 of 6 unplaced: more than 5 % -> above the bound
    assert (got.factor, got.censored) == (1.199, True)
    table = table.record(cls, 1.25)  # the retry's exact ratio, above the bound: the largest of 6
    assert (table.factor(cls).factor, table.factor(cls).censored, table.factor(cls).padded) == (1.3625, False, True)
    many = CalibrationTable(ratios={cls.key(): [1.0] * 19}, exceeded={cls.key(): [1.1]})
    assert many.factor(cls).factor == 1.09 and not many.factor(cls).censored  # unplaced 1/20 = 5 %: known, at the top


def test_padded_quantile_by_hand() -> None:
    """The quantile stands as it is only below the largest exact ratio; a lower bound on it gets the static factor."""
    policy = CalibrationPolicy()  # 0.95, static 1.09
    twenty = [1.0 + i / 100 for i in range(20)]  # 1.00 .. 1.19: the nearest-rank 0.95 quantile is the 19th, 1.18
    assert padded_quantile(twenty, [], policy) == (1.18, False, False)
    value, censored, padded = padded_quantile(twenty[:19], [], policy)  # 1.18 is now the maximum: a lower bound
    assert value == pytest.approx(1.18 * 1.09) and (censored, padded) == (False, True)
    value, censored, padded = padded_quantile([0.9], [1.1, 1.2], policy)  # bounds above every exact ratio
    assert value == pytest.approx(1.2 * 1.09) and (censored, padded) == (True, True)
    assert padded_quantile([0.9, 0.95], [], policy)[0] == pytest.approx(0.95 * 1.09)  # the floor is CalibrationTable's


def test_exceeded_samples_validate_and_load(tmp_path: Path) -> None:
    key = "V100-32GB.gcn.train.builtin"
    with pytest.raises(ValueError, match="exceeded"):
        CalibrationTable(exceeded={key: [-1.0]})
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"status": {"ratios": {key: [1.2]}, "exceeded": {key: [1.1]}}}))
    assert load_calibration_file(path).exceeded == {key: [1.1]}


def test_static_factor_is_the_estimators() -> None:
    assert DEFAULT_CALIBRATION.static_factor == estimator.DEFAULT_SAFETY_FACTOR_CUDA


def test_calibration_class_key_round_trips() -> None:
    cls = CalibrationClass(gpu_model="A100-80GB", arch="sage", mode="infer", container="custom")
    assert CalibrationClass.parse(cls.key()) == cls
    with pytest.raises(ValueError, match="expected"):
        CalibrationClass.parse("gcn.train")
    with pytest.raises(ValueError, match="builtin or custom"):
        CalibrationClass.parse("V100.gcn.train.other")


def test_load_calibration_file_forms_and_errors(tmp_path: Path) -> None:
    key = "V100-32GB.gcn.train.builtin"
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"ratios": {key: [1.1, 1.2]}}))
    assert load_calibration_file(bare).ratios == {key: [1.1, 1.2]}
    cr = tmp_path / "cr.yaml"
    cr.write_text(f"apiVersion: gnnsched.io/v1alpha1\nkind: GNNCalibration\nstatus:\n  ratios:\n    {key}: [1.3]\n")
    assert load_calibration_file(cr).ratios == {key: [1.3]}
    cm = tmp_path / "cm.yaml"
    cm.write_text(f"kind: ConfigMap\ndata:\n  ratios: '{json.dumps({key: [1.4]})}'\n")
    assert load_calibration_file(cm).ratios == {key: [1.4]}
    for name, text, message in (
        ("missing.json", None, "cannot read"),
        ("bad.yaml", "ratios: [unclosed", "not JSON or YAML"),
        ("nokey.yaml", "foo: 1\n", "'ratios' or 'exceeded' key"),
        ("negative.json", json.dumps({"ratios": {key: [-1]}}), "positive finite"),
        ("badclass.json", json.dumps({"ratios": {"nope": [1.0]}}), "expected"),
    ):
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        with pytest.raises(FieldError, match=message) as err:
            load_calibration_file(path)
        assert err.value.field == "--calibration" and name in str(err.value) and "\n" not in str(err.value)


def test_parse_mps_memory_limit_reads_what_the_gate_writes_and_the_mps_forms() -> None:
    from gnnsched.node_agent.protocol import mem_limit_value
    from gnnsched.portable.mps_limit import parse_mps_memory_limit

    assert parse_mps_memory_limit(mem_limit_value(10 * 2**30)) == 10 * 2**30
    assert parse_mps_memory_limit("0=2G,1=512M", device=1) == 512 * 2**20
    assert parse_mps_memory_limit("0=2G,1=512M") == 2 * 2**30
    assert parse_mps_memory_limit("4GB") == 4 * 2**30  # one value for every device
    assert parse_mps_memory_limit("1=512M") is None  # nothing for device 0
    assert parse_mps_memory_limit("0=1048576") == 2**20
    with pytest.raises(ValueError, match="CUDA_MPS_PINNED_DEVICE_MEM_LIMIT: cannot read '0=lots'"):
        parse_mps_memory_limit("0=lots")


def test_runtime_class_is_model_class_size_bucket_mode_gpu_and_container() -> None:
    from gnnsched.spec import parse_spec

    assert [size_bucket(e) for e in (0, 1, 2, 3, 1023, 1024, 10_556)] == [0, 0, 1, 1, 9, 10, 13]
    spec = parse_spec({"mode": "train", "model": {"arch": "gcn", "layers": 2, "hidden": 16}, "graph": {
        "nodes": 1000, "edges": 10_556, "features": 8, "classes": 2}})
    cls = runtime_class(spec, "A100-40GB", "builtin")
    assert cls.key() == "A100-40GB.gcn-e13.train.builtin"
    assert CalibrationClass.parse(cls.key()) == cls  # a valid table key
    twice = parse_spec({**spec.model_dump(mode="json", by_alias=True, exclude_none=True),
                        "graph": {"nodes": 1000, "edges": 2 * 10_556, "features": 8, "classes": 2}})
    assert runtime_class(twice, "A100-40GB", "builtin").key() == "A100-40GB.gcn-e14.train.builtin"
    assert runtime_class(spec, "V100-32GB", "custom").key() == "V100-32GB.gcn-e13.train.custom"


def test_runtime_factor_is_the_median_of_the_class_in_both_directions() -> None:
    """The runtime policy is the memory rule with the median and bounds 0.1..10: it corrects a prediction that is
    too low or too high (the memory policy would floor 0.5 at 1.0), and stays 1.0 until the class has min_samples."""
    policy = DEFAULT_RUNTIME_CALIBRATION
    slow = CalibrationClass(gpu_model="A100-40GB", arch="gat-e13", mode="train")
    fast = CalibrationClass(gpu_model="A100-40GB", arch="sage-e13", mode="train")
    table = CalibrationTable()
    for ratio in (1.9, 2.2, 1.7, 2.0, 30.0):  # one runaway attempt does not move the median
        table = table.record(slow, ratio, policy)
    assert table.factor(slow, policy).factor == 2.0 and table.factor(slow, policy).source == "class"
    for ratio in (0.5, 0.6, 0.4, 0.5):
        table = table.record(fast, ratio, policy)
    # four of its own: the pool's median (every model class on that GPU and mode) stands in
    pooled = table.factor(fast, policy)
    assert pooled.source == "pool" and pooled.factor == sorted([1.9, 2.2, 1.7, 2.0, 30.0, 0.5, 0.6, 0.4, 0.5])[4]
    table = table.record(fast, 0.45, policy)
    assert table.factor(fast, policy).factor == 0.5  # below 1: a runtime factor corrects downwards too
    assert table.factor(fast, DEFAULT_CALIBRATION).factor == 1.0  # the memory policy floors it at the prediction
    other = CalibrationClass(gpu_model="V100-32GB", arch="gat-e13", mode="train")
    assert table.factor(other, policy).factor == 1.0 and not table.factor(other, policy).calibrated
    huge = CalibrationTable().record(slow, 500.0, policy).record(slow, 400.0, policy)
    assert table.factor(slow, policy.model_copy(update={"min_samples": 1})).factor == 2.0
    assert huge.factor(slow, policy.model_copy(update={"min_samples": 1})).factor == policy.cap == 10.0
