"""The GNN a job runs: model, graph and one step, shared by the worker and the estimator so they cannot drift.

``build_model(spec)`` builds the job's model (a built-in arch, a PyG model class, a layer stack or the user's
entrypoint; ``gnnsched.model_catalog``) with its optimizer attached,
``make_graph(spec, seed)`` builds the graph (the real Planetoid files for cora/citeseer when present, otherwise a
synthetic graph of the spec's dimensions), and ``run_step(model, graph, mode)`` runs one training step (zero grads,
forward, loss, backward, optimizer step) or one inference forward under ``torch.no_grad`` (``gnnsched.portable.step``,
the same code a probe runs in the user's image).

The estimator runs exactly these functions under ``FakeTensorMode``; everything here therefore avoids shapes that
depend on data: the synthetic generator draws edges without self-loops by construction (``dst = src + offset``,
offset never 0), the loss indexes labelled nodes with an integer index (never a boolean mask), and
``graph_layout(spec)`` states every tensor's shape and the graph's self-loop count without touching the data, so the
estimator can size GCN's and GAT's self-loop masks exactly.

PyG runs on its pure-torch paths here (``pyg_backends()`` reports torch-scatter, torch-sparse or pyg-lib if they are
installed, because they change which kernels run and so the peak). Neighbour sampling for mini-batches is this
module's own pure-torch sampler (PyG's ``NeighborLoader`` needs pyg-lib or torch-sparse).

This module imports torch; the CLI imports it only inside the ``worker``/``estimate`` command bodies so that
``gnnsched --help`` stays light.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F

from gnnsched.datasets import get_dataset
from gnnsched.portable.graph import synthetic_tensors
from gnnsched.portable.sampler import PortableSampler, incoming_csr
from gnnsched.portable.step import (
    EntrypointError,
    GraphDims,
    attach_optimizer,
    build_entrypoint_model,
    make_optimizer,
)
from gnnsched.spec import GNNJobSpec, SpecError, layer_dims

Mode = Literal["train", "infer"]

DATA_DIR_ENV = "GNNSCHED_DATA_DIR"
"""Directory holding Planetoid raw files as ``<root>/Cora/raw/ind.cora.*`` (the shared ``data/graphs`` folder)."""

PLANETOID_TRAIN_PER_CLASS = 20
"""Planetoid's public split labels 20 nodes per class (Cora 140, CiteSeer 120)."""

PLANETOID_SELF_LOOPS = {"Cora": 0, "CiteSeer": 0}
"""Self-loops in PyG's Planetoid edge_index (counted from the raw files; ``tests/test_models.py`` re-counts them)."""


@dataclass(frozen=True)
class GraphLayout:
    """Every tensor shape of the graph ``make_graph`` builds, known without building it.

    ``self_loops`` is the number of edges ``(i, i)`` in ``edge_index``; GCN and GAT remove/re-add self-loops through
    boolean masks whose true-count the estimator cannot compute on fake data, so it takes it from here.
    """

    nodes: int
    edges: int
    features: int
    classes: int
    labelled: int
    self_loops: int
    source: str  # "synthetic" or "planetoid:<Name>"


@dataclass
class Graph:
    """A graph as the model consumes it: node features, COO edges (source row 0, target row 1), labels, and the
    integer index of the nodes the loss is computed on (train nodes, or a mini-batch's seed nodes)."""

    x: torch.Tensor
    edge_index: torch.Tensor
    y: torch.Tensor
    target: torch.Tensor
    layout: GraphLayout

    def to(self, device: str | torch.device) -> Graph:
        """The same graph on ``device`` (no copy when it is already there)."""
        return Graph(
            x=self.x.to(device),
            edge_index=self.edge_index.to(device),
            y=self.y.to(device),
            target=self.target.to(device),
            layout=self.layout,
        )

    def nbytes(self) -> int:
        return sum(t.untyped_storage().nbytes() for t in (self.x, self.edge_index, self.y, self.target))


def pyg_backends() -> dict[str, bool]:
    """Which optional PyG extension libraries are importable (each one changes kernels, hence the peak)."""
    import importlib.util

    return {name: importlib.util.find_spec(name) is not None for name in ("torch_scatter", "torch_sparse", "pyg_lib")}


