"""The measured runtime table, the prior's constants and the simulator's use of them stay one story.

``gnnsched/data/runtime_truth.json`` is what ``bench/runtime_truth.py`` measured; ``gnnsched.runtime_prior.CPU_RATES``
is what ``gnnsched.runtime_fit`` fitted on it. Each test below fails when one moves without the other: a rate edited
by hand, a summary edited by hand, or a change to the prior's step counts that makes the measured rows' counts stale.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from gnnsched.errors import FieldError
from gnnsched.runtime_fit import SAMPLER, cpu_sensitivity, evaluate, fit_rates, is_heldout, predict, wmape
from gnnsched.runtime_prior import (
    CPU_RATES,
    FAMILIES,
    CpuRates,
    cpu_seconds_per_step,
    solo_runtime_seconds,
    step_counts,
    worker_step_cost,
)
from gnnsched.simulator.runtime_error import (
    measured_error,
    parse_runtime_error,
    runtime_multipliers,
    sampler_core_exponent,
)
from gnnsched.spec import GNNJobSpec

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def table() -> dict[str, Any]:
    return json.loads(resources.files("gnnsched.data").joinpath("runtime_truth.json").read_text())


def _bench() -> Any:
    spec = importlib.util.spec_from_file_location("runtime_truth_bench", ROOT / "bench" / "runtime_truth.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_table_is_a_measurement_of_at_least_60_jobs_at_1_and_2_cores(table: dict[str, Any]) -> None:
    rows = [r for r in table["rows"] if r["device"] == "cpu"]
    cores: dict[int, set[int]] = {}
    for r in rows:
        cores.setdefault(r["job"], set()).add(r["cores"])
        assert r["seconds_per_step"] > 0 and r["steps_timed"] >= 2
    assert len(cores) >= 60
    assert all(c == {1, 2} for c in cores.values())
    assert table["command"].startswith("python bench/runtime_truth.py")
    # the grid is the bench's seeded grid: the rows' specs are what it generates
    bench = _bench()
    assert [r["spec"] for r in rows if r["cores"] == 1] == bench.grid(len(cores), 0)
    kinds = {GNNJobSpec.model_validate(r["spec"]).model.kind for r in rows}
    assert kinds == {"arch", "pyg", "conv"}
    assert {r["mode"] for r in rows} == {"train", "infer"} and {r["batching"] for r in rows} == {"full", "minibatch"}


def test_the_priors_cpu_rates_are_the_refit_of_the_shipped_table(table: dict[str, Any]) -> None:
    rows = [r for r in table["rows"] if r["device"] == "cpu"]
    refit = evaluate(rows).rates
    shipped = {int(c): CpuRates(**r) for c, r in table["fit"]["rates"].items()}
    assert set(refit) == set(shipped) == set(CPU_RATES) == {1, 2}
    for cores, rates in CPU_RATES.items():
        for got in (refit[cores], shipped[cores]):  # 4 significant digits; rel 1e-3 allows another BLAS's last bit
            assert got.bytes_per_s == pytest.approx(rates.bytes_per_s, rel=1e-3)
            for name in ("launch_seconds", "flops_per_s", "sampled_edges_per_s", "gather_bytes_per_s"):
                assert getattr(got, name) == pytest.approx(getattr(rates, name), rel=1e-3), (cores, name)


def test_the_tables_summary_is_what_its_rows_give(table: dict[str, Any]) -> None:
    rows = [r for r in table["rows"] if r["device"] == "cpu"]
    ev = evaluate(rows)
    assert table["heldout_residuals"] == ev.heldout_residuals
    assert table["wmape"] == {"train": ev.wmape_train, "heldout": ev.wmape_heldout, "by_model_class": ev.wmape_by_class}
    assert table["cpu_sensitivity"] == cpu_sensitivity(rows)
    # the held-out residuals come from held-out jobs only, and every held-out row is in them
    heldout = [r for r in rows if is_heldout(r["job"])]
    assert sum(len(v) for v in ev.heldout_residuals.values()) == len(heldout) > 0


def test_the_measured_rows_counts_are_still_the_priors(table: dict[str, Any]) -> None:
    """A change to the prior's step counts makes the table stale: it must then be measured (or refit) again."""
    for r in table["rows"]:
        spec = GNNJobSpec.model_validate(r["spec"])
        counts = step_counts(worker_step_cost(spec))
        assert r["features"] == pytest.approx(list(counts), rel=1e-5)
        if r["device"] == "cpu":
            want = predict(CPU_RATES[r["cores"]], r)  # from the row's counts, stored to 6 digits
            assert cpu_seconds_per_step(spec, r["cores"]) == pytest.approx(want, rel=1e-5)


