"""Loaders for the real cluster traces in ``shared/data/traces``, with units and censoring made explicit.

Why a hand-written loader instead of pandas: every value is checked as it is read, so a bad file fails with one line
naming the file, the row and the column (``TraceError``) instead of a dtype surprise three functions later, and the
core does not depend on pandas.

Units (everything converted on the way in, so no caller has to remember the trace's conventions):

* openb pods (Alibaba cluster-trace-gpu-v2023): ``cpu_milli`` millicores -> ``cpu_cores``; ``memory_mib`` MiB ->
  ``memory_bytes``; ``num_gpu`` whole GPUs; ``gpu_milli`` thousandths of one GPU for sharing pods (1000 = a whole GPU);
  times are seconds from the trace start.
* openb nodes: ``cpu_milli``, ``memory_mib``, ``gpu`` count, ``model`` (trace code: G2, T4, P100, V100M16, ...).
* PAI-2020 machine spec (no header): ``machine, gpu_type, cap_cpu`` (cores), ``cap_mem`` (GB, decimal), ``cap_gpu``.
* DLRM 2025: cpu in vCPUs, gpu whole GPUs, rdma percent of one RNIC, memory and disk in GiB; times seconds from the
  trace start, empty when outside the trace window.

Censoring (what "runtime" means per row; ``Censoring`` enum):

* openb ``Succeeded``/``Failed``: ``runtime = deletion - scheduled``, exact (``EXACT``).
* openb ``Running``: still running at the end of its observation, so ``deletion - scheduled`` is a lower bound
  (``RIGHT``). Never use it as a label for a regressor of runtime.
* openb ``Pending``: never scheduled; no runtime (``NONE``).
* DLRM: empty ``scheduled_time`` means scheduled before the trace start (runtime >= deletion, ``LEFT``); empty
  ``deletion_time`` means still alive at the trace end (``RIGHT``, bound measured to the last timestamp in the file).
"""

from __future__ import annotations

import csv
import enum
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MIB = 2**20
GIB = 2**30


class TraceError(ValueError):
    """A trace file that cannot be read as the expected table; the message names file, row and column."""

    def __init__(self, path: str | Path, row: int | None, column: str | None, problem: str) -> None:
        self.path = str(path)
        self.row = row
        self.column = column
        self.problem = problem
        where = [self.path]
        if row is not None:
            where.append("header" if row == 0 else f"row {row}")
        if column is not None:
            where.append(f"column {column!r}")
        super().__init__(f"{', '.join(where)}: {problem}")


class Censoring(str, enum.Enum):
    """How much a row's runtime tells: exactly, a lower bound (right/left-censored), or nothing."""

    EXACT = "exact"
    RIGHT = "right"
    LEFT = "left"
    NONE = "none"


# --- low-level reading -----------------------------------------------------------------------------------------


def _rows(path: str | Path, columns: Sequence[str], header: bool = True) -> Iterator[tuple[int, dict[str, str]]]:
    """Yield ``(row_number, {column: text})`` with row 1 the first data row; check the header and row widths."""
    path = Path(path)
    try:
        handle = path.open(newline="", encoding="utf-8-sig")  # tolerate a byte-order mark
    except FileNotFoundError:
        raise TraceError(path, None, None, "no such file") from None
    except OSError as exc:
        raise TraceError(path, None, None, f"cannot open: {exc.strerror or exc}") from None
    with handle:
        reader = csv.reader(handle)
        try:
            first = next(reader, None)
        except (csv.Error, UnicodeDecodeError) as exc:
            raise TraceError(path, 0 if header else 1, None, f"not readable as CSV: {exc}") from None
        if first is None or (len(first) == 1 and not first[0].strip() and header):
            raise TraceError(path, None, None, "file is empty (expected a header line: " + ",".join(columns) + ")")
        if header:
            names = [name.strip() for name in first]
            for column in columns:
                if column not in names:
                    raise TraceError(path, 0, column, f"missing (the header has: {', '.join(names)})")
            index = {column: names.index(column) for column in columns}
            pending: list[list[str]] = []
        else:
            index = {column: i for i, column in enumerate(columns)}
            pending = [first]
        width = max(index.values()) + 1
        seen = 0

        def emit(number: int, record: list[str]) -> dict[str, str]:
            if len(record) < width:
                missing = next(c for c, i in index.items() if i >= len(record))
                raise TraceError(path, number, missing, f"missing value (row has {len(record)} fields)")
            return {column: record[i] for column, i in index.items()}

        for record in pending:
            seen += 1
            yield seen, emit(seen, record)
        try:
            for record in reader:
                if not record or (len(record) == 1 and not record[0].strip()):
                    continue  # blank line
                seen += 1
                yield seen, emit(seen, record)
        except (csv.Error, UnicodeDecodeError) as exc:
            raise TraceError(path, seen + 1, None, f"not readable as CSV: {exc}") from None
    if seen == 0:
        raise TraceError(path, None, None, "has a header but no data rows")


