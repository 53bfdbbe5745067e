"""Any PyG model, predicted exactly: model classes by name, layer stacks, optimizers and the user's own entrypoint.

Each model is estimated on data-less tensors and run for real on CPU under torch.profiler; the estimate must be the
measured peak of live bytes within 1 %. The built model must have exactly the parameters of the PyG class built
directly with the same arguments, so no option is silently dropped. Bad names and options fail with one error naming
the field.
"""

from __future__ import annotations

import sys
import textwrap
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from gnnsched.cli import app
from gnnsched.estimator import UntraceableModel, estimate
from gnnsched.model_catalog import check_model, conv_classes, pyg_model_classes, typical_degree_histogram
from gnnsched.models import build_model, make_graph
from gnnsched.spec import SpecError, parse_spec
from gnnsched.worker import measure_step_peak_cpu

pytestmark = pytest.mark.usefixtures("one_torch_thread")

GRAPH = {"nodes": 600, "edges": 4_800, "features": 24, "classes": 5}
PNA_OPTIONS = {"aggregators": ["mean", "min", "max", "std"], "scalers": ["identity", "amplification", "attenuation"]}

MODEL_CLASSES = [
    {"pyg": "GCN", "layers": 3, "hidden": 32},
    {"pyg": "GraphSAGE", "layers": 3, "hidden": 32, "options": {"aggr": "max"}},
    {"pyg": "GIN", "layers": 3, "hidden": 32, "options": {"jk": "cat", "norm": "batch_norm"}},
    {"pyg": "GAT", "layers": 2, "hidden": 32, "options": {"heads": 4, "v2": True}},
    {"pyg": "PNA", "layers": 3, "hidden": 32, "options": PNA_OPTIONS},
    {"pyg": "EdgeCNN", "layers": 2, "hidden": 32},
]
LAYERS = [
    {"conv": "TransformerConv", "layers": 2, "hidden": 32, "options": {"heads": 4}},
    {"conv": "GATv2Conv", "layers": 2, "hidden": 32, "options": {"heads": 4}},
    {"conv": "GENConv", "layers": 3, "hidden": 32, "options": {"aggr": "softmax", "learn_t": True}},
    {"conv": "ResGatedGraphConv", "layers": 3, "hidden": 32},
    {"conv": "GraphConv", "layers": 3, "hidden": 32, "options": {"aggr": "max", "norm": "layer_norm"}},
    {"conv": "SGConv", "layers": 2, "hidden": 32, "options": {"K": 2, "act": "elu"}},
]


def _spec(model: dict, mode: str = "train", **extra):
    return parse_spec({"mode": mode, "model": model, "graph": GRAPH, **extra})


def _name(model: dict) -> str:
    return f"{model.get('pyg') or model.get('conv')}-{'-'.join(f'{k}' for k in (model.get('options') or {}))}"


@pytest.mark.parametrize("mode", ["train", "infer"])
@pytest.mark.parametrize("model", MODEL_CLASSES + LAYERS, ids=_name)
def test_estimate_is_the_measured_peak(model, mode):
    spec = _spec(model, mode)
    predicted = estimate(spec).pmc_bytes
    measured = measure_step_peak_cpu(spec)
    assert predicted == pytest.approx(measured, rel=0.01), (predicted, measured)


@pytest.mark.parametrize("optimizer", [{"name": "sgd"}, {"name": "sgd", "momentum": 0.9}, {"name": "adamw"},
                                       {"name": "adam", "weightDecay": 0.0}])
def test_each_optimizer_is_predicted_exactly_and_holds_its_own_state(optimizer):
    spec = _spec({"pyg": "GraphSAGE", "layers": 2, "hidden": 32}, optimizer=optimizer)
    result = estimate(spec)
    assert result.pmc_bytes == pytest.approx(measure_step_peak_cpu(spec), rel=0.01)
    weights = result.breakdown["weights"]
    state = result.breakdown["optimizer_state"]
    if optimizer["name"] == "sgd" and "momentum" not in optimizer:
        assert state == 0  # plain SGD keeps nothing between steps
    elif optimizer["name"] == "sgd":
        assert state == weights  # one momentum buffer per weight
    else:
        assert state > 2 * weights  # two moments per weight and a step counter per tensor
    model = build_model(spec)
    expected = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}[optimizer["name"]]
    assert type(model.optimizer) is expected


