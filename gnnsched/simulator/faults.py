"""The closed memory loop in the simulator: estimate errors, fatal MPS faults, and what each policy does about them.

A real cluster's estimate is open-loop (the CUDA allocator's reserved memory, user scripts, unverified constants) and
MPS shares one fault domain per GPU.
``gnnsched simulate --estimate-error DIST --hw-fault-rate R --buggy-jobs F`` replays both, so the
loop's benefit is measured rather than asserted:

* **Estimate errors.** ``lognormal:SIGMA[:BIAS]``: a job's true peak is its predicted peak (the estimator's PMC plus
  the device overhead, the ``safety_factor=1.0`` figure the operator calibrates against) times
  ``BIAS * exp(N(0, SIGMA))``, one draw per job from a stream seeded by the run's ``--seed``, the same for every
  policy of the run.
* **Faults.** ``--hw-fault-rate R``: hardware faults per GPU-hour, a Poisson process on wall time on every GPU
  (:class:`HardwareFaultClock`, its own seeded stream); every client dies and the GPU is out for
  ``--hw-repair-seconds``. ``--buggy-jobs F``: a seeded fraction of jobs (:func:`buggy_points`) fault at a fixed
  point of every attempt; every client of their GPU dies and it drains for :data:`QUARANTINE_S`. Who is charged is
  the core rule (``gnnsched.attempts.fault_classes``), through :meth:`LoopBooks.fault_charges` and
  :meth:`LoopBooks.step`.

What each policy does is decided here, with the operator's own rules from :mod:`gnnsched.closed_loop`:

* gnnsched's policies run each attempt under its MPS memory limit (its admit bytes). An attempt whose true peak
  exceeds the limit fails alone with CUDA out of memory when its first step reaches the peak, and the next attempt
  reserves :func:`~gnnsched.closed_loop.next_reservation` (capped at the largest GPU); after ``max_resizes`` resizes
  the job is lost. Faults are charged by ``fault_classes.fault_step``: hardware faults and undecided application
  faults requeue uncharged, at most ``MAX_REQUEUES`` times per job as in the operator (``may_requeue``); a lone
  suspect is charged against its ``backoffLimit``; a job suspected or undecided twice runs later attempts alone on a
  GPU. Completed attempts record observed ÷
  predicted in a :class:`~gnnsched.closed_loop.CalibrationTable` per :class:`~gnnsched.closed_loop.CalibrationClass`,
  and new estimates use its factor (``-calib``: the static factor always).
* Baselines behave as Kubernetes does: a failed pod fails the job (:data:`BASELINE_BACKOFF_LIMIT`; with
  ``--backoff-limit N`` every failed pod is charged against ``N``, retried with kubelet's back-off while attempts
  remain). Naive MPS has no per-client limit, so a true peak that does not fit what
  is left of the GPU OOM-kills the job that allocates it; exclusive fails a job whose true peak exceeds the GPU.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from gnnsched.attempts import probation as prob
from gnnsched.attempts.checkpointing import kept_fraction
from gnnsched.attempts.failure_policy import FailedAttempt, Verdict, attempt_classes, judge, records_step
from gnnsched.attempts.fault_classes import Charge, ClientError, FaultStep, fault_charges, fault_step, undecided_peers
from gnnsched.closed_loop import (
    DEFAULT_CALIBRATION,
    DEFAULT_RESIZE,
    MEASURED_OVERPREDICTION,
    CalibrationClass,
    CalibrationPolicy,
    CalibrationTable,
    ResizePolicy,
    next_reservation,
)
from gnnsched.errors import FieldError
from gnnsched.simulator.model import JobProfile, SimJob

BASELINE_BACKOFF_LIMIT = 0
"""A baseline job's retry budget in a closed-loop run (unless ``--backoff-limit`` sets every job's). The baselines
run as Kubernetes runs a pod without gnnsched's operator: nothing classifies a failure as a misestimate or a fault's
victim, so, as issue 15 puts it, a failed pod fails the job; and the one budget a GNNJob has by default,
``spec.backoffLimit``, is 0 (``gnnsched.spec``). The open-loop engine keeps the workload's own (the built-in
generators' 3), so every figure without ``--estimate-error``/``--hw-fault-rate``/``--buggy-jobs`` is unchanged."""