def _number(path: str | Path, row: int, column: str, text: str, *, optional: bool = False) -> float:
    """Parse one numeric cell; empty cells are NaN only where the trace documents them as possibly empty."""
    text = text.strip()
    if text == "" or text.lower() == "nan":
        if optional:
            return math.nan
        raise TraceError(path, row, column, "empty, expected a number")
    try:
        value = float(text)
    except ValueError:
        raise TraceError(path, row, column, f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise TraceError(path, row, column, f"{text!r} is not a finite number")
    return value


def _non_negative(path: str | Path, row: int, column: str, value: float) -> float:
    if value < 0:
        raise TraceError(path, row, column, f"{value:g} is negative")
    return value


# --- openb pods --------------------------------------------------------------------------------------------------

OPENB_POD_COLUMNS = (
    "name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "qos", "pod_phase",
    "creation_time", "deletion_time", "scheduled_time",
)
POD_PHASES = ("Succeeded", "Failed", "Running", "Pending")
QOS_CLASSES = ("BE", "Burstable", "LS", "Guaranteed")


@dataclass(frozen=True)
class PodTable:
    """openb pods as columns (numpy arrays, one entry per pod, file order), in SI units.

    ``runtime_seconds`` is NaN where ``censoring`` is ``NONE``; a lower bound where it is ``RIGHT``.
    """

    source: tuple[str, ...]
    name: tuple[str, ...]
    cpu_cores: np.ndarray
    memory_bytes: np.ndarray
    num_gpu: np.ndarray
    gpu_milli: np.ndarray
    qos: tuple[str, ...]
    phase: tuple[str, ...]
    creation_time: np.ndarray
    scheduled_time: np.ndarray
    deletion_time: np.ndarray
    runtime_seconds: np.ndarray
    censoring: tuple[Censoring, ...]

    def __len__(self) -> int:
        return len(self.name)

    @property
    def gpu_share(self) -> np.ndarray:
        """GPUs requested as a real number: ``num_gpu`` whole GPUs, or ``gpu_milli``/1000 of one for sharing pods."""
        return self.num_gpu * self.gpu_milli / 1000.0

    def select(self, mask: np.ndarray | Sequence[int]) -> PodTable:
        """The rows picked by a boolean mask or an index array, in that order."""
        idx = np.flatnonzero(mask) if np.asarray(mask).dtype == bool else np.asarray(mask, dtype=int)
        pick = lambda seq: tuple(seq[i] for i in idx)  # noqa: E731
        return PodTable(
            source=pick(self.source), name=pick(self.name), cpu_cores=self.cpu_cores[idx],
            memory_bytes=self.memory_bytes[idx], num_gpu=self.num_gpu[idx], gpu_milli=self.gpu_milli[idx],
            qos=pick(self.qos), phase=pick(self.phase), creation_time=self.creation_time[idx],
            scheduled_time=self.scheduled_time[idx], deletion_time=self.deletion_time[idx],
            runtime_seconds=self.runtime_seconds[idx], censoring=pick(self.censoring),
        )

    def finished(self) -> PodTable:
        """Pods whose runtime is known exactly (Succeeded or Failed): the only rows fit to be regression labels."""
        return self.select(np.array([c is Censoring.EXACT for c in self.censoring], dtype=bool))

    def time_ordered(self) -> PodTable:
        """Rows sorted by submission (creation) time, ties kept in file order, for splits that never peek ahead."""
        return self.select(np.argsort(self.creation_time, kind="stable"))

    def deduplicated(self) -> PodTable:
        """Drop pods identical in every column but the name: the openb variants re-use the default trace's pods
        (``cpu050`` shares 1,434 of its finished pods with ``default``), and a duplicate would count twice."""
        seen: set[tuple] = set()
        keep = []
        for i in range(len(self)):
            key = (self.cpu_cores[i], self.memory_bytes[i], self.num_gpu[i], self.gpu_milli[i], self.qos[i],
                   self.phase[i], self.creation_time[i], self.scheduled_time[i], self.deletion_time[i])
            if key not in seen:
                seen.add(key)
                keep.append(i)
        return self.select(np.asarray(keep, dtype=int))

    @staticmethod
    def concat(tables: Sequence[PodTable]) -> PodTable:
        first = tables[0]
        out: dict[str, Any] = {}
        for field in first.__dataclass_fields__:
            values = [getattr(t, field) for t in tables]
            out[field] = np.concatenate(values) if isinstance(values[0], np.ndarray) else sum(values, ())
        return PodTable(**out)


def load_openb_pods(path: str | Path) -> PodTable:
    """Read an openb pod list (``openb_pod_list_*.csv`` with phases and times).

    Every cell is validated: numbers must parse, requests must be non-negative, ``gpu_milli`` within 0-1000, phases and
    QoS from the trace's vocabulary, ``scheduled_time`` present unless the pod is Pending, and no finished pod may end
    before it was scheduled.
    """
    cols: dict[str, list] = {c: [] for c in OPENB_POD_COLUMNS}
    runtime: list[float] = []
    censoring: list[Censoring] = []
    for row, rec in _rows(path, OPENB_POD_COLUMNS):
        phase = rec["pod_phase"].strip()
        if phase not in POD_PHASES:
            raise TraceError(path, row, "pod_phase", f"{phase!r} is not one of {', '.join(POD_PHASES)}")
        qos = rec["qos"].strip()
        if qos not in QOS_CLASSES:
            raise TraceError(path, row, "qos", f"{qos!r} is not one of {', '.join(QOS_CLASSES)}")
        values = {}
        for column in ("cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "creation_time", "deletion_time"):
            values[column] = _non_negative(path, row, column, _number(path, row, column, rec[column]))
        if values["gpu_milli"] > 1000:
            raise TraceError(path, row, "gpu_milli", f"{values['gpu_milli']:g} exceeds 1000 (one whole GPU)")
        scheduled = _number(path, row, "scheduled_time", rec["scheduled_time"], optional=True)
        if phase != "Pending" and math.isnan(scheduled):
            raise TraceError(path, row, "scheduled_time", f"empty, but a {phase} pod must have been scheduled")
        if phase in ("Succeeded", "Failed"):
            if values["deletion_time"] < scheduled:
                raise TraceError(
                    path, row, "deletion_time",
                    f"{values['deletion_time']:g} is before scheduled_time {scheduled:g}",
                )
            runtime.append(values["deletion_time"] - scheduled)
            censoring.append(Censoring.EXACT)
        elif phase == "Running":
            runtime.append(max(values["deletion_time"] - scheduled, 0.0))
            censoring.append(Censoring.RIGHT)
        else:
            runtime.append(math.nan)
            censoring.append(Censoring.NONE)
        cols["name"].append(rec["name"].strip())
        cols["qos"].append(qos)
        cols["pod_phase"].append(phase)
        cols["scheduled_time"].append(scheduled)
        for column, value in values.items():
            cols[column].append(value)
    n = len(cols["name"])
    return PodTable(
        source=(str(path),) * n,
        name=tuple(cols["name"]),
        cpu_cores=np.asarray(cols["cpu_milli"], dtype=float) / 1000.0,
        memory_bytes=np.asarray(cols["memory_mib"], dtype=float) * MIB,
        num_gpu=np.asarray(cols["num_gpu"], dtype=float),
        gpu_milli=np.asarray(cols["gpu_milli"], dtype=float),
        qos=tuple(cols["qos"]),
        phase=tuple(cols["pod_phase"]),
        creation_time=np.asarray(cols["creation_time"], dtype=float),
        scheduled_time=np.asarray(cols["scheduled_time"], dtype=float),
        deletion_time=np.asarray(cols["deletion_time"], dtype=float),
        runtime_seconds=np.asarray(runtime, dtype=float),
        censoring=tuple(censoring),
    )


# --- node specs ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MachineSpec:
    """One machine of a trace's cluster, in SI units; ``gpu_model`` is the trace's code (None for CPU-only)."""

    name: str
    cpu_cores: float
    memory_bytes: int
    gpus: int
    gpu_model: str | None


def load_openb_nodes(path: str | Path) -> list[MachineSpec]:
    """Read ``openb_node_list_*.csv`` (``sn,cpu_milli,memory_mib,gpu,model``; model empty for CPU-only nodes)."""
    out = []
    for row, rec in _rows(path, ("sn", "cpu_milli", "memory_mib", "gpu", "model")):
        cpu = _non_negative(path, row, "cpu_milli", _number(path, row, "cpu_milli", rec["cpu_milli"]))
        mem = _non_negative(path, row, "memory_mib", _number(path, row, "memory_mib", rec["memory_mib"]))
        gpus = _non_negative(path, row, "gpu", _number(path, row, "gpu", rec["gpu"]))
        model = rec["model"].strip() or None
        if gpus > 0 and model is None:
            raise TraceError(path, row, "model", f"empty, but the node has {gpus:g} GPUs")
        out.append(MachineSpec(rec["sn"].strip(), cpu / 1000.0, int(mem * MIB), int(gpus), model))
    return out


def load_pai_machines(path: str | Path) -> list[MachineSpec]:
    """Read PAI-2020 ``pai_machine_spec.csv`` (no header: machine, gpu_type, cap_cpu cores, cap_mem GB, cap_gpu).

    ``cap_mem`` is in GB as the PAI trace documents it; converted with 10^9 bytes per GB.
    """
    out = []
    columns = ("machine", "gpu_type", "cap_cpu", "cap_mem", "cap_gpu")
    for row, rec in _rows(path, columns, header=False):
        cpu = _non_negative(path, row, "cap_cpu", _number(path, row, "cap_cpu", rec["cap_cpu"]))
        mem = _non_negative(path, row, "cap_mem", _number(path, row, "cap_mem", rec["cap_mem"]))
        gpus = _non_negative(path, row, "cap_gpu", _number(path, row, "cap_gpu", rec["cap_gpu"]))
        gpu_type = rec["gpu_type"].strip()
        out.append(MachineSpec(rec["machine"].strip(), cpu, int(mem * 1e9), int(gpus),
                               None if gpu_type in ("", "CPU") else gpu_type))
    return out


# --- DLRM 2025 ---------------------------------------------------------------------------------------------------

DLRM_COLUMNS = (
    "instance_sn", "role", "app_name", "cpu_request", "gpu_request", "rdma_request", "memory_request",
    "disk_request", "max_instance_per_node", "creation_time", "scheduled_time", "deletion_time",
)


@dataclass(frozen=True)
class DLRMInstance:
    """One DLRM inference instance: requests in SI units, lifetime with its censoring."""

    name: str
    role: str  # CN (CPU node) or HN (heterogeneous GPU node)
    app: str
    cpu_cores: float
    gpus: float
    rdma_percent: float
    memory_bytes: int
    disk_bytes: int
    max_instance_per_node: int | None  # None when the trace says -1 (no density limit)
    creation_time: float | None
    scheduled_time: float | None
    deletion_time: float | None
    runtime_seconds: float | None
    censoring: Censoring


def load_dlrm(path: str | Path) -> list[DLRMInstance]:
    """Read ``disaggregated_DLRM_trace.csv``; see the module docstring for units and censoring."""
    raw = []
    last_seen = 0.0
    for row, rec in _rows(path, DLRM_COLUMNS):
        role = rec["role"].strip()
        if role not in ("CN", "HN"):
            raise TraceError(path, row, "role", f"{role!r} is not CN or HN")
        nums = {
            c: _non_negative(path, row, c, _number(path, row, c, rec[c]))
            for c in ("cpu_request", "gpu_request", "rdma_request", "memory_request", "disk_request")
        }
        density = _number(path, row, "max_instance_per_node", rec["max_instance_per_node"])
        times = {
            c: _number(path, row, c, rec[c], optional=True)
            for c in ("creation_time", "scheduled_time", "deletion_time")
        }
        for c, v in times.items():
            if not math.isnan(v):
                _non_negative(path, row, c, v)
                last_seen = max(last_seen, v)
        known = not math.isnan(times["scheduled_time"]) and not math.isnan(times["deletion_time"])
        if known and times["deletion_time"] < times["scheduled_time"]:
            raise TraceError(path, row, "deletion_time", "is before scheduled_time")
        raw.append((rec, role, nums, density, times))
    out = []
    for rec, role, nums, density, times in raw:
        sched, dele = times["scheduled_time"], times["deletion_time"]
        if math.isnan(dele):
            runtime = None if math.isnan(sched) else last_seen - sched
            censoring = Censoring.NONE if math.isnan(sched) else Censoring.RIGHT
        elif math.isnan(sched):
            runtime, censoring = dele, Censoring.LEFT  # alive since before the trace start: at least this long
        else:
            runtime, censoring = dele - sched, Censoring.EXACT
        opt = lambda v: None if math.isnan(v) else v  # noqa: E731
        out.append(DLRMInstance(
            name=rec["instance_sn"].strip(), role=role, app=rec["app_name"].strip(),
            cpu_cores=nums["cpu_request"], gpus=nums["gpu_request"], rdma_percent=nums["rdma_request"],
            memory_bytes=int(nums["memory_request"] * GIB), disk_bytes=int(nums["disk_request"] * GIB),
            max_instance_per_node=None if density < 0 else int(density),
            creation_time=opt(times["creation_time"]), scheduled_time=opt(sched), deletion_time=opt(dele),
            runtime_seconds=runtime, censoring=censoring,
        ))
    return out
