"""The one ``gnnsched`` command. Each component registers its subcommand here and keeps its heavy imports
(torch, kopf, grpc, xgboost) inside the command body, so ``gnnsched --help`` stays instant."""

from __future__ import annotations

import importlib

import typer

from gnnsched import __version__
from gnnsched.contract import (
    DEFAULT_JOB_RUNTIME_CLASS,
    DEFAULT_JOBS_UID,
    ENV_JOB_NODE_SELECTOR,
    ENV_JOB_RUNTIME_CLASS,
    ENV_JOB_TOLERATIONS,
    ENV_JOBS_UID,
    SCHEDULER_NAME,
)
from gnnsched.scheduler_config import DEFAULT_SCORING_STRATEGY

app = typer.Typer(
    name="gnnsched",
    help="Memory-safe GPU sharing for GNN jobs on Kubernetes. Every subcommand has its own --help.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gnnsched {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Memory-safe GPU sharing for GNN jobs on Kubernetes."""


# --- component registrations (one block per component; keep imports light) ---

# operator (issue 6): `gnnsched operator [--namespace NS ... | --all-namespaces]`, `gnnsched operator export-history`
operator_app = typer.Typer(help="The GNNJob operator (kopf) and its history export.", invoke_without_command=True,
                            no_args_is_help=False, rich_markup_mode=None)


@operator_app.callback()
def _operator(
    ctx: typer.Context,
    namespace: list[str] = typer.Option([], "--namespace", "-n", help="Watch this namespace (repeatable)."),
    all_namespaces: bool = typer.Option(False, "--all-namespaces", "-A", help="Watch every namespace (default)."),
    image: str = typer.Option(None, "--image", envvar="GNNSCHED_IMAGE",
                              help="Worker image for pods whose GNNJob names none."),
    scheduler_name: str = typer.Option("gnnsched-scheduler", "--scheduler-name", envvar="GNNSCHED_SCHEDULER_NAME",
                                       help="schedulerName of the pods (the profile that calls the extender)."),
    health_port: int = typer.Option(9401, "--health-port", min=0, max=65535,
                                    help="Port of the liveness probe (GET /healthz); 0 turns it off."),
    metrics_port: int = typer.Option(9402, "--metrics-port", min=0, max=65535,
                                     help="Port of the Prometheus metrics (GET /metrics, gnnsched_operator_*); "
                                          "0 turns them off."),
    worker_device: str = typer.Option("cuda", "--worker-device",
                                      help="Device of the built-in worker in job pods: cuda (GPU nodes) or cpu "
                                           "(nodes whose GPUs are fake, e.g. tests/e2e/local_cluster.py)."),
    worker_prestart: bool = typer.Option(
        False, "--worker-prestart/--no-worker-prestart",
        help="The built-in worker imports, loads its graph and builds its model on the CPU while it waits at the "
             "gate (gnnsched gate --prestart), then touches the GPU once admitted. On in the chart "
             "(operator.workerPrestart), off by default on the command line. The CPU start-up runs under a "
             "pre-admission CUDA guard (gnnsched.gpu.cuda_guard); where the guard misses a path into the CUDA "
             "driver the worker re-executes itself once admitted, paying its start-up twice instead of failing "
             "(docs/gpu-measurements.md; bench/gpu/prestart_check.py says on a GPU whether that happens)."),
    default_gpu_model: str = typer.Option("A100-40GB", "--default-gpu-model",
                                          help="GPU model for runtime predictions while no GPUNode has reported."),
    workers: int = typer.Option(8, "--workers", min=1, max=256, help="Handler threads (estimation is CPU work)."),
    queue_priority: bool = typer.Option(
        False,
        "--queue-priority/--no-queue-priority",
        help="Shortest-predicted-first: give each pod the PriorityClass of its "
        "predicted runtime's bucket, so kube-scheduler's queue tries shorter "
        "jobs first (the classes never preempt; the chart creates them). A "
        "GNNJob's spec.priorityClassName always wins.",
    ),
    retry_priority: bool = typer.Option(
        False,
        "--retry-priority/--no-retry-priority",
        help="Put an attempt resized after running out of its GPU memory "
        "reservation, or requeued as a co-located fault's victim, in the "
        "PriorityClass PREFIXretry (value base + buckets), ahead of every pod "
        "that has not run yet (the chart creates it; queuePriority.retryFirst). "
        "A GNNJob's spec.priorityClassName always wins.",
    ),
    queue_priority_base: int = typer.Option(
        1000,
        "--queue-priority-base",
        help="Value of the longest-runtime class; shorter buckets get base+1, "
        "base+2, ... Must match the chart's queuePriority.base.",
    ),
    queue_priority_prefix: str = typer.Option(
        "gnnsched-runtime-",
        "--queue-priority-prefix",
        help="Class names are PREFIX000, PREFIX001, ... (chart: queuePriority.prefix).",
    ),
    queue_priority_per_doubling: int = typer.Option(
        2,
        "--queue-priority-per-doubling",
        help="Buckets per doubling of the predicted runtime, 1..8 (chart: queuePriority.perDoubling).",
    ),
    run_as_user: int = typer.Option(
        DEFAULT_JOBS_UID,
        "--run-as-user",
        envvar=ENV_JOBS_UID,
        min=1,
        help="UID every job pod runs as (runAsUser; MPS serves one user at a time, so it "
        "must match the node side's; chart: jobs.runAsUser).",
    ),
    memory_limit_factor: float = typer.Option(
        2.0,
        "--memory-limit-factor",
        envvar="GNNSCHED_JOB_MEMORY_LIMIT_FACTOR",
        help="Each job container's memory limit as a multiple of its right-sized memory request; 0 = no limit, "
        "else >= 1 (chart: jobs.memoryLimitFactor; docs/operator.md says why twice).",
    ),
    runtime_class_name: str = typer.Option(
        DEFAULT_JOB_RUNTIME_CLASS,
        "--runtime-class-name",
        envvar=ENV_JOB_RUNTIME_CLASS,
        help="RuntimeClass of job pods ('' = none; chart: jobs.runtimeClassName).",
    ),
    tolerations: str = typer.Option(
        None,
        "--tolerations",
        envvar=ENV_JOB_TOLERATIONS,
        help="Tolerations of every job pod as a JSON list (default: tolerate the "
        "nvidia.com/gpu NoSchedule taint; '[]' = none; chart: jobs.tolerations). "
        "A GNNJob's spec.tolerations are added.",
    ),
    node_selector: str = typer.Option(
        None,
        "--node-selector",
        envvar=ENV_JOB_NODE_SELECTOR,
        help="nodeSelector of every job pod as a JSON object (default none; chart: "
        "jobs.nodeSelector). A GNNJob's spec.nodeSelector is added.",
    ),
    probe_cpu: str = typer.Option(
        "1", "--probe-cpu", help="CPU request and limit of an entrypoint job's probe pod (chart: operator.probe.cpu)."
    ),
    probe_memory: str = typer.Option(
        "2Gi", "--probe-memory",
        help="Memory request and limit of the probe pod: the user's image imports torch and PyG in it "
        "(chart: operator.probe.memory).",
    ),
    probe_deadline: int = typer.Option(
        600, "--probe-deadline", min=30,
        help="activeDeadlineSeconds of the probe pod; past it the job runs as a failed probe's does "
        "(chart: operator.probe.deadlineSeconds).",
    ),
    checkpoint_every_seconds: int = typer.Option(
        10, "--checkpoint-every-seconds", min=1, max=86400,
        help="Seconds between a checkpointing job's saves when its spec.checkpoint.everySeconds is left out "
        "(chart: checkpoint.everySeconds).",
    ),
    checkpoint_storage_class: str = typer.Option(
        "", "--checkpoint-storage-class",
        help="StorageClass of the PVC the operator creates for a checkpointing job without claimName (default: the "
        "cluster's default class; chart: checkpoint.storageClass).",
    ),
    checkpoint_size: str = typer.Option(
        "1Gi", "--checkpoint-size", help="Storage request of that PVC (chart: checkpoint.size)."
    ),
    checkpoint_access_mode: str = typer.Option(
        "ReadWriteMany", "--checkpoint-access-mode",
        help="Access mode of that PVC: ReadWriteMany where a job's attempts may run on different nodes "
        "(chart: checkpoint.accessMode).",
    ),
    kubeconfig: str = typer.Option(
        None, "--kubeconfig", help="Kubeconfig file (default: in-cluster, then $KUBECONFIG)."
    ),
    context: str = typer.Option(None, "--context", help="Kubeconfig context."),
    watch_timeout: float = typer.Option(
        None, "--watch-timeout", min=0.1, help="Seconds a watch request may last before it is renewed (kopf default)."
    ),
    resync_seconds: float = typer.Option(
        30.0, "--resync-seconds", min=0.1, help="How often unfinished jobs are re-derived from their pods."
    ),
    predictor_model_configmap: str = typer.Option(
        None, "--predictor-model-configmap",
        help="NAMESPACE/NAME of the ConfigMap the retrain CronJob keeps the runtime model in; it is re-read every "
             "--predictor-reload-seconds and a changed model is used without a restart (default: the shipped model "
             "only; chart: always set).",
    ),
    predictor_reload_seconds: float = typer.Option(
        60.0, "--predictor-reload-seconds", min=1.0, help="How often the runtime model's ConfigMap is re-read."
    ),
    log_level: str = typer.Option("info", "--log-level", help="debug, info, warning or error."),
) -> None:
    """Run the GNNJob operator (watches GNNJobs and their pods until interrupted)."""
    if ctx.invoked_subcommand is not None:
        return
    from gnnsched.cliutil import fail, setup_logging

    if namespace and all_namespaces:
        fail("--namespace and --all-namespaces are mutually exclusive")
    if worker_device not in ("cuda", "cpu"):
        fail(f"--worker-device: must be cuda or cpu, got {worker_device!r}")
    from gnnsched.gpu.catalogue import get_gpu_model

    try:
        get_gpu_model(default_gpu_model)
    except KeyError as exc:  # else every job would fail later with EstimationFailed
        fail(f"--default-gpu-model: {exc.args[0]}")
    setup_logging(log_level)
    from gnnsched.queue_order import QueueOrder, QueueOrderError

    try:
        QueueOrder(base=queue_priority_base, prefix=queue_priority_prefix, per_doubling=queue_priority_per_doubling)
    except QueueOrderError as exc:
        flag = {"queuePriority.base": "--queue-priority-base", "queuePriority.prefix": "--queue-priority-prefix",
                "queuePriority.perDoubling": "--queue-priority-per-doubling"}.get(exc.field, exc.field)
        fail(f"{flag}: {exc.message}")
    from gnnsched.operator.checkpoint import checkpoint_settings
    from gnnsched.operator.handlers import OperatorConfig
    from gnnsched.operator.main import run
    from gnnsched.operator.podspec import job_pod_settings
    from gnnsched.operator.probe import probe_settings

    try:
        pods = job_pod_settings(run_as_user, runtime_class_name, tolerations, node_selector, memory_limit_factor)
        probe = probe_settings(probe_cpu, probe_memory, probe_deadline)
        checkpoint = checkpoint_settings(checkpoint_every_seconds, checkpoint_storage_class, checkpoint_size,
                                         checkpoint_access_mode)
    except ValueError as exc:
        fail(str(exc))
    fields = {"pods": pods, "probe": probe, "checkpoint": checkpoint, "namespaces": list(namespace),
              "default_gpu_model": default_gpu_model,
              "workers": workers, "watch_client_timeout": watch_timeout, "resync_seconds": resync_seconds,
              "scheduler_name": scheduler_name, "worker_device": worker_device,
              "worker_prestart": worker_prestart, "health_port": health_port or None,
              "metrics_port": metrics_port or None, "queue_priority": queue_priority, "retry_priority": retry_priority,
              "queue_priority_base": queue_priority_base, "queue_priority_prefix": queue_priority_prefix,
              "queue_priority_per_doubling": queue_priority_per_doubling,
              "predictor_model_configmap": predictor_model_configmap,
              "predictor_reload_seconds": predictor_reload_seconds}
    if image:
        fields["image"] = image
    if predictor_model_configmap is not None and predictor_model_configmap.count("/") != 1:
        fail(f"--predictor-model-configmap: {predictor_model_configmap!r} must be NAMESPACE/NAME")
    try:
        config = OperatorConfig(**fields)
    except ValueError as exc:  # pydantic's ValidationError: name the flag of the first bad field
        err = exc.errors()[0] if hasattr(exc, "errors") else {"loc": ("?",), "msg": str(exc)}
        fail(f"--{str(err['loc'][0]).replace('_', '-')}: {err['msg']}")
    run(config, kubeconfig=kubeconfig, context=context)


@operator_app.command("export-history")
def _operator_export_history(
    out: str = typer.Option(..., "--out", "-o", help="JSON-lines file to write ('-' for stdout)."),
    namespace: str = typer.Option(None, "--namespace", "-n", help="Only this namespace (default: all)."),
    append: bool = typer.Option(False, "--append", help="Append to --out instead of replacing it."),
    kubeconfig: str = typer.Option(None, "--kubeconfig", help="Kubeconfig file."),
    context: str = typer.Option(None, "--context", help="Kubeconfig context."),
) -> None:
    """Write one JSON line per finished GNNJob (spec, resources, predicted and observed runtime and peak)."""
    import json
    import sys
    from pathlib import Path

    from gnnsched.cliutil import fail
    from gnnsched.kubeclient import load_client_configuration
    from gnnsched.operator.history import write_jsonl
    from gnnsched.operator.kube import Kube, KubeError
    from gnnsched.operator.main import export_history

    try:
        kube = Kube(load_client_configuration(kubeconfig, context))
        records = export_history(kube, namespace)
    except KubeError as exc:
        fail(f"cannot list GNNJobs: {exc}", code=1)
    except Exception as exc:  # kubeconfig missing or unreadable
        fail(f"--kubeconfig: {exc}")
    if out == "-":
        for record in records:
            sys.stdout.write(json.dumps(record, sort_keys=True) + "\n")
        return
    try:
        count = write_jsonl(records, Path(out), append=append)
    except OSError as exc:
        fail(f"--out: cannot write {out}: {exc.strerror or exc}")
    typer.echo(f"wrote {count} history records to {out}", err=True)


app.add_typer(operator_app, name="operator")


# doctor (issue 20): `gnnsched doctor` - a preflight of the current kubeconfig context for administrators
@app.command("doctor")
def _doctor(
    namespace: str = typer.Option("gnnsched", "--namespace", "-n", help="Namespace gnnsched's chart is installed in."),
    kubeconfig: str = typer.Option(None, "--kubeconfig", help="Kubeconfig file (default: $KUBECONFIG, then "
                                                               "~/.kube/config, as kubectl finds it)."),
    context: str = typer.Option(None, "--context", help="Kubeconfig context (default: the current one)."),
    crds: str = typer.Option(None, "--crds", help="Directory of the CRDs to compare with (default: this "
                                                  "checkout's crds/)."),
    runtime_class: str = typer.Option(DEFAULT_JOB_RUNTIME_CLASS, "--runtime-class",
                                      help="RuntimeClass job pods use (chart: jobs.runtimeClassName; '' = none)."),
    gpu_node_label: str = typer.Option("nvidia.com/gpu.present=true", "--gpu-node-label",
                                       help="key=value label of GPU nodes (chart: node.nodeSelector)."),
    tolerations: str = typer.Option(None, "--tolerations", help="Job pods' tolerations as JSON (chart: "
                                                               "jobs.tolerations; default: nvidia.com/gpu)."),
    run_test_job: bool = typer.Option(False, "--run-test-job", help="Also run one tiny GNNJob to Succeeded "
                                                                    "(created, watched, deleted)."),
    test_namespace: str = typer.Option("default", "--test-namespace", help="Namespace of the test GNNJob."),
    timeout: float = typer.Option(300.0, "--timeout", min=1.0, help="Seconds the test GNNJob may take."),
    as_json: bool = typer.Option(False, "--json", help="Print the checks as JSON instead of the checklist."),
) -> None:
    """Check that the cluster in the current kubeconfig context can run gnnsched: the scheduler's version against
    the API server, the CRDs, the jobs' RuntimeClass, Pod Security of the namespace, GPU node labels and taints,
    every node agent (Ready, MPS up, compute mode, shared /dev/shm), a second device plugin on the GPU nodes, the
    admission policies that keep tenants off the GPU shares, and optionally one test job. Prints a checklist with a
    fix for each failure; exits 1 when there is a blocker (docs/doctor.md)."""
    import json
    from pathlib import Path

    from gnnsched.cliutil import fail
    from gnnsched.doctor import ClusterReader, DoctorError, default_crds_dir, render, run_checks

    if "=" not in gpu_node_label:
        fail(f"--gpu-node-label: {gpu_node_label!r} is not key=value")
    if tolerations:
        try:
            tol = json.loads(tolerations)
        except ValueError as exc:
            fail(f"--tolerations: not JSON: {exc}")
        if not isinstance(tol, list) or not all(isinstance(t, dict) for t in tol):
            fail("--tolerations: must be a JSON list of objects")
    else:
        tol = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    crds_dir = Path(crds) if crds else default_crds_dir()
    if crds and not Path(crds).is_dir():
        fail(f"--crds: {crds} is not a directory")
    try:
        import kubernetes

        configuration = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=kubeconfig, context=context,
                                           client_configuration=configuration)
        reader = ClusterReader(kubernetes.client.ApiClient(configuration))
    except Exception as exc:  # noqa: BLE001 - no kubeconfig, bad context: one line
        fail(f"--kubeconfig: {exc}", code=1)
    try:
        checks = run_checks(reader, namespace, crds_dir, runtime_class, gpu_node_label, tol, test_job=run_test_job,
                            test_namespace=test_namespace, timeout=timeout)
    except DoctorError as exc:
        fail(str(exc), code=1)
    if as_json:
        typer.echo(json.dumps([c.model_dump() for c in checks], indent=2))
    else:
        typer.echo(render(checks))
    if any(c.status == "FAIL" for c in checks):
        raise typer.Exit(1)

