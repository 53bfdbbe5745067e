"""Returning a repaired GPU to service: the request an admin leaves in the node state directory, and the rule the node
agent applies to it.

Why a file: the node state directory is a host path written only by the agent (and the MPS daemon), which
``kubectl exec`` into the agent's container reaches without a new port, API or credential; and a request outlives the
agent process, so the running agent honours it at its next sample and an agent that starts honours one it finds. The
admin writes it with ``gnnsched node-agent return-to-service GPU`` (an empty file ``touch``-ed by hand is a request
too); the agent consumes it (deletes the file) when it returns the GPU, or renames it ``<uuid>.rejected`` with the
reason inside when it refuses, so the admin's command, or ``cat``, can say why.

Why the agent checks anything at all: the request says a human repaired the GPU, but an agent that finds the GPU gone
from NVML, still unreadable there, or struck again by a hardware Xid after the request was made has better evidence
than the human had. It then refuses, and the GPU stays out (:func:`judge_return`). NVML cannot say that a GPU which
fell off the bus is fit again (docs/faults.md): that is the admin's call, which is why a human has to ask.
"""

from __future__ import annotations

import contextlib
import os
import pwd
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from pydantic import ValidationError

from gnnsched.attempts.fault_classes import is_hardware_xid
from gnnsched.contract import (
    RETURN_TO_SERVICE_DIR_NAME,
    RETURN_TO_SERVICE_REJECTED_SUFFIX,
    ReturnToServiceRequest,
)
from gnnsched.gpu.backend import GPUInfo

__all__ = [
    "PendingReturn",
    "Verdict",
    "consume_request",
    "hardware_mark",
    "judge_return",
    "pending_requests",
    "reject_request",
    "rejection",
    "request_folder",
    "when",
    "write_request",
]

MAX_REQUEST_BYTES = 4096
"""A request file is read up to this many bytes: it holds a short JSON object, never anything large."""

RefusalCode = Literal["unknown-gpu", "not-held", "still-faulty", "new-xid"]


def request_folder(state_dir: str | os.PathLike[str]) -> Path:
    """``<state dir>/return-to-service``: where requests are written and read."""
    return Path(state_dir) / RETURN_TO_SERVICE_DIR_NAME


def when(t: float | None) -> str:
    """A Unix time as the log lines and messages print it (UTC, whole seconds)."""
    if t is None:
        return "an unknown time"
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class PendingReturn:
    """One request file as the agent found it: the GPU it names, when it was made (the file's mtime) and by whom."""

    uuid: str
    path: Path
    requested_at: float
    requested_by: str
    note: str | None = None


