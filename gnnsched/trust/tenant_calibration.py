"""Calibration one namespace cannot move for another: per-namespace tables with a bounded cluster prior.

Why: the calibration loop turns finished attempts into the safety factor (memory) and the runtime factor of every
later job of the same class. With one cluster-wide table per class, the security review (issue 39, finding 4) set
another namespace's memory factor to the 2.0 cap with five forged attempts, or with two forged memory-exceeded lower
bounds against twenty honest samples, and pushed runtime factors to the 10x cap. A tenant's own code decides what its
pods report and even what they really allocate, so no check on a sample can make it honest; only where a sample
counts can be limited.

The rule (the figure: a namespace that records any number of samples moves another namespace's factor by at most
:data:`PRIOR_BAND` - 1 = 5 %):

1. Each namespace's samples go into its own table (class, pool and lower bounds as before:
   :meth:`gnnsched.closed_loop.CalibrationTable.factor`). A namespace whose own samples calibrate a class
   (``min_samples`` of the class or of its pool, or a lower bound no exact ratio resolves) uses them and nothing
   else: no other namespace's sample reaches it.
2. A namespace with too few samples of its own gets the **cluster prior**: the median, over the other namespaces
   whose own samples calibrate the class, of their factors, held within a band around the static factor whose width
   is :data:`PRIOR_BAND`: ``[static, static x 1.05]`` for a memory safety factor (the prior may add margin, never
   remove the static one) and ``[static / sqrt(1.05), static x sqrt(1.05)]`` for a runtime factor (a correction in
   either direction). Without such a namespace the static factor stays, as before.

Whatever other namespaces record, rule 1 leaves a calibrated namespace's factor unchanged and rule 2 keeps an
uncalibrated one inside a band 5 % wide; ``tests/test_tenant_calibration.py`` measures it and
``bench/calibration_isolation.py`` prints the figure. What it costs: a new namespace's first jobs get at most 5 % of
the cluster's experience instead of all of it, until five of its own attempts (or one overrun) have finished.
"""

from __future__ import annotations

import math
import statistics

from pydantic import Field

from gnnsched.closed_loop import (
    CalibrationClass,
    CalibrationFactor,
    CalibrationPolicy,
    CalibrationTable,
    RuntimeCalibrationPolicy,
)

PRIOR_BAND = 1.05
"""The cluster prior's band, as the ratio of its upper to its lower end: the most one namespace's samples can move
another's factor."""


def prior_band(policy: CalibrationPolicy) -> tuple[float, float]:
    """``(low, high)`` of the cluster prior under ``policy``, rounded inwards to the table's 4 decimals so that
    ``high / low`` never exceeds :data:`PRIOR_BAND`."""
    static = policy.static_factor
    if isinstance(policy, RuntimeCalibrationPolicy):
        low, high = static / math.sqrt(PRIOR_BAND), static * math.sqrt(PRIOR_BAND)
    else:
        low, high = static, static * PRIOR_BAND
    low, high = max(low, policy.floor), min(high, policy.cap)
    return math.ceil(low * 1e4) / 1e4, math.floor(high * 1e4) / 1e4


class TenantTable(CalibrationTable):
    """One namespace's calibration table (``ratios``, ``exceeded``: its own samples) and the other namespaces'
    tables its cluster prior is taken from. A drop-in for :class:`CalibrationTable` where a factor is asked for."""

    others: list[CalibrationTable] = Field(default_factory=list)

    def factor(self, cls: CalibrationClass, policy: CalibrationPolicy | None = None) -> CalibrationFactor:
        policy = policy if policy is not None else CalibrationPolicy()
        own = super().factor(cls, policy)
        if own.calibrated:
            return own
        theirs = [f.factor for f in (t.factor(cls, policy) for t in self.others) if f.calibrated]
        if not theirs:
            return own
        low, high = prior_band(policy)
        value = round(min(high, max(low, statistics.median(theirs))), 4)
        return own.model_copy(update={"factor": value, "calibrated": True, "source": "prior",
                                      "pool_samples": len(theirs)})


def tenant_table(tables: dict[str, CalibrationTable], namespace: str) -> TenantTable:
    """The table a job of ``namespace`` is planned with: its own samples, the others' as its prior's source."""
    own = tables.get(namespace, CalibrationTable())
    return TenantTable(ratios=own.ratios, exceeded=own.exceeded,
                       others=[t for ns, t in sorted(tables.items()) if ns != namespace])
