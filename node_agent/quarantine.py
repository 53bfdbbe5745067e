"""MPS's fault domain on one node: which GPU is draining after a fatal fault, and who was its suspect.

Why: under MPS a fatal GPU exception in one client reaches every client sharing that GPU. NVIDIA's MPS documentation
("Fault Tolerance" / error containment): the server does not say which client caused it, terminates the others with
``cudaErrorMpsClientTerminated`` (810), waits for all affected clients to exit and refuses new clients on that GPU
meanwhile. So the agent must (1) admit nothing there until every client has exited and MPS answers its probe again,
and (2) tell the operator which pods were victims (requeued without using their ``backoffLimit``) and which one is
the suspect (charged normally).

A pure state machine, no I/O and no clock (the agent passes times in): the agent feeds it triggers (a critical Xid
from NVML, a client that died with 810 or another fatal error, the MPS server reporting a fault) and each affected
client's end; it answers with the fault records to write and whether a GPU may be released.

Who is the suspect: among the affected clients that failed, those whose own error is a fatal GPU error other than 810.
When exactly one such client exists it is the suspect and the rest are victims; when none or several do, they cannot
be told apart and every affected client is a victim (charging an innocent job is worse than not charging a guilty
one: a job suspected twice runs alone, which the operator decides from the records).

Restart safety: the draining GPUs (reason, Xid, since) are part of the agent's GPUNode status and of the node status
file (``gpus[].draining``). A new agent reads the file it wrote last and keeps those GPUs draining; the clients still
booked there (adopted from their pods' annotations, or reconnecting) are the affected ones it still waits for. Roles
already written to pods are annotations and survive by themselves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Literal

from gnnsched.attempts.fault_classes import ClientError, fault_charges, is_hardware_xid, undecided_peers
from gnnsched.closed_loop import (
    CRITICAL_XIDS,
    FaultRecord,
    classify_log,
    is_mps_victim_text,
)

Role = Literal["victim", "suspect"]

REASON_XID = "Xid"
REASON_SERVER_FAULT = "MpsServerFault"
ENDS_WAIT_S = 60.0
"""The longest a drain waits, after it began, for its clients' ends (their pods' container status) before it ends
without them: the agent gives up on one end after ``end_wait`` (30 s by default) and records it as unknown, so this
only bounds a client whose end is never followed (one without a pod name)."""
XID_GRACE_S = 5.0
"""How long the roles of a fault that no Xid has named yet wait for one. A client's error (its exit, read from its
pod) and the driver's Xid (NVML's event stream, polled once a second) reach the agent by different paths in either
order; roles decided before the Xid would be decided as an application fault's (no Xid), which charges a lone client
of a hardware fault and writes a record without its Xid (seen in ``tests/e2e/test_fault_e2e.py``). Past this wait the
roles are decided without one: MPS can report a fault that no Xid names."""


def is_critical_xid(xid: int) -> bool:
    """An Xid after which the GPU's MPS clients cannot be trusted: one of ``gnnsched.closed_loop.CRITICAL_XIDS``, or
    any hardware Xid (``gnnsched.attempts.fault_classes``: every Xid that is not an application's makes the GPU
    unhealthy)."""
    return xid in CRITICAL_XIDS or is_hardware_xid(xid)


@dataclass(slots=True)
class ClientEnd:
    """How one affected client ended, as its pod's container status tells (exit code and termination message, which
    holds the log tail under ``FallbackToLogsOnError``). ``None`` message: nothing could be read."""

    exit_code: int | None
    message: str | None

    @property
    def failed(self) -> bool:
        return self.exit_code is not None and self.exit_code != 0

    @property
    def victim_of_810(self) -> bool:
        return bool(self.message) and is_mps_victim_text(self.message or "")

    @property
    def own_fault(self) -> bool:
        """Failed with a fatal GPU error that is not 810: a client the fault started in, if it is the only one."""
        return self.failed and not self.victim_of_810 and classify_log(self.message or "") == "fault"


@dataclass(slots=True)
class Affected:
    key: str
    namespace: str
    name: str
    end: ClientEnd | None = None  # None while it runs (or until its pod shows how it ended)
    gone: bool = False  # its gate connection ended (the process exited)
    job: str | None = None  # its GNNJob (``<namespace>/<name>``), what an undecided record's peers name


@dataclass(slots=True)
class Drain:
    """One draining GPU."""

    uuid: str
    reason: str
    since: float
    xid: int | None = None
    affected: dict[str, Affected] = field(default_factory=dict)
    recorded: bool = False  # the roles have been decided and handed out

    def label(self) -> str:
        return f"{self.reason} {self.xid}" if self.reason == REASON_XID and self.xid is not None else self.reason


class Quarantine:
    """Every draining GPU of one node."""

    def __init__(self) -> None:
        self.drains: dict[str, Drain] = {}

    def draining(self, uuid: str) -> bool:
        return uuid in self.drains

    def trigger(self, uuid: str, reason: str, now: float, clients: list[tuple[str, str, str]],
                xid: int | None = None, jobs: dict[str, str] | None = None) -> Drain | None:
        """Mark ``uuid`` draining; ``clients`` are ``(key, namespace, name)`` of the gated clients that ran there at the
        fault (running now, or exited moments ago). Returns the new drain, or ``None`` when it was already draining
        (then the clients are added to the affected set: they share the same fault). The driver's Xid is the cause
        of its clients' error 810, and either can reach the agent first: a drain started by a client's 810 takes the
        Xid that arrives during it, so the fault records name the Xid whatever the order. ``jobs``: client key ->
        its GNNJob, for the peers of an undecided fault's records."""
        jobs = jobs or {}
        existing = self.drains.get(uuid)
        if existing is not None:
            for key, ns, name in clients:
                existing.affected.setdefault(key, Affected(key, ns, name, job=jobs.get(key)))
            if xid is not None and existing.xid is None:
                existing.xid, existing.reason = xid, reason
            return None
        drain = Drain(uuid=uuid, reason=reason, since=now, xid=xid,
                      affected={key: Affected(key, ns, name, job=jobs.get(key)) for key, ns, name in clients})
        self.drains[uuid] = drain
        return drain

    def restore(self, uuid: str, reason: str, since: float, xid: int | None,
                clients: list[tuple[str, str, str]]) -> Drain:
        """After an agent restart: a GPU the last agent left draining, waiting for the clients still booked there."""
        drain = Drain(uuid=uuid, reason=reason, since=since, xid=xid,
                      affected={key: Affected(key, ns, name) for key, ns, name in clients})
        self.drains[uuid] = drain
        return drain

    def client_gone(self, uuid: str, key: str) -> None:
        drain = self.drains.get(uuid)
        if drain is not None and key in drain.affected:
            drain.affected[key].gone = True

    def client_ended(self, uuid: str, key: str, end: ClientEnd) -> None:
        drain = self.drains.get(uuid)
        if drain is not None and key in drain.affected:
            drain.affected[key].end = end
            drain.affected[key].gone = True

    def pending(self, uuid: str) -> list[Affected]:
        """Affected clients whose end is not known yet (the roles wait for them)."""
        drain = self.drains.get(uuid)
        return [a for a in drain.affected.values() if a.end is None] if drain is not None else []

    def decide_roles(self, uuid: str, at: datetime | None = None, now: float | None = None
                     ) -> list[tuple[Affected, FaultRecord]]:
        """The fault records for every affected client that failed, once all of them have ended (each end known, or
        given up on by the caller with ``ClientEnd(None, None)``) and, when ``now`` is given (the agent's clock, as
        ``since``), once the Xid is known or :data:`XID_GRACE_S` has passed without one (:meth:`xid_wait_left`).
        Decided once per drain; ``[]`` otherwise."""
        drain = self.drains.get(uuid)
        if drain is None or drain.recorded or any(a.end is None for a in drain.affected.values()):
            return []
        if now is not None and (self.xid_wait_left(uuid, now) or 0.0) > 0:
            return []
        drain.recorded = True
        stamp = at or datetime.now(tz=timezone.utc)
        failed = [a for a in drain.affected.values() if a.end is not None and (a.end.failed or a.end.exit_code is None)]
        errors = [ClientError(a.key, own_fault=bool(a.end and a.end.own_fault),
                              terminated_810=bool(a.end and a.end.victim_of_810)) for a in failed]
        charges = fault_charges(drain.xid, errors, drain.label())
        peers = undecided_peers(errors, charges)
        job_of = {a.key: a.job for a in failed}
        return [(a, FaultRecord(gpu=uuid, role=charges[a.key].role, reason=charges[a.key].reason, at=stamp,
                                xid=drain.xid, fault_class=charges[a.key].fault_class,
                                peers=sorted({j for k in peers.get(a.key, ()) if (j := job_of[k]) is not None}
                                             - {a.job}))) for a in failed]

    def xid_wait_left(self, uuid: str, now: float) -> float | None:
        """Seconds the roles of ``uuid``'s drain still wait for an Xid (0 when the wait is over); None when they do
        not wait for one (the Xid is known, the roles are decided, or nothing drains)."""
        drain = self.drains.get(uuid)
        if drain is None or drain.recorded or drain.xid is not None:
            return None
        return max(0.0, drain.since + XID_GRACE_S - now)

    def may_release(self, uuid: str, clients_on_gpu: int, mps_answers: bool, now: float | None = None) -> bool:
        """Whether the drain of ``uuid`` can end: no client left on the GPU (neither booked by the gate nor seen by
        the driver), every affected client's end handled, and the MPS control daemon answering its probe; with
        ``now``, also not while its roles still wait for an Xid (the records would be lost with the drain)."""
        drain = self.drains.get(uuid)
        if drain is None:
            return False
        if now is not None and not drain.recorded and (self.xid_wait_left(uuid, now) or 0.0) > 0:
            return False
        all_gone = all(a.gone for a in drain.affected.values())
        if now is not None and not drain.recorded and now - drain.since < ENDS_WAIT_S and any(
                a.end is None for a in drain.affected.values()):
            # A client's process is gone but its pod has not said how it ended yet: its role is decided with this
            # drain, so the drain waits for it. Released first, the client's end arrived after and started a
            # second fault with no client (this one's clients are dropped from the recent exits at the release),
            # and its record was never written: the operator charged a culprit's first fault on a loaded machine.
            return False
        return clients_on_gpu == 0 and all_gone and mps_answers

    def release(self, uuid: str) -> Drain | None:
        return self.drains.pop(uuid, None)
