"""The cluster's own history of finished GNNJobs: one JSON object per line, written by the operator, read to retrain
the GNN runtime model (``gnnsched predictor train --from-history FILE``).

Kept deliberately flat so the operator can write it without importing anything heavy::

    {"spec": {...GNNJob spec as in the manifest...}, "requested": {"cpu": "8", "memory": "32Gi"},
     "scaled": {"cpu": 4, "memory": 17179869184}, "gpu_model": "A100-80GB", "predicted_runtime_seconds": 812.0,
     "observed_runtime_seconds": 901.5, "pmc_bytes": 3221225472, "observed_peak_bytes": 3000000000,
     "node": "gpu-node-7", "finished_at": "2026-11-21T22:00:00Z"}

``cpu`` is cores and ``memory`` bytes; Kubernetes quantity strings ("500m", "32Gi") are accepted too. ``scaled`` is
what the job actually ran with — the model learns from it. Unknown keys are rejected so a typo cannot silently drop
a field.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gnnsched.gpu.catalogue import get_gpu_model
from gnnsched.quantity import QuantityError, parse_bytes, parse_cpu
from gnnsched.spec import GNNJobSpec, SpecError, parse_spec


class HistoryError(ValueError):
    """A history file line that is not a valid record; the message names file, line and field."""


class ResourceAmounts(BaseModel):
    """CPU cores and memory bytes; quantity strings are converted on the way in."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cpu: float = Field(gt=0)
    memory: int = Field(gt=0)

    @field_validator("cpu", mode="before")
    @classmethod
    def _cpu(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return parse_cpu(value)
            except QuantityError as exc:
                raise ValueError(str(exc)) from None
        return value

    @field_validator("memory", mode="before")
    @classmethod
    def _memory(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return parse_bytes(value)
            except QuantityError as exc:
                raise ValueError(str(exc)) from None
        return value


class HistoryRecord(BaseModel):
    """One finished GNNJob."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    spec: dict[str, Any]
    requested: ResourceAmounts
    scaled: ResourceAmounts
    gpu_model: str
    predicted_runtime_seconds: float | None = Field(default=None, ge=0)
    observed_runtime_seconds: float = Field(gt=0)
    pmc_bytes: int | None = Field(default=None, ge=0)
    observed_peak_bytes: int | None = Field(default=None, ge=0)
    node: str | None = None
    finished_at: datetime

    @field_validator("spec")
    @classmethod
    def _valid_spec(cls, value: dict[str, Any]) -> dict[str, Any]:
        try:
            parse_spec(value)
        except SpecError as exc:
            raise ValueError(str(exc)) from None
        return value

    @field_validator("gpu_model")
    @classmethod
    def _known_gpu(cls, value: str) -> str:
        try:
            return get_gpu_model(value).name
        except KeyError as exc:
            raise ValueError(str(exc.args[0])) from None

    def job_spec(self) -> GNNJobSpec:
        return parse_spec(self.spec)

    def to_json_line(self) -> str:
        """The record as one line of the history file (what the operator appends)."""
        return json.dumps(self.model_dump(mode="json"), separators=(",", ":"), sort_keys=True)


def append_history(path: str | Path, record: HistoryRecord) -> None:
    """Append one finished job to the history file (created if absent); one write per line, so a crash mid-way
    leaves at most one partial last line, which ``load_history`` reports by line number."""
    with Path(path).open("a", encoding="utf-8") as handle:
        handle.write(record.to_json_line() + "\n")


def load_history(path: str | Path, allow_empty: bool = False) -> list[HistoryRecord]:
    """Read a history JSONL file; blank lines are skipped, anything else invalid raises ``HistoryError``. A file
    with no records is an error unless ``allow_empty`` (the retrain CronJob: a cluster with no finished job yet)."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise HistoryError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise HistoryError(f"{path}: cannot read: {exc}") from None
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise HistoryError(f"{path}, line {number}: not JSON: {exc.msg} at column {exc.colno}") from None
        if not isinstance(obj, dict):
            raise HistoryError(f"{path}, line {number}: must be a JSON object, got {type(obj).__name__}")
        try:
            records.append(HistoryRecord.model_validate(obj))
        except ValidationError as exc:
            err = exc.errors(include_url=False)[0]
            field = ".".join(str(p) for p in err["loc"]) or "record"
            message = err["msg"].removeprefix("Value error, ")
            if err["type"] == "missing":
                message = "required"
            elif err["type"] == "extra_forbidden":
                message = "unknown field"
            raise HistoryError(f"{path}, line {number}, field {field!r}: {message}") from None
    if not records and not allow_empty:
        raise HistoryError(f"{path}: no records (one JSON object per line expected)")
    return records
