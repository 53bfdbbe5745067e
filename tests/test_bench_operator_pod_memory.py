"""``bench/operator_pod_memory.py`` runs to its end and prints its figures: a smoke run with a few hundred pods.

The bench once ran for many minutes and printed nothing (the operator's pod watch could not be stopped while it waited
for events, and tracing the imports took minutes), so docs/operator.md's figure could not be reproduced; this run
fails instead of hanging (every wait in the bench is bounded by ``--deadline``, the test by its timeout).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
PODS = 300


def _bench() -> Any:
    spec = importlib.util.spec_from_file_location("operator_pod_memory", ROOT / "bench" / "operator_pod_memory.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["operator_pod_memory"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(180)
def test_the_bench_measures_both_operators_and_ends(capsys: pytest.CaptureFixture[str]) -> None:
    code = _bench().main(["--pods", str(PODS), "--settle", "2", "--deadline", "90", "--no-probe"])
    out, err = capsys.readouterr()
    assert code == 0, err[-3000:]
    lines = out.strip().splitlines()
    assert lines[0].startswith(f"{PODS} unrelated pods in the API server; load average ")
    by_mode = {r["mode"]: r for r in json.loads(lines[-1])}
    assert set(by_mode) == {"kopf-labels", "server-selector"}
    for mode, r in by_mode.items():
        assert f"\n{mode} " in out  # a row of the table
        assert 30 * 2**20 < r["settled"]["VmRSS"] <= r["settled"]["VmHWM"], r
        assert 0 < r["traced_current"] <= r["traced_peak"], r
        assert r["pod_events"] == 0 and r["job_pod_created"] is False, r  # --no-probe: no job, none of its pods
    # kopf receives every pod and keeps state per pod; the server-side selector receives none of them.
    assert by_mode["kopf-labels"]["traced_current"] > 2 * by_mode["server-selector"]["traced_current"], by_mode
