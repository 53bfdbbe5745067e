"""Fault classes (``gnnsched.attempts.fault_classes``): the one rule, and the agent, the operator and the simulator
applying it.

The last test is the contract between them: the same recorded fault fed to the node agent's state machine (then the
operator's step on the records it writes) and to the simulator's books must give every client the same charge.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from gnnsched.attempts.fault_classes import (
    ALONE_AFTER,
    APPLICATION_XIDS,
    MAX_REQUEUES,
    REASON_CLIENT_FAULT,
    REASON_CLIENT_TERMINATED,
    REASON_COLOCATED,
    REASON_GPU_FAULT,
    REASON_REQUEUE_LIMIT,
    Charge,
    ClientError,
    fault_charges,
    fault_class,
    fault_step,
    format_fault_peers,
    must_stay_apart,
    parse_fault_peers,
    undecided_peers,
)
from gnnsched.closed_loop import FaultRecord
from gnnsched.contract import ANN_FAULT, ANN_FAULT_PEERS, JOB_CONTAINER_NAME
from gnnsched.gpu.backend import FakeGPUBackend
from gnnsched.node_agent.books import Books, GPUSlot
from gnnsched.node_agent.quarantine import REASON_XID, ClientEnd, Quarantine, is_critical_xid
from gnnsched.operator.resize import attempt_facts, decide
from gnnsched.simulator.faults import NO_ERROR, NO_FAULTS, LoopBooks
from gnnsched.simulator.model import JobProfile, SimJob

HARDWARE_XIDS = (48, 61, 62, 63, 64, 69, 74, 79, 92, 94, 95, 119, 120)
OWN_700 = "RuntimeError: CUDA error: an illegal memory access was encountered"
TERMINATED_810 = "RuntimeError: CUDA error: cudaErrorMpsClientTerminated"


def test_application_xids_are_nvidias_device_plugin_list() -> None:
    # NVIDIA/k8s-device-plugin internal/rm/health.go, ignoredXids ("Application errors: the GPU should still be
    # healthy"); the backend that marks GPUs unhealthy uses the same set
    assert {13, 31, 43, 45, 68, 109} == APPLICATION_XIDS
    for xid in APPLICATION_XIDS:
        assert fault_class(xid) == "application"
    for xid in HARDWARE_XIDS:
        assert fault_class(xid) == "hardware" and is_critical_xid(xid)
    assert fault_class(None) == "application"  # a client's own fatal error without an Xid


@pytest.mark.parametrize("xid", HARDWARE_XIDS)
def test_a_hardware_fault_charges_nobody(xid: int) -> None:
    clients = [ClientError("a", own_fault=True), ClientError("b", terminated_810=True), ClientError("c"),
               ClientError("d", failed=False)]
    charges = fault_charges(xid, clients, f"Xid {xid}")
    assert set(charges) == {"a", "b", "c"}  # a client that did not fail has nothing to be charged for
    for c in charges.values():
        assert (c.role, c.reason, c.charged, c.fault_class) == ("victim", REASON_GPU_FAULT, False, "hardware")
        step = fault_step(c, own_fault=True, undecided=5, suspected=5)
        assert step.requeue and step.reason == REASON_GPU_FAULT and not step.alone
        assert (step.undecided, step.suspected) == (5, 5)  # no counter moves


def test_application_fault_suspect_rule() -> None:
    # one client with its own fatal error: it is the suspect, the 810 one a victim
    one = fault_charges(13, [ClientError("a", own_fault=True), ClientError("b", terminated_810=True)], "Xid 13")
    assert (one["a"].role, one["a"].reason, one["a"].charged) == ("suspect", REASON_CLIENT_FAULT, True)
    assert (one["b"].role, one["b"].reason, one["b"].charged) == ("victim", REASON_CLIENT_TERMINATED, False)
    # several with their own error (the H100: every client got 700): nobody can be told apart
    several = fault_charges(31, [ClientError("a", own_fault=True), ClientError("b", own_fault=True)], "Xid 31")
    assert all(c.role == "victim" and not c.charged and c.reason == "Xid 31" for c in several.values())
    # no Xid at all, one client's own error: an application fault, charged
    alone = fault_charges(None, [ClientError("a", own_fault=True)], "ClientFault")
    assert alone["a"].charged and alone["a"].fault_class == "application"


def test_repeated_undecided_or_suspected_faults_run_alone() -> None:
    undecided = fault_charges(43, [ClientError("a", own_fault=True), ClientError("b", own_fault=True)], "Xid 43")["a"]
    u = s = 0
    for n in range(1, ALONE_AFTER + 1):
        step = fault_step(undecided, own_fault=True, undecided=u, suspected=s)
        u, s = step.undecided, step.suspected
        assert step.requeue and step.reason == REASON_COLOCATED and u == n
        assert step.alone == (n >= ALONE_AFTER) and step.alone_reason == ("RepeatFault" if n >= ALONE_AFTER else None)
    # a victim whose own error is 810 is not undecided: it never has to run alone
    victim = fault_step(undecided, own_fault=False, undecided=0, suspected=0)
    assert victim.requeue and victim.undecided == 0 and not victim.alone
    suspect = fault_charges(13, [ClientError("a", own_fault=True)], "Xid 13")["a"]
    first, second = fault_step(suspect, True, 0, 0), fault_step(suspect, True, 0, 1)
    assert not first.requeue and first.suspected == 1 and not first.alone
    assert second.alone and second.alone_reason == "RepeatSuspect"


def test_the_fake_backend_marks_the_gpu_unhealthy_for_hardware_xids_only() -> None:
    backend = FakeGPUBackend(2, 32 * 2**30)
    backend.inject_xid(0, 13, "application")
    assert backend.devices()[0].healthy
    backend.inject_xid(1, 79, "fallen off the bus")
    assert not backend.devices()[1].healthy and "Xid 79" in backend.devices()[1].health_reason


# ---------------------------------------------------------------------------------- the agent's state machine


def _agent_records(xid: int | None, ends: dict[str, ClientEnd], jobs: dict[str, str] | None = None
                   ) -> dict[str, FaultRecord]:
    q = Quarantine()
    q.trigger("GPU-0", REASON_XID if xid is not None else "MpsServerFault", 0.0,
              [(k, "ns", k) for k in ends], xid=xid, jobs=jobs)
    for key, end in ends.items():
        q.client_ended("GPU-0", key, end)
    return {a.key: r for a, r in q.decide_roles("GPU-0", datetime(2026, 1, 1, tzinfo=timezone.utc))}


def test_agent_hardware_xid_requeues_a_lone_client_with_its_own_error() -> None:
    """Issue 27's second cause: a lone client whose own error is fatal was charged for Xid 79. It is not now."""
    records = _agent_records(79, {"a": ClientEnd(1, OWN_700)})
    assert records["a"].role == "victim" and records["a"].reason == REASON_GPU_FAULT
    assert records["a"].fault_class == "hardware" and records["a"].xid == 79
    records = _agent_records(13, {"a": ClientEnd(1, OWN_700)})
    assert records["a"].role == "suspect" and records["a"].fault_class == "application"


