"""``gnnsched node-agent`` and ``gnnsched gate``. Registered by ``gnnsched.cli``; heavy imports stay in the bodies."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from gnnsched.cliutil import fail, setup_logging
from gnnsched.contract import (
    DEFAULT_AGENT_METRICS_PORT,
    DEFAULT_GATE_SOCKET,
    DEFAULT_JOBS_UID,
    DEFAULT_MPS_LOG_DIR,
    DEFAULT_MPS_PIPE_DIR,
    DEFAULT_MPS_SHM_DIR,
    DEFAULT_NODE_STATE_DIR,
    ENV_JOBS_UID,
    ENV_NODE_NAME,
    MPS_MAX_CLIENTS_PER_GPU,
)
from gnnsched.policies import DEFAULT_BYPASS_LIMIT, STARTUP_SECONDS

if TYPE_CHECKING:
    from gnnsched.node_agent.node_conflicts import NodeReader

_POLICIES = ("base", "lmcf", "bmc", "sqtf", "bqt")


def node_agent(
    ctx: typer.Context,
    gpus: str = typer.Option(
        "nvml", "--gpus",
        help="nvml, or fake:NxSIZE[xMODEL] (e.g. fake:2x80Gi, fake:2x80GixH100) for machines without GPUs; "
             "fake:NxSIZExnvml:NAME (fake:1x96Gixnvml:NVIDIA Z100) names a board the catalogue does not know.",
    ),
    node_name: str | None = typer.Option(
        None, "--node-name", envvar=ENV_NODE_NAME, help="Kubernetes node name (default: hostname)."
    ),
    gate_socket: Path = typer.Option(
        Path(DEFAULT_GATE_SOCKET), "--gate-socket", help="Unix socket the gate listens on."
    ),
    metrics_port: int = typer.Option(
        DEFAULT_AGENT_METRICS_PORT, "--metrics-port", help="Prometheus /metrics port (0: any free port, -1: off)."
    ),
    metrics_addr: str = typer.Option("0.0.0.0", "--metrics-addr", help="Address /metrics binds to."),
    policy: str = typer.Option("base", "--policy", help="Grouping policy: base|lmcf|bmc|sqtf|bqt."),
    bypass_limit: int = typer.Option(
        DEFAULT_BYPASS_LIMIT,
        "--bypass-limit",
        help="Backfill: a queued pod that does not fit may be overtaken by at most N pods later in the policy's order "
        "before it blocks them (0: admit a strict prefix of the order, no overtaking).",
    ),
    spread: bool = typer.Option(
        True,
        "--spread/--no-spread",
        help="Plan each admission decision in rounds of one pod per GPU, least loaded GPU first (least predicted "
        "work left of the pods running there, then fewest running pods), so pods spread over the node's GPUs "
        "instead of grouping onto the one with most free memory while others stay idle (the default, as in the "
        "chart).",
    ),
    startup_seconds: float = typer.Option(
        STARTUP_SECONDS, "--startup-seconds", min=0.0, max=3600.0,
        help="The process start-up a pod pays after its admission before its GPU work (interpreter, imports, graph "
        "load), as the spread rule assumes it: a pod's predicted end is its admission plus the start-up it has left "
        "(all of it behind the plain gate; behind gate --prestart what its wait did not cover) plus its predicted "
        "runtime. The default is torch and PyG's import time; set your image's.",
    ),
    share_when_pays: bool = typer.Option(
        False,
        "--share-when-pays/--share-on-memory",
        help="Let a pod join a GPU where others run only when the interference model predicts that finishes the "
        "work sooner than waiting for an idle GPU (and an inference pod's latency target holds); default: on "
        "memory alone (the robustness grid: the rule does not pay, docs/node-agent.md).",
    ),
    trust_domain: str = typer.Option(
        "namespace", "--trust-domain",
        help="Whose pods may share a GPU (docs/node-agent.md): namespace (each namespace alone), label:<key> (the "
        "namespaces whose Namespace label <key> has the same value; needs get on namespaces) or cluster (anyone).",
    ),
    reserve_bytes: str = typer.Option(
        "1Gi", "--reserve-bytes", help="Memory per GPU the gate never commits (quantity)."
    ),
    reserve_fraction: float = typer.Option(
        0.0, "--reserve-fraction", help="Reserve as a fraction of each GPU (the larger of the two applies)."
    ),
    max_clients_per_gpu: int = typer.Option(
        MPS_MAX_CLIENTS_PER_GPU, "--max-clients-per-gpu", help="MPS clients per GPU (capped by the GPU model's limit)."
    ),
    active_thread_percentage: str = typer.Option(
        "auto",
        "--active-thread-percentage",
        help="CUDA_MPS_ACTIVE_THREAD_PERCENTAGE per client: auto (100 / group size) or 1-100.",
    ),
    mps: str = typer.Option(
        "on",
        "--mps",
        help="on: start, configure and supervise nvidia-cuda-mps-control in this process (development); external: read "
        "the health `gnnsched mps-daemon` publishes in --state-dir (a real cluster); off: MPS not watched.",
    ),
    state_dir: Path = typer.Option(
        Path(DEFAULT_NODE_STATE_DIR),
        "--state-dir",
        help="Node state directory (written only by the agent and the MPS daemon, never mounted into jobs): the device "
        "plugin's status file and the MPS daemon's health.",
    ),
    mps_health_max_age: float = typer.Option(
        60.0,
        "--mps-health-max-age",
        help="With --mps external: seconds after which the daemon's health counts as stale (MPS down).",
    ),
    jobs_uid: int = typer.Option(
        DEFAULT_JOBS_UID,
        "--jobs-uid",
        envvar=ENV_JOBS_UID,
        help="The one UID gated processes must run as (MPS serves one user at a time); -1 admits any UID.",
    ),
    node_check: bool = typer.Option(
        True,
        "--node-check/--no-node-check",
        help="Read this node's Node object and report another device plugin advertising nvidia.com/gpu.",
    ),
    mps_pipe_dir: Path = typer.Option(Path(DEFAULT_MPS_PIPE_DIR), "--mps-pipe-dir"),
    mps_log_dir: Path = typer.Option(Path(DEFAULT_MPS_LOG_DIR), "--mps-log-dir"),
    compute_mode: str = typer.Option(
        "exclusive", "--compute-mode", help="exclusive (EXCLUSIVE_PROCESS, as MPS wants), default, or keep."
    ),
    live_memory_check: bool = typer.Option(
        True,
        "--live-memory-check/--no-live-memory-check",
        help="Also admit only into memory the driver reports free (second check besides the books).",
    ),
    stop_overruns: bool = typer.Option(
        True,
        "--stop-overruns/--no-stop-overruns",
        help="Stop (SIGKILL) a gated pod whose processes hold more GPU memory than it was admitted with plus the "
             "margin, or memory on a GPU it was not admitted to, with the reason on its pod; off: log and count only.",
    ),
    overrun_margin: float = typer.Option(
        0.05, "--overrun-margin", min=0.0, max=1.0,
        help="Fraction of a pod's admitted bytes it may hold over them before it is stopped (the larger of this and "
             "--overrun-margin-bytes applies; why: docs/node-agent.md).",
    ),
    overrun_margin_bytes: str = typer.Option(
        "512Mi", "--overrun-margin-bytes", help="Least margin over a pod's admitted bytes, a quantity.",
    ),
    max_gate_connections_per_pod: int = typer.Option(
        8, "--max-gate-connections-per-pod", min=1, max=1024,
        help="Concurrent gate connections one pod may hold; one more is refused (too-many-connections).",
    ),
    pods_file: Path | None = typer.Option(
        None, "--pods-file", help="Read pods/GNNJobs from this JSON file instead of the API server (development)."
    ),
    status_file: Path | None = typer.Option(
        None, "--status-file", help="Write GPUNode status to this file instead of the API server (development)."
    ),
    peer_check: str = typer.Option(
        "cgroup",
        "--peer-check",
        help="cgroup: verify the pod UID against the peer's cgroup (Linux); off: trust the claimed UID.",
    ),
    recovery_grace: float = typer.Option(
        5.0, "--recovery-grace", help="Seconds after start before admitting new pods (running ones reconnect first)."
    ),
    status_interval: float = typer.Option(
        5.0, "--status-interval", help="Seconds between GPUNode status writes (also written on change)."
    ),
    event_log: Path | None = typer.Option(
        None, "--event-log", help="Append gate events (queued/admitted/released) as JSON lines."
    ),
    measure_gpu_constants: bool = typer.Option(
        True,
        "--measure-gpu-constants/--no-measure-gpu-constants",
        help="Measure each GPU model's device constants (CUDA context at the jobs' active-thread share, cuBLAS and "
             "cuBLASLt workspaces, the allocator's rounding) at start and when the driver changes, and publish them "
             "in the GPUNode status (gpus[].measured); the operator plans with them.",
    ),
    gpu_constants_timeout: float = typer.Option(
        120.0, "--gpu-constants-timeout", min=1.0, max=3600.0,
        help="Seconds the measuring probe may take before it is killed (a failure: retried with backoff).",
    ),
    fake_gpu_constants: str = typer.Option(
        "",
        "--fake-gpu-constants",
        help="With --gpus fake: the stand-in measurement of every fake GPU, "
             "context=742Mi,cublas=32Mi,cublaslt=1Mi[,delay=SECONDS][,cc=9.0] (delay: the stand-in takes that "
             "long). Without it a catalogued fake model gets the catalogue's constants, the unnamed Fake-GPU "
             "test board the default entry's, and an nvml:NAME board none.",
    ),
    log_level: str = typer.Option("info", "--log-level"),
    fake_gpu_memory: str = typer.Option(
        "",
        "--fake-gpu-memory",
        help="With --gpus fake: enforce[:FACTOR] makes every admitted gnnsched worker enforce its MPS memory limit as "
             "a real GPU would (GNNSCHED_FAKE_GPU_MEMORY; development and tests).",
    ),
    fake_gpu_usage: Path | None = typer.Option(
        None,
        "--fake-gpu-usage",
        help="With --gpus fake and --fake-gpu-memory: a directory where admitted gnnsched workers record the device "
             "bytes they hold, which the fake GPUs list per process as NVML does (the agent stops a pod over its "
             "admitted bytes; GNNSCHED_FAKE_GPU_USAGE; development and tests).",
    ),
    fake_gpu_faults: Path | None = typer.Option(
        None,
        "--fake-gpu-faults",
        help="With --gpus fake: a directory whose files, named after a GPU UUID and holding an Xid number, are fatal "
             "faults on that GPU: the agent sees the Xid and every admitted gnnsched worker there fails as an MPS "
             "client of a terminated server (GNNSCHED_FAKE_GPU_FAULTS; development and tests).",
    ),
) -> None:
    """Run the node agent: MPS daemon, memory-safety gate, GPUNode status and metrics. `gnnsched node-agent
    return-to-service GPU` puts a repaired GPU back into service on the running agent."""
    if ctx.invoked_subcommand is not None:
        return
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
    try:
        margin_floor = parse_bytes(overrun_margin_bytes)
    except QuantityError as exc:
        fail(f"--overrun-margin-bytes: {exc}")
    if margin_floor < 0:
        fail("--overrun-margin-bytes: must be >= 0")
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
    if mps not in ("on", "off", "external"):
        fail("--mps: use on, off or external")
    if jobs_uid < -1:
        fail("--jobs-uid: a UID >= 0, or -1 for any")
    if mps_health_max_age <= 0:
        fail("--mps-health-max-age: must be > 0")
    if compute_mode not in ("exclusive", "default", "keep"):
        fail("--compute-mode: use exclusive, default or keep")
    if peer_check not in ("cgroup", "off"):
        fail("--peer-check: use cgroup or off")
    if bypass_limit < 0:
        fail("--bypass-limit: must be >= 0 (0: strict prefix of the policy's order)")
    if recovery_grace < 0 or status_interval <= 0:
        fail("--recovery-grace/--status-interval: must be >= 0 / > 0")
    workload_env: dict[str, str] = {}
    if fake_gpu_memory:
        from gnnsched.contract import ENV_FAKE_GPU_MEMORY
        from gnnsched.gpu.fake_memory import parse_fake_gpu_memory

        if not gpus.strip().startswith("fake:"):
            fail("--fake-gpu-memory: only with --gpus fake:NxSIZE (a real GPU enforces its own limit)")
        try:
            parse_fake_gpu_memory(fake_gpu_memory)
        except ValueError as exc:
            fail(f"--fake-gpu-memory: {exc}")
        workload_env[ENV_FAKE_GPU_MEMORY] = fake_gpu_memory.strip()
    if fake_gpu_usage is not None:
        from gnnsched.contract import ENV_FAKE_GPU_USAGE

        if not gpus.strip().startswith("fake:") or not fake_gpu_memory:
            fail("--fake-gpu-usage: only with --gpus fake:NxSIZE and --fake-gpu-memory (the workers count their "
                 "device bytes there; a real GPU's driver reports its own)")
        if not fake_gpu_usage.is_dir():
            fail(f"--fake-gpu-usage: {fake_gpu_usage} is not a directory")
        workload_env[ENV_FAKE_GPU_USAGE] = str(fake_gpu_usage.resolve())
    if fake_gpu_faults is not None:
        from gnnsched.contract import ENV_FAKE_GPU_FAULTS

        if not gpus.strip().startswith("fake:"):
            fail("--fake-gpu-faults: only with --gpus fake:NxSIZE (a real GPU faults by itself)")
        if not fake_gpu_faults.is_dir():
            fail(f"--fake-gpu-faults: {fake_gpu_faults} is not a directory")
        workload_env[ENV_FAKE_GPU_FAULTS] = str(fake_gpu_faults.resolve())

    fake_constants = None
    if fake_gpu_constants.strip():
        from gnnsched.node_agent.constants import parse_fake_constants

        if not gpus.strip().startswith("fake:"):
            fail("--fake-gpu-constants: only with --gpus fake:NxSIZE (a real GPU is measured)")
        try:
            fake_constants = parse_fake_constants(fake_gpu_constants)
        except ValueError as exc:
            fail(f"--fake-gpu-constants: {exc}")

    from gnnsched.gpu.backend import BackendSpecError, GPUBackendError, open_backend
    from gnnsched.node_agent.agent import AgentOptions, NodeAgent
    from gnnsched.node_agent.identity import IS_LINUX, FilePodLookup, PeerVerifier, PodLookup
    from gnnsched.node_agent.mps import MPSConfig, MPSManager
    from gnnsched.node_agent.mps_external import ExternalMPS
    from gnnsched.node_agent.status import FileStatusSink, StatusSink
    from gnnsched.trust.domain import parse_trust_domain

    try:
        trust = str(parse_trust_domain(trust_domain, "--trust-domain"))
    except ValueError as exc:
        fail(str(exc))
    if peer_check == "cgroup" and not IS_LINUX:
        fail("--peer-check: cgroup needs Linux (SO_PEERCRED and /proc); use --peer-check off elsewhere")
    if jobs_uid >= 0 and not IS_LINUX:
        fail("--jobs-uid: the UID check needs Linux (SO_PEERCRED); use --jobs-uid -1 elsewhere")
    name = node_name or socket.gethostname()
    try:
        backend = open_backend(gpus, node_name=name, fault_dir=fake_gpu_faults, usage_dir=fake_gpu_usage)
    except BackendSpecError as exc:
        fail(str(exc))
    except GPUBackendError as exc:
        fail(f"--gpus {gpus}: {exc}", code=1)
    devices = backend.devices()
    if not devices:
        fail(f"--gpus {gpus}: no GPUs found", code=1)

    pods: PodLookup
    if pods_file is not None:
        pods = FilePodLookup(pods_file)
    else:
        from gnnsched.node_agent.identity import KubePodLookup

        try:
            pods = KubePodLookup()
        except Exception as exc:
            fail(f"--pods-file: not given and no Kubernetes API reachable ({exc})", code=1)
    sink: StatusSink
    if status_file is not None:
        sink = FileStatusSink(status_file)
    else:
        from gnnsched.node_agent.status import KubeStatusSink

        try:
            sink = KubeStatusSink()
        except Exception as exc:
            fail(f"--status-file: not given and no Kubernetes API reachable ({exc})", code=1)

    nodes: NodeReader | None = None
    if node_check:
        from gnnsched.node_agent.node_conflicts import FileNodeReader, KubeNodeReader

        if pods_file is not None:
            nodes = FileNodeReader(pods_file)
        else:
            try:
                nodes = KubeNodeReader()
            except Exception as exc:
                fail(f"--node-check: no Kubernetes API reachable ({exc}); use --no-node-check", code=1)

    mps_mgr: MPSManager | ExternalMPS | None = None
    if mps == "on":
        mps_mgr = MPSManager(MPSConfig(
            pipe_directory=mps_pipe_dir, log_directory=mps_log_dir, devices=[d.index for d in devices],
            uuids=[d.uuid for d in devices], compute_mode=None if compute_mode == "keep" else compute_mode,
            owner_uid=jobs_uid if jobs_uid >= 0 else None,
        ))
    elif mps == "external":
        from gnnsched.node_agent.mps_daemon import health_file_path

        mps_mgr = ExternalMPS(health_file_path(state_dir), max_age_s=mps_health_max_age)
    opts = AgentOptions(
        node_name=name, gate_socket=gate_socket, policy=policy.lower(), reserve_bytes=reserve,
        reserve_fraction=reserve_fraction, max_clients_per_gpu=max_clients_per_gpu,
        pipe_directory=str(mps_pipe_dir), active_thread_percentage=atp, status_interval=status_interval,
        recovery_grace=recovery_grace, event_log=event_log, metrics_port=None if metrics_port < 0 else metrics_port,
        metrics_addr=metrics_addr, live_memory_check=live_memory_check, bypass_limit=bypass_limit,
        spread=spread, share_when_pays=share_when_pays, startup_seconds=startup_seconds, trust_domain=trust,
        state_dir=str(state_dir), jobs_uid=jobs_uid if jobs_uid >= 0 else None,
        workload_env=workload_env, measure_constants=measure_gpu_constants, fake_gpu_constants=fake_constants,
        constants_timeout=gpu_constants_timeout,
        # Reading the daemon's health file is cheap; probing a daemon of our own runs a process each time.
        mps_probe_interval=2.0 if mps == "external" else 10.0,
        stop_overruns=stop_overruns, overrun_margin=overrun_margin, overrun_margin_bytes=margin_floor,
        max_gate_connections_per_pod=max_gate_connections_per_pod,
    )
    agent = NodeAgent(opts, backend, pods, sink, PeerVerifier(enabled=peer_check == "cgroup"), mps=mps_mgr,
                      nodes=nodes)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await agent.run(stop)

    asyncio.run(main())


def gate(
    ctx: typer.Context,
    socket_path: str | None = typer.Option(
        None, "--socket", help="Gate socket (default: $GNNSCHED_GATE_SOCKET or the node default)."
    ),
    wait_seconds: float = typer.Option(
        7 * 24 * 3600.0, "--wait-seconds", help="Give up (exit 4) if no agent answers for this long."
    ),
    container: str = typer.Option(
        "", "--container", help="Container name, when several containers of one pod are gated."
    ),
    prestart: bool = typer.Option(
        False, "--prestart",
        help="Start CMD at once, with no GPU visible, while a keeper waits at the gate; CMD must read the admission "
             "from $GNNSCHED_GATE_HANDOFF_FD before it uses a GPU (the built-in `gnnsched worker` does).",
    ),
) -> None:
    """Wait at the node agent's gate, then exec CMD with the admitted GPU and MPS limits: gnnsched gate -- CMD
    [ARGS]."""
    from gnnsched.portable.gate import EXIT_NO_AGENT, GateUsageError, run

    try:
        run(list(ctx.args), socket_path, wait_seconds, container, prestart)
    except GateUsageError as exc:
        fail(str(exc))
    except OSError as exc:  # never let typer turn an EPIPE into a silent exit 1: say what broke
        fail(f"gate: {exc}", code=EXIT_NO_AGENT)


def mps_daemon(
    gpus: str = typer.Option(
        "nvml", "--gpus", help="nvml, or fake:NxSIZE (e.g. fake:2x80Gi) for machines without GPUs."
    ),
    mps_pipe_dir: Path = typer.Option(Path(DEFAULT_MPS_PIPE_DIR), "--mps-pipe-dir"),
    mps_log_dir: Path = typer.Option(Path(DEFAULT_MPS_LOG_DIR), "--mps-log-dir"),
    state_dir: Path = typer.Option(
        Path(DEFAULT_NODE_STATE_DIR),
        "--state-dir",
        help="Where the daemon's health is published (root-owned, not the pipe directory).",
    ),
    mps_shm_dir: str = typer.Option(
        DEFAULT_MPS_SHM_DIR,
        "--mps-shm-dir",
        help="Host tmpfs mounted at /dev/shm here and in every job; the health reports whether /dev/shm really is it "
             "('none': not checked).",
    ),
    clean_shm_dir: str = typer.Option(
        "none",
        "--clean-shm",
        help="The shared tmpfs as this container sees it (the chart: /dev/shm): emptied when this command starts an "
             "MPS daemon, since no client can be using it then ('none': never cleaned; outside the daemon's own "
             "container leave it so, or the host's /dev/shm is emptied).",
    ),
    jobs_uid: int = typer.Option(
        DEFAULT_JOBS_UID,
        "--jobs-uid",
        envvar=ENV_JOBS_UID,
        help="Owner of the pipe and log directories: the UID every gated pod runs as.",
    ),
    compute_mode: str = typer.Option(
        "exclusive", "--compute-mode", help="exclusive (EXCLUSIVE_PROCESS by GPU UUID, as MPS wants) or keep."
    ),
    pinned_mem_limit: str = typer.Option(
        "auto",
        "--default-pinned-mem-limit",
        help="Default pinned device memory limit per GPU set through the control daemon: auto (GPU memory less "
             "--reserve-bytes), a quantity (e.g. 70Gi), or off.",
    ),
    reserve_bytes: str = typer.Option(
        "1Gi",
        "--reserve-bytes",
        help="With --default-pinned-mem-limit auto: memory per GPU kept out of any client's reach (the agent's "
             "--reserve-bytes).",
    ),
    active_thread_percentage: int = typer.Option(
        0,
        "--default-active-thread-percentage",
        help="set_default_active_thread_percentage (1-100; 0: leave the daemon's default).",
    ),
    probe_interval: float = typer.Option(
        10.0, "--probe-interval", help="Seconds between health probes (restart when gone, publish health)."
    ),
    start_timeout: float = typer.Option(
        10.0, "--start-timeout", help="Seconds to wait for a started daemon to answer."
    ),
    mount_shm_only: bool = typer.Option(
        False,
        "--mount-shm",
        help="Make --mps-shm-dir a fresh tmpfs (privileged init container, Bidirectional mount propagation) and exit.",
    ),
    shm_size: str = typer.Option(
        "1Gi",
        "--shm-size",
        help="With --mount-shm: tmpfs size, a quantity (default 1Gi: docs/node-agent.md says why) or auto (half "
             "the node's memory, as NVIDIA's mount-shm).",
    ),
    disable: bool = typer.Option(
        False,
        "--disable",
        help="Quit the MPS daemon, put compute mode back to DEFAULT by UUID, publish 'disabled', exit.",
    ),
    reset_on_exit: bool = typer.Option(
        False,
        "--reset-on-exit",
        help="On SIGTERM also do what --disable does (default: exit without quit; in a pod the daemon ends with the "
             "container).",
    ),
    log_level: str = typer.Option("info", "--log-level"),
) -> None:
    """Run the node's MPS control daemon apart from the agent (privileged; see docs/node-agent.md)."""
    import signal
    import threading

    from gnnsched.quantity import QuantityError, parse_bytes

    setup_logging(log_level)
    if compute_mode not in ("exclusive", "keep"):
        fail("--compute-mode: use exclusive or keep")
    if jobs_uid < 0:
        fail("--jobs-uid: must be a UID >= 0")
    if not 0 <= active_thread_percentage <= 100:
        fail("--default-active-thread-percentage: use 1-100, or 0 to leave the default")
    if probe_interval <= 0 or start_timeout <= 0:
        fail("--probe-interval/--start-timeout: must be > 0")
    try:
        reserve = parse_bytes(reserve_bytes)
    except QuantityError as exc:
        fail(f"--reserve-bytes: {exc}")
    fixed: int | None = None
    if pinned_mem_limit not in ("auto", "off"):
        try:
            fixed = parse_bytes(pinned_mem_limit)
        except QuantityError as exc:
            fail(f"--default-pinned-mem-limit: {exc} (or use auto / off)")
        if fixed < (1 << 20):
            fail("--default-pinned-mem-limit: must be at least 1Mi")

    from gnnsched.gpu.backend import BackendSpecError, GPUBackendError, open_backend
    from gnnsched.node_agent.mps import MPSConfig, MPSError, MPSManager
    from gnnsched.node_agent.mps_daemon import (
        MPSDaemonService,
        mount_shm,
        pinned_limit_mib,
    )

    if mount_shm_only:
        if mps_shm_dir == "none" or not Path(mps_shm_dir).is_absolute():
            fail(f"--mps-shm-dir: --mount-shm needs an absolute path, got {mps_shm_dir!r}")
        size: str | None = None
        if shm_size != "auto":
            try:
                size = f"{parse_bytes(shm_size) // 1024}k"
            except QuantityError as exc:
                fail(f"--shm-size: {exc} (or use auto)")
        try:
            mount_shm(mps_shm_dir, size)
        except (MPSError, OSError) as exc:
            fail(f"--mount-shm: {exc}", code=1)
        return

    try:
        backend = open_backend(gpus)
    except BackendSpecError as exc:
        fail(str(exc))
    except GPUBackendError as exc:
        fail(f"--gpus {gpus}: {exc}", code=1)
    devices = backend.devices()
    backend.close()
    if not devices:
        fail(f"--gpus {gpus}: no GPUs found", code=1)
    limits: dict[int, str] = {}
    if pinned_mem_limit == "auto":
        limits = {d.index: pinned_limit_mib(d.total_bytes, reserve) for d in devices}
    elif fixed is not None:
        limits = {d.index: f"{fixed // (1 << 20)}M" for d in devices}
    cfg = MPSConfig(
        pipe_directory=mps_pipe_dir, log_directory=mps_log_dir, devices=[d.index for d in devices],
        uuids=[d.uuid for d in devices], compute_mode="exclusive" if compute_mode == "exclusive" else None,
        default_active_thread_percentage=active_thread_percentage or None, pinned_mem_limits=limits,
        owner_uid=jobs_uid, start_timeout=start_timeout,
    )
    service = MPSDaemonService(MPSManager(cfg), state_dir, jobs_uid, None if mps_shm_dir == "none" else mps_shm_dir,
                               shm_mount=None if clean_shm_dir == "none" else Path(clean_shm_dir))
    if disable:
        problems = service.disable()
        if problems:
            fail(f"--disable: {'; '.join(problems)}", code=1)
        return

    def on_signal(signum: int, frame: object) -> None:
        service.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    runner = threading.Thread(target=service.run, args=(probe_interval,), name="mps-daemon")
    runner.start()
    while runner.is_alive():
        runner.join(0.5)
    if reset_on_exit:
        problems = service.disable()
        if problems:
            fail(f"--reset-on-exit: {'; '.join(problems)}", code=1)


