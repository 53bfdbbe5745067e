"""How far one namespace's forged calibration samples move another namespace's factor (issue 39, finding 4).

Prints, for the memory safety factor and the runtime factor, the largest relative move of a victim namespace's factor
when a forging namespace records 5, 50 or 500 samples (exact ratios at the cap, memory-exceeded lower bounds far above
it, or ratios at the floor), for a victim with no samples of its own, with too few, and with twenty honest ones,
beside a third honest namespace. The rule (``gnnsched.trust.tenant_calibration``) promises at most 5 %.

    PYTHONPATH=. python bench/calibration_isolation.py
"""

from __future__ import annotations

import sys

from gnnsched.closed_loop import (
    DEFAULT_CALIBRATION,
    DEFAULT_RUNTIME_CALIBRATION,
    CalibrationClass,
    CalibrationPolicy,
    CalibrationTable,
)
from gnnsched.trust.tenant_calibration import PRIOR_BAND, tenant_table

CLS = CalibrationClass(gpu_model="A100-40GB", arch="gcn", mode="train")
POOLMATE = CalibrationClass(gpu_model="A100-40GB", arch="gat", mode="train")  # same pool, another architecture


def _table(ratios: list[float], exceeded: list[float], policy: CalibrationPolicy,
           cls: CalibrationClass = CLS) -> CalibrationTable:
    t = CalibrationTable()
    for r in ratios:
        t = t.record(cls, r, policy)
    for r in exceeded:
        t = t.record(cls, r, policy, exceeded=True)
    return t


def worst_move(policy: CalibrationPolicy) -> tuple[float, list[str]]:
    """The largest relative move of the victim's factor over every forging pattern, and one line per case."""
    honest = [1.02, 1.05, 1.08, 1.1, 1.04, 1.07, 1.03, 1.06]
    victims: dict[str, tuple[list[float], list[float]]] = {"no samples": ([], []), "3 samples": (honest[:3], []),
               "20 samples": ((honest * 3)[:20], []), "pool-mate only": ([], [])}
    forgeries = {
        "at the cap": lambda n: ([policy.cap * 5] * n, []),
        "exceeded bounds": lambda n: ([], [policy.cap * 50] * n),
        "mixed": lambda n: ([policy.cap * 5] * (n // 2), [policy.cap * 50] * (n - n // 2)),
        "at the floor": lambda n: ([policy.floor / 5] * n, []),
    }
    worst = 0.0
    lines = []
    third = _table(honest, [], policy)  # an honest bystander namespace
    for vname, (vr, ve) in victims.items():
        vt = _table(vr, ve, policy) if vname != "pool-mate only" else _table(honest, [], policy, POOLMATE)
        for n in (5, 50, 500):
            for fname, make in forgeries.items():
                fr, fe = make(n)
                base = tenant_table({"victim": vt, "bystander": third}, "victim").factor(CLS, policy).factor
                forged = tenant_table({"victim": vt, "bystander": third, "forger": _table(fr, fe, policy)},
                                      "victim").factor(CLS, policy).factor
                alone = tenant_table({"victim": vt, "forger": _table(fr, fe, policy)}, "victim").factor(CLS, policy)
                move = max(abs(forged - base) / base, abs(alone.factor - base) / base)
                worst = max(worst, move)
                lines.append(f"  victim {vname:15s} forger {n:3d} {fname:16s} factor {base:.4f} -> {forged:.4f} "
                             f"(forger alone: {alone.factor:.4f}) move {100 * move:.2f} %")
    return worst, lines


def main(verbose: bool = False) -> int:
    ok = True
    for name, policy in (("memory", DEFAULT_CALIBRATION), ("runtime", DEFAULT_RUNTIME_CALIBRATION)):
        worst, lines = worst_move(policy)
        if verbose:
            print("\n".join(lines))
        print(f"{name} factor: largest move of another namespace's factor by forged samples: {100 * worst:.2f} % "
              f"(bound {100 * (PRIOR_BAND - 1):.0f} %)")
        ok = ok and worst <= PRIOR_BAND - 1 + 1e-9
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(verbose="-v" in sys.argv))