def _owner(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def write_request(state_dir: str | os.PathLike[str], uuid: str, requested_by: str, note: str | None = None) -> Path:
    """Write the request for GPU ``uuid`` atomically (a reader never sees half a file) and drop an old refusal of the
    same GPU, so that what the agent answers next is about this request. Returns the request's path."""
    folder = request_folder(state_dir)
    folder.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        (folder / f"{uuid}{RETURN_TO_SERVICE_REJECTED_SUFFIX}").unlink()
    body = ReturnToServiceRequest(requested_by=requested_by[:256], note=note[:1024] if note else None)
    target = folder / uuid
    tmp = folder / f".{uuid}.tmp"
    tmp.write_text(body.model_dump_json(by_alias=True, exclude_none=True) + "\n", encoding="utf-8")
    os.replace(tmp, target)
    return target


def pending_requests(state_dir: str | os.PathLike[str]) -> list[PendingReturn]:
    """Every request in the folder, oldest first. Hidden files (a request being written) and refusals are skipped; a
    file that is empty or not a :class:`ReturnToServiceRequest` is a request by its owner, without a note."""
    folder = request_folder(state_dir)
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return []
    out = []
    for path in entries:
        name = path.name
        if name.startswith(".") or name.endswith(RETURN_TO_SERVICE_REJECTED_SUFFIX):
            continue
        try:
            st = path.stat()
            if not path.is_file():
                continue
            with path.open("rb") as fh:
                raw = fh.read(MAX_REQUEST_BYTES)
        except OSError:
            continue  # gone meanwhile (another reader, the admin)
        by, note = _owner(st.st_uid), None
        if raw.strip():
            try:
                body = ReturnToServiceRequest.model_validate_json(raw)
            except ValidationError:
                body = None
            if body is not None:
                by = body.requested_by or by
                note = body.note
        out.append(PendingReturn(uuid=name, path=path, requested_at=st.st_mtime, requested_by=by, note=note))
    return sorted(out, key=lambda r: (r.requested_at, r.uuid))


def consume_request(req: PendingReturn) -> None:
    """The request was honoured: delete it (an absent file is fine: nothing is left to do)."""
    with contextlib.suppress(FileNotFoundError):
        req.path.unlink()


def reject_request(req: PendingReturn, reason: str) -> Path:
    """The request was refused: write the reason to ``<uuid>.rejected`` first, then delete the request, so a reader
    that sees the request gone finds the reason already there. Returns the refusal's path."""
    rejected = req.path.with_name(req.path.name + RETURN_TO_SERVICE_REJECTED_SUFFIX)
    tmp = req.path.with_name(f".{req.path.name}{RETURN_TO_SERVICE_REJECTED_SUFFIX}.tmp")
    tmp.write_text(reason.strip() + "\n", encoding="utf-8")
    os.replace(tmp, rejected)
    consume_request(req)
    return rejected


def rejection(state_dir: str | os.PathLike[str], uuid: str) -> str | None:
    """The agent's reason for refusing the last request for ``uuid``; None when there is no refusal."""
    try:
        return (request_folder(state_dir) / f"{uuid}{RETURN_TO_SERVICE_REJECTED_SUFFIX}").read_text(
            encoding="utf-8").strip()
    except OSError:
        return None


def hardware_mark(device: GPUInfo) -> tuple[int, float | None] | None:
    """The driver view's hardware Xid mark on ``device`` (the Xid and when it came), or None when the driver does not
    hold the GPU out for a hardware Xid (healthy, an application Xid, or unhealthy for another reason)."""
    if device.healthy or device.unhealthy_xid is None or not is_hardware_xid(device.unhealthy_xid):
        return None
    return device.unhealthy_xid, device.unhealthy_since


@dataclass(frozen=True, slots=True)
class Verdict:
    """The agent's answer to one request: returned (``code`` None) or refused (``code`` says why, for the metric),
    with the Xid it clears (or would have) and since when the GPU was out."""

    code: RefusalCode | None
    message: str
    xid: int | None = None
    since: float | None = None

    @property
    def accepted(self) -> bool:
        return self.code is None


def judge_return(req: PendingReturn, device: GPUInfo | None, held: tuple[int, float] | None,
                 last_hardware_xid: tuple[int, float] | None) -> Verdict:
    """Whether the agent returns the GPU ``req`` names to service.

    ``device``: the GPU as the driver sees it now (None: no GPU with that UUID on this node); ``held``: the hardware
    Xid and since-when the agent keeps the GPU out by from its last status file (an agent restart: NVML's own mark is
    per process), if any; ``last_hardware_xid``: the latest hardware Xid this agent saw on the GPU, and when.

    Returned only if the GPU is present, out of service by a hardware Xid (the agent's mark or the driver's), NVML
    reads it without an error, and no hardware Xid came after the request was made (a GPU struck again after the admin
    looked at it is not repaired)."""
    if device is None:
        return Verdict("unknown-gpu", f"no GPU with UUID {req.uuid} on this node")
    name = f"GPU {device.index} ({device.uuid})"
    mark = held if held is not None else hardware_mark(device)
    if mark is None:
        if device.healthy:
            return Verdict("not-held", f"{name} is in service: there is nothing to return")
        return Verdict("not-held", f"{name} is not out of service by a hardware Xid but for {device.health_reason!r}: "
                                   "it returns by itself once NVML reports it healthy")
    xid, since = mark
    if not device.healthy and device.unhealthy_xid is None:
        return Verdict("still-faulty", f"{name}: NVML still reports a problem ({device.health_reason}): reset or "
                                       "replace the GPU, then ask again", xid, since)
    seen = [(t, x) for x, t in (mark, last_hardware_xid or (xid, None)) if t is not None]
    if seen and max(seen)[0] > req.requested_at:
        at, late = max(seen)
        return Verdict("new-xid", f"{name}: Xid {late} came at {when(at)}, after the request (made at "
                                  f"{when(req.requested_at)}): repair the GPU, then ask again", xid, since)
    return Verdict(None, f"{name}: returned to service", xid, since)