def default_data_dir() -> Path:
    """The graphs folder: ``$GNNSCHED_DATA_DIR/graphs`` when the variable names a data folder (one holding
    ``graphs/`` and ``traces/``, as ``gnnsched simulate`` reads it), ``$GNNSCHED_DATA_DIR`` itself when it holds the
    graphs directly, else ``shared/data/graphs`` beside the repository checkout (``../shared``), or beside one of its
    parents (a git worktree nested one or two levels deeper). One variable, one meaning for every command: set to the
    data folder, the estimator and the simulator read the same graphs."""
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        nested = Path(env) / "graphs"
        return nested if nested.is_dir() else Path(env)
    repo = Path(__file__).resolve().parent.parent
    candidates = [ancestor / "shared" / "data" / "graphs" for ancestor in list(repo.parents)[:3]]
    return next((c for c in candidates if c.is_dir()), candidates[0])


def _planetoid_name(spec: GNNJobSpec) -> str | None:
    dims = spec.graph.resolve()
    if dims.dataset is None:
        return None
    return get_dataset(dims.dataset).planetoid


def _planetoid_available(name: str, root: Path) -> bool:
    raw = root / name / "raw"
    return all(
        (raw / f"ind.{name.lower()}.{part}").is_file()
        for part in ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")
    )


def graph_layout(spec: GNNJobSpec, root: str | Path | None = None) -> GraphLayout:
    """The shapes of the graph ``make_graph(spec, seed, root)`` would build (same decision about real vs synthetic)."""
    dims = spec.graph.resolve()
    root_path = Path(root) if root is not None else default_data_dir()
    name = _planetoid_name(spec)
    if name is not None and _planetoid_available(name, root_path):
        return GraphLayout(
            nodes=dims.nodes,
            edges=dims.edges,
            features=dims.features,
            classes=dims.classes,
            labelled=PLANETOID_TRAIN_PER_CLASS * dims.classes,
            self_loops=PLANETOID_SELF_LOOPS[name],
            source=f"planetoid:{name}",
        )
    return GraphLayout(
        nodes=dims.nodes,
        edges=dims.edges,
        features=dims.features,
        classes=dims.classes,
        labelled=dims.nodes,
        self_loops=0,
        source="synthetic",
    )


def synthetic_graph(layout: GraphLayout, seed: int) -> Graph:
    """A random graph with the layout's shapes and no self-loops, every node labelled
    (``gnnsched.portable.graph.synthetic_tensors``, which the portable step runner uses too)."""
    x, edge_index, y, target = synthetic_tensors(layout.nodes, layout.edges, layout.features, layout.classes, seed)
    return Graph(x=x, edge_index=edge_index, y=y, target=target, layout=layout)


def fake_graph_tensors(layout: GraphLayout) -> Graph:
    """Uninitialised tensors with exactly the shapes and dtypes of the real graph (used under FakeTensorMode)."""

    return Graph(
        x=torch.empty(layout.nodes, layout.features),
        edge_index=torch.empty(2, layout.edges, dtype=torch.long),
        y=torch.empty(layout.nodes, dtype=torch.long),
        target=torch.empty(layout.labelled, dtype=torch.long),
        layout=layout,
    )


def _load_planetoid(name: str, root: Path, layout: GraphLayout) -> Graph:
    """Load Planetoid from read-only raw files: processing happens in a private cache dir that links to them."""
    from torch_geometric.datasets import Planetoid

    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gnnsched" / "planetoid"
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError:
        cache = Path(tempfile.mkdtemp(prefix="gnnsched-planetoid-"))
    raw_link = cache / name / "raw"
    if not raw_link.exists():
        raw_link.parent.mkdir(parents=True, exist_ok=True)
        try:
            raw_link.symlink_to((root / name / "raw").resolve(), target_is_directory=True)
        except OSError:
            shutil.copytree(root / name / "raw", raw_link)
    data = Planetoid(str(cache), name)[0]
    target = data.train_mask.nonzero().view(-1)
    return Graph(x=data.x, edge_index=data.edge_index, y=data.y, target=target, layout=layout)


