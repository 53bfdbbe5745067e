"""MPS manager against a fake ``nvidia-cuda-mps-control`` on PATH (records commands; can fail or die)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from fake_mps import kill_fake_mps

from gnnsched.node_agent.mps import MPSConfig, MPSError, MPSManager

FAKES = Path(__file__).parent / "fakes"


@pytest.fixture
def mps(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{FAKES}{os.pathsep}{os.environ['PATH']}")
    cfg = MPSConfig(
        pipe_directory=tmp_path / "pipe", log_directory=tmp_path / "log", devices=[0, 1], compute_mode="exclusive",
        default_active_thread_percentage=50, default_pinned_mem_limit="78G", start_timeout=5,
    )
    m = MPSManager(cfg)
    yield m
    m.stop()
    kill_fake_mps(cfg.pipe_directory)


def _commands(m: MPSManager) -> list[str]:
    return (m.config.log_directory / "fake-commands.log").read_text().splitlines()


def test_start_configures_and_probes(mps: MPSManager) -> None:
    assert mps.check() is True
    assert mps.healthy and mps.restarts == 0 and mps.message == "running"
    cmds = _commands(mps)
    assert cmds[:2] == ["nvidia-smi -i 0 -c EXCLUSIVE_PROCESS", "nvidia-smi -i 1 -c EXCLUSIVE_PROCESS"]
    assert "-d" in cmds
    assert cmds[cmds.index("-d") + 1] == "get_server_list"  # waited until it answered
    assert "set_default_active_thread_percentage 50" in cmds
    assert "set_default_device_pinned_mem_limit 0 78G" in cmds
    assert "set_default_device_pinned_mem_limit 1 78G" in cmds
    # A healthy probe does not restart anything.
    assert mps.check() and _commands(mps).count("-d") == 1


def test_start_uses_a_daemon_that_already_answers_on_the_pipe_directory(mps: MPSManager) -> None:
    """A daemon someone else started (an admin, on the host) is used, not doubled; the defaults are still applied.
    (A daemon of an earlier mps-daemon container is never there: it ends with that container, docs/node-agent.md.)"""
    import subprocess

    env = mps.env()
    subprocess.run(["nvidia-cuda-mps-control", "-d"], env=env, check=True, timeout=30)
    pid = int((mps.config.pipe_directory / "fake-mps.pid").read_text())
    assert mps.check() is True and mps.restarts == 0
    cmds = _commands(mps)
    assert cmds.count("-d") == 1 and int((mps.config.pipe_directory / "fake-mps.pid").read_text()) == pid
    assert "set_default_device_pinned_mem_limit 1 78G" in cmds


def test_restart_when_daemon_dies(mps: MPSManager) -> None:
    assert mps.check()
    pid = int((mps.config.pipe_directory / "fake-mps.pid").read_text())
    os.kill(pid, signal.SIGKILL)
    assert mps.probe() is False
    assert mps.check() is True
    assert mps.restarts == 1
    cmds = _commands(mps)
    assert cmds.count("-d") == 2
    assert cmds.count("set_default_active_thread_percentage 50") == 2  # defaults re-applied (quit loses them)
    new_pid = int((mps.config.pipe_directory / "fake-mps.pid").read_text())
    assert new_pid != pid


def test_failed_start_reports_unhealthy_then_recovers(mps: MPSManager) -> None:
    marker = mps.config.pipe_directory / "fail-start"
    mps.config.pipe_directory.mkdir(parents=True)
    marker.touch()
    assert mps.check() is False
    assert not mps.healthy and "nvidia-cuda-mps-control -d: exit 1" in mps.message
    marker.unlink()
    assert mps.check() is True and mps.healthy


def test_failing_commands_are_reported(mps: MPSManager) -> None:
    assert mps.check()
    (mps.config.pipe_directory / "fail-commands").touch()
    with pytest.raises(MPSError, match="set_default_active_thread_percentage 10: exit 1: Failed to run command"):
        mps.control("set_default_active_thread_percentage 10")
    mps.config.start_timeout = 0.3
    assert mps.check() is False  # the probe fails, the restarted daemon never answers → unhealthy, with the reason
    assert "did not answer" in mps.message and mps.restarts == 1


def test_missing_binary(tmp_path) -> None:
    m = MPSManager(MPSConfig(pipe_directory=tmp_path / "p", log_directory=tmp_path / "l", binary="no-such-mps-ctl"))
    assert m.check() is False
    assert m.message == "no-such-mps-ctl not found on PATH"


def test_stop_quits_daemon(mps: MPSManager) -> None:
    assert mps.check()
    mps.stop()
    assert "quit" in _commands(mps)
    assert mps.probe() is False
