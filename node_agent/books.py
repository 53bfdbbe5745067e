"""The gate's books: which pods wait, which run where with how many bytes. A pure state machine, no I/O, no clock.

The asyncio server, the restart recovery and the property test all drive this one class, so the invariant that
matters — per GPU, ``sum(admit-bytes of running clients) <= total - reserve`` and ``clients <= max_clients`` — is
checked in one place (``gnnsched.policies.check_gate_invariant``) after every mutation. Every public method either
applies completely or raises ``Rejected`` and leaves the books exactly as they were: a bad request can be refused,
never half-applied.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gnnsched.attempts import probation as prob
from gnnsched.colocation.interference import load_default as load_interference
from gnnsched.colocation.learned import SlowdownBook, SlowdownFn, interval_step_seconds, observed_slowdown
from gnnsched.contract import LearnedSlowdown
from gnnsched.policies import (
    DEFAULT_BYPASS_LIMIT,
    STARTUP_SECONDS,
    Admission,
    Client,
    GateInvariantError,
    GPUBooks,
    GPUFree,
    Policy,
    Task,
    check_gate_invariant,
    parse_policy,
    plan_decision,
    remaining_seconds,
    startup_left,
)
from gnnsched.progress import StepProgress
from gnnsched.trust.domain import mixed


class Rejected(Exception):
    """A request the books refuse. ``reason`` is a short stable label (metrics, replies); ``message`` for people."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


@dataclass(slots=True)
class GPUSlot:
    """One GPU the gate manages."""

    index: int
    uuid: str
    model: str
    total_bytes: int
    reserve_bytes: int
    max_clients: int
    healthy: bool = True
    used_bytes: int = 0  # what the driver last reported in use (for the optional live-memory check)

    @property
    def capacity_bytes(self) -> int:
        return max(0, self.total_bytes - self.reserve_bytes)


@dataclass(slots=True)
class Entry:
    """A pod's request, queued or running. ``key`` is unique: ``<pod uid>`` or ``<pod uid>/<container>``."""

    key: str
    pod_uid: str
    namespace: str
    name: str
    job: str | None
    bytes: int
    seq: int
    qt_seconds: float | None = None
    intensity: str | None = None
    queued_at: float = 0.0
    gpu_index: int | None = None
    group: str | None = None
    admitted_at: float | None = None
    bypassed: int = 0  # entries later in the policy's order admitted while this one waited (bounded by bypass_limit)
    exclusive: bool = False  # runs alone on a whole GPU (ANN_EXCLUSIVE): booked at the GPU's whole capacity
    qos_seconds: float | None = None  # inference: the latency target (ANN_QOS_TARGET), kept by the share rule
    prestarted: bool = False  # behind gate --prestart (ANN_PRESTART): its start-up began at queued_at
    progress: StepProgress | None = None  # its workload's last step report (gate connection; gnnsched.progress)
    apart: frozenset[str] = frozenset()  # jobs it may not share a GPU with (ANN_FAULT_PEERS: an undecided fault's)
    domain: str | None = None  # its trust domain (gnnsched.trust.domain): it shares a GPU only within it
    mates: tuple[str, ...] | None = None  # co-runners' classes at its last progress report (learned slowdowns)
    solo_step_s: float | None = None  # its seconds per step measured while it ran alone
    # probation (gnnsched.attempts.probation): the step its undecided fault came at; admitted on an idle GPU, it holds
    # the GPU alone until it passes that step
    probation: int | None = None
    probation_suspect: bool = False  # that fault was its own as the suspect: planned alone even when no GPU is idle
    held: bool = False  # admitted alone on probation: books the whole GPU until its progress passes ``probation``

    def task(self) -> Task:
        return Task(key=self.key, bytes=self.bytes, seq=self.seq, qt_seconds=self.qt_seconds, intensity=self.intensity,
                    bypassed=self.bypassed, qos_seconds=self.qos_seconds, job=self.job, apart=self.apart,
                    domain=self.domain)


@dataclass(slots=True)
class Decision:
    """One admitted group: its id, the GPU and the entries that now run there."""

    group: str
    gpu: GPUSlot
    entries: list[Entry] = field(default_factory=list)


