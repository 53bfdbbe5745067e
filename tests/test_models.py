"""The model, graph and step functions the worker and the estimator share (gnnsched.models)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from gnnsched.models import (
    PLANETOID_SELF_LOOPS,
    GraphLayout,
    NeighborSampler,
    build_model,
    default_data_dir,
    fake_graph_tensors,
    graph_layout,
    make_graph,
    minibatch_bound,
    pyg_backends,
)
from gnnsched.portable.step import run_step
from gnnsched.spec import GNNJobSpec, parse_spec


def _spec(arch: str = "gcn", mode: str = "train", layers: int = 2, hidden: int = 16, heads: int | None = None,
          graph: dict | None = None, **extra) -> GNNJobSpec:
    model = {"arch": arch, "layers": layers, "hidden": hidden}
    if heads is not None:
        model["heads"] = heads
    graph = graph or {"nodes": 300, "edges": 2_000, "features": 12, "classes": 4}
    return parse_spec({"mode": mode, "model": model, "graph": graph, **extra})


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("arch", ["gcn", "sage", "gin", "gat"])
@pytest.mark.parametrize("layers", [1, 3, 16])
def test_build_model_layers_and_output_width(arch, layers):
    spec = _spec(arch, layers=layers, hidden=8, heads=3 if arch == "gat" else None)
    model: Any = build_model(spec)
    assert len(model.convs) == layers
    graph = make_graph(spec, seed=1)
    out = model.eval()(graph.x, graph.edge_index)
    assert out.shape == (300, 4)
    assert isinstance(model.optimizer, torch.optim.Adam)


def test_gat_hidden_layers_concatenate_heads():
    model = build_model(_spec("gat", layers=3, hidden=8, heads=4))
    assert [c.heads for c in model.convs] == [4, 4, 1]
    assert model.convs[1].in_channels == 8 * 4
    assert model.convs[2].out_channels == 4


def test_inference_models_have_no_optimizer_and_train_steps_need_one():
    model = build_model(_spec(mode="infer"))
    assert model.optimizer is None
    with pytest.raises(ValueError, match="optimizer"):
        run_step(model, make_graph(_spec(mode="infer")), "train")


def test_synthetic_graph_matches_layout_has_no_self_loops_and_is_seeded():
    spec = _spec()
    layout = graph_layout(spec)
    assert layout == GraphLayout(nodes=300, edges=2_000, features=12, classes=4, labelled=300, self_loops=0,
                                 source="synthetic")
    a, b, c = make_graph(spec, seed=5), make_graph(spec, seed=5), make_graph(spec, seed=6)
    assert a.x.shape == (300, 12) and a.edge_index.shape == (2, 2_000) and a.y.shape == (300,)
    assert int((a.edge_index[0] == a.edge_index[1]).sum()) == 0
    assert int(a.edge_index.min()) >= 0 and int(a.edge_index.max()) < 300 and int(a.y.max()) < 4
    assert torch.equal(a.edge_index, b.edge_index) and torch.equal(a.x, b.x)
    assert not torch.equal(a.edge_index, c.edge_index)


def test_fake_graph_tensors_have_the_real_graphs_shapes_and_dtypes():
    spec = _spec()
    real = make_graph(spec)
    with torch.device("meta"):
        fake = fake_graph_tensors(graph_layout(spec))
    for name in ("x", "edge_index", "y", "target"):
        r, f = getattr(real, name), getattr(fake, name)
        assert (r.shape, r.dtype) == (f.shape, f.dtype), name


CORA = default_data_dir() / "Cora" / "raw" / "ind.cora.x"


@pytest.mark.skipif(not CORA.exists(), reason="shared Planetoid files not present")
@pytest.mark.parametrize("dataset", ["cora", "citeseer"])
def test_planetoid_is_loaded_when_present_and_matches_its_layout(dataset, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # Planetoid processes into a private cache, not the share
    spec = _spec(graph={"dataset": dataset})
    layout = graph_layout(spec)
    graph = make_graph(spec)
    assert layout.source.startswith("planetoid:")
    assert graph.x.shape == (layout.nodes, layout.features)
    assert graph.edge_index.shape == (2, layout.edges)
    assert graph.target.numel() == layout.labelled == 20 * layout.classes
    loops = int((graph.edge_index[0] == graph.edge_index[1]).sum())
    assert loops == layout.self_loops == PLANETOID_SELF_LOOPS[layout.source.split(":")[1]]


def test_named_dataset_without_files_falls_back_to_synthetic_with_its_dimensions(tmp_path):
    spec = _spec(graph={"dataset": "cora"})
    layout = graph_layout(spec, root=tmp_path)
    graph = make_graph(spec, root=tmp_path)
    assert layout.source == "synthetic" and graph.layout == layout
    assert graph.x.shape == (2708, 1433) and graph.edge_index.shape == (2, 10556)


def test_data_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("GNNSCHED_DATA_DIR", str(tmp_path))
    assert default_data_dir() == Path(tmp_path)


def test_data_dir_accepts_the_data_folder_the_simulator_reads(monkeypatch, tmp_path):
    (tmp_path / "graphs").mkdir()
    (tmp_path / "traces").mkdir()
    monkeypatch.setenv("GNNSCHED_DATA_DIR", str(tmp_path))
    assert default_data_dir() == tmp_path / "graphs"


def test_training_steps_reduce_the_loss_and_inference_keeps_weights():
    spec = _spec("sage", hidden=32, graph={"nodes": 200, "edges": 1_500, "features": 8, "classes": 3})
    spec = spec.model_copy(update={"model": spec.model.model_copy(update={"dropout": 0.0})})
    torch.manual_seed(0)
    model, graph = build_model(spec), make_graph(spec)
    losses = [float(run_step(model, graph, "train")) for _ in range(40)]
    assert losses[-1] < 0.8 * losses[0]
    before = [p.detach().clone() for p in model.parameters()]
    assert run_step(model, graph, "infer") is None
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert not model.training


def test_neighbor_sampler_batches_are_real_subgraphs_within_fanouts():
    spec = _spec("sage", layers=2, batching={"mode": "minibatch", "batchSize": 64, "fanouts": [3, 2]},
                 graph={"nodes": 400, "edges": 4_000, "features": 6, "classes": 3})
    graph = make_graph(spec, seed=2)
    sampler = NeighborSampler(graph, spec)
    real_edges = set(zip(graph.edge_index[0].tolist(), graph.edge_index[1].tolist(), strict=True))
    seen_seeds = []
    batches = list(sampler.batches(seed=3))
    assert len(batches) == -(-400 // 64)
    bound = minibatch_bound(graph.layout, 64, [3, 2])
    for batch in batches:
        nodes = batch.layout.nodes
        assert batch.x.shape == (nodes, 6) and batch.y.shape == (nodes,)
        assert nodes <= bound.nodes and batch.layout.edges <= bound.edges
        assert int(batch.edge_index.max()) < nodes
        # map local ids back through the features (rows are copies of graph.x rows)
        local_to_global = {}
        for local in range(nodes):
            matches = (graph.x == batch.x[local]).all(dim=1).nonzero().view(-1).tolist()
            local_to_global[local] = matches[0]
        seeds = [local_to_global[i] for i in range(batch.target.numel())]
        seen_seeds.extend(seeds)
        for s, d in zip(batch.edge_index[0].tolist(), batch.edge_index[1].tolist(), strict=True):
            assert (local_to_global[s], local_to_global[d]) in real_edges
        in_degree = torch.bincount(batch.edge_index[1], minlength=nodes)
        assert int(in_degree.max()) <= 3  # each node is expanded in one hop only, with at most that hop's fanout
    assert sorted(seen_seeds) == list(range(400))  # one pass visits every labelled node once
    assert int(sampler.position.max()) == -1  # the id map is clean between batches


def test_minibatch_training_step_runs():
    spec = _spec("gat", heads=2, layers=2, batching={"mode": "minibatch", "batchSize": 32, "fanouts": [4, 4]})
    graph = make_graph(spec)
    model = build_model(spec)
    batch = next(NeighborSampler(graph, spec).batches())
    loss = run_step(model, batch, "train")
    assert torch.isfinite(loss)


def test_pyg_backends_reports_the_three_extensions():
    found = pyg_backends()
    assert set(found) == {"torch_scatter", "torch_sparse", "pyg_lib"}
    assert all(isinstance(v, bool) for v in found.values())
