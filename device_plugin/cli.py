"""``gnnsched device-plugin``: run the plugin until SIGTERM/SIGINT.

Kept apart from ``gnnsched/cli.py`` so the typer command there stays a thin, import-free block; grpc and the
generated stubs are imported here, inside :func:`run`, only when the command actually runs.
"""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path

from gnnsched.cliutil import fail, setup_logging
from gnnsched.contract import DEFAULT_NODE_STATE_DIR, MPS_MAX_CLIENTS_PER_GPU

log = logging.getLogger("gnnsched.device_plugin")

NVML_UNAVAILABLE_EXIT = 1
RUNTIME_EXIT = 1
MAX_UNIX_SOCKET_PATH = 107  # sockaddr_un.sun_path is 108 bytes including the terminating NUL


def run(
    *,
    plugin_dir: str,
    gpus: str,
    slots_per_gpu: int,
    mps_pipe_dir: str,
    gate_socket: str,
    mps_status_file: str | None,
    mps_status_max_age: float,
    poll_interval: float,
    log_level: str,
    mps_shm_dir: str = "none",
    state_dir: str | None = None,
    device_list_strategy: str = "envvar",
    device_id_strategy: str = "uuid",
) -> None:
    """Validate flags (one line, exit 2 on a bad one), open the GPU backend, serve until a signal arrives."""
    setup_logging(log_level)
    if not 1 <= slots_per_gpu <= MPS_MAX_CLIENTS_PER_GPU:
        fail(
            f"--slots-per-gpu: must be between 1 and {MPS_MAX_CLIENTS_PER_GPU} (the MPS client limit), got "
            f"{slots_per_gpu}"
        )
    paths = [("--mps-pipe-dir", mps_pipe_dir), ("--gate-socket", gate_socket), ("--plugin-dir", plugin_dir)]
    if mps_shm_dir != "none":
        paths.append(("--mps-shm-dir", mps_shm_dir))
    if state_dir is not None:
        paths.append(("--state-dir", state_dir))
    for flag, value in paths:
        if not value or not Path(value).is_absolute():
            fail(f"{flag}: must be an absolute path, got {value!r}")
    if device_list_strategy not in ("envvar", "cdi-cri"):
        fail(f"--device-list-strategy: use envvar or cdi-cri, got {device_list_strategy!r}")
    if device_id_strategy not in ("uuid", "index"):
        fail(f"--device-id-strategy: use uuid or index, got {device_id_strategy!r}")
    if not Path(plugin_dir).is_dir():
        fail(f"--plugin-dir: {plugin_dir} is not a directory (is kubelet running with device plugins enabled?)")
    if not 0.01 <= poll_interval <= 60:
        fail(f"--poll-interval: must be between 0.01 and 60 seconds, got {poll_interval}")
    if mps_status_max_age <= 0:
        fail(f"--mps-status-max-age: must be positive, got {mps_status_max_age}")

    from gnnsched.gpu.backend import BackendSpecError, NVMLUnavailableError, open_backend
    from gnnsched.node_status_file import status_file_path

    from .mps_health import StatusFileMPSHealth, assume_mps_healthy
    from .server import DEFAULT_ENDPOINT, DevicePlugin, PluginConfig

    if len(str(Path(plugin_dir) / DEFAULT_ENDPOINT)) > MAX_UNIX_SOCKET_PATH:
        fail(f"--plugin-dir: {plugin_dir} is too long for a unix socket path ({MAX_UNIX_SOCKET_PATH} bytes at most)")

    try:
        backend = open_backend(gpus)
    except BackendSpecError as exc:
        fail(str(exc))
    except NVMLUnavailableError as exc:
        fail(str(exc), code=NVML_UNAVAILABLE_EXIT)

    if mps_status_file is None:
        mps_status_file = str(status_file_path(state_dir or DEFAULT_NODE_STATE_DIR))
    health = (
        assume_mps_healthy if mps_status_file == "none" else StatusFileMPSHealth(mps_status_file, mps_status_max_age)
    )
    config = PluginConfig(
        plugin_dir=Path(plugin_dir),
        slots_per_gpu=slots_per_gpu,
        mps_pipe_dir=mps_pipe_dir,
        mps_shm_dir=None if mps_shm_dir == "none" else mps_shm_dir,
        gate_socket=gate_socket,
        device_list_strategy=device_list_strategy,
        device_id_strategy=device_id_strategy,
        poll_interval_s=poll_interval,
    )
    plugin = DevicePlugin(backend, config, health)
    done = threading.Event()

    def _on_signal(signum: int, frame: object) -> None:  # noqa: ARG001
        log.info("signal %d: stopping", signum)
        done.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        plugin.start()
    except (RuntimeError, OSError) as exc:  # e.g. no permission to create the socket in the plugin dir
        backend.close()
        fail(f"--plugin-dir: cannot serve {config.socket_path}: {exc}", code=RUNTIME_EXIT)
    try:
        while not done.wait(1.0):
            pass
    finally:
        plugin.stop()
        backend.close()
