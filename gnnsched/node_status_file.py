"""The node agent's status file: how the agent tells other processes on the node (the device plugin) what it sees.

Why a file and not an RPC: the device plugin must keep advertising (and marking slots unhealthy) while the agent
restarts, and must not depend on the agent's process being up to answer. The agent rewrites the file on every
status publish; readers treat a missing, unreadable or stale file as "MPS not known to be healthy".

Format: ``GPUNodeStatus.wire()`` JSON (camelCase, as in the ``GPUNode`` object); readers also accept a whole
``GPUNode`` object (``{"apiVersion", "kind": "GPUNode", "metadata", "status"}``) and use its ``status``. Path:
``<node state directory>/contract.NODE_STATUS_FILE_NAME`` (:func:`status_file_path`). That directory
(``contract.DEFAULT_NODE_STATE_DIR``) is written only by the agent and the MPS daemon and mounted read-only into the
device plugin; it is never mounted into job pods. (It used to be the MPS pipe directory, which every job pod mounts
read-write because MPS clients need it: any job could have forged the health the plugin advertises.)
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from pydantic import ValidationError

from gnnsched.contract import GPUNODE_KIND, NODE_STATUS_FILE_NAME, GPUNodeStatus

__all__ = [
    "StatusFileError",
    "read_status_file",
    "status_age_seconds",
    "status_file_path",
    "write_json_atomic",
    "write_status_file",
]


def status_file_path(state_dir: str | os.PathLike[str]) -> Path:
    """Where the agent writes (and the device plugin reads) the status, given the node state directory."""
    return Path(state_dir) / NODE_STATUS_FILE_NAME


class StatusFileError(Exception):
    """The status file is missing, unreadable or not a ``GPUNodeStatus``; the message says which."""


def write_json_atomic(path: str | os.PathLike[str], obj: object) -> None:
    """Atomically replace ``path`` with ``obj`` as JSON (write a temporary file in the same directory, then rename),
    so a reader never sees a half-written file. Mode 0644: readable by the plugin, writable by the owner only."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(obj, fh, separators=(",", ":"))
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_status_file(path: str | os.PathLike[str], status: GPUNodeStatus) -> None:
    """Atomically replace ``path`` with ``status``."""
    write_json_atomic(path, status.wire())


def read_status_file(path: str | os.PathLike[str]) -> GPUNodeStatus:
    """Read and validate the status file; raise :class:`StatusFileError` with a one-line reason."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise StatusFileError(f"node agent status file {path} does not exist") from None
    except OSError as exc:
        raise StatusFileError(f"cannot read node agent status file {path}: {exc.strerror}") from None
    try:
        obj = json.loads(text)
    except ValueError as exc:
        raise StatusFileError(f"node agent status file {path} is not JSON: {exc}") from None
    if isinstance(obj, dict) and obj.get("kind") == GPUNODE_KIND and isinstance(obj.get("status"), dict):
        obj = obj["status"]  # a whole GPUNode object (as the agent's file sink writes it) is accepted too
    try:
        return GPUNodeStatus.model_validate(obj)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(root)"
        raise StatusFileError(f"node agent status file {path}: {where}: {first['msg']}") from None


def status_age_seconds(status: GPUNodeStatus, now: datetime | None = None) -> float | None:
    """Seconds since the agent wrote ``status`` (None when it carries no ``updatedAt``)."""
    if status.updated_at is None:
        return None
    at = status.updated_at if status.updated_at.tzinfo else status.updated_at.replace(tzinfo=timezone.utc)
    return ((now or datetime.now(timezone.utc)) - at).total_seconds()