from gnnsched.simulator.cli import simulate as _simulate  # noqa: E402  (simulator; heavy imports inside)

app.command("simulate")(_simulate)

# estimator and worker (core): these modules import torch only inside the command bodies.
from gnnsched.estimate_cli import estimate_command  # noqa: E402
from gnnsched.worker_cli import worker_command  # noqa: E402

app.command("estimate")(estimate_command)
app.command("worker")(worker_command)

from gnnsched.node_agent.cli import register as _register_node_agent  # noqa: E402

_register_node_agent(app)

from gnnsched.predictor.cli import app as _predictor_app  # noqa: E402  (predictor: typer only at import)

app.add_typer(_predictor_app, name="predictor")


@app.command("extender")
def extender_cmd(
    host: str = typer.Option("0.0.0.0", help="Address to listen on."),
    port: int = typer.Option(8888, help="Port to listen on (kube-scheduler's urlPrefix points here)."),
    fake_cluster: str = typer.Option(
        None, "--fake-cluster", help="Serve a synthetic cluster N[xG][xMODEL] (e.g. 5000x8xH100-80GB) instead of "
        "watching the API; binds are recorded in memory."
    ),
    fake_state: str = typer.Option(
        None, "--fake-state", help="With --fake-cluster: JSON file keeping bound pods, so a restart rebuilds them."
    ),
    fake_seed: int = typer.Option(0, "--fake-seed", help="Seed of the synthetic cluster."),
    reservation_ttl: float = typer.Option(300.0, help="Seconds a reservation waits for the node agent's report."),
    bind_timeout: float = typer.Option(
        4.0, "--bind-timeout", help="Seconds the Binding call may take; keep it below kube-scheduler's httpTimeout "
        "for the extender (5s by default) so the scheduler always gets the answer."
    ),
    kubeconfig: str = typer.Option(None, help="kubeconfig file (default: in-cluster, then ~/.kube/config)."),
    log_level: str = typer.Option("info", help="Log level."),
    metrics_host: str = typer.Option("0.0.0.0", "--metrics-host", help="Address of the metrics/health listener."),
    metrics_port: int = typer.Option(
        None, "--metrics-port", help="Serve /metrics, /healthz and /readyz on this port too (probes, Prometheus)."
    ),
    print_scheduler_config: bool = typer.Option(
        False, "--print-scheduler-config", help="Print the KubeSchedulerConfiguration for this extender and exit."
    ),
    url_prefix: str = typer.Option(
        None, "--url-prefix", help="With --print-scheduler-config: the extender URL kube-scheduler calls."
    ),
    scheduler_name: str = typer.Option(
        SCHEDULER_NAME, "--scheduler-name",
        help="With --print-scheduler-config: the profile's schedulerName (the operator's GNNSCHED_SCHEDULER_NAME) "
             "and the leader-election lease name.",
    ),
    scoring_strategy: str = typer.Option(
        DEFAULT_SCORING_STRATEGY, "--scoring-strategy",
        help="With --print-scheduler-config: NodeResourcesFit's scoring in the profile, LeastAllocated (spread, "
             "kube-scheduler's default) or MostAllocated (pack GNN pods, keeping whole nodes free for pods asking many "
             "cores: for clusters short of CPU).",
    ),
    trust_domain: str = typer.Option(
        "namespace", "--trust-domain",
        help="Whose pods may share a GPU (docs/extender.md): namespace, label:<key> (namespaces with the same value "
             "of Namespace label <key>; needs get on namespaces) or cluster (anyone). Match the node agents'.",
    ),
) -> None:
    """kube-scheduler extender: filter, prioritize and bind GNN pods (HTTP, k8s.io/kube-scheduler/extender/v1)."""
    import sys
    from pathlib import Path

    if print_scheduler_config:
        from gnnsched.scheduler_config import scheduler_config_yaml

        try:
            typer.echo(scheduler_config_yaml(url_prefix, scoring_strategy=scoring_strategy,
                                             scheduler_name=scheduler_name), nl=False)
        except ValueError as exc:
            flag = {"scoring_strategy": "--scoring-strategy", "scheduler_name": "--scheduler-name"}.get(
                str(exc).split(":", 1)[0], "--url-prefix")
            print(f"{flag}: {exc}", file=sys.stderr)
            raise typer.Exit(2) from None
        return
    if not 0 < port < 65536:
        print(f"--port: {port} is not a TCP port", file=sys.stderr)
        raise typer.Exit(2)
    server = importlib.import_module("gnnsched.extender.server")
    ExtenderOptions, OptionError, serve = server.ExtenderOptions, server.OptionError, server.serve

    opts = ExtenderOptions(
        host=host, port=port, fake_cluster=fake_cluster, fake_state=Path(fake_state) if fake_state else None,
        fake_seed=fake_seed, reservation_ttl=reservation_ttl, kubeconfig=kubeconfig, log_level=log_level.lower(),
        metrics_host=metrics_host, metrics_port=metrics_port, bind_timeout=bind_timeout, trust_domain=trust_domain,
    )
    try:
        serve(opts)
    except OptionError as exc:
        print(str(exc), file=sys.stderr)
        raise typer.Exit(2) from None


