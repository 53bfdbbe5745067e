"""GNNJob runtime: the analytic prior, the host footprint, the history format and the residual model retrained from
history."""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from shared_data import GRAPHS

from gnnsched.gpu.catalogue import get_gpu_model
from gnnsched.host_footprint import LOAD_PEAK_FACTOR, RUNTIME_BYTES, host_footprint
from gnnsched.predictor.gnn import GNNRuntimePredictor, job_class, probe_grid
from gnnsched.predictor.history import HistoryError, HistoryRecord, append_history, load_history
from gnnsched.runtime_prior import (
    arithmetic_intensity,
    device_seconds_per_step,
    intensity_class,
    solo_runtime_seconds,
    step_cost,
)
from gnnsched.spec import load_job, parse_spec

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _spec(**overrides):
    base = {"mode": "train", "model": {"arch": "gcn", "layers": 2, "hidden": 64}, "graph": {"dataset": "cora"},
            "epochs": 100}
    base.update(overrides)
    return parse_spec(base)


# --- prior ---------------------------------------------------------------------------------------------------------


def test_prior_scales_with_steps_and_gpu() -> None:
    gin = _spec(model={"arch": "gin", "layers": 3, "hidden": 16}, graph={"dataset": "ogbn-arxiv"}, epochs=10)
    twice = _spec(model={"arch": "gin", "layers": 3, "hidden": 16}, graph={"dataset": "ogbn-arxiv"}, epochs=20)
    a100 = solo_runtime_seconds(gin, "A100-80GB", 4)
    assert solo_runtime_seconds(twice, "A100-80GB", 4) == pytest.approx(2 * a100)
    # Narrow GIN is aggregation-bound (memory): the T4 (320 GB/s) trails the A100 (2 TB/s) by nearly the
    # bandwidth ratio (6.4x), not the FP32 ratio (2.4x); widening the layers makes the dense transforms dominate.
    assert 5 * a100 < solo_runtime_seconds(gin, "T4", 4) < 6.4 * a100
    assert intensity_class(gin, "A100-80GB") == "memory"
    wide = _spec(model={"arch": "gin", "layers": 3, "hidden": 1024}, graph={"dataset": "ogbn-arxiv"}, epochs=10)
    assert arithmetic_intensity(wide) > arithmetic_intensity(gin)
    assert intensity_class(wide, "A100-80GB") == "compute"


def test_prior_counts_a_gcn_layer_by_hand() -> None:
    """One GCN inference layer on 10 nodes / 20 edges / 8 features -> 2 classes, counted independently."""
    spec = parse_spec({"mode": "infer", "model": {"arch": "gcn", "layers": 1, "hidden": 4},
                       "graph": {"nodes": 10, "edges": 20, "features": 8, "classes": 2}, "requests": 1})
    n, e, din, dout = 10, 20, 8, 2
    flops = 2 * n * din * dout + 2 * e * dout
    byts = 4 * (n * din + din * dout + n * dout) + 4 * (e * dout + n * dout + e) + 2 * 8 * e
    cost = step_cost(spec)
    assert (cost.flops, cost.bytes) == (flops, byts)
    gpu = get_gpu_model("A100-80GB")
    assert device_seconds_per_step(spec, gpu) == pytest.approx(
        byts / gpu.bandwidth_bytes_per_s + flops / gpu.fp32_flops_per_s
    )
    assert arithmetic_intensity(spec) == pytest.approx(flops / byts)


def test_minibatch_runtime_depends_on_cores_full_batch_does_not() -> None:
    sage = load_job(EXAMPLES / "sage-minibatch.yaml").spec
    times = [solo_runtime_seconds(sage, "A100-80GB", c) for c in (1, 2, 4, 8, 16)]
    assert all(a >= b for a, b in pairwise(times))  # never slower with more cores
    assert times[0] > 2 * times[2]  # host-bound at 1 core
    assert times[3] == times[4]  # beyond MAX_LOADER_CORES cores stop helping
    gcn = load_job(EXAMPLES / "gcn-train-cora.yaml").spec
    assert solo_runtime_seconds(gcn, "A100-80GB", 1) == solo_runtime_seconds(gcn, "A100-80GB", 32)
    assert solo_runtime_seconds(gcn, "A100-80GB", 0.5) > solo_runtime_seconds(gcn, "A100-80GB", 1)


def test_minibatch_sizes_follow_fanouts_from_the_seeds() -> None:
    spec = parse_spec({"mode": "infer", "model": {"arch": "sage", "layers": 2, "hidden": 16},
                       "graph": {"nodes": 1_000_000, "edges": 50_000_000, "features": 10, "classes": 2},
                       "batching": {"mode": "minibatch", "batchSize": 100, "fanouts": [5, 3]}, "requests": 1})
    # hop 1: 100 seeds x 5 = 500 edges -> 600 nodes; hop 2: 600 x 3 = 1800 edges -> 2400 nodes.
    cost = step_cost(spec)
    assert cost.host_sampled_edges == 500 + 1800
    assert cost.host_gather_bytes == 2400 * 10 * 4