@pytest.mark.parametrize("model", [{"pyg": "GraphSAGE", "layers": 2, "hidden": 32, "options": {"aggr": "max"}},
                                   {"conv": "TransformerConv", "layers": 2, "hidden": 32, "options": {"heads": 2}}],
                         ids=_name)
def test_minibatch_estimate_bounds_the_measured_peak(model):
    spec = _spec(model, batching={"mode": "minibatch", "batchSize": 64, "fanouts": [5, 4]})
    predicted = estimate(spec).pmc_bytes
    measured = measure_step_peak_cpu(spec)
    # the largest batch the sampler can produce is traced: an upper bound, not far above a real batch
    assert measured <= predicted <= measured * 2


@pytest.mark.parametrize("model", MODEL_CLASSES, ids=_name)
def test_a_model_class_has_the_parameters_of_the_pyg_class_built_directly(model):
    spec = _spec(model)
    options = dict(model.get("options") or {})
    if model["pyg"] == "PNA":
        options["deg"] = typical_degree_histogram(GRAPH["nodes"], GRAPH["edges"])
    direct = pyg_model_classes()[model["pyg"]](GRAPH["features"], model["hidden"], model["layers"],
                                               GRAPH["classes"], dropout=0.5, **options)
    built = build_model(spec)
    assert _count(built) == _count(direct)
    assert [type(c) for c in built.convs] == [type(c) for c in direct.convs]


def _count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_a_layer_stack_is_the_pyg_model_of_that_layer():
    """GATv2Conv stacked by conv is PyG's GAT(v2=True); GCNConv stacked is PyG's GCN: same parameters."""
    from torch_geometric.nn.models import GAT, GCN

    f, c = GRAPH["features"], GRAPH["classes"]
    stack = build_model(_spec({"conv": "GATv2Conv", "layers": 3, "hidden": 32, "options": {"heads": 4}}))
    assert _count(stack) == _count(GAT(f, 32, 3, c, v2=True, heads=4))
    stack = build_model(_spec({"conv": "GCNConv", "layers": 3, "hidden": 32, "options": {"jk": "cat"}}))
    assert _count(stack) == _count(GCN(f, 32, 3, c, jk="cat"))


def test_a_layer_stack_passes_every_option_to_every_layer():
    from torch_geometric.nn import TransformerConv

    model: Any = build_model(_spec({"conv": "TransformerConv", "layers": 3, "hidden": 32,
                               "options": {"heads": 4, "beta": True, "root_weight": True}}))
    layers = list(model.convs)
    assert all(isinstance(layer, TransformerConv) and layer.beta for layer in layers)
    direct = [TransformerConv(24, 8, heads=4, beta=True), TransformerConv(32, 8, heads=4, beta=True),
              TransformerConv(32, 5, heads=4, beta=True, concat=False)]
    assert [_count(a) for a in layers] == [_count(b) for b in direct]


def test_every_listed_class_and_layer_is_in_the_catalogue():
    assert {"GCN", "GraphSAGE", "GIN", "GAT", "PNA", "EdgeCNN"} <= set(pyg_model_classes())
    assert {"TransformerConv", "GATv2Conv", "GENConv", "ResGatedGraphConv", "GraphConv", "SGConv"} <= set(
        conv_classes())


def test_pna_takes_the_degree_histogram_of_the_job_s_graph():
    spec = _spec({"pyg": "PNA", "layers": 2, "hidden": 16, "options": PNA_OPTIONS})
    graph = make_graph(spec, seed=3)
    model = build_model(spec, graph=graph)
    aggr = model.convs[0].aggr_module
    in_degree = torch.zeros(GRAPH["nodes"]).scatter_add_(0, graph.edge_index[1], torch.ones(GRAPH["edges"]))
    assert aggr.init_avg_deg_lin == pytest.approx(float(in_degree.mean()))


