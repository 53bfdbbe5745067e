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
    AttemptResult,
    CalibrationClass,
    CalibrationPolicy,
    CalibrationTable,
    FaultRecord,
    ResizePolicy,
    classify_log,
    failed_request_bytes,
    high_quantile,
    is_mps_victim_text,
    load_calibration_file,
    next_reservation,
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
    assert table.factor(cls, policy).model_dump() == {"factor": 1.10, "samples": 2, "calibrated": False,
                                                      "source": "static", "pool_samples": 2}
    table = table.record(cls, 1.3, policy)
    assert table.factor(cls, policy).factor == 1.3 and table.factor(cls, policy).calibrated
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
    assert table.ratios[cls.key()] == [1.0] * 4 and table.factor(cls, policy).factor == 1.0
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
    assert (got.source, got.factor, got.samples, got.pool_samples) == ("static", 1.10, 0, 2)
    table = table.record(sage, 1.40, policy)
    got = table.factor(gat, policy)
    assert (got.source, got.factor, got.calibrated, got.samples, got.pool_samples) == ("pool", 1.40, True, 0, 3)
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
    assert (got.source, got.factor, got.samples) == ("class", 1.05, 3)
    # Pooling off: a class is on its own.
    off = CalibrationPolicy(min_samples=3, pooled=False)
    assert table.factor(CalibrationClass(gpu_model="V100-32GB", arch="gin", mode="train"), off).source == "static"


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
        ("nokey.yaml", "foo: 1\n", "'ratios' key"),
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
    from gnnsched.closed_loop import parse_mps_memory_limit
    from gnnsched.node_agent.protocol import mem_limit_value

    assert parse_mps_memory_limit(mem_limit_value(10 * 2**30)) == 10 * 2**30
    assert parse_mps_memory_limit("0=2G,1=512M", device=1) == 512 * 2**20
    assert parse_mps_memory_limit("0=2G,1=512M") == 2 * 2**30
    assert parse_mps_memory_limit("4GB") == 4 * 2**30  # one value for every device
    assert parse_mps_memory_limit("1=512M") is None  # nothing for device 0
    assert parse_mps_memory_limit("0=1048576") == 2**20
    with pytest.raises(ValueError, match="CUDA_MPS_PINNED_DEVICE_MEM_LIMIT: cannot read '0=lots'"):
        parse_mps_memory_limit("0=lots")