def make_graph(spec: GNNJobSpec, seed: int = 0, root: str | Path | None = None) -> Graph:
    """The job's graph: real Planetoid data when the spec names cora/citeseer and the files exist under ``root``
    (default ``default_data_dir()``), otherwise a synthetic graph with the spec's (or the dataset's) dimensions."""
    root_path = Path(root) if root is not None else default_data_dir()
    layout = graph_layout(spec, root_path)
    if layout.source.startswith("planetoid:"):
        return _load_planetoid(layout.source.split(":", 1)[1], root_path, layout)
    return synthetic_graph(layout, seed)


def build_model(
    spec: GNNJobSpec,
    features: int | None = None,
    classes: int | None = None,
    device: str | torch.device = "cpu",
    graph: Graph | None = None,
) -> torch.nn.Module:
    """The job's model (a ``torch.nn.Module``) with its optimizer at ``model.optimizer`` for training jobs.

    One function for every way a spec names its model (``spec.model.arch``, ``pyg``, ``conv``, ``entrypoint``): the
    worker runs and the estimator traces what it returns, so the two cannot drift. ``features``/``classes`` default
    to the spec's graph dimensions, or to ``graph``'s. Classes that take the graph's in-degree histogram (PNA) get
    ``graph``'s, computed from its edges as the user's code would; without a graph (the estimator builds without data)
    they get the mean-degree histogram of the graph's size, which changes PNA's two scalars and no tensor size. The
    optimizer is ``spec.optimizer`` (Adam by default) in its multi-tensor form (``foreach=True``, PyTorch's default on
    CUDA) on every device, so the CPU trace has the same temporaries a GPU run has. Raises ``SpecError`` for a PyG
    class, layer or option the installed PyG cannot build, or an entrypoint that gives no model.
    """
    dims = spec.graph.resolve()
    if graph is not None:
        features = graph.layout.features if features is None else features
        classes = graph.layout.classes if classes is None else classes
    features = dims.features if features is None else features
    classes = dims.classes if classes is None else classes
    model: torch.nn.Module
    if spec.model.arch is not None:
        model = _built_in(spec, features, classes)
    elif spec.model.entrypoint is not None:
        try:
            model = build_entrypoint_model(
                spec.model.entrypoint,
                GraphDims(num_nodes=dims.nodes, num_edges=dims.edges, num_features=features, num_classes=classes),
            )
        except EntrypointError as exc:
            raise SpecError("spec.model.entrypoint", str(exc)) from None
    else:
        from gnnsched.model_catalog import build_network, check_model, degree_histogram, typical_degree_histogram

        check_model(spec)

        def histogram() -> torch.Tensor:
            if graph is None:
                return typical_degree_histogram(dims.nodes, dims.edges)
            return degree_histogram(graph.edge_index, graph.layout.nodes)

        model = build_network(spec, features, classes, histogram)
    if torch.device(device).type != "cpu":
        model = model.to(device)  # parameters stay the same objects, so the optimizer below sees the moved ones
    optimizer = None
    if spec.mode == "train":
        opt = spec.training_optimizer
        optimizer = make_optimizer(model.parameters(), opt.name, opt.learning_rate, opt.weight_decay, opt.momentum)
    attach_optimizer(model, optimizer)
    return model


def _built_in(spec: GNNJobSpec, features: int, classes: int) -> GNN:
    """The four built-in stacks (``spec.model.arch``)."""
    from torch_geometric.nn import GATConv, GCNConv, GINConv, SAGEConv

    arch = spec.model.arch
    convs = torch.nn.ModuleList()
    for width_in, width_out, heads in layer_dims(spec, features, classes):
        if arch == "gcn":
            convs.append(GCNConv(width_in, width_out))
        elif arch == "sage":
            convs.append(SAGEConv(width_in, width_out, aggr="mean"))
        elif arch == "gin":
            mlp = torch.nn.Sequential(
                torch.nn.Linear(width_in, width_out), torch.nn.ReLU(), torch.nn.Linear(width_out, width_out)
            )
            convs.append(GINConv(mlp, train_eps=True))
        elif arch == "gat":
            convs.append(GATConv(width_in, width_out, heads=heads, dropout=spec.model.dropout))
        else:  # the spec's Literal makes this unreachable; kept so a new arch cannot silently build nothing
            raise ValueError(f"unknown arch {arch!r}")
    return GNN(convs, spec.model.dropout)