def test_fit_rates_recovers_the_rates_that_made_the_rows() -> None:
    truth = CpuRates(launch_seconds=2e-5, bytes_per_s={"gcn": 1e9, "sage": 3e9, "gin": 2e9, "gat": 5e8},
                     flops_per_s=4e10, sampled_edges_per_s=5e5, gather_bytes_per_s=6e9)
    rows: list[dict[str, Any]] = []
    for i in range(60):
        counts = (float(10 + 7 * i), 1e7 * (1 + i % 5), 1e8 * (1 + (i * 3) % 7), 1e4 * (i % 4), 1e6 * ((i * 5) % 3))
        family = FAMILIES[i % 4]
        rows.append({"features": counts, "family": family, "seconds_per_step": truth.seconds(counts, family)})
    got = fit_rates(rows)
    assert got.bytes_per_s == pytest.approx(truth.bytes_per_s, rel=2e-3)
    for name in ("launch_seconds", "flops_per_s", "sampled_edges_per_s", "gather_bytes_per_s"):
        assert getattr(got, name) == pytest.approx(getattr(truth, name), rel=2e-3), name
    assert wmape([r["seconds_per_step"] for r in rows], [predict(got, r) for r in rows]) < 1e-3
    with pytest.raises(ValueError, match="positive seconds_per_step"):
        fit_rates([{**r, "seconds_per_step": 0.0} for r in rows])
    without_gat = fit_rates([r for r in rows if r["family"] != "gat"])
    assert without_gat.bytes_per_s["gat"] == pytest.approx((1e9 * 3e9 * 2e9) ** (1 / 3), rel=2e-3)


def test_measured_runtime_error_draws_from_the_tables_heldout_residuals(table: dict[str, Any]) -> None:
    dist = parse_runtime_error("measured")
    assert dist.kind == "measured" and dist == measured_error(table)
    pools = dict(dist.residuals)
    for cls, ratios in table["heldout_residuals"].items():
        assert pools[cls] == tuple(ratios)

    class _Model:
        model_class = "gcn"

    class _Spec:
        model = _Model()

    class _Job:
        def __init__(self, i: int) -> None:
            self.id, self.spec = i, _Spec()

    jobs: Any = [_Job(i) for i in range(50)]
    draws = runtime_multipliers(jobs, dist, seed=3)
    assert set(draws.values()) <= set(pools["gcn"]) and len(set(draws.values())) > 1
    assert draws == runtime_multipliers(jobs, dist, seed=3)


def test_a_scaled_jobs_true_slowdown_uses_the_measured_sampler_exponent(table: dict[str, Any]) -> None:
    alpha = sampler_core_exponent()
    assert alpha == table["cpu_sensitivity"][SAMPLER]["alpha"] and table["cpu_sensitivity"][SAMPLER]["jobs"] >= 5
    sage = GNNJobSpec.model_validate({
        "mode": "train", "model": {"arch": "sage", "layers": 2, "hidden": 64},
        "graph": {"nodes": 2_000_000, "edges": 60_000_000, "features": 128, "classes": 40}, "epochs": 1,
        "batching": {"mode": "minibatch", "batchSize": 1024, "fanouts": [15, 10]}})
    slow = solo_runtime_seconds(sage, "A100-80GB", 1, core_exponent=alpha) / solo_runtime_seconds(
        sage, "A100-80GB", 2, core_exponent=alpha)
    assert slow == pytest.approx(2 ** alpha, rel=0.05)  # host-bound: the measured ratio, not the prior's 2x
    with pytest.raises(FieldError, match="cpu_sensitivity.sampler.alpha"):
        sampler_core_exponent({"cpu_sensitivity": {}})


def test_the_bench_measures_and_refits(tmp_path: Path) -> None:
    bench = _bench()
    out = tmp_path / "t.json"
    assert bench.main(["--jobs", "2", "--target-seconds", "0.01", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert len(doc["rows"]) == 4 and {r["cores"] for r in doc["rows"]} == {1, 2}
    assert all(math.isfinite(r["seconds_per_step"]) and r["load1"] >= 0 for r in doc["rows"])
    doc["heldout_residuals"] = {}
    out.write_text(json.dumps(doc))
    assert bench.main(["--refit", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["heldout_residuals"] == evaluate(doc["rows"]).heldout_residuals
    with pytest.raises(SystemExit):
        bench.main(["--cores", "1,x", "--out", str(out)])


def test_gpu_rows_are_scored_against_the_gpu_prior_and_kept_out_of_the_cpu_fit(table: dict[str, Any]) -> None:
    """A lent GPU's rows (``--device cuda --append``) are reported against the GPU prior per GPU model and class; the
    CPU fit, and so ``CPU_RATES``, does not see them."""
    bench = _bench()
    cpu_rows = [r for r in table["rows"] if r["device"] == "cpu"]
    gpu_rows = [{**r, "device": "cuda", "gpu_model": "H100-80GB", "prior_seconds_per_step": r["seconds_per_step"] / 2}
                for r in cpu_rows[:6]]
    got = bench.summarise(cpu_rows + gpu_rows)
    assert got["fit"] == bench.summarise(cpu_rows)["fit"]
    keys = {f"H100-80GB.{r['model_class'].lower()}" for r in gpu_rows}
    assert set(got["gpu_prior_wmape"]) == keys
    assert all(v == pytest.approx(0.5) for v in got["gpu_prior_wmape"].values())  # predicted half of measured