BAD = [
    ({"pyg": "GraphSage", "layers": 2}, "spec.model.pyg", "did you mean 'GraphSAGE'"),
    ({"pyg": "MLP", "layers": 2}, "spec.model.pyg", "not a model class"),
    ({"conv": "TransformConv"}, "spec.model.conv", "did you mean 'TransformerConv'"),
    ({"conv": "GINConv"}, "spec.model.conv", "not constructed as (in_channels, out_channels"),
    ({"conv": "NNConv"}, "spec.model.conv", "needs nn (a Callable), which YAML options cannot give"),
    ({"pyg": "GAT", "options": {"heads": "four"}}, "spec.model.options.heads", "must be int"),
    ({"pyg": "GAT", "options": {"v2": 1}}, "spec.model.options.v2", "must be bool"),
    ({"pyg": "GraphSAGE", "options": {"agr": "max"}}, "spec.model.options.agr", "did you mean 'aggr'"),
    ({"pyg": "GraphSAGE", "options": {"aggr": "avg"}}, "spec.model.options", "refused them"),
    ({"pyg": "GCN", "options": {"hidden_channels": 8}}, "spec.model.options.hidden_channels", "spec.model.hidden"),
    ({"pyg": "GCN", "options": {"dropout": 0.1}}, "spec.model.options.dropout", "spec.model.dropout"),
    ({"pyg": "PNA", "options": {**PNA_OPTIONS, "deg": [1, 2]}}, "spec.model.options.deg", "computed by gnnsched"),
    ({"pyg": "PNA", "options": {"scalers": ["identity"]}}, "spec.model.options.aggregators", "required by"),
    ({"pyg": "GCN", "options": {"jk": "lstm"}}, "spec.model.options.jk", "recurrent layer"),
    ({"conv": "GATv2Conv", "hidden": 30, "options": {"heads": 4}}, "spec.model.hidden", "not divisible"),
    ({"pyg": "GCN", "options": {"norm_kwargs": [1]}}, "spec.model.options.norm_kwargs", "must be"),
]


@pytest.mark.parametrize("model,field,words", BAD, ids=[f"{b[1]}:{b[2]}" for b in BAD])
def test_bad_class_layer_or_option_names_the_field(model, field, words):
    with pytest.raises(SpecError) as caught:
        check_model(_spec({"layers": 2, "hidden": 32, **model}))
    assert caught.value.field == field, caught.value
    assert words in caught.value.message, caught.value


@pytest.mark.parametrize("model,message", [
    ({"arch": "gcn", "pyg": "GCN"}, "exactly one of arch, pyg, conv, entrypoint"),
    ({"hidden": 4}, "exactly one of"),
    ({"arch": "gcn", "options": {"aggr": "max"}}, "options: apply only to pyg and conv"),
    ({"pyg": "GAT", "heads": 4}, "heads: applies only to arch gat"),
    ({"entrypoint": "no colon here"}, "pattern"),
])
def test_the_spec_itself_refuses_ambiguous_models(model, message):
    with pytest.raises(SpecError) as caught:
        _spec(model)
    assert message in str(caught.value)


def test_optimizer_fields_are_checked():
    with pytest.raises(SpecError, match="momentum: applies only to sgd"):
        _spec({"arch": "gcn"}, optimizer={"name": "adam", "momentum": 0.9})
    with pytest.raises(SpecError, match=r"spec\.optimizer: applies only to mode train"):
        parse_spec({"mode": "infer", "model": {"arch": "gcn"}, "graph": GRAPH, "optimizer": {"name": "sgd"}})
    with pytest.raises(SpecError, match=r"spec\.optimizer\.name"):
        _spec({"arch": "gcn"}, optimizer={"name": "lbfgs"})


# --- the user's own code -------------------------------------------------------------------------------------------