def test_operator_requeues_a_hardware_fault_as_gpufault() -> None:
    record = FaultRecord(gpu="GPU-0", role="victim", reason=REASON_GPU_FAULT, at=datetime.now(timezone.utc),
                         xid=79, fault_class="hardware")
    facts = attempt_facts(_pod(record, OWN_700))
    decision = decide(facts, admit_bytes=2**30, resizes=0, max_resizes=3, requeues=0, largest_gpu_bytes=2**35)
    assert decision.kind == "requeue" and "hardware fault" in decision.message
    assert fault_step(facts.fault.charge(), True, 0, 0).reason == REASON_GPU_FAULT  # type: ignore[union-attr]
    # an older agent's record without the class is classified from its Xid
    old = FaultRecord.model_validate({"gpu": "GPU-0", "role": "victim", "reason": "Xid 79",
                                      "at": "2026-01-01T00:00:00Z", "xid": 79})
    assert old.klass() == "hardware" and old.charge().fault_class == "hardware"


# ---------------------------------------------------------------------------------- agent == simulator


def _pod(record: FaultRecord, message: str) -> dict:
    return {"metadata": {"annotations": {ANN_FAULT: record.model_dump_json()}},
            "status": {"containerStatuses": [{"name": JOB_CONTAINER_NAME, "state": {"terminated": {
                "exitCode": 1, "message": message, "finishedAt": "2026-01-01T00:00:00Z"}}}]}}


