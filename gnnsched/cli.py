"""The one ``gnnsched`` command. Each component registers its subcommand here and keeps its heavy imports
(torch, kopf, grpc, xgboost) inside the command body, so ``gnnsched --help`` stays instant."""

from __future__ import annotations

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

from gnnsched.node_agent.cli import register as _register_node_agent  # noqa: E402

_register_node_agent(app)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