DEFAULT_REPAIR_S = 600.0
"""``--hw-repair-seconds``' default: how long a GPU with a hardware fault stays out of the pool (NVIDIA's device
plugin never marks a device healthy again by itself; an admin resets or replaces the GPU)."""

HW_FAULT_XID = 79
"""The Xid a simulated hardware fault carries (GPU fallen off the bus; any non-application Xid classifies the same)."""
APP_FAULT_XID = 13
"""The Xid a buggy job's fault carries (graphics engine exception, an application Xid)."""

QUARANTINE_S = 10.0
"""Seconds a faulted GPU admits nothing: its clients exit (the MPS server terminated them) and the agent's probe
client is answered again. A modelling choice, not a measurement: NVIDIA documents the order (wait for every affected
client to exit, refuse new clients meanwhile), not the duration."""

ERROR_STREAM = 0x15E1
FAULT_STREAM = 0x15FA
BUGGY_STREAM = 0x1B06
_LOGNORMAL = re.compile(r"lognormal:(?P<sigma>[^:]+)(?::(?P<bias>[^:]+))?")


@dataclass(frozen=True)
class EstimateError:
    """``--estimate-error``: ``none``, or ``lognormal`` with ``sigma`` and ``bias``."""

    kind: str = "none"
    sigma: float = 0.0
    bias: float = 1.0

    @property
    def active(self) -> bool:
        return self.kind != "none"

    def text(self) -> str:
        return "none" if not self.active else f"lognormal:{self.sigma:g}:{self.bias:g}"


NO_ERROR = EstimateError()


def lognormal_parameters(text: str, flag: str, expected: str) -> tuple[float, float]:
    """SIGMA and BIAS of ``lognormal:SIGMA[:BIAS]`` (BIAS 1 when left out), checked the same way for every flag
    that takes one (``--estimate-error``, ``--runtime-error``); a bad text is a :class:`FieldError` naming ``flag``,
    ``expected`` saying what the flag accepts."""
    m = _LOGNORMAL.fullmatch(text.strip().lower())
    if m is None:
        raise FieldError(flag, f"{text!r}: expected {expected}")
    try:
        sigma = float(m.group("sigma"))
        bias = float(m.group("bias")) if m.group("bias") is not None else 1.0
    except ValueError:
        raise FieldError(flag, f"{text!r}: SIGMA and BIAS must be numbers") from None
    if not (math.isfinite(sigma) and 0.0 <= sigma <= 3.0):
        raise FieldError(flag, f"{text!r}: SIGMA must be between 0 and 3")
    if not (math.isfinite(bias) and 0.0 < bias <= 10.0):
        raise FieldError(flag, f"{text!r}: BIAS must be > 0 and <= 10")
    return sigma, bias


def parse_estimate_error(text: str) -> EstimateError:
    """``none`` | ``lognormal:SIGMA[:BIAS]``; anything else is a :class:`FieldError` naming ``--estimate-error``."""
    if text.strip().lower() in ("", "none"):
        return NO_ERROR
    sigma, bias = lognormal_parameters(text, "--estimate-error", "none or lognormal:SIGMA[:BIAS]")
    return EstimateError(kind="lognormal", sigma=sigma, bias=bias)


