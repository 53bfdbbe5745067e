"""The simulator's workload types, in one module that imports no generator.

Every generator (the papers' built-ins and the seeded ``gen:`` family in :mod:`gnnsched.simulator.workloads`, the
openb trace in :mod:`gnnsched.simulator.openb`) builds these; keeping them apart from the generators is what lets
``workloads`` import ``openb`` at the top without a circle (``openb`` used to import its types from ``workloads``,
which had to import ``openb`` inside a function).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gnnsched.errors import FieldError
from gnnsched.gpu.catalogue import GiB
from gnnsched.spec import GNNJobSpec

DEFAULT_CPU_MILLI = 2000
DEFAULT_MEMORY_BYTES = 8 * GiB


class WorkloadError(FieldError):
    """A workload (built-in name or YAML file) that cannot be simulated."""


@dataclass(frozen=True)
class JobTemplate:
    """A job before its costs are known: a GNNJob spec (or a trace pod) and when it arrives."""

    name: str
    arrival: float
    spec: GNNJobSpec | None
    cpu_milli: int
    memory_bytes: int
    gpu_milli: int = 1000
    num_gpus: int = 1
    runtime_s: float | None = None
    qos_factor: float | None = None
    backoff_limit: int = 3
    labels: dict[str, str] = field(default_factory=dict)


@dataclass
class Workload:
    """Jobs plus the setting the experiment was run in (defaults for the CLI)."""

    name: str
    description: str
    templates: list[JobTemplate]
    cluster: str = "v100"
    policies: tuple[str, ...] = ()
    horizon: float | None = None
    max_clients: int | None = None
    reference: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


Fits = Callable[[GNNJobSpec, float], bool]
"""``fits(spec, share)``: the job's admit bytes fit in ``share`` of the cluster's smallest GPU."""
