"""Fault classes: whose fault a fatal GPU error is, and who is charged for it. One rule for the node agent, the
operator and the simulator, which all call these pure functions (no copy of the rule lives anywhere else).

Why two classes: a critical Xid either says the GPU failed (double-bit ECC 48, row-remapping failure 63/64, NVLink 74,
fallen off the bus 79, GSP 119/120, ...) or that an application made its own context fault (13, 31, 43, 45, 68, 109).
NVIDIA's device plugin draws the same line (``internal/rm/health.go``, ``ignoredXids``: "Application errors: the GPU
should still be healthy"; any other critical Xid marks the device unhealthy). So:

* A **hardware fault** (a critical Xid that is not an application Xid) makes the GPU unhealthy and charges no job:
  every client on the GPU is requeued, its ``backoffLimit`` untouched (condition ``Requeued``, reason ``GPUFault``).
* An **application fault** (an application Xid, or a client's own fatal error without a hardware Xid) keeps the
  suspect rule: exactly one affected client whose own error is fatal and not ``cudaErrorMpsClientTerminated`` (810)
  is the suspect and is charged; with none or several, nobody can be told apart (on the H100 every client of a fault
  got error 700 and none 810, docs/gpu-measurements.md), so all are requeued uncharged as *undecided*, and a job
  undecided (or suspected) :data:`ALONE_AFTER` times runs its later attempts alone on a GPU, where a fault of its own
  is charged.

Why undecided clients are kept apart (:func:`undecided_peers`, :func:`must_stay_apart`): the clients of one undecided
fault are requeued together, ahead of every other pod, and a gate that groups them again puts the culprit beside the
same neighbours, so its next fault makes every one of them undecided a second time and sends innocent jobs to run
alone (measured in the simulator, docs/simulator.md). Their next attempts must not share a GPU with one another while
they run: the culprit's next fault then happens beside none of them, and only it is undecided twice. The operator
writes each requeued attempt's peers on its pod (``gnnsched.io/fault-peers``), the gate and the simulator refuse a
group or a GPU that would put a job beside one of its peers (``gnnsched.policies``, through :func:`must_stay_apart`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from gnnsched.contract import ANN_FAULT_PEERS, ANN_JOB, MAX_FAULT_PEERS

FaultClass = Literal["hardware", "application"]
Role = Literal["victim", "suspect"]

APPLICATION_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})
"""Xids an application causes by itself: the GPU stays healthy. NVIDIA's device plugin skips exactly these in its
health check (``internal/rm/health.go``: 13 graphics engine exception, 31 GPU memory page fault, 43 GPU stopped
processing, 45 preemptive cleanup, 68 video processor exception, 109 context switch timeout)."""

REASON_GPU_FAULT = "GPUFault"
"""The ``Requeued`` condition's reason (and a fault record's reason) for every client of a hardware fault."""
REASON_COLOCATED = "CoLocatedFault"
"""The ``Requeued`` condition's reason for a victim or an undecided client of an application fault."""
REASON_CLIENT_FAULT = "ClientFault"
REASON_CLIENT_TERMINATED = "MpsClientTerminated"

ALONE_AFTER = 2
"""A job suspected, or undecided, this many times in application faults runs its later attempts alone on a GPU."""
MAX_REQUEUES = 10
"""Uncharged fault requeues a job may take; a fault that would requeue it again is charged to its ``backoffLimit``
instead, so a cluster (or a job) that keeps faulting cannot loop a job forever."""
REASON_REQUEUE_LIMIT = "RequeueLimit"


def fault_class(xid: int | None) -> FaultClass:
    """``hardware`` for an Xid that is not an application Xid; ``application`` for an application Xid or none (a
    client's own fatal error, or MPS reporting a fault, without a hardware Xid)."""
    return "hardware" if xid is not None and xid not in APPLICATION_XIDS else "application"


def counted_class(xid: int | None) -> Literal["hardware", "application", "unknown"]:
    """The class the agent's and the operator's fault metrics count a fault under: its Xid's, or ``unknown`` when no
    Xid reached the agent (a client's own error or MPS told; the charge rule treats such a fault as an
    application's)."""
    return "unknown" if xid is None else fault_class(xid)


def is_hardware_xid(xid: int) -> bool:
    """Whether ``xid`` makes its GPU unhealthy (NVIDIA's device plugin marks it so too)."""
    return fault_class(xid) == "hardware"


@dataclass(frozen=True, slots=True)
class ClientError:
    """How one affected client ended, reduced to what the rule needs: whether it failed at all, and whether its own
    error was a fatal GPU error other than 810 (a client the fault may have started in)."""

    key: str
    failed: bool = True
    own_fault: bool = False
    terminated_810: bool = False


@dataclass(frozen=True, slots=True)
class Charge:
    """One failed client's verdict on one fault: its role, the reason the fault record carries, and whether the fault
    is charged to its job's ``backoffLimit``."""

    role: Role
    reason: str
    charged: bool
    fault_class: FaultClass


def fault_charges(xid: int | None, clients: Sequence[ClientError], label: str) -> dict[str, Charge]:
    """Every failed client's :class:`Charge` for one fault on one GPU (``label``: what told the agent, e.g. ``Xid 79``
    or ``MpsServerFault``, the reason of a victim whose own error says nothing more)."""
    cls = fault_class(xid)
    failed = [c for c in clients if c.failed]
    if cls == "hardware":
        return {c.key: Charge("victim", REASON_GPU_FAULT, False, cls) for c in failed}
    own = [c for c in failed if c.own_fault]
    suspect = own[0].key if len(own) == 1 else None
    out: dict[str, Charge] = {}
    for c in failed:
        if c.key == suspect:
            out[c.key] = Charge("suspect", REASON_CLIENT_FAULT, True, cls)
        else:
            out[c.key] = Charge("victim", REASON_CLIENT_TERMINATED if c.terminated_810 else label, False, cls)
    return out