@dataclass(frozen=True)
class FaultModel:
    """The run's faults: ``--hw-fault-rate`` hardware faults per GPU-hour (Poisson on wall time, busy and idle GPUs
    alike), each taking its GPU out for ``--hw-repair-seconds``; and ``--buggy-jobs``, the fraction of jobs that carry
    a deterministic application fault."""

    hw_rate: float = 0.0
    hw_repair_s: float = DEFAULT_REPAIR_S
    buggy_fraction: float = 0.0
    checkpoint_every_s: float = 0.0
    """``--checkpoint-every``: every gnnsched job saves its state this often while it runs (0: no checkpoints, a
    requeued attempt starts from step 0); its next attempt resumes from the last save."""
    checkpoint_write_s: float = 0.0
    """``--checkpoint-write-seconds``: what one save costs the job (its steps wait for it), and what loading the
    checkpoint costs a resumed attempt."""

    @property
    def checkpointing(self) -> bool:
        return self.checkpoint_every_s > 0

    @property
    def active(self) -> bool:
        return self.hw_rate > 0 or self.buggy_fraction > 0

    def text(self) -> dict[str, float]:
        out = {"hw_fault_rate": self.hw_rate, "hw_repair_seconds": self.hw_repair_s,
               "buggy_jobs": self.buggy_fraction}
        if self.checkpointing:
            out.update(checkpoint_every_s=self.checkpoint_every_s, checkpoint_write_s=self.checkpoint_write_s)
        return out


NO_FAULTS = FaultModel()


def parse_faults(hw_rate: float, repair_s: float = DEFAULT_REPAIR_S, buggy: float = 0.0,
                 checkpoint_every_s: float = 0.0, checkpoint_write_s: float = 0.0) -> FaultModel:
    """The options as a :class:`FaultModel`; a bad value is a :class:`FieldError` naming its option."""
    if not (math.isfinite(hw_rate) and 0.0 <= hw_rate <= 3600.0):
        raise FieldError("--hw-fault-rate", f"{hw_rate!r}: must be a number of hardware faults per GPU-hour in 0..3600")
    if not (math.isfinite(repair_s) and 0.0 < repair_s <= 30 * 86400.0):
        raise FieldError("--hw-repair-seconds", f"{repair_s!r}: must be > 0 and at most 30 days")
    if not (math.isfinite(buggy) and 0.0 <= buggy <= 1.0):
        raise FieldError("--buggy-jobs", f"{buggy!r}: must be a fraction of jobs in 0..1")
    if not (math.isfinite(checkpoint_every_s) and 0.0 <= checkpoint_every_s <= 86400.0):
        raise FieldError("--checkpoint-every", f"{checkpoint_every_s!r}: must be seconds in 0..86400 (0: none)")
    if not (math.isfinite(checkpoint_write_s) and 0.0 <= checkpoint_write_s <= 3600.0):
        raise FieldError("--checkpoint-write-seconds", f"{checkpoint_write_s!r}: must be seconds in 0..3600")
    return FaultModel(float(hw_rate), float(repair_s), float(buggy), float(checkpoint_every_s),
                      float(checkpoint_write_s))


def buggy_points(jobs: list[SimJob], fraction: float, seed: int) -> dict[int, float]:
    """The jobs that carry an application fault, each with the point of its run where it faults (a fraction of its
    solo run time, in 0.1..0.9): ``round(fraction * len(jobs))`` jobs drawn without replacement from the run's seeded
    stream, the same for every policy. Deterministic per job: every attempt faults at the same point."""
    count = int(round(fraction * len(jobs)))
    if count <= 0:
        return {}
    rng = np.random.default_rng([BUGGY_STREAM, seed])
    ordered = sorted(j.id for j in jobs)
    chosen = rng.choice(len(ordered), size=count, replace=False)
    points = rng.uniform(0.1, 0.9, size=count)
    return {ordered[int(i)]: float(p) for i, p in zip(chosen, points, strict=True)}


def true_multipliers(jobs: list[SimJob], error: EstimateError, seed: int) -> dict[int, float]:
    """Each job's true peak ÷ predicted peak: one draw per job in id order from the run's seeded error stream."""
    if not error.active:
        return {j.id: 1.0 for j in jobs}
    rng = np.random.default_rng([ERROR_STREAM, seed])
    ordered = sorted(j.id for j in jobs)
    draws = rng.normal(0.0, error.sigma, size=len(ordered)) if error.sigma > 0 else np.zeros(len(ordered))
    return {jid: float(error.bias * math.exp(d)) for jid, d in zip(ordered, draws, strict=True)}


