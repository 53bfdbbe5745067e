"""The gate's wire protocol: newline-delimited JSON over a unix stream socket.

One request per connection, then replies until the connection ends::

    client → {"op": "admit", "version": 1, "podUid": ..., "podName": ..., "podNamespace": ..., "container": ""}
    agent  → {"status": "queued", "position": 3}                       (zero or more times)
    agent  → {"status": "admitted", "gpuUuid": ..., "gpuIndex": 0, "bytes": ..., "memLimit": "0=1024M",
              "activeThreadPercentage": 50, "pipeDirectory": ..., "group": "g7", "admittedAt": "2026-..."}
          or {"status": "rejected", "reason": "pod-uid-mismatch", "message": ...}

The connection then stays open for as long as the admitted workload runs (the client's keeper process holds it):
its end is the release. After an agent restart the keeper reconnects and sends
``{"op": "resume", ..., "gpuUuid": ..., "bytes": ..., "group": ..., "admittedAt": ...}`` and gets
``{"status": "resumed"}`` or a rejection. Lines are capped at ``MAX_LINE`` bytes.

While an admitted (or resumed) workload runs, the keeper may send its progress on the same connection, at most every
``gnnsched.progress.REPORT_INTERVAL_S``::

    client → {"op": "progress", "steps": 40, "total": 200, "seconds": 12.5}

(steps done of ``total``, in ``seconds`` since the first step began). The agent answers nothing: a report it cannot
parse is logged and dropped, and the connection, whose end is the release, stays open.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator
from pydantic.alias_generators import to_camel

PROTOCOL_VERSION = 1
MAX_LINE = 16 * 1024


class _Wire(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    def line(self) -> bytes:
        return self.model_dump_json(by_alias=True, exclude_none=True).encode() + b"\n"


_Uid = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[0-9A-Za-z-]+$")]
_Name = Annotated[str, Field(min_length=1, max_length=253)]


class AdmitRequest(_Wire):
    op: Literal["admit"]
    version: int = PROTOCOL_VERSION
    pod_uid: _Uid
    pod_name: _Name
    pod_namespace: _Name
    container: Annotated[str, Field(max_length=253)] = ""


class ResumeRequest(_Wire):
    op: Literal["resume"]
    version: int = PROTOCOL_VERSION
    pod_uid: _Uid
    pod_name: _Name
    pod_namespace: _Name
    container: Annotated[str, Field(max_length=253)] = ""
    gpu_uuid: Annotated[str, Field(min_length=1, max_length=128)]
    bytes: Annotated[int, Field(gt=0)]
    group: str | None = None
    admitted_at: str | None = None


Request = Annotated[AdmitRequest | ResumeRequest, Field(discriminator="op")]
REQUEST = TypeAdapter(Request)


class ProgressReport(_Wire):
    """A running workload's progress (the keeper forwards what the workload wrote on ``$GNNSCHED_PROGRESS_FD``)."""

    op: Literal["progress"]
    steps: Annotated[int, Field(ge=0)]
    total: Annotated[int, Field(ge=1)]
    seconds: Annotated[float, Field(ge=0)]

    @model_validator(mode="after")
    def _consistent(self) -> ProgressReport:
        if self.steps > self.total:
            raise ValueError(f"steps {self.steps} exceeds total {self.total}")
        if not math.isfinite(self.seconds):
            raise ValueError("seconds must be finite")
        return self


PROGRESS = TypeAdapter(ProgressReport)


class Queued(_Wire):
    status: Literal["queued"] = "queued"
    position: int


class Admitted(_Wire):
    status: Literal["admitted"] = "admitted"
    gpu_uuid: str
    gpu_index: int
    bytes: int
    mem_limit: str
    active_thread_percentage: int
    pipe_directory: str
    group: str
    admitted_at: str
    env: dict[str, str] | None = None  # extra workload environment (the fake GPU's limit enforcement only)


class Resumed(_Wire):
    status: Literal["resumed"] = "resumed"


class Rejected(_Wire):
    status: Literal["rejected"] = "rejected"
    reason: str
    message: str


Reply = Annotated[Queued | Admitted | Resumed | Rejected, Field(discriminator="status")]
REPLY = TypeAdapter(Reply)


def parse_request(line: bytes) -> AdmitRequest | ResumeRequest:
    """Parse one request line; raises ``ValueError`` whose message names the bad field."""
    return _parse(REQUEST, line, "request")


def parse_progress(line: bytes) -> ProgressReport:
    """Parse one progress line; raises ``ValueError`` whose message names the bad field."""
    return _parse(PROGRESS, line, "progress")


def _parse(adapter: TypeAdapter[Any], line: bytes, what: str) -> Any:
    try:
        return adapter.validate_json(line)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err.get("loc", ())) or what
        raise ValueError(f"{where}: {err.get('msg', 'invalid')}") from None


def mem_limit_value(nbytes: int) -> str:
    """``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` for one visible device: rounded *down* to MiB so the MPS limit never
    exceeds the bytes the gate booked (min 1 MiB)."""
    return f"0={max(1, nbytes // (1 << 20))}M"
