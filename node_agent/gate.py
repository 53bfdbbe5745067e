"""The memory-safety gate: an asyncio unix-socket server in front of the books.

Each connection is one pod's process. The gate identifies it (peer credentials + pod lookup, see ``identity``),
books its trusted bytes in the queue, runs the grouping policy on every arrival and exit, answers the admitted ones
with their GPU and MPS limits, and releases their bytes when the connection ends (the gated process exited) or when
the pod is gone from the API server. After a restart it waits ``recovery_grace`` seconds before admitting anything
new, so that the keepers of workloads admitted by the previous agent can reconnect and re-book first; pods the API
server still shows as admitted (``gnnsched.io/gpu`` annotation, not finished) are booked from their annotations even
if their keeper never comes back. Nothing in the books is ever changed by a request that fails a check.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gnnsched.contract import (
    ANN_ADMISSION_SEAL,
    ANN_ADMITTED_AT,
    ANN_FINISHED_AT,
    ANN_GPU,
    ANN_GROUP,
    ANN_STARTED_AT,
)
from gnnsched.node_agent.books import Books, Decision, Entry, Rejected
from gnnsched.node_agent.gate_checks import (
    MAX_CONNECTIONS_PER_POD,
    SEAL_KEY_BYTES,
    AdmissionSeal,
    ConnectionCap,
    ProgressLimiter,
    gate_key,
    peer_pod,
)
from gnnsched.node_agent.identity import (
    Demand,
    IdentityError,
    PeerVerifier,
    PodInfo,
    PodLookup,
    check_peer_uid,
    is_permanent,
    peer_cred,
    trusted_demand,
)
from gnnsched.node_agent.protocol import (
    MAX_LINE,
    AdmitRequest,
    Admitted,
    Queued,
    Resumed,
    ResumeRequest,
    mem_limit_value,
    parse_progress,
    parse_request,
)
from gnnsched.node_agent.protocol import (
    Rejected as RejectedReply,
)
from gnnsched.progress import REPORT_INTERVAL_S, StepProgress
from gnnsched.trust.domain import DomainResolver

log = logging.getLogger("gnnsched.node_agent.gate")

ANNOTATION_RETRY_DELAYS = (0.5, 1.0, 2.0, 4.0, 8.0)
"""Seconds between tries of a pod annotation that failed for a passing reason: about 15 s in all, within the
operator's wait for the agent's verdict (``operator/resize.py`` ``AGENT_VERDICT_SECONDS``)."""
_YIELD_EVERY = 64  # progress lines read back to back before the reader yields the event loop


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_rfc3339(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclass(slots=True)
class GateConfig:
    node_name: str
    pipe_directory: str
    active_thread_percentage: int | None = None  # None: 100 / group size
    recovery_grace: float = 5.0
    first_message_timeout: float = 10.0
    reconcile_seconds: float = 5.0
    jobs_uid: int | None = None  # the one UID an MPS client may run as (None: any); see identity.check_peer_uid
    # Extra environment for every admitted workload; only ``--fake-gpu-memory`` sets it (the fake GPU's limit
    # enforcement, gnnsched.gpu.fake_memory): on a real GPU the MPS server enforces the limit by itself.
    workload_env: dict[str, str] = field(default_factory=dict)
    # The key of the admission seal (gate_checks.AdmissionSeal); the agent reads it from its state directory so that
    # its successor can check the seals it wrote. The default, a fresh one, suits a gate with no successor.
    seal_key: bytes = field(default_factory=lambda: secrets.token_bytes(SEAL_KEY_BYTES), repr=False)
    max_connections_per_pod: int = MAX_CONNECTIONS_PER_POD  # gate_checks.ConnectionCap
    # whose pods may share a GPU (node-agent --trust-domain; gnnsched.trust.domain): a GPU holding a client of
    # another domain is not eligible for a pod
    domains: DomainResolver = field(default_factory=DomainResolver)


@dataclass(slots=True)
class _Conn:
    key: str
    writer: asyncio.StreamWriter
    pid: int | None
    admitted: asyncio.Future[Decision] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class GateServer:
    """Owns the books and every live gate connection. All mutation happens on the event loop thread."""

    def __init__(
        self,
        books: Books,
        config: GateConfig,
        *,
        pods: PodLookup,
        verifier: PeerVerifier,
        metrics: Any = None,
        event_log: Path | None = None,
        on_change: Callable[[], None] | None = None,
        wall: Callable[[], float] = time.time,
        on_release: Callable[[Entry, str], int | None] | None = None,
    ) -> None:
        self.books = books
        self.config = config
        self.pods = pods
        self.verifier = verifier
        self.metrics = metrics
        self.on_change = on_change or (lambda: None)
        # The agent's hook when a running entry ends (observation, fault domain); returns the entry's observed peak.
        self.on_release = on_release
        self._wall = wall
        self._event_log = event_log.open("a", buffering=1) if event_log else None
        self._conns: dict[str, _Conn] = {}
        self._server: asyncio.base_events.Server | None = None
        self._hold_until = 0.0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._annotations: asyncio.Queue[tuple[str, str, dict[str, str | None]]] | None = None
        self.decision_seconds: list[float] = []
        self.pids: dict[str, int] = {}  # key → pid of the gated process (for observed-peak attribution)
        self.seal = AdmissionSeal(config.seal_key, config.node_name)
        self.connections = ConnectionCap(config.max_connections_per_pod)
        self.progress_parsed = 0  # progress lines parsed / dropped unread by the rate (gate_checks.ProgressLimiter)
        self.progress_dropped = 0

    # --- lifecycle ---------------------------------------------------------------------------------------------

    async def start(self, socket_path: Path) -> None:
        socket_path = Path(socket_path)
        socket_path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            socket_path.unlink()  # a stale socket from a previous agent; our own lock is the process itself
        self._annotations = asyncio.Queue()
        self._hold_until = time.monotonic() + self.config.recovery_grace
        self._event("start", policy=self.books.policy.value, gpus=len(self.books.gpus))
        await self._adopt_pods()
        self._server = await asyncio.start_unix_server(self._handle, path=str(socket_path), limit=MAX_LINE)
        os.chmod(socket_path, 0o666)  # pods of any UID must reach it; identity comes from SO_PEERCRED, not perms
        self._spawn(self._annotation_writer())
        self._spawn(self._release_hold())
        if self.config.reconcile_seconds > 0:
            self._spawn(self._reconcile_loop())

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for c in list(self._conns.values()):
            c.writer.close()
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
        if self._event_log:
            self._event_log.close()
            self._event_log = None

    def _spawn(self, coro: Any) -> None:
        t = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    # --- events, metrics, annotations ----------------------------------------------------------------------------

    def _event(self, kind: str, **fields: Any) -> None:
        if self._event_log:
            self._event_log.write(json.dumps({"t": self._wall(), "event": kind, **fields}) + "\n")

    def annotate(self, e: Entry, values: dict[str, str | None]) -> None:
        """Queue annotations for ``e``'s pod on the gate's one ordered writer."""
        self._annotate(e, values)

    def annotate_pod(self, namespace: str, name: str, values: dict[str, str | None]) -> None:
        """Queue annotations for a pod by name (one that may have left the books already)."""
        if self._annotations is not None and namespace and name:
            self._annotations.put_nowait((namespace, name, values))

    def event(self, kind: str, **fields: Any) -> None:
        """Append one event to ``--event-log`` (the agent's record of what it did; it has no Kubernetes Event
        writer)."""
        self._event(kind, **fields)

    def _annotate(self, e: Entry, values: dict[str, str | None]) -> None:
        if self._annotations is not None and e.namespace and e.name:
            self._annotations.put_nowait((e.namespace, e.name, values))

    async def _annotation_writer(self) -> None:
        """One writer, in order: a pod's admitted-at must never land after its finished-at.

        A write that fails for a passing reason (a timeout, a reset connection, 429, 5xx) is tried again, with
        backoff, before the next one: these annotations are verdicts the operator waits for (a fault victim's
        record is what keeps the job from being charged), so one API server hiccup must not lose them. A write the
        API server refuses as such (``identity.is_permanent``) is dropped at once, and so is one still failing after
        ``ANNOTATION_RETRY_DELAYS``: the API server being down must not stop the gate."""
        assert self._annotations is not None
        while True:
            ns, name, values = await self._annotations.get()
            for delay in (*ANNOTATION_RETRY_DELAYS, None):
                try:
                    await asyncio.to_thread(self.pods.annotate, ns, name, values)
                    break
                except Exception as exc:
                    if delay is None or is_permanent(exc):
                        log.warning("annotating pod %s/%s with %s failed, not retried: %s", ns, name,
                                    sorted(values), exc)
                        self._count_annotation("dropped")
                        break
                    log.info("annotating pod %s/%s failed (retrying in %.1f s): %s", ns, name, delay, exc)
                    self._count_annotation("retried")
                    await asyncio.sleep(delay)

    def _count_annotation(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.annotation_failures.labels(outcome).inc()

    def _changed(self) -> None:
        if self.metrics is not None:
            self.metrics.books_changed(self.books)
        self.on_change()

    def _reject(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.rejected(reason)

    # --- the decision ------------------------------------------------------------------------------------------

    def decide(self) -> list[Decision]:
        """Run the policy (unless still in the post-restart hold) and hand each admitted group its reply."""
        if time.monotonic() < self._hold_until:
            return []
        t0 = time.perf_counter()
        now = self._wall()
        decisions = self.books.decide(now)
        self.decision_seconds.append(time.perf_counter() - t0)
        if len(self.decision_seconds) > 10_000:
            del self.decision_seconds[:5_000]
        for d in decisions:
            self._event("admitted", group=d.group, gpu=d.gpu.index, keys=[e.key for e in d.entries],
                        bytes=[e.bytes for e in d.entries])
            for e in d.entries:
                if self.metrics is not None:
                    self.metrics.admitted(now - e.queued_at)
                    if e.probation is not None:
                        self.metrics.probation.labels("alone" if e.held else "shared").inc()
                at = rfc3339(now)
                self._annotate(e, {ANN_GPU: d.gpu.uuid, ANN_GROUP: d.group, ANN_ADMITTED_AT: at,
                                   ANN_ADMISSION_SEAL: self.seal.seal(e.pod_uid, e.key, d.gpu.uuid, at),
                                   ANN_FINISHED_AT: None, ANN_STARTED_AT: None})
                conn = self._conns.get(e.key)
                if conn is not None and not conn.admitted.done():
                    conn.admitted.set_result(d)
        if decisions:
            self._changed()
        return decisions

    async def _release_hold(self) -> None:
        """The end of the post-restart hold: every client that will be restored is, so probation holds are booked
        again (:meth:`Books.rehold_probation`) before the first decision."""
        delay = self._hold_until - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        reheld = self.books.rehold_probation()
        for e in reheld:
            self._event("probation-rehold", key=e.key, gpu=e.gpu_index, step=e.probation)
        if reheld:
            self._changed()
        self.decide()

    def release(self, key: str, why: str) -> None:
        e = self.books.release(key)
        if e is None:
            return
        self._event("released", key=key, gpu=e.gpu_index, bytes=e.bytes, why=why)
        self._annotate(e, {ANN_FINISHED_AT: rfc3339(self._wall())})
        # The observed peak reaches the pod from the agent's observer while the pod runs (never lowered on restart).
        observed = self.on_release(e, why) if self.on_release is not None else None
        if self.metrics is not None:
            self.metrics.job_finished(e, observed)
        self.pids.pop(key, None)
        self._changed()
        self.decide()

    def cancel(self, key: str, why: str) -> None:
        if self.books.cancel(key) is not None:
            self._event("cancelled", key=key, why=why)
            self._changed()

    # --- connections -------------------------------------------------------------------------------------------

    async def _send(self, writer: asyncio.StreamWriter, msg: Any) -> None:
        writer.write(msg.line())
        await writer.drain()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        counted: str | None = None  # the pod this connection counts against (ConnectionCap), once identified
        try:
            early = peer_pod(self.verifier, peer_cred(sock) if sock is not None else None)
            if early is not None:
                if not self.connections.take(early):
                    self._reject("too-many-connections")
                    await self._send(writer, RejectedReply(reason="too-many-connections", message=(
                        f"pod {early} already holds {self.connections.limit} gate connections "
                        "(--max-gate-connections-per-pod); this one is refused")))
                    return
                counted = early
            try:
                line = await asyncio.wait_for(reader.readline(), self.config.first_message_timeout)
            except (asyncio.LimitOverrunError, ValueError):
                self._reject("malformed")
                await self._send(
                    writer, RejectedReply(reason="malformed", message=f"request line longer than {MAX_LINE} bytes")
                )
                return
            except asyncio.TimeoutError:
                self._reject("timeout")
                return
            if not line:
                return
            try:
                req = parse_request(line)
            except ValueError as exc:
                self._reject("malformed")
                await self._send(writer, RejectedReply(reason="malformed", message=str(exc)))
                return
            cred = peer_cred(sock) if sock is not None else None
            try:
                check_peer_uid(cred, self.config.jobs_uid)
                self.verifier.verify(cred, req.pod_uid)
                if counted is None:  # not identified at accept (peer check off): count the verified claim
                    if not self.connections.take(req.pod_uid.lower()):
                        raise IdentityError(
                            "too-many-connections",
                            f"pod {req.pod_namespace}/{req.pod_name} already holds {self.connections.limit} gate "
                            "connections (--max-gate-connections-per-pod); this one is refused",
                        )
                    counted = req.pod_uid.lower()
                pod = await asyncio.to_thread(self.pods.get, req.pod_namespace, req.pod_name)
                demand = self._check_pod(pod, req)
                assert pod is not None
                key = gate_key(pod, req.container)
            except IdentityError as exc:
                self._reject(exc.reason)
                self._event("rejected", pod=req.pod_uid, reason=exc.reason)
                await self._send(writer, RejectedReply(reason=exc.reason, message=exc.message))
                return
            if isinstance(req, ResumeRequest):
                await self._resume(key, req, pod, demand, cred.pid if cred else None, reader, writer)
            else:
                await self._admit(key, req, pod, demand, cred.pid if cred else None, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            if counted is not None:
                self.connections.give(counted)
            with contextlib.suppress(Exception):
                writer.close()

    def _check_pod(self, pod: PodInfo | None, req: AdmitRequest | ResumeRequest) -> Demand:
        if pod is None:
            raise IdentityError("unknown-pod", f"pod {req.pod_namespace}/{req.pod_name} does not exist")
        if pod.uid != req.pod_uid:
            raise IdentityError(
                "pod-uid-mismatch", f"pod {req.pod_namespace}/{req.pod_name} has uid {pod.uid}, not {req.pod_uid}"
            )
        if pod.node_name and pod.node_name != self.config.node_name:
            raise IdentityError("wrong-node", f"pod {pod.namespace}/{pod.name} is bound to {pod.node_name}")
        if pod.terminated:
            raise IdentityError("pod-finished", f"pod {pod.namespace}/{pod.name} is {pod.phase}")
        whole = max(g.capacity_bytes for g in self.books.gpus.values())
        return trusted_demand(pod, whole)

    async def _wait_eof(self, reader: asyncio.StreamReader) -> None:
        """The connection's end is the release signal; anything the client sends meanwhile is ignored."""
        while True:
            chunk = await reader.read(4096)
            if not chunk:
                return

    async def _follow(self, key: str, reader: asyncio.StreamReader) -> None:
        """Until the connection ends (the release signal): take the workload's progress reports
        (:meth:`progress`). A line longer than ``MAX_LINE`` ends the reports from this client, not its booking.

        The rate comes first: a line sooner than the keeper's cadence allows is dropped unparsed (and a flood yields
        the loop every ``_YIELD_EVERY`` lines, so that other pods' requests are served between its reads)."""
        limiter = ProgressLimiter(min_gap=REPORT_INTERVAL_S / 2)
        seen = 0
        while True:
            try:
                line = await reader.readline()
            except (asyncio.LimitOverrunError, ValueError):
                log.warning("%s: a progress line longer than %d bytes; its reports are ignored from now on", key,
                            MAX_LINE)
                self._event("progress-rejected", key=key, reason=f"line longer than {MAX_LINE} bytes")
                await self._wait_eof(reader)
                return
            if not line.endswith(b"\n"):  # EOF (a partial last line is not a report)
                return
            seen += 1
            if seen % _YIELD_EVERY == 0:
                await asyncio.sleep(0)
            if not limiter.admit(self._wall()):
                self.progress_dropped += 1
                if self.metrics is not None:
                    self.metrics.progress_line("dropped")
                if limiter.first_complaint():
                    log.warning("%s: progress lines faster than one per %.1f s; the excess is dropped unread (logged "
                                "once per connection)", key, limiter.min_gap)
                    self._event("progress-flood", key=key)
                continue
            self.progress_parsed += 1
            if self.metrics is not None:
                self.metrics.progress_line("parsed")
            self.progress(key, line, limiter)

    def progress(self, key: str, line: bytes, limiter: ProgressLimiter | None = None) -> StepProgress | None:
        """Record one progress line of ``key``'s workload; returns the report kept, None when it was dropped.

        Only a running entry reports. Reports closer together than half ``REPORT_INTERVAL_S`` are dropped (the keeper
        sends at most one per interval; this bounds a client that does not). The first report that counts a step
        sets the pod's ``started-at`` annotation to when its first step began, so the operator's observed runtime
        is the workload's own, without its start-up."""
        e = self.books.running.get(key)
        if e is None:
            return None
        try:
            report = parse_progress(line)
        except ValueError as exc:
            if limiter is None or limiter.first_complaint():  # once per connection, then counted only
                log.warning("%s: progress report dropped: %s", key, exc)
                self._event("progress-rejected", key=key, reason=str(exc))
            return None
        now = self._wall()
        last = e.progress
        if last is not None and now - last.at < REPORT_INTERVAL_S / 2:
            return None
        progress = StepProgress(steps=report.steps, total=report.total, seconds=report.seconds, at=now)
        # sets e.progress; also a co-location slowdown sample (issue 37); True: it passed its probation step
        released = self.books.report_progress(e, progress)
        if (last is None or last.steps == 0) and report.steps > 0:
            self._annotate(e, {ANN_STARTED_AT: rfc3339(progress.work_started_at)})
        self._changed()
        if released:
            self._event("probation-passed", key=key, step=e.probation, steps=report.steps)
            if self.metrics is not None:
                self.metrics.probation.labels("passed").inc()
            self.decide()  # its GPU takes others now
        return progress

    async def _admit(
        self, key: str, req: AdmitRequest, pod: PodInfo, demand: Demand, pid: int | None,
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
    ) -> None:
        if key in self.books.running and key not in self._conns:
            # Booked from the pod's annotations after a restart, and no keeper has re-attached. A new admit from the
            # same pod and container means that process ended (the container restarted). Keepers of live workloads
            # reconnect within the grace period, so only after it is the stale booking released.
            delay = self._hold_until - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            if key in self.books.running and key not in self._conns:
                self._event("superseded", key=key)
                self.release(key, "superseded")
        try:
            e = self.books.enqueue(
                key, pod_uid=req.pod_uid, bytes=demand.bytes, namespace=pod.namespace, name=pod.name,
                job=demand.job, qt_seconds=demand.qt_seconds, intensity=demand.intensity, now=self._wall(),
                exclusive=demand.exclusive, qos_seconds=demand.qos_seconds, prestarted=demand.prestarted,
                apart=demand.apart, domain=await self.config.domains.of_async(pod.namespace),
                probation=demand.probation, probation_suspect=demand.probation_suspect,
            )
        except Rejected as exc:
            self._reject(exc.reason)
            self._event("rejected", key=key, reason=exc.reason)
            message = exc.message
            if exc.reason == "duplicate":
                which = f"container {req.container!r} of " if req.container else ""
                message = (f"{which}pod {pod.namespace}/{pod.name} already has a live gate entry ({key}): one per "
                           "container, until its process exits")
            await self._send(writer, RejectedReply(reason=exc.reason, message=message))
            return
        conn = _Conn(key=key, writer=writer, pid=pid)
        self._conns[key] = conn
        if pid is not None:
            self.pids[key] = pid
        self._event("queued", key=key, bytes=e.bytes, seq=e.seq, qt=e.qt_seconds, source=demand.source)
        self._changed()
        admitted = False
        eof = asyncio.ensure_future(self._follow(key, reader))
        try:
            self.decide()
            if not conn.admitted.done():
                await self._send(writer, Queued(position=len(self.books.queued)))
            waiters: set[asyncio.Future[Any]] = {conn.admitted, eof}
            done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            if conn.admitted.done():
                d = conn.admitted.result()
                admitted = True
                n = len(d.entries)
                pct = self.config.active_thread_percentage or max(1, math.ceil(100 / n))
                at = e.admitted_at if e.admitted_at is not None else self._wall()
                await self._send(writer, Admitted(
                    gpu_uuid=d.gpu.uuid, gpu_index=d.gpu.index, bytes=e.bytes, mem_limit=mem_limit_value(e.bytes),
                    active_thread_percentage=pct, pipe_directory=self.config.pipe_directory, group=d.group,
                    admitted_at=rfc3339(at), env=dict(self.config.workload_env) or None,
                ))
                await eof
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            eof.cancel()
            if self._conns.get(key) is conn:
                del self._conns[key]
            if admitted or key in self.books.running:
                self.release(key, "exit")
            else:
                self.cancel(key, "client-gone")

    async def _resume(
        self, key: str, req: ResumeRequest, pod: PodInfo, demand: Demand, pid: int | None,
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
    ) -> None:
        existing = self.books.running.get(key)
        if existing is not None and self._conns.get(key) is not None:
            self._reject("duplicate")
            await self._send(writer, RejectedReply(reason="duplicate", message=f"{key} already has a live connection"))
            return
        try:
            if existing is None:
                domain = await self.config.domains.of_async(pod.namespace)
                self._restore_resumed(key, req, pod, demand, domain)
                self._event("resumed", key=key, gpu=self.books.running[key].gpu_index, bytes=req.bytes)
            else:
                self._check_reattach(existing, req)
                self._event("reattached", key=key, gpu=existing.gpu_index, bytes=existing.bytes)
        except Rejected as exc:
            self._reject(exc.reason)
            self._event("rejected", key=key, reason=exc.reason)
            await self._send(writer, RejectedReply(reason=exc.reason, message=exc.message))
            return
        conn = _Conn(key=key, writer=writer, pid=pid)
        conn.admitted.cancel()
        self._conns[key] = conn
        if pid is not None:
            self.pids[key] = pid
        self._changed()
        try:
            await self._send(writer, Resumed())
            await self._follow(key, reader)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            if self._conns.get(key) is conn:
                del self._conns[key]
                self.release(key, "exit")

    def _check_reattach(self, e: Entry, req: ResumeRequest) -> None:
        """A keeper re-attaching to an entry in the books: only with the GPU and bytes the books hold for it."""
        gpu = self.books.gpus.get(e.gpu_index) if e.gpu_index is not None else None
        if gpu is None or gpu.uuid != req.gpu_uuid or req.bytes != e.bytes:
            raise Rejected("resume-mismatch", f"claimed {req.bytes} B on {req.gpu_uuid}; this agent admitted "
                                              f"{e.key} with {e.bytes} B on {gpu.uuid if gpu else '?'}")

    def _restore_resumed(self, key: str, req: ResumeRequest, pod: PodInfo, demand: Demand,
                         domain: str | None) -> None:
        """Book a resume that is not in the books: only a workload this node's agent admitted (its seal on the pod,
        for this key and GPU, not finished since), within the recovery grace after a restart, on a healthy GPU that
        has room; everything else asks with ``admit`` (gate_checks module docstring)."""
        ann = pod.annotations
        where = f"pod {pod.namespace}/{pod.name} ({key})"
        if req.bytes != demand.bytes:
            raise Rejected("resume-mismatch", f"claimed {req.bytes} B; the pod says {demand.bytes} B")
        gpu = self.books.gpu_by_uuid(req.gpu_uuid)
        if gpu is None:
            raise Rejected("unknown-gpu", f"{req.gpu_uuid!r} is not a GPU of this node")
        admitted_at = ann.get(ANN_ADMITTED_AT)
        if ann.get(ANN_GPU) != req.gpu_uuid or not self.seal.verifies(ann.get(ANN_ADMISSION_SEAL), pod.uid, key,
                                                                      req.gpu_uuid, admitted_at):
            raise Rejected("not-admitted-here", f"{where} was not admitted on {req.gpu_uuid} by this node's agent: "
                                                "resume only re-books a workload the agent admitted; ask with admit")
        if ann.get(ANN_FINISHED_AT):
            raise Rejected("not-admitted-here", f"{where}: its admission on {req.gpu_uuid} ended at "
                                                f"{ann[ANN_FINISHED_AT]}; ask with admit")
        if time.monotonic() >= self._hold_until:
            raise Rejected("resume-late", f"{where}: a workload is re-booked only within the recovery grace after "
                                          "an agent restart; an admission not in the books by then has ended")
        if not gpu.healthy:
            raise Rejected("gpu-unhealthy", f"{where}: GPU {gpu.index} ({gpu.uuid}) is out of service; nothing is "
                                            "booked there")
        self.books.restore(
            key, pod_uid=req.pod_uid, bytes=req.bytes, gpu_uuid=req.gpu_uuid, namespace=pod.namespace,
            name=pod.name, job=demand.job, group=ann.get(ANN_GROUP), admitted_at=parse_rfc3339(admitted_at),
            qt_seconds=demand.qt_seconds, intensity=demand.intensity, exclusive=demand.exclusive, apart=demand.apart,
            domain=domain, probation=demand.probation,
        )

    # --- pods: adoption after restart, release when gone ----------------------------------------------------------

    async def _adopt_pods(self) -> None:
        """Book pods the API server shows as admitted on this node and not finished (their keeper may reconnect)."""
        try:
            pods = await asyncio.to_thread(self.pods.on_node, self.config.node_name)
        except Exception as exc:
            log.warning("cannot list pods on %s for recovery: %s", self.config.node_name, exc)
            return
        whole = max(g.capacity_bytes for g in self.books.gpus.values())
        for pod in pods:
            gpu = pod.annotations.get(ANN_GPU)
            if not gpu or pod.terminated or pod.annotations.get(ANN_FINISHED_AT):
                continue
            # Only what this node's agent admitted: its seal names the key, the GPU and the admission time.
            key = self.seal.sealed_key(pod, pod.annotations.get(ANN_ADMISSION_SEAL), gpu,
                                       pod.annotations.get(ANN_ADMITTED_AT))
            if key is None:
                log.warning("pod %s/%s: not adopted: its %s annotation carries no admission seal of this node's "
                            "agent", pod.namespace, pod.name, ANN_GPU)
                self._event("not-adopted", pod=pod.uid, reason="no-seal")
                continue
            try:
                demand = trusted_demand(pod, whole)
                self.books.restore(
                    key, pod_uid=pod.uid, bytes=demand.bytes, gpu_uuid=gpu, namespace=pod.namespace,
                    name=pod.name, job=demand.job, group=pod.annotations.get(ANN_GROUP),
                    admitted_at=parse_rfc3339(pod.annotations.get(ANN_ADMITTED_AT)), qt_seconds=demand.qt_seconds,
                    intensity=demand.intensity, exclusive=demand.exclusive, apart=demand.apart,
                    domain=await self.config.domains.of_async(pod.namespace), probation=demand.probation,
                )
                self._event("adopted", key=key, bytes=demand.bytes)
            except (Rejected, IdentityError) as exc:
                log.warning("pod %s/%s: not adopted: %s", pod.namespace, pod.name, exc)
        self._changed()

    async def reconcile(self) -> None:
        """Release running entries whose pod is gone or finished, and drop queued ones likewise."""
        entries = list(self.books.running.values()) + list(self.books.queued.values())
        for e in entries:
            if not e.namespace or not e.name:
                continue
            try:
                pod = await asyncio.to_thread(self.pods.get, e.namespace, e.name)
            except Exception as exc:
                log.warning("reconcile: cannot read pod %s/%s: %s", e.namespace, e.name, exc)
                continue
            if pod is None or pod.terminated or pod.uid != e.pod_uid:
                conn = self._conns.pop(e.key, None)
                if conn is not None:
                    conn.writer.close()
                if e.key in self.books.running:
                    self.release(e.key, "pod-gone")
                else:
                    self.cancel(e.key, "pod-gone")

    async def _reconcile_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.reconcile_seconds)
            try:
                await self.reconcile()
            except Exception as exc:
                log.warning("reconcile failed: %s", exc)