@dataclass(frozen=True, slots=True)
class FaultStep:
    """What the operator does with one faulted attempt, and the job's counters after it."""

    requeue: bool
    """Requeued uncharged (``Requeued``); False: charged to ``backoffLimit`` (``Retrying`` or ``Failed``)."""
    reason: str
    undecided: int
    suspected: int
    alone: bool
    """Later attempts run alone on a GPU (the counter that reached :data:`ALONE_AFTER` names why)."""
    alone_reason: str | None = None
    apart: frozenset[str] = frozenset()
    """The jobs the next attempt must not share a GPU with while it runs (its peers in an undecided fault, when it is
    requeued undecided and does not run alone); empty otherwise."""


def undecided_peers(clients: Sequence[ClientError], charges: Mapping[str, Charge]) -> dict[str, frozenset[str]]:
    """For one fault's :func:`fault_charges`, every *undecided* client (an application fault's victim whose own error
    was fatal, so it may be the culprit) and the other undecided clients of the same fault: the keys its next attempt
    must be kept apart from. Empty when the fault names a suspect, is a hardware fault, or has fewer than two such
    clients (nobody else could be the culprit)."""
    undecided = [c.key for c in clients if c.failed and c.own_fault and c.key in charges
                 and charges[c.key].role == "victim" and charges[c.key].fault_class == "application"]
    if len(undecided) < 2:
        return {}
    everyone = frozenset(undecided)
    return {key: everyone - {key} for key in undecided}


def must_stay_apart(job: str | None, apart: Collection[str], other_job: str | None,
                    other_apart: Collection[str]) -> bool:
    """Whether two attempts (each its job's identity and the jobs it is kept apart from) may not run on one GPU at
    the same time. Symmetric: either side's list is enough, so an attempt whose own list was lost (a pod recreated
    by hand) is still kept from its peers by theirs."""
    return (other_job is not None and other_job in apart) or (job is not None and job in other_apart)


def format_fault_peers(peers: Collection[str]) -> str:
    """The pod annotation ``gnnsched.io/fault-peers`` for ``peers`` (jobs as ``<namespace>/<name>``), sorted so the
    same peers always read the same."""
    return ",".join(sorted(peers)[:MAX_FAULT_PEERS])


def parse_fault_peers(raw: str | None) -> frozenset[str]:
    """``gnnsched.io/fault-peers`` as a set of ``<namespace>/<name>`` (at most :data:`MAX_FAULT_PEERS`). A malformed
    entry is skipped rather than refused, like the predicted runtime: the list only keeps pods apart and books no
    memory, so a wrong one can cost a wait but never break the gate's bound."""
    if not raw:
        return frozenset()
    out = []
    for part in raw.split(","):
        name = part.strip()
        ns, sep, job = name.partition("/")
        if sep and ns and job and "/" not in job and len(name) <= 317:
            out.append(name)
    return frozenset(out[:MAX_FAULT_PEERS])


def apart_identity(annotations: Mapping[str, object], owner_job: str | None) -> tuple[str | None, frozenset[str]]:
    """A pod's side of the apart rule: its job (``gnnsched.io/job``, else its owner) and its fault peers, believed
    only on a pod a GNNJob owns (``owner_job``, ``<namespace>/<name>``): the operator wrote them there. Any other pod
    has no job and no peers, so nothing keeps it apart and it keeps nothing apart. A value that is not a string
    counts as absent, a malformed entry is skipped (:func:`parse_fault_peers`)."""
    if owner_job is None:
        return None, frozenset()
    job = annotations.get(ANN_JOB, owner_job)
    raw = annotations.get(ANN_FAULT_PEERS)
    return (job if isinstance(job, str) else owner_job), parse_fault_peers(raw if isinstance(raw, str) else None)


def may_requeue(requeues: int) -> bool:
    """Whether a job already requeued ``requeues`` times without charge may be requeued so once more."""
    return requeues < MAX_REQUEUES


def fault_step(charge: Charge, own_fault: bool, undecided: int, suspected: int, requeues: int = 0,
               peers: Collection[str] = ()) -> FaultStep:
    """The operator's step for a faulted attempt with ``charge`` (its own error a fatal fault other than 810 when
    ``own_fault``), given the job's ``undecided`` and ``suspected`` counts and its uncharged ``requeues`` so far.
    A victim past :data:`MAX_REQUEUES` is charged like any failure (``RequeueLimit``), its counters unchanged.
    ``peers``: the other undecided clients' jobs in this fault (:func:`undecided_peers`); an undecided attempt that
    does not run alone next is kept apart from them (``FaultStep.apart``)."""
    if charge.role == "victim" and not may_requeue(requeues):
        return FaultStep(False, REASON_REQUEUE_LIMIT, undecided, suspected, False)
    if charge.fault_class == "hardware":
        return FaultStep(True, REASON_GPU_FAULT, undecided, suspected, False)
    if charge.role == "suspect":
        suspected += 1
        alone = suspected >= ALONE_AFTER
        return FaultStep(False, REASON_CLIENT_FAULT, undecided, suspected, alone,
                         "RepeatSuspect" if alone else None)
    if own_fault:
        undecided += 1
        alone = undecided >= ALONE_AFTER
        return FaultStep(True, REASON_COLOCATED, undecided, suspected, alone, "RepeatFault" if alone else None,
                         frozenset() if alone else frozenset(peers))
    return FaultStep(True, REASON_COLOCATED, undecided, suspected, False)