# --- host footprint --------------------------------------------------------------------------------------------


def test_host_footprint_of_cora_matches_the_real_tensors(tmp_path: Path) -> None:
    """Graph bytes counted from dimensions equal the bytes of the tensors PyG builds from the real Cora files."""
    spec = _spec()
    fp = host_footprint(spec, gpu=False)
    if (GRAPHS / "Cora").is_dir():
        import shutil

        from torch_geometric.datasets import Planetoid

        shutil.copytree(GRAPHS, tmp_path / "graphs")
        data = Planetoid(str(tmp_path / "graphs"), "Cora")[0]
        real = sum(v.numel() * v.element_size() for _, v in data.items() if hasattr(v, "element_size"))
        assert fp.graph_bytes == real
    assert fp.load_peak_bytes == int(fp.graph_bytes * (LOAD_PEAK_FACTOR - 1))
    assert fp.runtime_bytes == RUNTIME_BYTES
    assert fp.total_bytes > fp.graph_bytes + fp.runtime_bytes


def test_host_footprint_grows_with_loader_workers_and_inference_processes() -> None:
    sage = load_job(EXAMPLES / "sage-minibatch.yaml").spec
    one, eight = host_footprint(sage, 1), host_footprint(sage, 8)
    assert one.sampler_bytes == eight.sampler_bytes > 0
    assert eight.loader_buffer_bytes == 8 * one.loader_buffer_bytes
    gat = load_job(EXAMPLES / "gat-infer-parallel.yaml").spec
    assert host_footprint(gat).runtime_bytes == gat.parallelism * host_footprint(gat).runtime_bytes // gat.parallelism
    assert gat.parallelism > 1 and host_footprint(gat).runtime_bytes > host_footprint(_spec()).runtime_bytes


# --- history ---------------------------------------------------------------------------------------------------------


def _record(spec_dict, observed, cpu=4.0, memory=8 * 2**30, gpu="A100-80GB") -> HistoryRecord:
    return HistoryRecord(
        spec=spec_dict, requested={"cpu": "8", "memory": "16Gi"}, scaled={"cpu": cpu, "memory": memory},
        gpu_model=gpu, predicted_runtime_seconds=None, observed_runtime_seconds=observed, pmc_bytes=123,
        observed_peak_bytes=100, node="n1", finished_at=datetime(2026, 11, 21, tzinfo=timezone.utc),
    )


def test_history_round_trip_and_quantities(tmp_path: Path) -> None:
    rec = _record({"mode": "train", "model": {"arch": "gcn"}, "graph": {"dataset": "cora"}}, 12.5)
    assert rec.requested.cpu == 8.0 and rec.requested.memory == 16 * 2**30
    path = tmp_path / "h.jsonl"
    path.write_text(rec.to_json_line() + "\n\n" + rec.to_json_line() + "\n")
    loaded = load_history(path)
    assert loaded == [rec, rec]
    append_history(path, rec)
    assert load_history(path) == [rec, rec, rec]
    assert loaded[0].job_spec().model.arch == "gcn"


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: d.pop("observed_runtime_seconds"), "line 1, field 'observed_runtime_seconds': required"),
        (lambda d: d.update(gpu_model="Voodoo5"), "line 1, field 'gpu_model': unknown GPU model 'Voodoo5'"),
        (lambda d: d["spec"]["model"].update(layers=99), "line 1, field 'spec': spec.model.layers"),
        (lambda d: d.update(observed_runtime_seconds=-1), "line 1, field 'observed_runtime_seconds'"),
        (lambda d: d["scaled"].update(cpu="lots"), "line 1, field 'scaled.cpu'"),
        (lambda d: d.update(extra=1), "line 1, field 'extra': unknown field"),
    ],
)
def test_bad_history_lines_name_line_and_field(tmp_path: Path, mutate, expected: str) -> None:
    data = json.loads(
        _record({"mode": "train", "model": {"arch": "gcn"}, "graph": {"dataset": "cora"}}, 1.0).to_json_line()
    )
    mutate(data)
    path = tmp_path / "h.jsonl"
    path.write_text(json.dumps(data) + "\n")
    with pytest.raises(HistoryError) as err:
        load_history(path)
    assert str(err.value).startswith(str(path)) and expected in str(err.value)


