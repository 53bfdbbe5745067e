"""Fatal faults on fake GPUs (``gnnsched.gpu.fake_faults``): one fault file, seen by the agent's fake backend as the
driver's Xid event and by the workers on that GPU as MPS's client-terminated error."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from gnnsched.closed_loop import classify_log, is_mps_victim_text
from gnnsched.errors import FieldError
from gnnsched.gpu.backend import BackendSpecError, FakeGPUBackend, fake_uuid, open_backend
from gnnsched.gpu.fake_faults import FakeGPUFaultWatch, fault_path, watch_from_env
from gnnsched.spec import parse_spec
from gnnsched.worker import run_attempt

UUID0, UUID1 = fake_uuid(0), fake_uuid(1)


def _write(directory: Path, uuid: str, xid: int, mtime: float | None = None) -> Path:
    path = fault_path(directory, uuid)
    path.write_text(f"{xid}\n")
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def test_backend_reports_a_new_fault_file_once_as_the_drivers_xid(tmp_path: Path) -> None:
    backend = FakeGPUBackend(2, 2**30, fault_dir=tmp_path)
    assert backend.health_events(0.05) == []
    _write(tmp_path, UUID1, 31)
    events = backend.health_events(2.0)
    assert [(e.index, e.uuid, e.xid) for e in events] == [(1, UUID1, 31)]
    assert backend.health_events(0.3) == []  # the same file is not a second fault
    # Xid 31 is application-caused: MPS's clients die, the GPU stays in service; Xid 79 takes the GPU out
    assert all(d.healthy for d in backend.devices())
    _write(tmp_path, UUID0, 79, mtime=time.time() + 1)
    assert [e.xid for e in backend.health_events(2.0)] == [79]
    assert [d.healthy for d in backend.devices()] == [False, True]


def test_backend_ignores_faults_older_than_itself(tmp_path: Path) -> None:
    _write(tmp_path, UUID0, 79)
    backend = FakeGPUBackend(1, 2**30, fault_dir=tmp_path)
    assert backend.health_events(0.3) == []
    assert backend.devices()[0].healthy


def test_fault_dir_is_for_fake_gpus_only(tmp_path: Path) -> None:
    with pytest.raises(BackendSpecError, match="--fake-gpu-faults"):
        open_backend("nvml", fault_dir=tmp_path)


def test_worker_watch_fails_with_the_xids_client_error_after_its_admission(tmp_path: Path) -> None:
    admitted = time.time()
    watch = FakeGPUFaultWatch(tmp_path, UUID0, since=admitted)
    watch.check()  # no fault yet
    _write(tmp_path, UUID0, 31, mtime=admitted - 5)  # an older fault (already drained): not this client's
    watch.check()
    _write(tmp_path, UUID1, 31, mtime=admitted + 1)  # another GPU's fault
    time.sleep(0.06)
    watch.check()
    _write(tmp_path, UUID0, 31, mtime=admitted + 1)
    time.sleep(0.06)
    with pytest.raises(RuntimeError) as err:
        watch.check()
    text = str(err.value)
    # an application Xid: every client gets its own fatal error (700, as on the H100), not MPS's 810
    assert classify_log(text) == "fault" and not is_mps_victim_text(text) and UUID0 in text and "Xid 31" in text
    assert "illegal memory access" in text
    _write(tmp_path, UUID0, 79, mtime=admitted + 2)  # a hardware Xid: MPS terminates its clients (810)
    time.sleep(0.06)
    with pytest.raises(RuntimeError) as err:
        watch.check()
    assert classify_log(str(err.value)) == "fault" and is_mps_victim_text(str(err.value)) and "Xid 79" in str(err.value)


def test_watch_from_env(tmp_path: Path) -> None:
    assert watch_from_env({}) is None
    env = {"GNNSCHED_FAKE_GPU_FAULTS": str(tmp_path), "CUDA_VISIBLE_DEVICES": UUID0,
           "GNNSCHED_ADMITTED_AT": "2026-11-25T17:00:00.250Z"}
    watch = watch_from_env(env)
    assert watch is not None and watch.uuid == UUID0 and watch.since == pytest.approx(1795626000.25)
    for bad, field in [({"GNNSCHED_FAKE_GPU_FAULTS": str(tmp_path / "nope")}, "GNNSCHED_FAKE_GPU_FAULTS"),
                       ({"CUDA_VISIBLE_DEVICES": ""}, "GNNSCHED_FAKE_GPU_FAULTS"),
                       ({"CUDA_VISIBLE_DEVICES": f"{UUID0},{UUID1}"}, "GNNSCHED_FAKE_GPU_FAULTS"),
                       ({"GNNSCHED_ADMITTED_AT": "yesterday"}, "GNNSCHED_ADMITTED_AT")]:
        with pytest.raises(FieldError) as err:
            watch_from_env({**env, **bad})
        assert err.value.field == field


@pytest.mark.usefixtures("one_torch_thread")
def test_a_fault_mid_run_is_a_fault_outcome(tmp_path: Path) -> None:
    spec = parse_spec({"mode": "train", "model": {"arch": "gcn", "layers": 2, "hidden": 8},
                       "graph": {"nodes": 200, "edges": 800, "features": 8, "classes": 3}, "epochs": 100000})
    watch = FakeGPUFaultWatch(tmp_path, UUID0, since=time.time() - 1)
    steps = 0

    def progress(n: int) -> None:
        nonlocal steps
        steps += n
        if steps == 3:
            _write(tmp_path, UUID0, 31)

    result = run_attempt(spec, progress=progress, fault_watch=watch)
    assert result.outcome == "fault" and "illegal memory access" in (result.message or "")
    assert steps < 100000