class HardwareFaultClock:
    """One GPU's hardware faults: a Poisson process of ``rate`` per GPU-hour on wall time (a GPU fails whether or not
    it has clients), from its own generator seeded by the run's seed and the GPU's index, so every policy sees the
    same faults at the same times on each GPU."""

    __slots__ = ("rng", "mean_s")

    def __init__(self, rate_per_hour: float, seed: int, gid: int) -> None:
        self.rng = np.random.default_rng([FAULT_STREAM, seed, gid])
        self.mean_s = 3600.0 / rate_per_hour

    def next_after(self, now: float) -> float:
        """The time of the next fault after ``now``."""
        return now + float(self.rng.exponential(self.mean_s))


@dataclass
class LoopBooks:
    """One run's closed-loop state and counters: per job the true-peak multiplier, the current reservation, resizes,
    charges and suspicions; the calibration table; and the figures the metrics report."""

    error: EstimateError
    fault_model: FaultModel
    seed: int
    mode: str  # "gnnsched" (the operator's loop), "calib-off" (the loop with the static factor), "baseline"
    largest_bytes: int
    capacity: dict[str, int]  # GPU model -> what one job alone may use (total - reserve), largest per model
    multipliers: dict[int, float] = field(default_factory=dict)
    resize: ResizePolicy = DEFAULT_RESIZE
    calibration_policy: CalibrationPolicy = DEFAULT_CALIBRATION
    table: CalibrationTable = field(default_factory=CalibrationTable)
    predicted: dict[int, dict[str, int]] = field(default_factory=dict)  # job id -> model -> predicted peak
    reservation: dict[int, dict[str, int]] = field(default_factory=dict)  # job id -> model -> admit bytes (resized)
    resizes: dict[int, int] = field(default_factory=dict)
    charged: dict[int, int] = field(default_factory=dict)
    suspected: dict[int, int] = field(default_factory=dict)
    undecided: dict[int, int] = field(default_factory=dict)
    alone: set[int] = field(default_factory=set)  # jobs whose later attempts run alone (fault_step's ``alone``)
    buggy: dict[int, float] = field(default_factory=dict)  # job id -> the point of its run where it faults
    requeued_innocent: set[int] = field(default_factory=set)  # innocent jobs requeued uncharged by a fault
    requeues: dict[int, int] = field(default_factory=dict)  # job id -> uncharged fault requeues (the operator's)
    # job id -> the jobs (str ids) its current attempt may not share a GPU with (fault_step's ``apart``); only
    # non-empty sets are kept, so an empty dict tells the gate's view that no decision needs the apart rule
    apart: dict[int, frozenset[str]] = field(default_factory=dict)
    # checkpointing (FaultModel.checkpoint_every_s): job id -> the share of its work its last checkpoint holds
    kept: dict[int, float] = field(default_factory=dict)
    fault_steps: dict[int, list[int]] = field(default_factory=dict)  # job id -> steps of its own-error faults so far
    # probation (gnnsched.attempts.probation): job id -> (its probation step, that step as a share of its steps); the
    # gate admits its attempts alone where a GPU is idle, holding it until they pass that step
    probation: dict[int, tuple[int, float]] = field(default_factory=dict)
    # of those, the jobs whose probation is a suspect's: the gate plans them alone whether or not a GPU is idle
    probation_suspects: set[int] = field(default_factory=set)
    probation_rule: bool = True  # False: the rule before probation (bench/checkpoint_sweep.py compares the two)
    probation_alone: int = 0  # attempts the gate admitted alone on probation
    probation_passed: int = 0  # of those, attempts that passed their probation step (their GPU took others again)
    failed_by_rule: int = 0  # jobs a FailJob verdict failed (gnnsched.attempts.failure_policy)
    lost_work_s: float = 0.0  # solo-seconds of steps that ended attempts had done past their last checkpoint
    kept_work_s: float = 0.0  # solo-seconds of steps a later attempt did not run again (the refund)
    hw_faults: int = 0
    app_faults: int = 0
    memory_exceeded: int = 0
    resize_retries: int = 0
    fault_victims: int = 0
    faults: int = 0
    fault_log: list[tuple[float, int]] = field(default_factory=list)  # (time, GPU gid) of every fault
    hw_out: list[tuple[float, float]] = field(default_factory=list)  # (fault, repaired) of every hardware fault
    # The factor of every class an attempt was planned with under the current table (recomputed after each record,
    # so ``changed`` names the classes whose waiting attempts a re-plan must look at), and each job's class keys.
    factors: dict[str, float] = field(default_factory=dict)
    factors_of: CalibrationTable | None = None  # the table ``factors`` were computed from
    changed: set[str] = field(default_factory=set)
    class_keys: dict[tuple[int, str], CalibrationClass] = field(default_factory=dict)

    @property
    def gnnsched(self) -> bool:
        return self.mode != "baseline"

    @property
    def calibrating(self) -> bool:
        return self.mode == "gnnsched"

    def true_peak(self, job: SimJob, model: str) -> int:
        """The job's true peak on ``model``: its predicted peak (of the job as the workload made it, not of an
        attempt, whose ``peak_bytes`` is what it reaches under its limit) times its multiplier."""
        predicted = self.predicted.get(job.id)
        base = predicted[model] if predicted is not None else job.profile(model).peak_bytes
        return int(math.ceil(base * self.multipliers.get(job.id, 1.0)))

    def fits_alone(self, job: SimJob) -> bool:
        """Whether the job's true peak fits some GPU alone (a job that does not is not counted as lost)."""
        return any(self.true_peak(job, m) <= cap for m, cap in self.capacity.items() if m in job.profiles)

    def _class(self, job: SimJob, model: str) -> CalibrationClass:
        cls = self.class_keys.get((job.id, model))
        if cls is None:
            spec = job.spec
            arch = spec.model.model_class if spec is not None else "trace"
            mode = spec.mode if spec is not None else job.mode or "train"
            cls = self.class_keys[(job.id, model)] = CalibrationClass(gpu_model=model, arch=arch, mode=mode,
                                                                      container="builtin")
        return cls

    def _factor(self, cls: CalibrationClass) -> float:
        """``CalibrationTable.factor`` of ``cls`` under the current table (cached until the next record)."""
        if self.factors_of is not self.table:  # the table was replaced (a record, or a caller setting it)
            self.factors, self.factors_of = {}, self.table
        key = cls.key()
        factor = self.factors.get(key)
        if factor is None:
            factor = self.factors[key] = self.table.factor(cls, self.calibration_policy).factor
        return factor

    def _admit(self, job: SimJob, model: str, prof: JobProfile) -> int:
        """The admit bytes a new (not resized) attempt gets on ``model``: the predicted need (peak plus device
        overhead) times the class's factor, the static factor until the class has enough samples
        (``CalibrationTable.factor``) and always with ``-calib``. The factor multiplies the whole need, context and
        workspaces included; with the static factor this is the estimator's ``admit_bytes`` itself."""
        if job.id in self.alone:
            return self.capacity[model]  # runs alone: books the GPU's whole capacity
        factor = self.calibration_policy.static_factor
        if self.calibrating:
            factor = self._factor(self._class(job, model))
        admit = int(math.ceil(prof.peak_bytes * factor))
        if admit > self.capacity[model] and prof.peak_bytes <= self.capacity[model] * MEASURED_OVERPREDICTION:
            # fits the whole GPU but not a shared one (the operator's ExceedsShareableCapacity), or is predicted above
            # it by less than an estimate has been measured to be high (PredictedPeakAboveGPU): runs alone, booking
            # the whole GPU; its true peak decides, an overrun ends it with ExceedsLargestGPU
            return self.capacity[model]
        return admit

    def attempt(self, job: SimJob) -> SimJob:
        """The SimJob of ``job``'s next attempt: its admit bytes (calibrated or resized) and the peak it really
        reaches (the true peak; under gnnsched's MPS limit at most the limit, where it fails)."""
        self.predicted.setdefault(job.id, {m: p.peak_bytes for m, p in job.profiles.items()})
        profiles = {}
        resized = self.reservation.get(job.id)
        for model, prof in job.profiles.items():
            true = self.true_peak(job, model)
            if not self.gnnsched:
                profiles[model] = replace(prof, peak_bytes=true)
                continue
            admit = resized[model] if resized is not None else self._admit(job, model, prof)
            if job.id in self.alone:
                admit = max(admit, self.capacity[model])
            profiles[model] = replace(prof, admit_bytes=admit, peak_bytes=min(true, admit))
        return replace(job, profiles=profiles)

    def exceeds(self, attempt: SimJob, model: str) -> bool:
        """gnnsched: the attempt's true peak passes its MPS limit (it will fail with memory-exceeded)."""
        return self.gnnsched and self.true_peak(attempt, model) > attempt.profile(model).admit_bytes

    def resized(self, attempt: SimJob, model: str) -> bool:
        """After a memory-exceeded attempt on ``model``: record the resize; False when the job is lost (no larger
        reservation fits any GPU, or ``max_resizes`` is used up)."""
        self.memory_exceeded += 1
        jid = attempt.id
        self.apart.pop(jid, None)  # the operator clears faultPeers on any next attempt but an undecided requeue
        # The operator records a memory-exceeded attempt too (operator/handlers.py: the larger of its observed peak
        # and the bytes it needed, held + the failed request), as a lower bound of the job's ratio, when the OOM is
        # reported (here: at the OOM itself, the attempt's end). Without it only the attempts that fitted would be
        # recorded at first, and the early factor would be biased low (survivors); recorded as an exact ratio it
        # would pin the factor at the one that failed (CalibrationTable's docstring).
        # The model's attempt held about its limit when it failed: the limit is its needed bytes.
        self._record(attempt, model, attempt.profile(model).admit_bytes, exceeded=True)
        if self.resizes.get(jid, 0) >= self.resize.max_resizes:
            return False
        old = attempt.profile(model).admit_bytes
        # The attempt's report: it held about its limit when the request that crossed it failed; the model does not
        # know the failing request's size, so the growth factor decides (ResizePolicy's docstring).
        new = next_reservation(old, old, self.largest_bytes, self.resize)
        if new is None:
            return False
        self.resizes[jid] = self.resizes.get(jid, 0) + 1
        self.resize_retries += 1
        self.reservation[jid] = {
            m: min(self.capacity[m], int(math.ceil(p.admit_bytes * new / old))) if m != model else new
            for m, p in attempt.profiles.items()
        }
        return True

    def completed(self, attempt: SimJob, model: str) -> None:
        """A completed attempt: its observed ÷ predicted ratio goes into the calibration table."""
        self.apart.pop(attempt.id, None)  # done: nothing is kept apart from it any more
        if not self.gnnsched:
            return
        # observed (the attempt reached its true peak: it completed under its limit) over the job's prediction
        self._record(attempt, model, self.true_peak(attempt, model))

    def _record(self, attempt: SimJob, model: str, observed: int, exceeded: bool = False) -> None:
        ratio = observed / max(self.predicted[attempt.id][model], 1)
        self.table = self.table.record(self._class(attempt, model), ratio, self.calibration_policy, exceeded)
        before, self.factors, self.factors_of = self.factors, {}, self.table
        for key, factor in before.items():
            if self._factor(CalibrationClass.parse(key)) != factor:
                self.changed.add(key)

    def replanned(self, waiting: SimJob, job: SimJob) -> SimJob | None:
        """The attempt ``waiting`` (of ``job``, as the workload made it) as the operator would plan it now, or None
        when that changes nothing: the classes of its models kept their factors since the last re-plan, its
        reservation is a resize's or a whole GPU's, or its admit bytes come out the same."""
        if not self.calibrating or job.id in self.reservation or job.id in self.alone:
            return None
        if not any(self._class(job, model).key() in self.changed for model in job.profiles):
            return None
        new = self.attempt(job)
        if all(new.profile(m).admit_bytes == waiting.profile(m).admit_bytes for m in job.profiles):
            return None
        return new

    def fault_charges(self, xid: int, runs: list[SimJob], culprit: int | None) -> dict[int, Charge]:
        """The charges of one fault on a GPU whose clients are ``runs`` (``culprit``: the buggy job whose own fault
        it is, None for a hardware fault), by the core rule (``gnnsched.attempts.fault_classes.fault_charges``) on the
        clients' own errors. What each client reports is what the H100 measured (docs/gpu-measurements.md): every client
        of a faulted MPS server gets a fatal error of its own (700), none gets 810, so the culprit cannot be told apart
        from its neighbours; alone, its fault is its own."""
        charges = fault_charges(xid, self._client_errors(runs), f"Xid {xid}")
        return {j.id: charges[str(j.id)] for j in runs}

    @staticmethod
    def _client_errors(runs: list[SimJob]) -> list[ClientError]:
        return [ClientError(str(j.id), own_fault=True, terminated_810=False) for j in runs]

    def fault_peers(self, runs: list[SimJob], charges: dict[int, Charge]) -> dict[int, frozenset[str]]:
        """Each undecided client's peers in the same fault (``gnnsched.attempts.fault_classes.undecided_peers``, on the
        same client errors as :meth:`fault_charges`), as the agent writes them in its records: job ids as strings."""
        peers = undecided_peers(self._client_errors(runs), {str(k): c for k, c in charges.items()})
        return {j.id: peers.get(str(j.id), frozenset()) for j in runs}

    def step(self, job: SimJob, charge: Charge, peers: frozenset[str] = frozenset()) -> FaultStep:
        """:meth:`judged_step` without the step the fault came at, its verdict left out."""
        return self.judged_step(job, charge, peers)[0]

    def judged_step(self, job: SimJob, charge: Charge, peers: frozenset[str] = frozenset(),
                    at_step: int | None = None, at_point: float | None = None) -> tuple[FaultStep, Verdict]:
        """The operator's step for one faulted client (``gnnsched.attempts.fault_classes.fault_step``), kept in the
        books, and the failure rules' verdict on it (``gnnsched.attempts.failure_policy.judge``, gnnsched's default
        rules: the simulated jobs have none of their own); ``peers``: its undecided fault's peers (:meth:`fault_peers`),
        which its next attempt is kept apart from; ``at_step``: the step it faulted at, ``at_point`` the same as a
        share of the job's steps (its probation step, when an undecided fault, or its own as the suspect, puts it on
        probation)."""
        requeues = self.requeues.get(job.id, 0)
        earlier = self.fault_steps.setdefault(job.id, [])
        attempt = FailedAttempt(classes=attempt_classes(charge, True, at_step, earlier), step=at_step)
        if records_step(attempt):
            earlier.append(at_step)  # type: ignore[arg-type]  # records_step: a step is known
        verdict = judge((), attempt, requeues)
        step = fault_step(charge, True, self.undecided.get(job.id, 0), self.suspected.get(job.id, 0),
                          requeues, peers)
        step = replace(step, requeue=verdict.action == "Ignore")
        current = self.probation.get(job.id)
        suspect = charge.role == "suspect"
        wanted, is_suspect = prob.after_fault((bool(step.apart) or suspect) and self.probation_rule, at_step,
                                              step.alone, current[0] if current is not None else None,
                                              job.id in self.probation_suspects, suspect)
        if wanted is None:
            self.probation.pop(job.id, None)
        elif current is None or wanted != current[0]:
            self.probation[job.id] = (wanted, at_point if at_point is not None else 0.0)
        if is_suspect:
            self.probation_suspects.add(job.id)
        else:
            self.probation_suspects.discard(job.id)
        if step.apart:
            self.apart[job.id] = step.apart
        else:
            self.apart.pop(job.id, None)
        self.undecided[job.id], self.suspected[job.id] = step.undecided, step.suspected
        if step.alone:
            self.alone.add(job.id)
        if step.requeue:
            self.requeues[job.id] = self.requeues.get(job.id, 0) + 1
            if job.id not in self.buggy:
                self.requeued_innocent.add(job.id)
        return step, verdict

    # ------------------------------------------------------------------ checkpoints
    def overhead(self) -> float:
        """Wall seconds per solo-second of steps while checkpointing: each ``every`` seconds of steps pay one save."""
        m = self.fault_model
        return 1.0 + m.checkpoint_write_s / m.checkpoint_every_s if m.checkpointing and self.gnnsched else 1.0

    def resume_cost(self, job_id: int) -> float:
        """Seconds a resumed attempt spends loading its checkpoint before its first step (as long as a save)."""
        return self.fault_model.checkpoint_write_s if self.kept.get(job_id, 0.0) > 0 else 0.0

    def attempt_work(self, job_id: int, solo_s: float) -> float:
        """The GPU work (solo-seconds) of a new attempt: what its checkpoint does not hold, with the saves' cost, and
        the load of a checkpoint it resumes from."""
        return solo_s * (1.0 - self.kept.get(job_id, 0.0)) * self.overhead() + self.resume_cost(job_id)

    def fault_after(self, job_id: int, point: float, solo_s: float) -> float:
        """A buggy job's fault, ``point`` of its steps in, comes this many solo-seconds into an attempt that resumed
        from its checkpoint (the same step every attempt: the fault is deterministic)."""
        return max(0.0, point - self.kept.get(job_id, 0.0)) * solo_s * self.overhead() + self.resume_cost(job_id)

    def stepped(self, job_id: int, done_s: float) -> float:
        """Solo-seconds of the job's steps among ``done_s`` solo-seconds of an attempt's work (``attempt_work``: its
        checkpoint's load and its saves left out)."""
        return max(0.0, done_s - self.resume_cost(job_id)) / self.overhead()

    def attempt_ended(self, job_id: int, solo_s: float, done_s: float, running_s: float) -> None:
        """An attempt that did not complete ran ``done_s`` solo-seconds of its work (``attempt_work``) in
        ``running_s`` seconds past its start-up: its last save holds ``kept_fraction`` of the steps it ran; the
        rest is lost (all of it without checkpointing)."""
        if solo_s <= 0:
            return
        m = self.fault_model
        stepped = self.stepped(job_id, done_s)
        kept = stepped * kept_fraction(running_s, m.checkpoint_every_s, m.checkpoint_write_s) \
            if m.checkpointing and self.gnnsched else 0.0
        self.lost_work_s += stepped - kept
        self.kept_work_s += kept
        if kept > 0:
            self.kept[job_id] = min(0.999, self.kept.get(job_id, 0.0) + kept / solo_s)

    def summary(self) -> dict[str, Any]:
        return {"memory_exceeded": self.memory_exceeded, "resize_retries": self.resize_retries,
                "fault_victims": self.fault_victims, "faults": self.faults, "hw_faults": self.hw_faults,
                "app_faults": self.app_faults, "innocent_jobs_requeued": len(self.requeued_innocent),
                "innocent_jobs_alone": len(self.alone - self.buggy.keys()),
                "failed_by_rule": self.failed_by_rule,
                "probation_alone": self.probation_alone, "probation_passed": self.probation_passed,
                **({"lost_work_s": self.lost_work_s, "kept_work_s": self.kept_work_s}
                   if self.fault_model.checkpointing else {}),
                "fault_log": list(self.fault_log),
                "calibration": {k: self.table.factor(CalibrationClass.parse(k), self.calibration_policy).factor
                                for k in self.table.classes()}}
