"""Prometheus metrics of the node agent (``gnnsched_*``), in a registry the agent owns (no global state).

What an SRE needs to trust the gate: memory per GPU (total, reserved, committed by the gate, used as the driver
sees it), the queue, admissions and rejections by reason, how long pods wait, how good the memory prediction was
(predicted admit-bytes vs the observed peak of the pod's processes, and their ratio), and the MPS daemon's state.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from gnnsched.gpu.backend import GPUInfo
    from gnnsched.node_agent.books import Books, Entry

WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600)
RATIO_BUCKETS = (0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2, 4)


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        g = ("gpu", "uuid")
        self.total = Gauge("gnnsched_gpu_memory_total_bytes", "GPU memory size", g, registry=r)
        self.reserved = Gauge("gnnsched_gpu_memory_reserved_bytes", "Memory the gate never commits", g, registry=r)
        self.committed = Gauge(
            "gnnsched_gpu_memory_committed_bytes", "Sum of admit-bytes of running clients", g, registry=r
        )
        self.used = Gauge("gnnsched_gpu_memory_used_bytes", "Memory in use as the driver reports it", g, registry=r)
        self.healthy = Gauge("gnnsched_gpu_healthy", "1 if the GPU is healthy", g, registry=r)
        self.clients = Gauge("gnnsched_mps_clients", "Gated (MPS client) processes running per GPU", g, registry=r)
        self.queue = Gauge("gnnsched_gate_queue_length", "Pods waiting at the gate", registry=r)
        self.admissions = Counter("gnnsched_gate_admissions", "Pods admitted by the gate", registry=r)
        self.rejections = Counter("gnnsched_gate_rejections", "Requests refused by the gate", ("reason",), registry=r)
        self.wait = Histogram("gnnsched_gate_admission_wait_seconds", "Time from queueing to admission",
                              buckets=WAIT_BUCKETS, registry=r)
        self.predicted = Gauge("gnnsched_job_predicted_peak_bytes", "admit-bytes of a running pod",
                               ("namespace", "pod"), registry=r)
        self.observed = Gauge("gnnsched_job_observed_peak_bytes", "Observed peak GPU memory of a running pod",
                              ("namespace", "pod"), registry=r)
        # issue 37: the co-location slowdowns learned from progress, per calibration class (GPU model, class pair)
        self.slowdown = Gauge("gnnsched_colocation_learned_slowdown",
                              "Learned slowdown of a class beside its co-runners (prior x observed/prior median)",
                              ("pair",), registry=r)
        self.error_ratio = Histogram("gnnsched_job_prediction_error_ratio",
                                     "observed peak / predicted admit-bytes, per finished pod", buckets=RATIO_BUCKETS,
                                     registry=r)
        self.draining = Gauge(
            "gnnsched_gpu_draining", "1 while the GPU drains after a fatal MPS fault (admits nothing)", g, registry=r
        )
        self.faults = Counter("gnnsched_gpu_faults", "Fatal MPS faults that put a GPU into quarantine, by what told",
                              ("gpu", "reason"), registry=r)
        self.faults_by_class = Counter(
            "gnnsched_gpu_faults_by_class",
            "Fatal MPS faults by class (hardware, application, unknown: no Xid), counted when the GPU's drain ends",
            ("class",), registry=r)
        self.unhealthy = Gauge(
            "gnnsched_gpu_unhealthy",
            "1 while the GPU is out of service (a hardware Xid keeps it out until an admin acts); xid: the Xid that "
            "took it out, empty when healthy or another cause", ("gpu", "uuid", "xid"), registry=r)
        self.returned = Counter(
            "gnnsched_gpu_returned_to_service",
            "GPUs an admin's return-to-service request put back into service (their hardware Xid hold dropped)",
            g, registry=r)
        self.return_refused = Counter(
            "gnnsched_gpu_return_requests_refused",
            "Return-to-service requests the agent refused, by reason (unknown-gpu, not-held, still-faulty, new-xid)",
            ("reason",), registry=r)
        self.fault_pods = Counter("gnnsched_fault_pods", "Pods annotated after a fatal MPS fault, by role",
                                  ("role",), registry=r)
        self.drain_seconds = Histogram(
            "gnnsched_gpu_drain_seconds",
            "Time from a fatal fault to the GPU admitting again",
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.gate_outcomes = Counter("gnnsched_gate_attempt_outcomes",
                                     "Failed custom containers the agent classified (attempt-result annotation)",
                                     ("outcome",), registry=r)
        self.constants_measurements = Counter(
            "gnnsched_gpu_constants_measurements",
            "Measurements of a GPU model's device constants (context, cuBLAS/cuBLASLt workspaces) by result: ok, "
            "reused (from the state directory, same model, driver and torch), failed, timeout",
            ("result",), registry=r)
        self.constants_measured = Gauge(
            "gnnsched_gpu_constants_measured",
            "1 when the GPU's device constants are measured and published in its GPUNode entry", g, registry=r)
        self.progress_lines = Counter(
            "gnnsched_gate_progress_lines",
            "Progress lines from gated workloads: parsed, or dropped unread (faster than the keeper's cadence)",
            ("result",), registry=r)
        self.stopped = Counter(
            "gnnsched_gate_stopped_clients",
            "Gated pods whose GPU processes the agent stopped, by reason (over their admitted bytes plus the margin, "
            "or on a GPU they were not admitted to)", ("reason",), registry=r)
        self.annotation_failures = Counter(
            "gnnsched_gate_annotation_failures",
            "Pod annotation writes that failed: retried (a passing error), or dropped (refused, or still failing "
            "after the retries)", ("outcome",), registry=r)
        self.probation = Counter(
            "gnnsched_gate_probation",
            "Pods on probation after an undecided MPS fault (gnnsched.attempts.probation): admitted alone on an idle "
            "GPU (alone), admitted with their own bytes because no GPU was idle (shared), or past their fault's step, "
            "their GPU open to others again (passed)", ("event",), registry=r)
        self.mps_up = Gauge("gnnsched_mps_daemon_up", "1 if the MPS control daemon answers", registry=r)
        self.mps_restarts = Gauge(
            "gnnsched_mps_daemon_restarts", "MPS control daemon restarts by the agent", registry=r
        )
        self._lock = threading.Lock()
        self._peaks: dict[str, int] = {}
        self._labels: dict[str, tuple[str, str]] = {}
        self._unhealthy_labels: dict[str, tuple[str, str, str]] = {}  # uuid -> its gnnsched_gpu_unhealthy series

    # --- fed by the gate ----------------------------------------------------------------------------------------

    def books_changed(self, books: Books) -> None:
        self.queue.set(len(books.queued))
        for gpu in books.gpus.values():
            lab = (str(gpu.index), gpu.uuid)
            self.total.labels(*lab).set(gpu.total_bytes)
            self.reserved.labels(*lab).set(gpu.reserve_bytes)
            self.committed.labels(*lab).set(books.committed_bytes(gpu.index))
            self.clients.labels(*lab).set(books.clients(gpu.index))
        for pair, value in books.learned_slowdowns().items():
            self.slowdown.labels(pair).set(value)
        with self._lock:
            for e in books.running.values():
                if e.key not in self._labels:
                    self._labels[e.key] = (e.namespace, e.name or e.pod_uid)
                    self.predicted.labels(*self._labels[e.key]).set(e.bytes)

    def admitted(self, waited_seconds: float) -> None:
        self.admissions.inc()
        self.wait.observe(max(0.0, waited_seconds))

    def rejected(self, reason: str) -> None:
        self.rejections.labels(reason).inc()

    def progress_line(self, result: str) -> None:
        self.progress_lines.labels(result).inc()

    def job_finished(self, e: Entry, peak: int | None = None) -> int | None:
        """Close a pod's prediction record; returns its observed peak (None if never seen on a GPU). ``peak``: the
        observer's figure, when it has one (it wins over the sampled one kept here)."""
        with self._lock:
            sampled = self._peaks.pop(e.key, None)
            lab = self._labels.pop(e.key, None)
        peak = peak if peak is not None else sampled
        if lab is not None:
            for gauge in (self.predicted, self.observed):
                with contextlib.suppress(KeyError):
                    gauge.remove(*lab)
        if peak:
            self.error_ratio.observe(peak / e.bytes)
        return peak

    # --- fed by the sampler -------------------------------------------------------------------------------------

    def sample(self, devices: list[GPUInfo], books: Books, usage: dict[str, int],
               draining: set[str] | None = None) -> None:
        """Driver view: used bytes, health and drain state per GPU, and per-pod peaks of what the gated pods' processes
        hold (``usage``: entry key → bytes this sample, from ``observe.attribute``)."""
        for d in devices:
            lab = (str(d.index), d.uuid)
            self.used.labels(*lab).set(d.used_bytes)
            self.healthy.labels(*lab).set(1 if d.healthy else 0)
            unhealthy = (*lab, "" if d.healthy or d.unhealthy_xid is None else str(d.unhealthy_xid))
            old = self._unhealthy_labels.get(d.uuid)
            if old is not None and old != unhealthy:
                self.unhealthy.remove(*old)  # one series per GPU: the Xid label changed
            self._unhealthy_labels[d.uuid] = unhealthy
            self.unhealthy.labels(*unhealthy).set(0 if d.healthy else 1)
            self.draining.labels(*lab).set(1 if draining and d.uuid in draining else 0)
        with self._lock:
            for key, used in usage.items():
                if key in books.running:
                    self._peaks[key] = max(self._peaks.get(key, 0), used)
                    pod_labels = self._labels.get(key)
                    if pod_labels is not None:
                        self.observed.labels(*pod_labels).set(self._peaks[key])

    def mps(self, up: bool, restarts: int) -> None:
        self.mps_up.set(1 if up else 0)
        self.mps_restarts.set(restarts)

    def serve(self, port: int, addr: str = "0.0.0.0", healthy: Callable[[], bool] = lambda: True,
              ready: Callable[[], tuple[bool, str]] | None = None) -> WSGIServer:
        """Expose ``/metrics``, ``/healthz`` (the DaemonSet's liveness probe: 503 when ``healthy()`` is false) and
        ``/readyz`` (the readiness probe: 503 with the reason until the gate serves and MPS is up)."""
        from gnnsched.metrics_http import serve_metrics

        return serve_metrics(self.registry, port, addr, healthy, "unhealthy: the agent's loop has stalled", ready)