class Books:
    """Queue + running set for one node's GPUs under one policy."""

    def __init__(
        self,
        gpus: list[GPUSlot],
        policy: Policy | str,
        live_memory_check: bool = False,
        bypass_limit: int = DEFAULT_BYPASS_LIMIT,
        spread: bool = False,
        share_when_pays: bool = False,
        startup_seconds: float = STARTUP_SECONDS,
    ) -> None:
        if not gpus:
            raise ValueError("gpus: the gate needs at least one GPU")
        if isinstance(bypass_limit, bool) or not isinstance(bypass_limit, int) or bypass_limit < 0:
            raise ValueError(f"bypass_limit: must be an integer >= 0, got {bypass_limit!r}")
        if len({g.index for g in gpus}) != len(gpus) or len({g.uuid for g in gpus}) != len(gpus):
            raise ValueError("gpus: indices and uuids must be unique")
        if not (isinstance(startup_seconds, (int, float)) and 0 <= startup_seconds < math.inf):
            raise ValueError(f"startup_seconds: must be a finite number >= 0, got {startup_seconds!r}")
        # the start-up a client pays after its admission (policies.startup_left): its predicted end starts after it
        self.startup_seconds = float(startup_seconds)
        self.gpus: dict[int, GPUSlot] = {g.index: g for g in gpus}
        self.policy = parse_policy(policy)
        self.live_memory_check = live_memory_check
        # 0: admissions are a strict prefix of the policy's order; N > 0: bounded-bypass backfill (policies module
        # docstring). The per-entry counts live in Entry.bypassed; an agent restart starts them from 0 again.
        self.bypass_limit = bypass_limit
        # True: plan in rounds of one task per GPU (policies.plan_decision's spread), so a burst does not pile onto
        # one GPU while the node's others are idle
        self.spread = spread
        # True: a pod joins a GPU where others run only when policies.share_pays predicts it finishes sooner than
        # waiting for an idle GPU (off by default: the robustness grid says it does not pay, docs/node-agent.md)
        self.share_when_pays = share_when_pays
        self.queued: dict[str, Entry] = {}
        self.running: dict[str, Entry] = {}
        # co-location slowdowns learned from progress (gnnsched.colocation.learned; issue 37), the model as prior
        self.slowdowns = SlowdownBook()
        self.interference = load_interference()
        self._tasks: dict[str, Task] = {}  # the policies' view of each queued entry, built once per request
        self._seq = 0
        self._groups = 0

    # --- queries -----------------------------------------------------------------------------------------------

    def booked_bytes(self, e: Entry) -> int:
        """What a running entry books: the whole GPU while it is held on probation, else its own bytes (its MPS
        limit either way)."""
        return self.whole_gpu_bytes() if e.held else e.bytes

    def committed_bytes(self, index: int) -> int:
        return sum(self.booked_bytes(e) for e in self.running.values() if e.gpu_index == index)

    def clients(self, index: int) -> int:
        return sum(1 for e in self.running.values() if e.gpu_index == index)

    def gpu_by_uuid(self, uuid: str) -> GPUSlot | None:
        return next((g for g in self.gpus.values() if g.uuid == uuid), None)

    def invariant_books(self) -> list[GPUBooks]:
        return [
            GPUBooks(
                index=g.index,
                total_bytes=g.total_bytes,
                reserve_bytes=g.reserve_bytes,
                committed=tuple(self.booked_bytes(e) for e in self.running.values() if e.gpu_index == g.index),
                max_clients=g.max_clients,
            )
            for g in self.gpus.values()
        ]

    def whole_gpu_bytes(self) -> int:
        """What an exclusive entry books: the largest GPU's whole capacity (total − reserve). Booking all of it is
        what keeps an exclusive pod alone: it fits only a GPU with nothing committed, and while it runs that GPU has
        no room left for anyone (every request is > 0 bytes). Its MPS limit is the same number."""
        return max(g.capacity_bytes for g in self.gpus.values())

    def check(self) -> None:
        """Raise ``GateInvariantError`` if the books are unsafe (they never should be; this is the tripwire)."""
        check_gate_invariant(self.invariant_books())
        for e in self.running.values():
            if e.exclusive and self.clients(e.gpu_index) != 1:  # type: ignore[arg-type]
                raise GateInvariantError(f"gpu {e.gpu_index}: exclusive {e.key} shares it with others")

    def queue_order(self) -> list[Entry]:
        """The queue in the order the policy will consider it."""
        from gnnsched.policies import traversal

        return [self.queued[t.key] for t in traversal(self.policy, self._tasks.values())]

    # --- mutations ---------------------------------------------------------------------------------------------

    def enqueue(
        self,
        key: str,
        *,
        pod_uid: str,
        bytes: int,
        namespace: str = "",
        name: str = "",
        job: str | None = None,
        qt_seconds: float | None = None,
        intensity: str | None = None,
        now: float = 0.0,
        exclusive: bool = False,
        qos_seconds: float | None = None,
        prestarted: bool = False,
        apart: frozenset[str] = frozenset(),
        domain: str | None = None,
        probation: int | None = None,
        probation_suspect: bool = False,
    ) -> Entry:
        """Queue a request. Refused when the key is already queued or running, or when no GPU could ever hold it.
        ``qos_seconds``: an inference pod's latency target, which the share rule (``share_when_pays``) keeps.
        ``prestarted``: the pod runs behind ``gate --prestart`` (its start-up began now, not at its admission).
        ``apart``: the jobs it may not share a GPU with while it runs (``policies.apart_allows``).
        ``domain``: its trust domain; it joins only GPUs whose clients are all of it (``gnnsched.trust.domain``).
        ``probation``: the step its undecided fault came at: while a GPU is idle it is admitted alone there, booking the
        whole GPU until it passes that step (``gnnsched.attempts.probation``); ``probation_suspect``: the fault was its
        own as the suspect, so it is planned alone even when no GPU is idle (it waits for one).

        ``exclusive``: the pod runs alone on a whole GPU; it is booked at :meth:`whole_gpu_bytes` whatever ``bytes``
        says (its own estimate may exceed the shareable capacity: that is why it runs alone)."""
        if not isinstance(bytes, int) or isinstance(bytes, bool) or bytes <= 0:
            raise Rejected("invalid-bytes", f"admit-bytes must be a positive integer, got {bytes!r}")
        if exclusive:
            bytes = self.whole_gpu_bytes()
        if key in self.queued or key in self.running:
            raise Rejected("duplicate", f"{key} already has a request at this gate")
        biggest = max(g.capacity_bytes for g in self.gpus.values())
        if bytes > biggest:
            raise Rejected(
                "exceeds-gpu", f"admit-bytes {bytes} exceeds the largest GPU capacity on this node ({biggest} B)"
            )
        self._seq += 1
        e = Entry(
            key=key, pod_uid=pod_uid, namespace=namespace, name=name, job=job, bytes=bytes, seq=self._seq,
            qt_seconds=qt_seconds, intensity=intensity, queued_at=now, exclusive=exclusive, qos_seconds=qos_seconds,
            prestarted=prestarted, apart=apart, domain=domain, probation=None if exclusive else probation,
            probation_suspect=probation_suspect and not exclusive and probation is not None,
        )
        self.queued[key] = e
        self._tasks[key] = e.task()
        return e

    def cancel(self, key: str) -> Entry | None:
        """Drop a queued request (its client went away). Unknown keys are a no-op."""
        self._tasks.pop(key, None)
        return self.queued.pop(key, None)

    def release(self, key: str) -> Entry | None:
        """Free a running entry's bytes (process exited or pod gone). Unknown keys are a no-op."""
        return self.running.pop(key, None)

    def set_used(self, index: int, used_bytes: int) -> None:
        """The driver's current used bytes on a GPU (only consulted with ``live_memory_check``)."""
        self.gpus[index].used_bytes = max(0, int(used_bytes))

    def set_health(self, index: int, healthy: bool) -> None:
        """An unhealthy GPU admits nothing new; what runs there stays booked until it exits."""
        self.gpus[index].healthy = healthy

    def _work_from(self, e: Entry) -> float | None:
        """When a running entry's GPU work is predicted to start: its admission plus the start-up it had left then."""
        if e.admitted_at is None:
            return None
        return e.admitted_at + startup_left(self.startup_seconds, e.queued_at, e.admitted_at, e.prestarted)

    def seconds_left(self, e: Entry, now: float) -> float:
        """A running entry's seconds left, as every load-aware rule and the published status see it: measured from
        its step reports once they show its pace, else its predicted runtime from when its GPU work was predicted to
        start (:func:`gnnsched.policies.remaining_seconds`, the one estimator the simulator calls too)."""
        return remaining_seconds(e.qt_seconds, self._work_from(e), now, e.progress)

    def report_progress(self, e: Entry, progress: StepProgress) -> bool:
        """A running pod's new step report: its pace since the last report is a slowdown sample of its class beside
        the classes that ran with it throughout (``Entry.mates`` unchanged since then), or its solo pace when none
        did (gnnsched.colocation.learned: over that pace, else over its predicted solo step). Returns True when the
        report ends its probation: it passed the step of its undecided fault, so its GPU may take others now."""
        mates = tuple(sorted(x.intensity or "none" for x in self.running.values()
                             if x.gpu_index == e.gpu_index and x.key != e.key))
        step = interval_step_seconds(e.progress, progress) if e.mates == mates else None
        if step is not None and e.gpu_index in self.gpus:
            if not mates:
                e.solo_step_s = step
            else:
                predicted = e.qt_seconds / progress.total if e.qt_seconds and progress.total > 0 else None
                observed = observed_slowdown(step, e.solo_step_s, predicted)
                if observed is not None:
                    others = [None if m == "none" else m for m in mates]
                    model = self.interference
                    prior = model.slowdown(model.profile_for(e.intensity), [model.profile_for(o) for o in others])
                    self.slowdowns = self.slowdowns.record(self.gpus[e.gpu_index].model, e.intensity, others,
                                                           observed, prior)
        e.mates = mates
        e.progress = progress
        if e.held and not prob.on_probation(e.probation, progress.steps):
            e.held = False
            return True
        return False

    def learned_slowdowns(self) -> dict[str, float]:
        """Every class pair's learned slowdown by calibration key (metrics)."""
        return self.slowdowns.learned(self.interference)

    def learned_slowdown_entries(self) -> list[LearnedSlowdown]:
        """Every class pair's learned slowdown with its prior and samples (the GPUNode status)."""
        return self.slowdowns.entries(self.interference)

    def _learned(self) -> SlowdownFn | None:
        """The share rule's slowdowns: the learned ones on this node's GPU model (its first GPU's: a node has one
        model), None (the model's prior) before any sample."""
        if not self.share_when_pays or not self.slowdowns.table.ratios:
            return None
        return self.slowdowns.slowdown_fn(next(iter(self.gpus.values())).model, self.interference)

    def decide(self, now: float = 0.0) -> list[Decision]:
        """Apply the policy once: move every group it admits from the queue to the running set."""
        if not self.queued:
            return []
        free = []
        # the apart rule reads the running clients' jobs whenever a queued or running entry has peers to keep apart
        apart = any(e.apart for e in self.queued.values()) or any(e.apart for e in self.running.values())
        # ... and the trust-domain rule whenever the queue and the running clients hold domains that may not share
        apart = apart or mixed([e.domain for e in self.queued.values()] + [e.domain for e in self.running.values()])
        for g in self.gpus.values():
            slots = g.max_clients - self.clients(g.index) if g.healthy else 0
            room = g.capacity_bytes - self.committed_bytes(g.index)
            if self.live_memory_check:
                # Second opinion from the driver: admit only into memory that is physically free too (a process
                # outside the gate, or memory a finished job has not given back yet, shrinks it).
                room = min(room, g.total_bytes - g.used_bytes)
            running: tuple[Client, ...] = ()
            if self.spread or self.share_when_pays or apart:  # the load-aware and apart rules read the clients
                running = tuple(Client(e.intensity, self.seconds_left(e, now), e.job, e.apart, e.domain)
                                for e in self.running.values() if e.gpu_index == g.index)
            free.append(GPUFree(g.index, max(0, room), max(0, slots), g.capacity_bytes, running))
        tasks, alone = self._probation_tasks(free)
        result = plan_decision(self.policy, tasks, free, self.bypass_limit, spread=self.spread,
                               share_when_pays=self.share_when_pays, slowdown=self._learned())
        plan: list[Admission] = result.admissions
        for key, count in result.bypassed.items():  # overtaken entries stay queued; keep their counts
            e = self.queued[key]
            e.bypassed = count
            self._tasks[key] = e.task()
        out: list[Decision] = []
        for adm in plan:
            self._groups += 1
            d = Decision(group=f"g{self._groups}", gpu=self.gpus[adm.gpu_index])
            for t in adm.tasks:
                e = self.queued.pop(t.key)
                del self._tasks[t.key]
                e.gpu_index, e.group, e.admitted_at = adm.gpu_index, d.group, now
                e.held = t.key in alone
                self.running[e.key] = e
                d.entries.append(e)
            out.append(d)
        self.check()
        return out

    def _probation_tasks(self, free: list[GPUFree]) -> tuple[list[Task], set[str]]:
        """The queued tasks this decision plans with, and the keys of the probation entries planned alone
        (``gnnsched.attempts.probation.planned_tasks``: at the whole GPU's bytes while a healthy GPU is idle, a
        suspect's always)."""
        waiting = {e.key for e in self.queued.values() if e.probation is not None}
        if not waiting:
            return list(self._tasks.values()), set()
        busy = {e.gpu_index for e in self.running.values()}
        idle = any(self.gpus[f.index].healthy and f.index not in busy for f in free)
        suspects = {e.key for e in self.queued.values() if e.probation_suspect}
        return prob.planned_tasks(self._tasks.values(), waiting, idle, self.whole_gpu_bytes(), suspects)

    def restore(
        self,
        key: str,
        *,
        pod_uid: str,
        bytes: int,
        gpu_uuid: str,
        namespace: str = "",
        name: str = "",
        job: str | None = None,
        group: str | None = None,
        admitted_at: float | None = None,
        qt_seconds: float | None = None,
        intensity: str | None = None,
        exclusive: bool = False,
        apart: frozenset[str] = frozenset(),
        domain: str | None = None,
        probation: int | None = None,
    ) -> Entry:
        """Book a pod that was admitted before an agent restart (a reconnecting client or an annotated pod).
        ``probation``: the step of its undecided fault, from its trusted pod facts; the whole-GPU hold is not booked
        here but by :meth:`rehold_probation` once every client is restored.

        Refused if the key is already booked, the GPU is unknown, or booking it would break the invariant — the books
        never grow past the bound, whatever a client claims.
        """
        if not isinstance(bytes, int) or isinstance(bytes, bool) or bytes <= 0:
            raise Rejected("invalid-bytes", f"admit-bytes must be a positive integer, got {bytes!r}")
        if key in self.running:
            raise Rejected("duplicate", f"{key} is already running at this gate")
        if exclusive:
            bytes = self.whole_gpu_bytes()
        gpu = self.gpu_by_uuid(gpu_uuid)
        if gpu is None:
            raise Rejected("unknown-gpu", f"{gpu_uuid!r} is not a GPU of this node")
        if self.committed_bytes(gpu.index) + bytes > gpu.capacity_bytes or self.clients(gpu.index) >= gpu.max_clients:
            raise Rejected("resume-conflict", f"{key}: {bytes} B does not fit the books of GPU {gpu.index}")
        self.queued.pop(key, None)
        self._tasks.pop(key, None)
        self._seq += 1
        e = Entry(
            key=key, pod_uid=pod_uid, namespace=namespace, name=name, job=job, bytes=bytes, seq=self._seq,
            qt_seconds=qt_seconds, intensity=intensity, gpu_index=gpu.index, group=group, admitted_at=admitted_at,
            exclusive=exclusive, apart=apart, domain=domain, probation=None if exclusive else probation,
        )
        self.running[key] = e
        self.check()
        return e

    def rehold_probation(self) -> list[Entry]:
        """After a restart, once every client is restored: a client on probation that runs alone on its GPU holds
        the whole GPU again, as it did (or, if it shared before and its neighbours have ended, as an attempt admitted
        now onto an idle GPU would), until a progress report shows it past its step (:meth:`report_progress`). The
        hold itself is not persisted: a restored client books its own bytes, so booking in restore order could not
        tell whether a later-restored neighbour shared its GPU. Without this an agent restart dropped every hold,
        and the GPU took others before the client passed the step it had faulted at. Returns the entries re-held."""
        out = []
        whole = self.whole_gpu_bytes()
        for e in self.running.values():
            if e.probation is None or e.held or e.gpu_index is None or self.gpus[e.gpu_index].capacity_bytes < whole:
                continue  # a held client books the largest GPU's bytes, so it holds only a GPU of that size
            if self.clients(e.gpu_index) != 1:
                continue  # it shares its GPU
            if not prob.on_probation(e.probation, e.progress.steps if e.progress is not None else None):
                continue
            e.held = True
            out.append(e)
        self.check()
        return out
