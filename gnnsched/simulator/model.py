"""The simulator's job records: what a job asks for, what it costs on each GPU model, and what happened to it.

A :class:`SimJob` is built once per workload (from a GNNJob manifest or a trace row) and never mutated by the engine;
per-run outcomes live in :class:`JobOutcome` so one workload can be replayed under many policies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class JobProfile:
    """What a job costs on one GPU model (computed by the adapters from the estimator and the runtime prior).

    ``admit_bytes`` is what gnnsched's gate reserves (the estimator's ``admit_bytes``: PMC x safety factor plus the
    device overhead); ``peak_bytes`` is what the job really peaks at in the simulation (PMC plus the device overhead,
    no safety margin). ``solo_s`` is the runtime alone on an idle GPU; ``predicted_s`` is what the schedulers believe it
    is (the same prior unless a predictor is plugged in). ``sm_util`` is the modelled fraction of the GPU's SMs the
    job keeps busy alone (drives the interference model and the utilisation metric).
    """

    admit_bytes: int
    peak_bytes: int
    solo_s: float
    predicted_s: float
    sm_util: float
    intensity: str = "memory"
    mem_util: float = 0.0
    job_class: str | None = None  # the interference model's class of the truth (``<intensity>-<mode>``, issue 37)


@dataclass(frozen=True)
class SimJob:
    """One job of a workload.

    ``spec`` is the GNNJob spec (``None`` for trace pods); ``profiles`` maps a canonical GPU model name to the job's
    :class:`JobProfile` on it. ``gpu_milli`` is a declared GPU share (openb pods; 1000 = one whole GPU); ``num_gpus``
    whole GPUs asked for (multi-GPU trace pods). ``runtime_s`` overrides the prior for trace pods whose lifetime is
    known.
    """

    id: int
    name: str
    arrival: float
    mode: str
    cpu_milli: int
    memory_bytes: int
    profiles: dict[str, JobProfile]
    spec: Any = None
    qos_target_s: float | None = None
    num_gpus: int = 1
    gpu_milli: int = 1000
    backoff_limit: int = 3
    scaled_cpu_milli: int | None = None
    scaled_memory_bytes: int | None = None
    scaled_solo_factor: float = 1.0
    labels: dict[str, str] = field(default_factory=dict)
    namespace: str = "default"  # its namespace: the trust domain's (gnnsched.trust.domain; Simulation trust_domain)

    def profile(self, gpu_model: str) -> JobProfile:
        try:
            return self.profiles[gpu_model]
        except KeyError:
            raise KeyError(f"job {self.name} has no profile for GPU model {gpu_model}") from None


@dataclass
class JobOutcome:
    """What happened to one job under one policy."""

    job: SimJob
    status: str = "pending"  # pending | queued | running | completed | failed | unschedulable
    first_start: float | None = None
    start: float | None = None
    finish: float | None = None
    node: str | None = None
    gpu: int | None = None
    oom_kills: int = 0
    attempts: int = 0
    ran: bool = False
    slowdown_max: float = 1.0
    cpu_milli: int = 0
    memory_bytes: int = 0
    reason: str = ""

    @property
    def jct(self) -> float | None:
        return None if self.finish is None or self.status != "completed" else self.finish - self.job.arrival

    @property
    def queue_time(self) -> float | None:
        return None if self.first_start is None else self.first_start - self.job.arrival