@app.command("device-plugin")
def device_plugin(
    plugin_dir: str = typer.Option(
        "/var/lib/kubelet/device-plugins",
        "--plugin-dir",
        help="kubelet's device-plugin directory (holds kubelet.sock).",
    ),
    gpus: str = typer.Option(
        "nvml", "--gpus", help="GPU backend: nvml, or fake:NxSIZE[xMODEL] (e.g. fake:2x80Gi) without a GPU."
    ),
    slots_per_gpu: int = typer.Option(
        48, "--slots-per-gpu", help="gnnsched.io/gpu-share slots advertised per GPU (1-48, MPS clients)."
    ),
    mps_pipe_dir: str = typer.Option(
        "/var/run/gnnsched/mps", "--mps-pipe-dir", help="MPS pipe directory mounted into job containers."
    ),
    gate_socket: str = typer.Option(
        "/var/run/gnnsched/gate.sock",
        "--gate-socket",
        help="Node agent's gate socket; its directory is mounted into job containers.",
    ),
    mps_shm_dir: str = typer.Option(
        "/var/run/gnnsched/mps-shm",
        "--mps-shm-dir",
        help="Host tmpfs the MPS daemon uses as /dev/shm; mounted at /dev/shm in job containers ('none': not mounted).",
    ),
    state_dir: str = typer.Option(
        "/var/lib/gnnsched/node-state",
        "--state-dir",
        help="Node state directory the agent writes its status to (read-only here).",
    ),
    device_list_strategy: str = typer.Option(
        "envvar",
        "--device-list-strategy",
        help="How containers get the GPUs (NVIDIA's flag): envvar (NVIDIA_VISIBLE_DEVICES, for the nvidia runtime) or "
             "cdi-cri (CDI device names in the Allocate response).",
    ),
    device_id_strategy: str = typer.Option(
        "uuid",
        "--device-id-strategy",
        help="How GPUs are named in NVIDIA_VISIBLE_DEVICES and CDI names (NVIDIA's flag): uuid or index.",
    ),
    mps_status_file: str = typer.Option(
        None,
        "--mps-status-file",
        help="Node agent status file for MPS health (default: <state-dir>/gnnsched-node-status.json; 'none' = do not "
             "watch MPS).",
    ),
    mps_status_max_age: float = typer.Option(
        60.0, "--mps-status-max-age", help="Seconds after which the agent's status counts as stale (MPS unhealthy)."
    ),
    poll_interval: float = typer.Option(1.0, "--poll-interval", help="Seconds between GPU/MPS health checks."),
    log_level: str = typer.Option("info", "--log-level", help="debug, info, warning or error."),
) -> None:
    """Kubelet device plugin: advertise gnnsched.io/gpu-share MPS client slots and mount the gate and MPS pipes."""
    # The CLI is the composition root: it loads the component lazily, by name, only when this command runs.
    run = importlib.import_module("gnnsched.device_plugin.cli").run
    run(plugin_dir=plugin_dir, gpus=gpus, slots_per_gpu=slots_per_gpu, mps_pipe_dir=mps_pipe_dir,
        gate_socket=gate_socket, mps_status_file=mps_status_file, mps_status_max_age=mps_status_max_age,
        poll_interval=poll_interval, log_level=log_level, mps_shm_dir=mps_shm_dir, state_dir=state_dir,
        device_list_strategy=device_list_strategy, device_id_strategy=device_id_strategy)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