def test_history_not_json_and_empty(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text("{broken\n")
    with pytest.raises(HistoryError, match=r"line 1: not JSON"):
        load_history(path)
    path.write_text("\n")
    with pytest.raises(HistoryError, match="no records"):
        load_history(path)


# --- the predictor -----------------------------------------------------------------------------------------------


def test_default_predictor_is_the_prior_and_monotone() -> None:
    model = GNNRuntimePredictor.load_default()
    assert model.residual is None and model.training["rows"] == 0
    sage = load_job(EXAMPLES / "sage-minibatch.yaml").spec
    assert model.predict(sage, "A100-80GB", 8, 32 * 2**30) == solo_runtime_seconds(sage, "A100-80GB", 8)
    previous = math.inf
    for cores in (0.5, 1, 2, 3, 4, 6, 8, 12):
        now = model.predict(sage, "A100-80GB", cores, 32 * 2**30)
        assert now <= previous
        previous = now
    # Importance per class: cores matter to samplers, not to full-batch jobs; memory matters to none (above floor).
    assert model.class_importance(sage)["cpu"] > 0.05
    assert model.class_importance(load_job(EXAMPLES / "gcn-train-cora.yaml").spec)["cpu"] == 0.0
    assert all(v["memory_gib"] == 0.0 for v in model.importance.values())


def test_shipped_default_equals_the_reproducible_command() -> None:
    rebuilt = GNNRuntimePredictor.prior_only(probe_grid())
    assert rebuilt.to_dict() == GNNRuntimePredictor.load_default().to_dict()


def _history(factors: dict[str, float]) -> list[HistoryRecord]:
    """Jobs whose 'observed' runtime is the prior × a per-architecture factor (the prior's systematic error)."""
    records = []
    i = 0
    for dataset in ("cora", "citeseer", "pubmed", "ogbn-arxiv", "proteins", "artist", "dd"):
        for arch, factor in factors.items():
            for epochs in (50, 200):
                spec_dict: dict[str, Any] = {
                    "mode": "train", "model": {"arch": arch, "layers": 2 + i % 2, "hidden": 64 * (1 + i % 3)},
                    "graph": {"dataset": dataset}, "epochs": epochs,
                }
                if arch == "gat":
                    spec_dict["model"]["heads"] = 2
                spec = parse_spec(spec_dict)
                cpu = float(1 + i % 8)
                observed = factor * solo_runtime_seconds(spec, "A100-80GB", cpu)
                records.append(_record(spec_dict, observed, cpu=cpu, memory=(4 + i % 4) * 2**30))
                i += 1
    return records


def test_residual_learns_what_the_prior_gets_wrong() -> None:
    factors = {"gcn": 3.0, "sage": 1.5, "gin": 0.6, "gat": 5.0}
    everything = _history(factors)
    held_out = everything[3::5]
    history = [r for i, r in enumerate(everything) if i % 5 != 3]
    model = GNNRuntimePredictor.fit_history(history, source="synthetic")
    assert model.training["rows"] == len(history)
    assert model.training["in_sample"]["wmape"] < 0.25 * model.training["prior_only"]["wmape"]
    # Jobs the model never saw: the learnt per-architecture factor carries over.
    for rec in held_out:
        spec = rec.job_spec()
        ratio = model.predict(spec, "A100-80GB", rec.scaled.cpu, rec.scaled.memory) / solo_runtime_seconds(
            spec, "A100-80GB", rec.scaled.cpu)
        assert ratio == pytest.approx(factors[spec.model.arch], rel=0.2), spec.model.arch
    assert set(model.importance) == {"train-full"}
    # Round trip through the file format.
    again = GNNRuntimePredictor.from_dict(json.loads(json.dumps(model.to_dict())))
    spec = history[5].job_spec()
    assert again.predict(spec, "A100-80GB", 3, 2**32) == model.predict(spec, "A100-80GB", 3, 2**32)


def test_trained_predictor_is_monotone_in_resources() -> None:
    model = GNNRuntimePredictor.fit_history(_history({"gcn": 2.0, "sage": 1.0, "gin": 1.0, "gat": 3.0}))
    rng = np.random.default_rng(0)
    for rec in _history({"gcn": 1.0})[:8]:
        spec = rec.job_spec()
        for _ in range(5):
            cpu, mem = float(rng.uniform(0.5, 16)), float(rng.uniform(1, 64)) * 2**30
            base = model.predict(spec, "A100-80GB", cpu, mem)
            assert model.predict(spec, "A100-80GB", cpu * 1.5, mem) <= base * (1 + 1e-9)
            assert model.predict(spec, "A100-80GB", cpu, mem * 1.5) <= base * (1 + 1e-9)


def test_too_little_history_is_an_error() -> None:
    with pytest.raises(ValueError, match="need at least 10"):
        GNNRuntimePredictor.fit_history(_history({"gcn": 1.0})[:3])


def test_job_class() -> None:
    assert job_class(load_job(EXAMPLES / "sage-minibatch.yaml").spec) == "train-minibatch"
    assert job_class(load_job(EXAMPLES / "gat-infer-parallel.yaml").spec) == "infer-full"