def _job(i: int) -> SimJob:
    prof = JobProfile(peak_bytes=2**30, admit_bytes=2**30, solo_s=100.0, predicted_s=100.0, sm_util=0.3,
                      mem_util=0.3)
    return SimJob(id=i, name=f"j{i}", arrival=0.0, mode="train", cpu_milli=1000, memory_bytes=2**30,
                  profiles={"V100-32GB": prof})


@pytest.mark.parametrize("xid", sorted(APPLICATION_XIDS) + list(HARDWARE_XIDS))
@pytest.mark.parametrize("clients", [1, 2, 3])
def test_simulator_and_agent_agree_on_every_charge(xid: int, clients: int) -> None:
    """The same fault, three times over the same clients (each attempt's own error 700, as the H100 measured, which is
    what the simulator models): the agent's records, judged by the operator's step, and the simulator's books give
    every client the same role, the same charge and the same alone decision, fault after fault."""
    jobs = [_job(i) for i in range(clients)]
    books = LoopBooks(error=NO_ERROR, fault_model=NO_FAULTS, seed=0, mode="gnnsched", largest_bytes=2**35,
                      capacity={"V100-32GB": 2**35})
    counters = {j.id: (0, 0) for j in jobs}  # the operator's undecidedFaults, suspected per job
    for _ in range(3):
        records = _agent_records(xid, {str(j.id): ClientEnd(1, OWN_700) for j in jobs})
        sim = books.fault_charges(xid, jobs, culprit=None if fault_class(xid) == "hardware" else jobs[0].id)
        for job in jobs:
            facts = attempt_facts(_pod(records[str(job.id)], OWN_700))
            assert facts.fault is not None
            decision = decide(facts, admit_bytes=2**30, resizes=0, max_resizes=3, requeues=0,
                              largest_gpu_bytes=2**35)
            op = fault_step(facts.fault.charge(), facts.outcome == "fault" and not facts.victim_of_810,
                            *counters[job.id])
            counters[job.id] = (op.undecided, op.suspected)
            ours = books.step(job, sim[job.id])
            assert sim[job.id].role == facts.fault.role and sim[job.id].fault_class == facts.fault.klass()
            assert (decision.kind == "requeue") == op.requeue == ours.requeue == (not sim[job.id].charged)
            assert (op.reason, op.undecided, op.suspected, op.alone) == \
                (ours.reason, ours.undecided, ours.suspected, ours.alone)


