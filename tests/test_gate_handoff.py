"""The ``--prestart`` gate's hand-off to the workload (``gnnsched.gate_handoff``) and the environment the workload runs
under until its admission (``gate_client.prestart_env``). The whole path with real processes and a real agent is in
``tests/test_gate_prestart.py``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from gnnsched.cli import app
from gnnsched.contract import ENV_GATE_HANDOFF_FD, ENV_PRESTART_FALLBACK
from gnnsched.gate_handoff import (
    EXIT_NO_ADMISSION,
    NVML_CHECK_ENV,
    Handoff,
    NotAdmitted,
    await_admission,
    handoff_fd,
    read_handoff,
    reexec_admitted,
    reexec_command,
)
from gnnsched.portable.gate import prestart_env


def _pipe_with(data: bytes) -> int:
    r, w = os.pipe()
    os.write(w, data)
    os.close(w)
    return r


def test_handoff_fd_is_read_from_the_environment_and_must_be_a_number():
    assert handoff_fd({}) is None
    assert handoff_fd({ENV_GATE_HANDOFF_FD: "7"}) == 7
    with pytest.raises(NotAdmitted) as exc:
        handoff_fd({ENV_GATE_HANDOFF_FD: "seven"})
    assert exc.value.exit_code == 2 and ENV_GATE_HANDOFF_FD in str(exc.value)


def test_admission_applies_the_gates_environment_and_removes_the_guards(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv(NVML_CHECK_ENV, "1")
    monkeypatch.setenv(ENV_GATE_HANDOFF_FD, "99")
    env = {"CUDA_VISIBLE_DEVICES": "GPU-1234", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=512M",
           "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"}
    for name in env:  # recorded by monkeypatch (delenv of an absent name is not), so restored whatever is written
        monkeypatch.setenv(name, "")
    fd = _pipe_with(Handoff(status="admitted", env=env, unset=[NVML_CHECK_ENV]).line())
    got = await_admission(fd)
    assert got.status == "admitted"
    for name, value in env.items():
        assert os.environ[name] == value
    assert NVML_CHECK_ENV not in os.environ and ENV_GATE_HANDOFF_FD not in os.environ
    with pytest.raises(OSError):
        os.fstat(fd)  # read_handoff closed it: the workload keeps no descriptor of the gate


@pytest.mark.parametrize("data, code, words", [
    (b"", EXIT_NO_ADMISSION, "keeper ended before"),
    (b'{"status": "admitted"', EXIT_NO_ADMISSION, "keeper ended before"),
    (b"not json\n", EXIT_NO_ADMISSION, "hand-off"),
    (b'{"status": "maybe"}\n', EXIT_NO_ADMISSION, "status"),
    (Handoff(status="rejected", exit_code=3, message="gnnsched gate: rejected (pod-unknown): x").line(), 3,
     "rejected (pod-unknown)"),
    (Handoff(status="no-agent", exit_code=4, message="gnnsched gate: no node agent").line(), 4, "no node agent"),
])
def test_no_admission_is_an_exit_status_and_one_line(monkeypatch, data, code, words):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(NotAdmitted) as exc:
        await_admission(_pipe_with(data))
    assert exc.value.exit_code == code and words in str(exc.value) and "\n" not in str(exc.value)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""  # nothing of an admission was applied


def test_read_handoff_takes_the_first_line_only():
    fd = _pipe_with(Handoff(status="admitted", env={"A": "1"}).line() + b"trailing garbage\n")
    assert read_handoff(fd).env == {"A": "1"}


def test_prestart_env_hides_the_gpu_until_admission_and_restores_the_users_nvml_setting():
    before, restore, unset = prestart_env({"CUDA_VISIBLE_DEVICES": "0,1", "HOME": "/h"}, 5)
    assert before["CUDA_VISIBLE_DEVICES"] == "" and before[NVML_CHECK_ENV] == "1"
    assert before[ENV_GATE_HANDOFF_FD] == "5" and before["HOME"] == "/h"
    assert restore == {} and unset == [NVML_CHECK_ENV]
    before, restore, unset = prestart_env({NVML_CHECK_ENV: "0"}, 5)
    assert before[NVML_CHECK_ENV] == "1" and restore == {NVML_CHECK_ENV: "0"} and unset == []


def test_worker_cli_bad_handoff_fd_is_one_line_naming_it(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("apiVersion: gnnsched.io/v1alpha1\nkind: GNNJob\nmetadata: {name: j}\nspec:\n  mode: train\n"
                   "  model: {arch: gcn}\n  graph: {nodes: 100, edges: 400, features: 4, classes: 2}\n  epochs: 1\n")
    result = CliRunner().invoke(app, ["worker", str(job), "--no-progress"], env={ENV_GATE_HANDOFF_FD: "x"})
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and ENV_GATE_HANDOFF_FD in lines[0], result.output


REEXEC = """
import os, sys
from gnnsched.gate_handoff import reexec_admitted
print(os.getpid(), repr(os.environ.get("GNNSCHED_PRESTART_FALLBACK")), sys.argv[1:], flush=True)
if "GNNSCHED_PRESTART_FALLBACK" not in os.environ:
    reexec_admitted("a reason\\nover two lines")
reexec_admitted("again")
"""


def test_reexec_runs_the_same_command_once_in_the_same_process_with_the_reason():
    """A real ``exec``: the same pid, the same interpreter options and arguments, the reason in the environment (one
    line); the re-executed process refuses a second re-exec (one line, no loop)."""
    run = subprocess.run([sys.executable, "-X", "utf8", "-c", REEXEC, "arg1", "--flag"], capture_output=True,
                         text=True, timeout=60, check=False)
    first, second = run.stdout.splitlines()
    assert first.split(" ", 1)[0] == second.split(" ", 1)[0]  # same pid
    assert first.endswith("None ['arg1', '--flag']")
    assert second.endswith("'a reason over two lines' ['arg1', '--flag']")
    assert run.returncode == 1 and f"{ENV_PRESTART_FALLBACK}: already a re-executed worker" in run.stderr


def test_reexec_refuses_before_the_admission_is_applied(monkeypatch):
    monkeypatch.delenv(ENV_PRESTART_FALLBACK, raising=False)
    monkeypatch.setenv(ENV_GATE_HANDOFF_FD, "5")
    with pytest.raises(RuntimeError, match=ENV_GATE_HANDOFF_FD):
        reexec_admitted("why")
    assert ENV_PRESTART_FALLBACK not in os.environ


def test_reexec_command_is_this_interpreter_and_its_original_arguments():
    command = reexec_command()
    assert command[0] == sys.executable and command[1:] == sys.orig_argv[1:]


def test_worker_with_both_a_handoff_and_a_fallback_marker_refuses(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("apiVersion: gnnsched.io/v1alpha1\nkind: GNNJob\nmetadata: {name: j}\nspec:\n  mode: train\n"
                   "  model: {arch: gcn}\n  graph: {nodes: 100, edges: 400, features: 4, classes: 2}\n  epochs: 1\n")
    result = CliRunner().invoke(app, ["worker", str(job), "--no-progress"],
                                env={ENV_GATE_HANDOFF_FD: "7", ENV_PRESTART_FALLBACK: "why"})
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and ENV_PRESTART_FALLBACK in lines[0], result.output