@pytest.fixture
def user_package(tmp_path, monkeypatch):
    """A user's package on the import path, as it would be in their image."""
    pkg = tmp_path / "usergnn"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "models.py").write_text(textwrap.dedent("""
        import torch
        from torch_geometric.nn import GCNConv, SAGEConv

        class Net(torch.nn.Module):
            def __init__(self, dims, hidden=48):
                super().__init__()
                self.conv1 = SAGEConv(dims.num_features, hidden, aggr="max")
                self.norm = torch.nn.LayerNorm(hidden)
                self.conv2 = GCNConv(hidden, dims.num_classes)

            def forward(self, x, edge_index):
                x = torch.nn.functional.gelu(self.norm(self.conv1(x, edge_index)))
                return self.conv2(x, edge_index)

        def build(dims):
            return Net(dims)

        def not_a_model(dims):
            return "a string"

        def with_lstm(dims):
            return torch.nn.Sequential(torch.nn.LSTM(dims.num_features, 8))
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "usergnn.models"
    for name in [m for m in sys.modules if m.startswith("usergnn")]:
        del sys.modules[name]


@pytest.mark.parametrize("mode", ["train", "infer"])
def test_an_entrypoint_is_estimated_exactly(user_package, mode):
    spec = _spec({"entrypoint": f"{user_package}:build"}, mode)
    predicted = estimate(spec).pmc_bytes
    assert predicted == pytest.approx(measure_step_peak_cpu(spec), rel=0.01)


@pytest.mark.parametrize("entrypoint,words", [
    ("nosuchpackage.models:build", "cannot import 'nosuchpackage.models'"),
    ("usergnn.models:missing", "has no attribute 'missing'"),
    ("usergnn.models:not_a_model", "returned str, not a torch.nn.Module"),
])
def test_a_bad_entrypoint_names_the_field(user_package, entrypoint, words):
    with pytest.raises(SpecError) as caught:
        build_model(_spec({"entrypoint": entrypoint}))
    assert caught.value.field == "spec.model.entrypoint"
    assert words in caught.value.message


def test_a_layer_that_needs_edge_features_fails_naming_the_layer():
    spec = _spec({"conv": "GMMConv", "layers": 2, "hidden": 32, "options": {"dim": 2, "kernel_size": 2}})
    check_model(spec)  # its signature makes edge_attr optional; only running it shows the need
    with pytest.raises(SpecError) as caught:
        estimate(spec)
    assert caught.value.field == "spec.model.conv" and "no edge features" in caught.value.message


def test_a_recurrent_entrypoint_is_refused_as_untraceable(user_package):
    with pytest.raises(UntraceableModel, match="LSTM"):
        estimate(_spec({"entrypoint": f"{user_package}:with_lstm"}))


def test_cli_estimate_reports_a_bad_option_in_one_line(tmp_path):
    manifest = tmp_path / "job.yaml"
    manifest.write_text(textwrap.dedent("""
        apiVersion: gnnsched.io/v1alpha1
        kind: GNNJob
        metadata: {name: typo}
        spec:
          mode: train
          model: {pyg: GraphSAGE, layers: 2, hidden: 32, options: {agr: max}}
          graph: {dataset: cora}
    """))
    result = CliRunner().invoke(app, ["estimate", str(manifest)])
    assert result.exit_code == 2
    assert "spec.model.options.agr" in result.output and "did you mean 'aggr'" in result.output


def test_cli_estimate_of_an_entrypoint(user_package, tmp_path):
    manifest = tmp_path / "job.yaml"
    manifest.write_text(textwrap.dedent(f"""
        apiVersion: gnnsched.io/v1alpha1
        kind: GNNJob
        metadata: {{name: mine}}
        spec:
          mode: train
          model: {{entrypoint: "{user_package}:build"}}
          graph: {{nodes: 600, edges: 4800, features: 24, classes: 5}}
    """))
    result = CliRunner().invoke(app, ["estimate", str(manifest), "--json"])
    assert result.exit_code == 0, result.output
    assert f'"pmc_bytes": {estimate(_spec({"entrypoint": f"{user_package}:build"})).pmc_bytes}' in result.output
