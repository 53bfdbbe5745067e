"""What every ``gnnsched`` subcommand shares: one-line errors with exit status 2, and logging set-up.

Bad input must never produce a traceback: commands wrap their body in ``user_errors()``, which turns the project's
input errors into one line on stderr naming the field and exits 2 (the convention of ``typer``/``click`` usage errors).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import typer

from gnnsched.quantity import QuantityError
from gnnsched.spec import SpecError

USAGE_EXIT = 2


class UserError(Exception):
    """Bad input from the person at the terminal; the message is the whole explanation."""


def fail(message: str, code: int = USAGE_EXIT) -> NoReturn:
    """Print one line to stderr and exit."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


@contextmanager
def user_errors() -> Iterator[None]:
    """Map input errors to one stderr line and exit 2; anything else is a bug and keeps its traceback."""
    try:
        yield
    except SpecError as exc:
        fail(str(exc))
    except (UserError, QuantityError) as exc:
        fail(str(exc))


def setup_logging(level: str = "info", json_format: bool = False) -> None:
    """Configure the root logger once per process (components call this from their command, never at import)."""
    numeric = getattr(logging, level.upper(), None)
    if not isinstance(numeric, int):
        fail(f"--log-level: unknown level {level!r} (use debug, info, warning, error)")
    fmt = (
        '{"time":"%(asctime)s","level":"%(levelname)s","logger":"%(name)s","message":"%(message)s"}'
        if json_format
        else "%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.basicConfig(level=numeric, format=fmt, stream=sys.stderr, force=True)
