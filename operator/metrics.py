"""Prometheus metrics of the operator (``gnnsched_operator_*``), in a registry the operator owns (no global state).

The node agent already shows GPU memory and the peak-memory prediction per pod; what only the operator sees is the
job's life as a whole: how many jobs are in which phase, why jobs are rejected or fail, how long planning (PMC
estimate + runtime prediction + scaling) takes per job, how often pods are retried, and how good the *runtime*
prediction turned out once a job finished (observed / predicted), which is what decides whether the XGBoost
predictor needs re-training on fresher history.
"""

from __future__ import annotations

import math
import threading
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

PLAN_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
RATIO_BUCKETS = (0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2, 4)
PHASES = ("Pending", "Estimated", "Unschedulable", "Scheduled", "Queued", "Running", "Succeeded", "Failed")


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.jobs = Gauge("gnnsched_operator_jobs", "GNNJobs this operator has seen, by current phase", ("phase",),
                          registry=r)
        self.transitions = Counter("gnnsched_operator_phase_transitions", "GNNJob phase changes written",
                                   ("phase",), registry=r)
        self.failures = Counter("gnnsched_operator_job_failures",
                                "Jobs set Failed or Unschedulable, by reason (InvalidSpec, PredictedPeakExceedsGPU, "
                                "OOMKilled, ...)", ("reason",), registry=r)
        self.plan_seconds = Histogram("gnnsched_operator_plan_seconds",
                                      "Time to plan one job: PMC estimate, runtime prediction and scaling",
                                      buckets=PLAN_BUCKETS, registry=r)
        self.pods_created = Counter("gnnsched_operator_pods_created",
                                    "Pods created (job attempts and entrypoint probes)", registry=r)
        self.retries = Counter("gnnsched_operator_pod_retries", "Failed pods replaced by a new attempt", ("reason",),
                               registry=r)
        self.api_errors = Counter("gnnsched_operator_api_errors",
                                  "API server errors met by a handler (transient ones are retried)",
                                  ("handler", "transient"), registry=r)
        self.runtime_ratio = Histogram("gnnsched_operator_runtime_prediction_ratio",
                                       "observed / predicted runtime of each succeeded job", buckets=RATIO_BUCKETS,
                                       registry=r)
        self.peak_ratio = Histogram("gnnsched_operator_peak_prediction_ratio",
                                    "observed peak / predicted PMC of each succeeded job that reported its peak",
                                    buckets=RATIO_BUCKETS, registry=r)
        # The closed memory loop (gnnsched.closed_loop): resizes, fault requeues, calibration.
        self.resizes = Counter("gnnsched_operator_resizes",
                               "Attempts that ran out of their GPU memory reservation and were retried larger",
                               registry=r)
        self.requeues = Counter("gnnsched_operator_requeues",
                                "Attempts requeued without using backoffLimit, by reason (GPUFault, CoLocatedFault)",
                                ("reason",), registry=r)
        # spec.checkpoint (operator/checkpoint.py): what finished attempts resumed from and lost (their result lines)
        self.checkpoint_resumed_steps = Counter("gnnsched_operator_checkpoint_resumed_steps",
                                                "Steps finished attempts of checkpointing jobs did not run again "
                                                "(they resumed past them)", registry=r)
        self.checkpoint_lost_seconds = Counter("gnnsched_operator_checkpoint_lost_seconds",
                                               "Seconds of steps failed attempts of checkpointing jobs ran after "
                                               "their last save", registry=r)
        self.failure_rules = Counter("gnnsched_operator_failure_rule_verdicts",
                                     "Failed attempts by the failure rule's action (spec.failurePolicy, gnnsched's "
                                     "defaults) and rule", ("action", "rule"), registry=r)
        self.faults = Counter("gnnsched_operator_faults",
                              "Failed attempts that a fatal GPU fault ended, by class of the agent's fault record "
                              "(hardware, application; unknown: no Xid, or no record)", ("class",), registry=r)
        self.exclusive = Counter("gnnsched_operator_exclusive_pods",
                                 "Pods created to run alone on a whole GPU, by reason (ExceedsShareableCapacity, "
                                 "PredictedPeakAboveGPU, RepeatSuspect, RepeatFault, ProbeFailed)", ("reason",),
                                 registry=r)
        self.probes = Counter("gnnsched_operator_probes",
                              "Entrypoint jobs' probes by outcome: Succeeded or Failed (a probe pod ran), Cached (a "
                              "re-submission reused a finished probe)", ("outcome",), registry=r)
        self.prestart_fallbacks = Counter("gnnsched_operator_prestart_fallbacks",
                                          "Succeeded jobs whose built-in worker re-executed itself after admission "
                                          "(its prestarted start-up could not keep the GPU untouched: the start-up "
                                          "was paid twice; the reason is in the job's status.prestartFallback)",
                                          registry=r)
        self.calibration_factor = Gauge("gnnsched_calibration_factor",
                                        "Safety factor new estimates of a calibration class use (observed / "
                                        "predicted quantile; the static factor until the class has enough samples)",
                                        ("class",), registry=r)
        self.runtime_factor = Gauge("gnnsched_calibration_runtime_factor",
                                    "Factor new runtime predictions of a runtime class are multiplied by (median "
                                    "observed / predicted runtime; 1.0 until the class or its pool has enough "
                                    "samples)", ("class",), registry=r)
        self.replans = Counter("gnnsched_operator_replans",
                               "Pods still waiting for a node whose admit-bytes or predicted runtime were "
                               "re-planned after the calibration changed", registry=r)
        self.calibration_samples = Counter("gnnsched_calibration_samples",
                                           "Finished attempts recorded in the calibration object, per class",
                                           ("class",), registry=r)
        # The GNN runtime model in use (gnnsched.predictor.store: reloaded from its ConfigMap without a restart).
        self.model_training_rows = Gauge("gnnsched_predictor_model_training_rows",
                                         "Finished jobs the runtime model in use was trained on (0: the shipped "
                                         "prior-only model)", registry=r)
        self.model_held_out_wmape = Gauge("gnnsched_predictor_model_held_out_wmape",
                                          "WMAPE of the runtime model in use on the newest jobs it was not trained on, "
                                          "measured when it was adopted (NaN: the shipped model, never measured)",
                                          registry=r)
        self.model_age = Gauge("gnnsched_predictor_model_age_seconds",
                               "Seconds since the runtime model in use was trained (NaN: the shipped model)",
                               registry=r)
        self.model_age.set_function(self._model_age)
        self.model_reloads = Counter("gnnsched_predictor_model_reloads",
                                     "Changes of the model's ConfigMap seen, by result: loaded, invalid (kept the "
                                     "model in use), removed (back to the shipped model)", ("result",), registry=r)
        self.last_retrain = Gauge("gnnsched_predictor_last_retrain_timestamp_seconds",
                                  "When the retrain CronJob last ended with each outcome (adopted, rejected: its "
                                  "candidate was worse on held-out jobs, skipped: too few new jobs)", ("outcome",),
                                  registry=r)
        self.retrain_wmape = Gauge("gnnsched_predictor_last_retrain_held_out_wmape",
                                   "Held-out WMAPE of the last retrain's candidate and of the model then in use, on "
                                   "the same newest jobs", ("model",), registry=r)
        self._model_trained_at: float | None = None
        self.model_in_use(0, None, None)
        for phase in PHASES:
            self.jobs.labels(phase).set(0)
        self._lock = threading.Lock()
        self._phase_of: dict[str, str] = {}

    def _model_age(self) -> float:
        trained_at = self._model_trained_at
        return time.time() - trained_at if trained_at is not None else math.nan

    def model_in_use(self, rows: int, held_out_wmape: float | None, trained_at: float | None) -> None:
        """The runtime model the planner now uses: its training size, held-out error and training time."""
        self.model_training_rows.set(rows)
        self.model_held_out_wmape.set(math.nan if held_out_wmape is None else held_out_wmape)
        self._model_trained_at = trained_at

    def job_seen(self, uid: str, phase: str) -> None:
        """Count a job the first time this operator sees it (at start-up every existing job is seen once)."""
        with self._lock:
            if uid in self._phase_of:
                return
            self._phase_of[uid] = phase
            self.jobs.labels(phase).inc()

    def job_moved(self, uid: str, phase: str, reason: str | None = None) -> bool:
        """The operator wrote ``phase`` for the job. Counts a transition only when it differs from the last phase
        recorded for the job, so a handler re-run on a stale copy of the object does not count twice."""
        with self._lock:
            old = self._phase_of.get(uid)
            if old == phase:
                return False
            self._phase_of[uid] = phase
            if old is not None:
                self.jobs.labels(old).dec()
            self.jobs.labels(phase).inc()
        self.transitions.labels(phase).inc()
        if phase in ("Failed", "Unschedulable"):
            self.failures.labels(reason or phase).inc()
        return True

    def job_gone(self, uid: str) -> None:
        with self._lock:
            old = self._phase_of.pop(uid, None)
            if old is not None:
                self.jobs.labels(old).dec()

    def job_succeeded(self, status: dict) -> None:
        """Prediction quality of a finished job, from its status (observed vs planned)."""
        observed, predicted = status.get("observedRuntimeSeconds"), status.get("predictedRuntimeSeconds")
        if isinstance(observed, (int, float)) and isinstance(predicted, (int, float)) and predicted > 0:
            self.runtime_ratio.observe(observed / predicted)
        if status.get("prestartFallback"):
            self.prestart_fallbacks.inc()
        peak, pmc = status.get("observedPeakBytes"), status.get("pmcBytes")
        if isinstance(peak, int) and isinstance(pmc, int) and pmc > 0 and peak > 0:
            self.peak_ratio.observe(peak / pmc)