@pytest.mark.parametrize("xid", [79, 43])
def test_the_requeue_cap_is_the_same_in_the_operator_and_the_simulator(xid: int) -> None:
    """A job requeued uncharged MAX_REQUEUES times (by hardware faults, or undecided application faults with a
    neighbour) is charged at the next one, by ``may_requeue`` in the operator's decide and in the simulator's step."""
    jobs = [_job(0), _job(1)]
    books = LoopBooks(error=NO_ERROR, fault_model=NO_FAULTS, seed=0, mode="gnnsched", largest_bytes=2**35,
                      capacity={"V100-32GB": 2**35})
    requeues, undecided, suspected = 0, 0, 0
    verdicts = []
    for _ in range(MAX_REQUEUES + 2):
        record = _agent_records(xid, {str(j.id): ClientEnd(1, OWN_700) for j in jobs})["0"]
        facts = attempt_facts(_pod(record, OWN_700))
        assert facts.fault is not None
        decision = decide(facts, admit_bytes=2**30, resizes=0, max_resizes=3, requeues=requeues,
                          largest_gpu_bytes=2**35)
        op = fault_step(facts.fault.charge(), True, undecided, suspected, requeues)
        ours = books.step(jobs[0], books.fault_charges(xid, jobs, culprit=None)[0])
        assert (decision.kind == "requeue") == op.requeue == ours.requeue
        assert (op.reason, op.undecided, op.suspected) == (ours.reason, ours.undecided, ours.suspected)
        requeues += op.requeue
        undecided, suspected = op.undecided, op.suspected
        verdicts.append(op.reason)
    first = REASON_GPU_FAULT if xid == 79 else REASON_COLOCATED
    assert verdicts == [first] * MAX_REQUEUES + [REASON_REQUEUE_LIMIT] * 2
    assert books.requeues[0] == MAX_REQUEUES


def test_an_application_fault_with_an_810_neighbour_agrees_too() -> None:
    """Where a neighbour does report 810 (older drivers), the agent names the one with its own error the suspect;
    the core rule the simulator calls says the same on the same client errors."""
    records = _agent_records(13, {"a": ClientEnd(1, OWN_700), "b": ClientEnd(1, TERMINATED_810)})
    core = fault_charges(13, [ClientError("a", own_fault=True), ClientError("b", terminated_810=True)], "Xid 13")
    assert {k: (r.role, r.reason) for k, r in records.items()} == {k: (c.role, c.reason) for k, c in core.items()}
    assert json.loads(records["a"].model_dump_json())["fault_class"] == "application"


# ---------------------------------------------------------------------------------- undecided peers kept apart


def test_undecided_peers_are_the_other_clients_whose_own_error_was_fatal() -> None:
    own = [ClientError("a", own_fault=True), ClientError("b", own_fault=True), ClientError("c", own_fault=True),
           ClientError("d", terminated_810=True), ClientError("e", failed=False, own_fault=True)]
    peers = undecided_peers(own, fault_charges(43, own, "Xid 43"))
    # d reported 810 (a plain victim, never the culprit) and e did not fail: neither is anyone's peer
    assert peers == {"a": frozenset("bc"), "b": frozenset("ac"), "c": frozenset("ab")}
    lone = [ClientError("a", own_fault=True), ClientError("b", terminated_810=True)]
    assert undecided_peers(lone, fault_charges(43, lone, "Xid 43")) == {}  # a is the suspect: nothing undecided
    assert undecided_peers(own, fault_charges(79, own, "Xid 79")) == {}  # a hardware fault is nobody's


def test_fault_step_keeps_an_undecided_attempt_apart_unless_it_runs_alone() -> None:
    undecided = Charge("victim", REASON_COLOCATED, False, "application")
    first = fault_step(undecided, True, 0, 0, peers={"ns/b"})
    assert first.requeue and first.undecided == 1 and not first.alone and first.apart == {"ns/b"}
    second = fault_step(undecided, True, ALONE_AFTER - 1, 0, peers={"ns/b"})
    assert second.alone and second.apart == frozenset()  # alone on a GPU: nobody to keep apart
    assert fault_step(undecided, False, 0, 0, peers={"ns/b"}).apart == frozenset()  # an 810 victim is no culprit
    hardware = Charge("victim", REASON_GPU_FAULT, False, "hardware")
    assert fault_step(hardware, True, 0, 0, peers={"ns/b"}).apart == frozenset()


