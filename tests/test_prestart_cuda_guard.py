"""Nothing in a prestarted worker's pre-admission phase may reach the CUDA driver (gnnsched.gpu.cuda_guard).

On an H100 the built-in worker's start-up under ``gnnsched gate --prestart`` initialised CUDA with no device visible
(``import torch_geometric`` -> ``torch.__config__.show()`` -> ``cudaGetDeviceCount``) and every prestarted CUDA worker
then failed after admission (docs/gpu-measurements.md section 7). These tests run the worker's real prestart entry
(``gnnsched worker`` with a hand-off pipe, as the gate ``exec``s it) under tests/cuda_init_trap.py, which records
every call that would initialise the driver on a CUDA build, and check the guard itself in-process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from gnnsched.closed_loop import AttemptResult
from gnnsched.contract import ENV_GATE_HANDOFF_FD, ENV_RESULT_FILE
from gnnsched.gate_handoff import Handoff
from gnnsched.gpu.cuda_guard import CudaInitBlocked, PreAdmissionGuard, driver_free_config, runtime_device_count

pytestmark = pytest.mark.timeout(300)

TESTS = Path(__file__).parent
JOB = """apiVersion: gnnsched.io/v1alpha1
kind: GNNJob
metadata: {name: j}
spec:
  mode: train
  model: {arch: gin, layers: 2, hidden: 16}
  graph: {nodes: 1500, edges: 9000, features: 16, classes: 3}
  epochs: 1
