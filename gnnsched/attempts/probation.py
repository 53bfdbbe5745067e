"""Probation: an undecided fault's clients run alone until they pass the step they faulted at.

Why: when an MPS fault kills several clients that each report a fatal error of their own (on the H100 every client
got 700, docs/gpu-measurements.md), nobody can be told apart, and all are requeued uncharged (``Undecided``). Before
probation their next attempts were only kept apart from one another: the culprit's next attempt then shared a GPU
with new neighbours, faulted there at the same step (a bug is deterministic), killed them too, was undecided a second
time, ran alone, and only its third fault, alone, failed it (``RepeatedFault``). In the simulator that cost 13 of the
60 cognn-mix cells their 1.1x target against a rule that names the culprit at its first fault (docs/simulator.md).

A client that passes the step it faulted at is not that fault's culprit; one that faults there again, alone, is, and
its own fault at a step where it already faulted fails it (``gnnsched.attempts.failure_policy``). So an undecided
attempt with a known step (``probation_step``) is admitted **alone** and books the whole GPU until its progress
reports pass that step (:func:`on_probation`); then its booking drops to its own bytes and its GPU takes others. Its
MPS memory limit is its own bytes all along, so the memory bound holds when others join it.

Running alone costs a GPU of its own, and waiting for one can cost more than the fault it avoids: a GPU of long jobs
empties in minutes, and the innocent clients of the fault wait as long as the culprit. So the gate admits an
undecided probation attempt alone only while a GPU is idle (:func:`choice`); otherwise it shares under the apart rule,
as before probation, and its booking is its own bytes. Waiting up to 5, 10 or 20 s for a GPU predicted idle soon was
measured and is no better (docs/simulator.md, "Probation"). Its next attempts are created in the job's own priority
class, not the retry class: ahead of the queue they took the idle GPUs first, and the queue behind them waited.

A *suspect* (the one client whose own error was fatal, which on these drivers means it faulted alone) is on probation
at its fault's step too, and that probation always runs alone (``suspect``): its fault is certainly its own, so a
shared retry would kill its new neighbours at the same step, while only the suspect waits for a GPU of its own. It
is planned at the whole GPU's bytes whether or not a GPU is idle, so it waits like any task too large for the room
left, and the gate's bounded bypass keeps that wait finite (the queue stops overtaking it and a GPU drains for it).
Before, a suspect's retry shared like any attempt; measured in docs/simulator.md ("Probation of a suspect").

One rule for the node agent's gate (``node_agent.books``), the operator (which writes the step) and the simulator.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import replace
from typing import Literal

from gnnsched.policies import Task

Choice = Literal["alone", "share"]


def probation_step(own_fault: bool, step: int | None, sent_alone: bool, current: int | None) -> int | None:
    """The job's probation step after a failed attempt that reached ``step`` (its result line's): a ``current`` one
    the attempt passed is over; an attempt whose own fatal error took part in the fault (``own_fault``: undecided,
    requeued apart from its fault's peers, or the fault's suspect, retried) starts one at ``step`` (the larger of the
    two, if one is still on), unless its later attempts run alone anyway (``sent_alone``) or the step is unknown (a
    container that reports none). The operator and the simulator's books both call this."""
    if passed(current, step):
        current = None
    if not own_fault or step is None or sent_alone:
        return current
    return step if current is None else max(current, step)


def after_fault(own_fault: bool, step: int | None, sent_alone: bool, current: int | None, current_suspect: bool,
                suspect: bool) -> tuple[int | None, bool]:
    """The job's probation after a failed attempt: its step (:func:`probation_step`) and whether it is a suspect's.
    The fault that sets the step (``own_fault`` and the step is its own) decides the kind, ``suspect`` when it was
    the attempt's own fault as the suspect; an earlier probation that still stands keeps its kind
    (``current_suspect``); no probation, no kind. The operator's status and the simulator's books both call this."""
    wanted = probation_step(own_fault, step, sent_alone, current)
    if wanted is None:
        return None, False
    return wanted, suspect if own_fault and wanted == step else current_suspect


def on_probation(probation: int | None, reported_steps: int | None) -> bool:
    """Whether an attempt with probation step ``probation`` still runs alone: until a progress report counts more
    steps than that (the steps include the ones its checkpoint held). No report yet: still on probation."""
    return probation is not None and (reported_steps is None or reported_steps <= probation)


def passed(probation: int | None, steps: int | None) -> bool:
    """Whether an attempt that reached ``steps`` (its result line's) passed its probation step: the operator then
    clears the job's probation step."""
    return probation is not None and steps is not None and steps > probation


def choice(idle_gpu: bool, suspect: bool = False) -> Choice:
    """Where a queued probation attempt goes now: ``alone`` (booking the whole GPU) while a healthy GPU is idle, or
    always for a ``suspect``'s (it waits for a GPU of its own); else ``share`` (its own bytes, the apart rule)."""
    return "alone" if idle_gpu or suspect else "share"


def planned_tasks(tasks: Iterable[Task], on_probation: Collection[str], idle_gpu: bool, whole_bytes: int,
                  suspects: Collection[str] = ()) -> tuple[list[Task], set[str]]:
    """A gate decision's tasks under probation (:func:`choice`): each task whose key is ``on_probation`` and goes
    ``alone`` (a healthy GPU is idle, ``idle_gpu``, or its key is among ``suspects``) is planned at ``whole_bytes``
    (the whole GPU), so it runs alone and nothing joins it; the others keep their own bytes. Returns the tasks and
    the keys planned alone. One rule for the node agent's ``Books`` and the simulator's gate."""
    planned = list(tasks)
    alone = {t.key for t in planned if t.key in on_probation and choice(idle_gpu, t.key in suspects) == "alone"}
    if not alone:
        return planned, set()
    return [replace(t, bytes=whole_bytes) if t.key in alone else t for t in planned], alone