def test_must_stay_apart_is_symmetric_and_the_annotation_round_trips() -> None:
    assert must_stay_apart("ns/a", {"ns/b"}, "ns/b", ())
    assert must_stay_apart("ns/b", (), "ns/a", {"ns/b"})  # either side's list is enough
    assert not must_stay_apart("ns/a", {"ns/b"}, "ns/c", {"ns/d"})
    assert not must_stay_apart(None, (), None, ())
    text = format_fault_peers({"ns/c", "other/b"})
    assert text == "ns/c,other/b" and parse_fault_peers(text) == {"ns/c", "other/b"}
    assert parse_fault_peers(" ns/a , bad, /x, y/, a/b/c,ns/z") == {"ns/a", "ns/z"}  # malformed entries skipped
    assert parse_fault_peers(None) == frozenset() and parse_fault_peers("") == frozenset()


def _gate(gpus: int) -> Books:
    return Books([GPUSlot(index=i, uuid=f"GPU-{i}", model="V100-32GB", total_bytes=2**34, reserve_bytes=0,
                          max_clients=8)
                  for i in range(gpus)], "lmcf")


@pytest.mark.parametrize("xid", [13, 43, None])
@pytest.mark.parametrize("clients", [2, 3, 4])
def test_simulator_and_agent_keep_the_same_peers_apart(xid: int | None, clients: int) -> None:
    """The same recorded faults fed to both sides: the agent's records (their peers) judged by the operator's step,
    written on the next pod and read back by the gate, and the simulator's books, keep every undecided job apart from
    the same jobs; the gate then puts no two of them on one GPU. Then the culprit (job 0) faults again beside a new
    job: only it and the newcomer are undecided, and only the newcomer is kept apart (the culprit runs alone)."""
    jobs = [_job(i) for i in range(clients + 1)]
    name = {j.id: f"ns/j{j.id}" for j in jobs}
    books = LoopBooks(error=NO_ERROR, fault_model=NO_FAULTS, seed=0, mode="gnnsched", largest_bytes=2**35,
                      capacity={"V100-32GB": 2**35})
    counters = {j.id: (0, 0) for j in jobs}
    for faulted in (jobs[:clients], [jobs[0], jobs[clients]]):
        records = _agent_records(xid, {str(j.id): ClientEnd(1, OWN_700) for j in faulted},
                                 {str(j.id): name[j.id] for j in faulted})
        charges = books.fault_charges(xid if xid is not None else 13, faulted, culprit=jobs[0].id)
        peers = books.fault_peers(faulted, charges)
        gate = _gate(clients)
        for job in faulted:
            record = records[str(job.id)]
            op = fault_step(record.charge(), True, *counters[job.id], peers=record.peers)
            counters[job.id] = (op.undecided, op.suspected)
            ours = books.step(job, charges[job.id], peers[job.id])
            sim_apart = {name[int(k)] for k in books.apart.get(job.id, frozenset())}
            assert set(op.apart) == sim_apart, job.id
            annotation = {ANN_FAULT_PEERS: format_fault_peers(op.apart)} if op.apart else {}
            assert parse_fault_peers(annotation.get(ANN_FAULT_PEERS)) == op.apart
            assert op.alone == ours.alone
            if not op.alone:
                gate.enqueue(str(job.id), pod_uid=str(job.id), bytes=2**30, job=name[job.id], apart=op.apart)
        decisions = gate.decide()
        assert sum(len(d.entries) for d in decisions) == len(gate.running)  # one GPU each: nobody waits
        for d in decisions:
            for i, x in enumerate(d.entries):
                assert not any(must_stay_apart(x.job, x.apart, y.job, y.apart) for y in d.entries[i + 1:])
    # the second fault: the culprit, undecided twice, runs alone; the first fault's innocents were undecided once, and
    # the newcomer is kept apart from the culprit only
    assert books.alone == {0} and 0 not in books.apart
    assert all(counters[j.id][0] == 1 for j in jobs[1:])
    assert books.apart[jobs[clients].id] == {"0"}