"""


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _prestarted_worker(tmp_path: Path, extra_python: str = "") -> tuple[int, str, list[dict[str, Any]]]:
    """``gnnsched worker JOB`` as ``gnnsched gate --prestart`` leaves it (no GPU visible, NVML check on, hand-off
    pipe), under the trap; admitted (the keeper's line) once it says it is waiting (a worker that exits first is
    not). Returns (status, stderr, records)."""
    job = tmp_path / "job.yaml"
    job.write_text(JOB)
    record = tmp_path / "trap.jsonl"
    read_fd, write_fd = os.pipe()
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTORCH_NVML_BASED_CUDA_CHECK="1",
               **{ENV_GATE_HANDOFF_FD: str(read_fd), ENV_RESULT_FILE: str(tmp_path / "result.json")})
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    command = [sys.executable, "-c", extra_python + "import runpy, sys; sys.argv = sys.argv[1:]; "
               "runpy.run_path(sys.argv[0], run_name='__main__')", str(TESTS / "cuda_trap_run.py"), str(record),
               "worker", str(job), "--no-progress"]
    proc = subprocess.Popen(command, env=env, pass_fds=(read_fd,), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=tmp_path)
    os.close(read_fd)
    lines: list[str] = []
    waiting = threading.Event()

    def read_stderr() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if "waiting for the gate" in line:
                waiting.set()

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 240
        while not waiting.wait(0.1) and proc.poll() is None:  # a worker that ends before it waits is not admitted
            assert time.monotonic() < deadline, "the worker never finished its start-up"
        if waiting.is_set():
            admitted = Handoff(status="admitted", env={"GNNSCHED_GROUP": "g1"},
                               unset=["CUDA_VISIBLE_DEVICES", "PYTORCH_NVML_BASED_CUDA_CHECK"])
            os.write(write_fd, admitted.line())
    finally:
        os.close(write_fd)
    proc.wait(timeout=240)
    reader.join(10)
    assert proc.stdout is not None
    out = proc.stdout.read()
    if proc.returncode == 0:
        assert AttemptResult.model_validate_json(out.strip().splitlines()[-1]).outcome == "succeeded"
    return proc.returncode, "".join(lines), _records(record)


def test_prestart_phase_of_the_worker_makes_no_call_that_initialises_cuda(tmp_path):
    code, err, records = _prestarted_worker(tmp_path)
    assert code == 0, err
    calls = [r for r in records if r["event"] == "call"]
    before = [r for r in calls if r["pre_admission"]]
    assert before == [], "calls that initialise CUDA on a CUDA build, made before admission:\n" + json.dumps(
        before, indent=1)
    admission = [r for r in records if r["event"] == "admission"]
    # The guard is worth something only because PyG (whose import used to reach the driver) loads before admission.
    assert len(admission) == 1 and admission[0]["torch_geometric"] is True
    # What PyG cached at import under the guard is what the full configuration says once admitted.
    (exit_record,) = [r for r in records if r["event"] == "exit"]
    assert admission[0]["no_mkl"] is exit_record["use_mkl_off"]
    assert "blocked" not in err, err


def test_a_start_up_that_initialises_cuda_before_admission_is_stopped_and_the_worker_reexecutes_once_admitted(
        tmp_path):
    """A library that makes a CUDA tensor at import (here: at the start of the worker, while it is not admitted) is
    stopped before the driver, naming the call. The worker still waits for its admission, then re-executes itself as a
    plain admitted worker, which runs the job; its result line says why. The trap saw no call reach torch's CUDA
    initialisation before admission."""
    code, err, records = _prestarted_worker(
        tmp_path, extra_python="import gnnsched.worker as w, os, torch; _p = w.prepare_job; "
        f"w.prepare_job = lambda *a, **k: (os.environ.get('{ENV_GATE_HANDOFF_FD}') and torch.ones(1, device='cuda'), "
        "_p(*a, **k))[1]; ")
    assert code == 0, err
    assert "torch.cuda._lazy_init" in err and "before this process was admitted" in err
    assert "Traceback" not in err
    assert err.count("re-executing as a plain admitted worker") == 1
    assert [r for r in records if r["event"] == "call" and r["pre_admission"]] == []
    assert len([r for r in records if r["event"] == "admission"]) == 1  # the re-executed worker has no hand-off
    result = AttemptResult.model_validate_json((tmp_path / "result.json").read_text())
    assert result.prestart_fallback is not None and "torch.cuda._lazy_init" in result.prestart_fallback


def test_a_blocked_call_that_the_start_up_catches_is_reported_and_the_worker_runs(tmp_path):
    """A library that probes the GPU and tolerates failure (``try: torch.cuda.current_device() except RuntimeError``)
    goes on, as it would on a machine without a GPU; nothing reached the driver, so the worker is admitted and runs,
    and says at admission what was blocked."""
    code, err, records = _prestarted_worker(
        tmp_path, extra_python="import gnnsched.worker as w; import torch, contextlib; _p = w.prepare_job\n"
        "def probing(*a, **k):\n"
        "    with contextlib.suppress(RuntimeError):\n"
        "        torch.cuda.current_device()\n"
        "    return _p(*a, **k)\n"
        "w.prepare_job = probing\n")
    assert code == 0, err
    assert "before admission, blocked: torch.cuda._lazy_init" in err
    assert [r for r in records if r["event"] == "call" and r["pre_admission"]] == []
    assert len([r for r in records if r["event"] == "admission"]) == 1


def test_guard_blocks_cuda_initialisation_and_restores_torch():
    originals = (torch._C._show_config, torch.cuda._lazy_init)
    real_config = torch.__config__.show()
    guard = PreAdmissionGuard().install()
    try:
        assert guard.installed
        assert torch.__config__.show() == driver_free_config(torch)
        with pytest.raises(CudaInitBlocked, match="torch.cuda._lazy_init"):
            torch.zeros(1, device="cuda")
        with pytest.raises(CudaInitBlocked):
            torch.cuda.init()
        if hasattr(torch._C, "_accelerator_getDeviceIndex"):
            with pytest.raises(CudaInitBlocked, match="_accelerator_getDeviceIndex"):
                torch._C._accelerator_getDeviceIndex()
        assert torch.cuda.is_available() is False and torch.cuda.device_count() == 0
        with torch.cuda.device_of(torch.zeros(1)):  # a CPU tensor's device index is -1: nothing to initialise
            pass
        assert len(guard.attempts) >= 2 and all("test_prestart_cuda_guard.py" in a for a in guard.attempts)
        with pytest.raises(RuntimeError, match="already installed"):
            PreAdmissionGuard().install()
    finally:
        guard.remove()
    assert not guard.installed
    assert (torch._C._show_config, torch.cuda._lazy_init) == originals
    assert torch.__config__.show() == real_config
    assert not torch.cuda.is_initialized()


def test_driver_free_config_agrees_with_the_full_one_on_the_flags_it_gives():
    """Each build setting the pre-admission text gives is the one the full text gives (this torch's build)."""
    real = torch._C._show_config()
    settings = driver_free_config(torch).split("Build settings:", 1)[1]
    for item in (s.strip() for s in settings.split(",")):
        if not item or item.startswith(("USE_CUDA=", "CUDA_VERSION=", "USE_LAPACK=")):
            continue  # the full text spells these differently (USE_CUDA=0 on a CPU build; LAPACK as a line)
        assert item + "," in real, item
    assert ("USE_MKL=OFF" in real) == ("USE_MKL=OFF" in settings)


def test_guard_on_a_cuda_build_answers_no_device_without_the_runtime():
    """A CUDA build's ``torch._C`` has ``_cuda_getDeviceCount`` and ``_cuda_init`` (the CPU build here has neither):
    under the guard the count is 0 and init raises, neither reaching torch's own function; removal restores them."""
    reached: list[str] = []

    def reach(name: str, answer: Any = None) -> Any:
        reached.append(name)
        return answer

    c = SimpleNamespace(
        _show_config=lambda: reach("config", ""),
        _cuda_getDeviceCount=lambda: reach("count", 1),
        _cuda_init=lambda: reached.append("init"),
        _cuda_setDevice=lambda d: reached.append("set"),
        _cuda_exchangeDevice=lambda d: -1 if d < 0 else reach("exchange", 0),
        has_mkl=False,
    )
    cuda = SimpleNamespace(is_initialized=lambda: False, _lazy_init=lambda: reached.append("lazy"))
    fake_torch = SimpleNamespace(_C=c, cuda=cuda, __version__="2.11.0+cu130", version=SimpleNamespace(cuda="13.0"))
    saved = (c._cuda_getDeviceCount, c._cuda_init, cuda._lazy_init)
    with PreAdmissionGuard(fake_torch) as guard:  # type: ignore[arg-type]
        assert c._cuda_getDeviceCount() == 0
        with pytest.raises(CudaInitBlocked, match="_cuda_init"):
            c._cuda_init()
        with pytest.raises(CudaInitBlocked, match="_cuda_setDevice"):
            c._cuda_setDevice(0)
        with pytest.raises(CudaInitBlocked):
            cuda._lazy_init()
        assert c._cuda_exchangeDevice(-1) == -1  # torch answers a negative index before touching CUDA
        with pytest.raises(CudaInitBlocked, match="_cuda_exchangeDevice"):
            c._cuda_exchangeDevice(0)
        assert "USE_MKL=OFF" in c._show_config() and "USE_CUDA=ON" in c._show_config()
        assert not hasattr(c, "_accelerator_getDeviceIndex")  # only what this torch has is replaced
        assert len(guard.attempts) == 5
        with pytest.raises(RuntimeError, match="still installed"):
            runtime_device_count(fake_torch)  # type: ignore[arg-type]
    assert reached == []
    assert (c._cuda_getDeviceCount, c._cuda_init, cuda._lazy_init) == saved
    # Once removed, the latch check asks the runtime itself (here: 1 device).
    assert runtime_device_count(fake_torch) == 1  # type: ignore[arg-type]
    assert reached == ["count"]


def test_runtime_device_count_on_a_torch_without_cuda_is_zero():
    assert not hasattr(torch._C, "_cuda_getDeviceCount")  # this CPU build
    assert runtime_device_count(torch) == 0


def test_guard_refuses_to_install_once_cuda_is_initialised():
    c = SimpleNamespace(_show_config=lambda: "")
    fake_torch = SimpleNamespace(_C=c, cuda=SimpleNamespace(is_initialized=lambda: True, _lazy_init=lambda: None))
    with pytest.raises(CudaInitBlocked, match="before the pre-admission guard"):
        PreAdmissionGuard(fake_torch).install()  # type: ignore[arg-type]
    assert c._show_config() == ""


EXAMPLES_UNDER_GUARD = """
import glob, json, sys
from cuda_init_trap import install
install(sys.argv[1])
from gnnsched.gpu.cuda_guard import PreAdmissionGuard
guard = PreAdmissionGuard().install()
from gnnsched.spec import load_job
from gnnsched.worker import prepare_job
for path in sorted(glob.glob(sys.argv[2] + "/*.yaml")):
    prepare_job(load_job(path).spec, 0)
print(json.dumps(guard.attempts))
"""


def test_every_example_jobs_start_up_under_the_guard_reaches_no_driver_call(tmp_path):
    """The start-up of each shipped example (datasets, every conv type, the mini-batch sampler, parallel inference)
    runs before admission in a prestarted pod: under the guard none of it reaches a call that initialises CUDA, and
    none of it needed blocking."""
    record = tmp_path / "trap.jsonl"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTORCH_NVML_BASED_CUDA_CHECK="1", **{ENV_GATE_HANDOFF_FD: "99"})
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    examples = TESTS.parent / "examples"
    run = subprocess.run([sys.executable, "-c", EXAMPLES_UNDER_GUARD, str(record), str(examples)], env=env,
                         capture_output=True, text=True, timeout=240, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    assert len(list(examples.glob("*.yaml"))) >= 4
    assert json.loads(run.stdout.strip().splitlines()[-1]) == []
    assert [r for r in _records(record) if r["event"] == "call" and r["pre_admission"]] == []
