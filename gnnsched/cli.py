"""The one ``gnnsched`` command. Each component registers its subcommand here and keeps its heavy imports
(torch, kopf, grpc, xgboost) inside the command body, so ``gnnsched --help`` stays instant."""

from __future__ import annotations

import importlib

import typer

from gnnsched import __version__

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
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """Memory-safe GPU sharing for GNN jobs on Kubernetes."""


# --- component registrations (one block per component; keep imports light) ---

# estimator and worker (core): these modules import torch only inside the command bodies.
from gnnsched.estimate_cli import estimate_command  # noqa: E402
from gnnsched.worker_cli import worker_command  # noqa: E402

app.command("estimate")(estimate_command)
app.command("worker")(worker_command)

from gnnsched.node_agent.cli import register as _register_node_agent  # noqa: E402

_register_node_agent(app)

from gnnsched.predictor.cli import app as _predictor_app  # noqa: E402  (predictor: typer only at import)

app.add_typer(_predictor_app, name="predictor")


@app.command("device-plugin")
def device_plugin(
    plugin_dir: str = typer.Option("/var/lib/kubelet/device-plugins", "--plugin-dir", help="kubelet's device-plugin directory (holds kubelet.sock)."),
    gpus: str = typer.Option("nvml", "--gpus", help="GPU backend: nvml, or fake:NxSIZE[xMODEL] (e.g. fake:2x80Gi) without a GPU."),
    slots_per_gpu: int = typer.Option(48, "--slots-per-gpu", help="gnnsched.io/gpu-share slots advertised per GPU (1-48, MPS clients)."),
    mps_pipe_dir: str = typer.Option("/var/run/gnnsched/mps", "--mps-pipe-dir", help="MPS pipe directory mounted into job containers."),
    gate_socket: str = typer.Option("/var/run/gnnsched/gate.sock", "--gate-socket", help="Node agent's gate socket; its directory is mounted into job containers."),
    mps_status_file: str = typer.Option(None, "--mps-status-file", help="Node agent status file for MPS health (default: <mps-pipe-dir>/gnnsched-node-status.json; 'none' = do not watch MPS)."),
    mps_status_max_age: float = typer.Option(60.0, "--mps-status-max-age", help="Seconds after which the agent's status counts as stale (MPS unhealthy)."),
    poll_interval: float = typer.Option(1.0, "--poll-interval", help="Seconds between GPU/MPS health checks."),
    log_level: str = typer.Option("info", "--log-level", help="debug, info, warning or error."),
) -> None:
    """Kubelet device plugin: advertise gnnsched.io/gpu-share MPS client slots and mount the gate and MPS pipes."""
    # The CLI is the composition root: it loads the component lazily, by name, only when this command runs.
    run = importlib.import_module("gnnsched.device_plugin.cli").run
    run(plugin_dir=plugin_dir, gpus=gpus, slots_per_gpu=slots_per_gpu, mps_pipe_dir=mps_pipe_dir,
        gate_socket=gate_socket, mps_status_file=mps_status_file, mps_status_max_age=mps_status_max_age,
        poll_interval=poll_interval, log_level=log_level)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
