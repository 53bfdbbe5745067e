"""``gnnsched node-agent`` and ``gnnsched gate``. Registered by ``gnnsched.cli``; heavy imports stay in the bodies."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Optional

import typer

from gnnsched.cliutil import fail, setup_logging
from gnnsched.contract import (
    DEFAULT_AGENT_METRICS_PORT,
    DEFAULT_GATE_SOCKET,
    DEFAULT_MPS_LOG_DIR,
    DEFAULT_MPS_PIPE_DIR,
    MPS_MAX_CLIENTS_PER_GPU,
)
from gnnsched.policies import DEFAULT_BYPASS_LIMIT

_POLICIES = ("base", "lmcf", "bmc", "sqtf", "bqt")


def node_agent(
    gpus: str = typer.Option("nvml", "--gpus", help="nvml, or fake:NxSIZE (e.g. fake:2x80Gi) for machines without GPUs."),
    node_name: Optional[str] = typer.Option(None, "--node-name", envvar="NODE_NAME", help="Kubernetes node name (default: hostname)."),
    gate_socket: Path = typer.Option(Path(DEFAULT_GATE_SOCKET), "--gate-socket", help="Unix socket the gate listens on."),
    metrics_port: int = typer.Option(DEFAULT_AGENT_METRICS_PORT, "--metrics-port", help="Prometheus /metrics port (0: any free port, -1: off)."),
    metrics_addr: str = typer.Option("0.0.0.0", "--metrics-addr", help="Address /metrics binds to."),
    policy: str = typer.Option("base", "--policy", help="Grouping policy: base|lmcf|bmc|sqtf|bqt."),
    bypass_limit: int = typer.Option(DEFAULT_BYPASS_LIMIT, "--bypass-limit", help="Backfill: a queued pod that does not fit may be overtaken by at most N pods later in the policy's order before it blocks them (0: admit a strict prefix of the order, no overtaking)."),
    reserve_bytes: str = typer.Option("1Gi", "--reserve-bytes", help="Memory per GPU the gate never commits (quantity)."),
    reserve_fraction: float = typer.Option(0.0, "--reserve-fraction", help="Reserve as a fraction of each GPU (the larger of the two applies)."),
    max_clients_per_gpu: int = typer.Option(MPS_MAX_CLIENTS_PER_GPU, "--max-clients-per-gpu", help="MPS clients per GPU (capped by the GPU model's limit)."),
    active_thread_percentage: str = typer.Option("auto", "--active-thread-percentage", help="CUDA_MPS_ACTIVE_THREAD_PERCENTAGE per client: auto (100 / group size) or 1-100."),
    mps: str = typer.Option("on", "--mps", help="on: start, configure and supervise nvidia-cuda-mps-control; off: not managed here."),
    mps_pipe_dir: Path = typer.Option(Path(DEFAULT_MPS_PIPE_DIR), "--mps-pipe-dir"),
    mps_log_dir: Path = typer.Option(Path(DEFAULT_MPS_LOG_DIR), "--mps-log-dir"),
    compute_mode: str = typer.Option("exclusive", "--compute-mode", help="exclusive (EXCLUSIVE_PROCESS, as MPS wants), default, or keep."),
    live_memory_check: bool = typer.Option(True, "--live-memory-check/--no-live-memory-check", help="Also admit only into memory the driver reports free (second check besides the books)."),
    pods_file: Optional[Path] = typer.Option(None, "--pods-file", help="Read pods/GNNJobs from this JSON file instead of the API server (development)."),
    status_file: Optional[Path] = typer.Option(None, "--status-file", help="Write GPUNode status to this file instead of the API server (development)."),
    peer_check: str = typer.Option("cgroup", "--peer-check", help="cgroup: verify the pod UID against the peer's cgroup (Linux); off: trust the claimed UID."),
    recovery_grace: float = typer.Option(5.0, "--recovery-grace", help="Seconds after start before admitting new pods (running ones reconnect first)."),
    status_interval: float = typer.Option(5.0, "--status-interval", help="Seconds between GPUNode status writes (also written on change)."),
    event_log: Optional[Path] = typer.Option(None, "--event-log", help="Append gate events (queued/admitted/released) as JSON lines."),
    log_level: str = typer.Option("info", "--log-level"),
) -> None:
    """Run the node agent: MPS daemon, memory-safety gate, GPUNode status and metrics."""
    import asyncio
    import signal

    from gnnsched.quantity import QuantityError, parse_bytes

    setup_logging(log_level)
    if policy.lower() not in _POLICIES:
        fail(f"--policy: {policy!r} is not one of {'|'.join(_POLICIES)}")
    try:
        reserve = parse_bytes(reserve_bytes)
    except QuantityError as exc:
        fail(f"--reserve-bytes: {exc}")
    if reserve < 0:
        fail("--reserve-bytes: must be >= 0")
    if not 0.0 <= reserve_fraction < 1.0:
        fail("--reserve-fraction: must be in [0, 1)")
    if not 1 <= max_clients_per_gpu <= MPS_MAX_CLIENTS_PER_GPU:
        fail(f"--max-clients-per-gpu: must be in 1..{MPS_MAX_CLIENTS_PER_GPU}")
    atp: int | None = None
    if active_thread_percentage != "auto":
        try:
            atp = int(active_thread_percentage)
        except ValueError:
            atp = -1
        if not 1 <= atp <= 100:
            fail("--active-thread-percentage: use auto or an integer 1-100")
    if mps not in ("on", "off"):
        fail("--mps: use on or off")
    if compute_mode not in ("exclusive", "default", "keep"):
        fail("--compute-mode: use exclusive, default or keep")
    if peer_check not in ("cgroup", "off"):
        fail("--peer-check: use cgroup or off")
    if bypass_limit < 0:
        fail("--bypass-limit: must be >= 0 (0: strict prefix of the policy's order)")
    if recovery_grace < 0 or status_interval <= 0:
        fail("--recovery-grace/--status-interval: must be >= 0 / > 0")

    from gnnsched.node_agent.agent import AgentOptions, NodeAgent
    from gnnsched.node_agent.identity import IS_LINUX, FilePodLookup, PeerVerifier
    from gnnsched.node_agent.mps import MPSConfig, MPSManager
    from gnnsched.node_agent.status import FileStatusSink

    from gnnsched.gpu_backend import BackendSpecError, GPUBackendError, open_backend

    if peer_check == "cgroup" and not IS_LINUX:
        fail("--peer-check: cgroup needs Linux (SO_PEERCRED and /proc); use --peer-check off elsewhere")
    try:
        backend = open_backend(gpus)
    except BackendSpecError as exc:
        fail(str(exc))
    except GPUBackendError as exc:
        fail(f"--gpus {gpus}: {exc}", code=1)
    devices = backend.devices()
    if not devices:
        fail(f"--gpus {gpus}: no GPUs found", code=1)

    name = node_name or socket.gethostname()
    if pods_file is not None:
        pods = FilePodLookup(pods_file)
    else:
        from gnnsched.node_agent.identity import KubePodLookup

        try:
            pods = KubePodLookup()
        except Exception as exc:
            fail(f"--pods-file: not given and no Kubernetes API reachable ({exc})", code=1)
    if status_file is not None:
        sink = FileStatusSink(status_file)
    else:
        from gnnsched.node_agent.status import KubeStatusSink

        try:
            sink = KubeStatusSink()
        except Exception as exc:
            fail(f"--status-file: not given and no Kubernetes API reachable ({exc})", code=1)

    mps_mgr = None
    if mps == "on":
        mps_mgr = MPSManager(MPSConfig(
            pipe_directory=mps_pipe_dir, log_directory=mps_log_dir, devices=[d.index for d in devices],
            compute_mode=None if compute_mode == "keep" else compute_mode,
        ))
    opts = AgentOptions(
        node_name=name, gate_socket=gate_socket, policy=policy.lower(), reserve_bytes=reserve,
        reserve_fraction=reserve_fraction, max_clients_per_gpu=max_clients_per_gpu,
        pipe_directory=str(mps_pipe_dir), active_thread_percentage=atp, status_interval=status_interval,
        recovery_grace=recovery_grace, event_log=event_log, metrics_port=None if metrics_port < 0 else metrics_port,
        metrics_addr=metrics_addr, live_memory_check=live_memory_check, bypass_limit=bypass_limit,
    )
    agent = NodeAgent(opts, backend, pods, sink, PeerVerifier(enabled=peer_check == "cgroup"), mps=mps_mgr)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await agent.run(stop)

    asyncio.run(main())


def gate(
    ctx: typer.Context,
    socket_path: Optional[str] = typer.Option(None, "--socket", help="Gate socket (default: $GNNSCHED_GATE_SOCKET or the node default)."),
    wait_seconds: float = typer.Option(7 * 24 * 3600.0, "--wait-seconds", help="Give up (exit 4) if no agent answers for this long."),
    container: str = typer.Option("", "--container", help="Container name, when several containers of one pod are gated."),
) -> None:
    """Wait at the node agent's gate, then exec CMD with the admitted GPU and MPS limits: gnnsched gate -- CMD [ARGS]."""
    from gnnsched.node_agent.gate_client import EXIT_NO_AGENT, GateUsageError, run

    try:
        run(list(ctx.args), socket_path, wait_seconds, container)
    except GateUsageError as exc:
        fail(str(exc))
    except OSError as exc:  # never let typer turn an EPIPE into a silent exit 1: say what broke
        fail(f"gate: {exc}", code=EXIT_NO_AGENT)


def register(app: typer.Typer) -> None:
    app.command("node-agent")(node_agent)
    app.command("gate", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(gate)
