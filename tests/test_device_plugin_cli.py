"""``gnnsched device-plugin`` as a real process: registers with a test kubelet, follows the agent's status file at
its default place in the MPS pipe dir, stops cleanly on SIGTERM; bad flags give one line and exit 2."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from typing import Any

import pytest
from dp_test_kubelet import TestKubelet

from gnnsched import contract
from gnnsched.contract import GPUNodeStatus, MPSStatus
from gnnsched.gpu.backend import NVMLBackend, NVMLUnavailableError
from gnnsched.node_status_file import status_file_path, write_status_file

CMD = [sys.executable, "-m", "gnnsched.cli", "device-plugin"]


def test_cli_registers_follows_status_file_and_stops_on_sigterm(tmp_path):
    kubelet = TestKubelet(tmp_path)
    kubelet.start()
    pipe = tmp_path / "mps"
    proc = subprocess.Popen(
        [*CMD, f"--plugin-dir={tmp_path}", "--gpus=fake:2x16Gi", "--slots-per-gpu=3", f"--mps-pipe-dir={pipe}",
         f"--gate-socket={tmp_path}/gate/gate.sock", "--poll-interval=0.1", "--log-level=warning",
         f"--state-dir={tmp_path}/state", f"--mps-shm-dir={tmp_path}/shm"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert kubelet.wait_for(lambda: kubelet.lists, timeout=30), "plugin process never registered"
        devices = kubelet.latest()
        assert len(devices) == 6
        assert set(devices.values()) == {"Unhealthy"}  # no agent status file yet
        write_status_file(
            status_file_path(pipe),  # a forged status in the client-writable pipe dir: ignored
            GPUNodeStatus(node_name="n", updated_at=datetime.now(timezone.utc), mps=MPSStatus(healthy=True)),
        )
        time.sleep(0.5)
        assert set(kubelet.latest().values()) == {"Unhealthy"}
        write_status_file(
            status_file_path(tmp_path / "state"),
            GPUNodeStatus(node_name="n", updated_at=datetime.now(timezone.utc), mps=MPSStatus(healthy=True)),
        )
        assert kubelet.wait_for(lambda: set(kubelet.latest().values()) == {"Healthy"}, timeout=10)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kubelet.stop()
    assert not (tmp_path / "gnnsched-gpu-share.sock").exists()


@pytest.mark.parametrize(
    "args, field",
    [
        (["--slots-per-gpu=0"], "--slots-per-gpu"),
        (["--slots-per-gpu=49"], "--slots-per-gpu"),
        (["--gpus=fake:2xlots"], "--gpus"),
        (["--gpus=tpu"], "--gpus"),
        (["--gate-socket=relative/gate.sock"], "--gate-socket"),
        (["--plugin-dir=/definitely/not/here"], "--plugin-dir"),
        (["--poll-interval=0"], "--poll-interval"),
        (["--device-list-strategy=volume-mounts"], "--device-list-strategy"),
        (["--device-id-strategy=serial"], "--device-id-strategy"),
        (["--mps-shm-dir=shm"], "--mps-shm-dir"),
    ],
)
def test_bad_flags_one_line_exit_2(tmp_path, args, field):
    r = subprocess.run([*CMD, f"--plugin-dir={tmp_path}", "--gpus=fake:1x1Gi", *args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and field in lines[0] and "Traceback" not in r.stderr


def _nvml_loads() -> bool:
    try:
        NVMLBackend().close()
        return True
    except NVMLUnavailableError:
        return False


@pytest.mark.skipif(_nvml_loads(), reason="NVML loads on this machine")
def test_nvml_missing_one_line_nonzero(tmp_path):
    r = subprocess.run([*CMD, f"--plugin-dir={tmp_path}"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "NVML unavailable" in lines[0]


def test_cli_defaults_are_the_contract():
    """gnnsched/cli.py spells the defaults out (to keep `gnnsched --help` import-free); they must equal the contract."""
    from typer.main import get_command

    from gnnsched.cli import app

    group: Any = get_command(app)  # a TyperGroup (typer's own click), typed as a plain Command
    params = {p.name: p.default for p in group.commands["device-plugin"].params}
    assert params["plugin_dir"] == contract.DEFAULT_DEVICE_PLUGIN_DIR
    assert params["mps_pipe_dir"] == contract.DEFAULT_MPS_PIPE_DIR
    assert params["gate_socket"] == contract.DEFAULT_GATE_SOCKET
    assert params["slots_per_gpu"] == contract.MPS_MAX_CLIENTS_PER_GPU
    assert params["gpus"] == "nvml"


def test_plugin_dir_too_long_for_a_unix_socket(tmp_path):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    r = subprocess.run([*CMD, f"--plugin-dir={deep}", "--gpus=fake:1x1Gi"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "--plugin-dir" in lines[0] and "too long" in lines[0]