class GNN(torch.nn.Module):
    """Stacked message-passing layers with ReLU and dropout between them (none after the last): the built-in archs.

    ``optimizer`` is attached by ``build_model`` for training specs, so ``run_step`` needs nothing else.
    """

    def __init__(self, convs: torch.nn.ModuleList, dropout: float) -> None:
        super().__init__()
        self.convs = convs
        self.dropout = dropout
        self.optimizer: torch.optim.Optimizer | None = None

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        last = len(self.convs) - 1
        for i, conv in enumerate(self.convs):
            x = F.dropout(x, p=self.dropout, training=self.training)
            x = conv(x, edge_index)
            if i != last:
                x = F.relu(x)
        return x


# --- neighbour sampling (mini-batches for sage and gat) ------------------------------------------------------------


@dataclass(frozen=True)
@dataclass
class IncomingCSR:
    """Incoming edges grouped by target node: the sources of node v are ``sources[rowptr[v]:rowptr[v + 1]]``
    (``gnnsched.portable.sampler.incoming_csr``, static shapes only, so the estimator builds it on fake tensors)."""

    rowptr: torch.Tensor
    sources: torch.Tensor


def build_incoming_csr(graph: Graph) -> IncomingCSR:
    rowptr, sources = incoming_csr(graph.edge_index, graph.layout.nodes)
    return IncomingCSR(rowptr=rowptr, sources=sources)


def minibatch_bound(layout: GraphLayout, batch_size: int, fanouts: list[int]) -> GraphLayout:
    """An upper bound on a sampled batch's shapes: hop k adds at most ``frontier * fanouts[k]`` edges (and never
    more than the graph has) and at most as many new nodes (never more than the graph has)."""
    seeds = min(batch_size, layout.labelled)
    nodes, frontier, edges = seeds, seeds, 0
    for fanout in fanouts:
        hop_edges = min(frontier * fanout, layout.edges)
        edges += hop_edges
        frontier = min(hop_edges, layout.nodes - nodes)
        nodes += frontier
    return replace(layout, nodes=nodes, edges=edges, labelled=seeds, self_loops=0, source=layout.source + ":batch")


class NeighborSampler:
    """Pure-torch neighbour sampler (``gnnsched.portable.sampler.PortableSampler``, which the portable step runner uses
    too): batches of seed nodes expanded hop by hop through incoming edges, as ``Graph``s with their layout.

    The constructor allocates everything the sampler keeps for the whole job (the incoming-edge CSR and a
    global-to-local id map) with static shapes only, so the estimator can construct it on fake tensors and count it
    as resident memory; ``batches`` does the data-dependent sampling and only runs for real.
    """

    def __init__(self, graph: Graph, spec: GNNJobSpec) -> None:
        self.graph = graph
        self.batch_size = int(spec.batching.batch_size or graph.layout.nodes)
        self.fanouts = spec.fanouts
        self.core = PortableSampler(graph.x, graph.edge_index, graph.y, graph.target, graph.layout.nodes,
                                    self.batch_size, self.fanouts)

    @property
    def csr(self) -> IncomingCSR:
        return IncomingCSR(rowptr=self.core.rowptr, sources=self.core.sources)

    @property
    def position(self) -> torch.Tensor:
        return self.core.position

    def batches(self, seed: int = 0) -> Iterator[Graph]:
        """One pass over ``graph.target`` in shuffled batches (see ``sample_batches``)."""
        layout = self.graph.layout
        for b in self.core.batches(seed):
            yield Graph(x=b.x, edge_index=b.edge_index, y=b.y, target=b.target,
                        layout=replace(layout, nodes=b.nodes, edges=b.edges, labelled=b.labelled, self_loops=0,
                                       source=layout.source + ":batch"))
            del b


def sample_batches(graph: Graph, spec: GNNJobSpec, seed: int = 0) -> Iterator[Graph]:
    """One pass over ``graph.target`` in shuffled batches of ``spec.batching.batch_size`` seed nodes, each expanded
    by ``spec.fanouts`` hops of incoming neighbours (all of them when a node has at most ``fanout``, otherwise
    ``fanout`` drawn uniformly with replacement and de-duplicated). Each batch is a relabelled subgraph whose first
    ``len(seeds)`` nodes are the seeds (``target``), the loss/prediction nodes.
    """
    return NeighborSampler(graph, spec).batches(seed)
