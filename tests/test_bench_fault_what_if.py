"""``bench/fault_what_if.py``: each what-if engine changes the one rule it names, and the default engine changes
nothing. On cognn-mix seed 7 (its one buggy job and one hardware fault, the bench's own cell) under lmcf."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

from gnnsched.simulator.adapters import Integrations
from gnnsched.simulator.cli import default_data_dir, fits_on
from gnnsched.simulator.cluster import parse_cluster
from gnnsched.simulator.engine import Simulation
from gnnsched.simulator.faults import buggy_points, parse_estimate_error, parse_faults
from gnnsched.simulator.policyspec import parse_policies
from gnnsched.simulator.runner import materialise, run
from gnnsched.simulator.workloads import resolve_workload

ROOT = Path(__file__).resolve().parents[1]
SEED = 7
POLICY = "lmcf"


def _bench() -> Any:
    spec = importlib.util.spec_from_file_location("fault_what_if", ROOT / "bench" / "fault_what_if.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def cell() -> dict[str, Any]:
    bench = _bench()
    ix = Integrations()
    data = default_data_dir()
    cl = parse_cluster(bench.CLUSTER, data)
    wl = resolve_workload("cognn-mix", SEED, data, fits=fits_on(cl, ix))
    jobs = materialise(wl, cl, ix, scaling=False)
    faults = parse_faults(1.0, 600.0, 0.05)
    noisy = parse_estimate_error("lognormal:0.2")
    policies = parse_policies(POLICY)

    def go(engine: type[Simulation] | None, error: bool = True) -> Any:
        kw: dict[str, Any] = {} if engine is None else {"engine": engine}
        if error:
            kw["estimate_error"] = noisy
        return run(wl, cl, policies, SEED, ix, jobs=jobs, record_timeline=False, faults=faults, **kw).results[POLICY]

    plain = run(wl, cl, policies, SEED, ix, jobs=jobs, record_timeline=False).results[POLICY]
    out = {"bench": bench, "plain": plain, "buggy": set(buggy_points(jobs, 0.05, SEED)), "default": go(None)}
    for v in bench.VARIANTS:
        out[v.name] = go(v.engine, v.estimate_error)
    return out


def test_the_cell_has_what_the_variants_remove(cell: dict[str, Any]) -> None:
    built = cell["as built"]
    assert cell["buggy"], "cognn-mix seed 7 has a buggy job"
    assert built.extra["hw_faults"] >= 1 and built.extra["app_faults"] >= 2
    assert built.extra["innocent_jobs_requeued"] >= 1


def test_the_default_engine_is_the_system(cell: dict[str, Any]) -> None:
    a, b = cell["default"], cell["as built"]
    assert [(o.job.id, o.status, o.attempts, o.finish) for o in a.outcomes] == \
        [(o.job.id, o.status, o.attempts, o.finish) for o in b.outcomes]


def test_victims_resume_finishes_innocent_jobs_sooner_under_the_same_faults(cell: dict[str, Any]) -> None:
    built, resumed = cell["as built"], cell["victims resume"]
    ratio = cell["bench"].ratio_without
    # same faults, same rules for who is charged: only the lost work differs, and the innocent jobs finish sooner
    assert resumed.extra["hw_faults"] == built.extra["hw_faults"]
    assert ratio(cell["plain"], resumed, cell["buggy"]) < ratio(cell["plain"], built, cell["buggy"])
    assert resumed.extra["wasted_gpu_seconds"] > 0  # the killed attempts' time is still counted as wasted


def test_first_fault_names_the_culprit_and_charges_nobody_else(cell: dict[str, Any]) -> None:
    r = cell["first fault"]
    by_id = {o.job.id: o for o in r.outcomes}
    for jid in cell["buggy"]:
        o = by_id[jid]
        assert o.status == "failed" and o.reason == "CulpritAtFirstFault" and o.attempts == 1
    assert r.extra["app_faults"] == len(cell["buggy"])
    assert r.extra["innocent_jobs_alone"] == 0
    # every innocent job completes, but one the estimate error puts above every GPU (as the system fails it)
    assert all(o.status == "completed" or o.reason == "ExceedsLargestGPU"
               for o in r.outcomes if o.job.id not in cell["buggy"])
    assert sum(o.status == "completed" for o in r.outcomes) >= len(r.outcomes) - len(cell["buggy"]) - 1


def test_buggy_known_never_runs_a_buggy_job(cell: dict[str, Any]) -> None:
    for key in ("buggy known", "capacity only"):
        r = cell[key]
        by_id = {o.job.id: o for o in r.outcomes}
        for jid in cell["buggy"]:
            assert by_id[jid].status == "failed" and by_id[jid].attempts == 0 and not by_id[jid].ran
        assert r.extra["app_faults"] == 0
    assert cell["capacity only"].extra["memory_exceeded"] == 0  # no estimate error: nothing to resize
    assert cell["buggy known"].extra["memory_exceeded"] > 0