def return_to_service(
    gpu: str = typer.Argument(
        ..., metavar="GPU", show_default=False,
        help="The GPU to return: its index on this node (e.g. 1) or its UUID (GPU-...), as `kubectl get gpunode` or "
             "the agent's log names it.",
    ),
    state_dir: Path = typer.Option(
        Path(DEFAULT_NODE_STATE_DIR), "--state-dir",
        help="The node agent's --state-dir (the chart's node.paths.stateDir): its status file is read from there and "
             "the request written to its return-to-service/ folder.",
    ),
    note: str = typer.Option(
        "", "--note", help="Why (a ticket, what was repaired): the agent logs it with the return (at most 1024 "
                           "characters)."),
    wait: float = typer.Option(
        30.0, "--wait", min=0.0, max=3600.0,
        help="Seconds to wait for the running agent's answer (it reads requests at every sample, every 2 s); 0: "
             "write the request and exit.",
    ),
) -> None:
    """Return a repaired GPU to service: the running node agent drops the hold a hardware Xid put on it, without a
    restart.

    Run it in the node agent's container on the GPU's node, after the GPU was reset (nvidia-smi -r) or repaired:

    \b
      kubectl -n NAMESPACE exec NODE-POD -c agent -- \\
          gnnsched node-agent return-to-service 1 --note "reseated, ticket 123"

    It checks the GPU against the agent's status file (it must be out of service by a hardware Xid), writes the
    request to STATE_DIR/return-to-service/UUID and waits for the agent's answer. The agent returns the GPU if NVML
    sees it without an error and no hardware Xid came after the request; otherwise it refuses, says why, and the GPU
    stays out. Exit status: 0 returned (or the request written, with --wait 0), 1 refused or no answer, 2 bad input.
    """
    import getpass
    import os
    import time

    from gnnsched.attempts.fault_classes import is_hardware_xid
    from gnnsched.node_status_file import StatusFileError, read_status_file, status_file_path
    from gnnsched.return_to_service import rejection, write_request

    if len(note) > 1024:
        fail(f"--note: at most 1024 characters, got {len(note)}")
    path = status_file_path(state_dir)
    try:
        status = read_status_file(path)
    except StatusFileError as exc:
        fail(f"--state-dir: no node agent status to check the GPU against ({exc}); is this the agent's container?")
    known = ", ".join(f"{g.index} {g.uuid}" for g in status.gpus) or "none"
    wanted = gpu.strip()
    if wanted.isdigit():
        found = [g for g in status.gpus if g.index == int(wanted)]
    else:
        found = [g for g in status.gpus if g.uuid.lower() == wanted.lower()]
    if not wanted or not found:
        fail(f"GPU: no GPU {wanted!r} on node {status.node_name} (its GPUs: {known}); give an index or a UUID")
    g = found[0]
    name = f"GPU {g.index} ({g.uuid})"
    if g.healthy:
        fail(f"GPU: {name} is in service: there is nothing to return")
    if g.unhealthy_xid is None or not is_hardware_xid(g.unhealthy_xid):
        why = g.unhealthy_reason or ("draining after an MPS fault" if g.draining else "MPS or the driver")
        fail(f"GPU: {name} is out for {why!r}, not a hardware Xid: it returns by itself once that clears")
    try:
        user = getpass.getuser()
    except (OSError, KeyError):  # a container's UID without a passwd entry
        user = f"uid {os.getuid()}"
    by = f"{user}@{socket.gethostname()}"
    try:
        request = write_request(state_dir, g.uuid, by, note or None)
    except OSError as exc:
        fail(f"--state-dir: cannot write the request: {exc}", code=1)
    since = g.unhealthy_since.isoformat() if g.unhealthy_since else "an unknown time"
    typer.echo(f"asked the node agent to return {name} to service (out since {since}, Xid {g.unhealthy_xid}): "
               f"{request}")
    if wait <= 0:
        return
    deadline = time.monotonic() + wait
    while request.exists():
        if time.monotonic() >= deadline:
            fail(f"the node agent did not answer within {wait:g} s (is it running? its log says why); the request "
                 f"stays in {request} and is served when it reads it", code=1)
        time.sleep(0.2)
    refused = rejection(state_dir, g.uuid)
    if refused is not None:
        fail(f"the node agent refused: {refused}", code=1)
    typer.echo(f"{name} is back in service")


def register(app: typer.Typer) -> None:
    node_agent_app = typer.Typer(
        help="The node agent (`gnnsched node-agent [OPTIONS]` runs it) and what an admin asks of it.",
        invoke_without_command=True, no_args_is_help=False, rich_markup_mode=None)
    node_agent_app.callback()(node_agent)
    node_agent_app.command("return-to-service")(return_to_service)
    app.add_typer(node_agent_app, name="node-agent")
    app.command("mps-daemon")(mps_daemon)
    app.command("gate", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(gate)
