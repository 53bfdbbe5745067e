"""PyG's own model classes and message-passing layers, by name: which a GNNJob may name, how its options are checked,
and how the model is built.

Why names and options, not a fixed zoo: a user's model is a PyG class with options (``GraphSAGE`` with
``aggr: max``, ``GAT`` with ``v2: true``, ``PNA`` with its aggregators) or a stack of some other layer, and its peak
memory differs from the nearest built-in arch by up to 9x. So the spec names the class the way the user builds it and
the estimator traces exactly that class, built by ``build_network`` here, which the worker runs too.

* ``spec.model.pyg``: a class of ``torch_geometric.nn.models`` whose constructor starts with ``(in_channels,
  hidden_channels, num_layers, out_channels)`` (every ``BasicGNN`` of the installed PyG: GCN, GraphSAGE, GIN, GAT,
  PNA, EdgeCNN, and any such class a later PyG adds). ``hidden`` and ``layers`` are the class's ``hidden_channels``
  and ``num_layers``, ``out_channels`` is the graph's classes, ``dropout`` is ``spec.model.dropout``, and
  ``options`` are the remaining keyword arguments, as YAML.
* ``spec.model.conv``: a class of ``torch_geometric.nn.conv`` whose constructor starts with ``(in_channels,
  out_channels)``, stacked ``layers`` times at width ``hidden`` by PyG's own ``BasicGNN`` (so activation, dropout,
  normalisation and jumping knowledge are applied exactly as PyG applies them; ``act``, ``norm``, ``jk`` ... are
  options). Layers with attention heads that concatenate them (``heads`` and ``concat`` in their signature) get
  ``hidden / heads`` channels per head in hidden layers and no concatenation in the output layer, as PyG's ``GAT``
  does.

Arguments that depend on the graph are computed from the job's graph, as the user's code would compute them: PNA's
``deg`` is the in-degree histogram (``degree_histogram``). Options are checked against the constructors' signatures
(unknown names, values of the wrong type, arguments YAML cannot give such as a module or a tensor, layers whose
``forward`` needs edge features), then by building the model on the meta device, so a value PyG itself refuses
(``aggr: avg``) is reported before any pod exists. Every error is a ``SpecError`` naming the field.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable
from functools import cache
from typing import Any

import torch

from gnnsched.spec import GNNJobSpec, SpecError

SET_BY_SPEC = {
    "in_channels": "the graph's features",
    "hidden_channels": "spec.model.hidden",
    "num_layers": "spec.model.layers",
    "out_channels": "the graph's classes",
    "dropout": "spec.model.dropout",
}
"""Constructor arguments the spec already sets; an option may not set them a second time."""
FROM_GRAPH = {"deg": "the in-degree histogram of the job's graph"}
"""Constructor arguments computed from the job's graph (``graph_arguments``)."""
BASIC_GNN_EXTRAS = {"GAT": {"v2": bool, "heads": int, "concat": bool}}
"""Keyword arguments a model class's ``init_conv`` takes for itself before passing the rest to its layer."""
LAYER_INPUTS = ("x", "edge_index")
"""What a GNNJob's graph gives a layer's ``forward``: node features and edges, nothing per edge."""


def _torch_geometric() -> Any:
    import torch_geometric.nn.conv
    import torch_geometric.nn.models

    return torch_geometric


@cache
def pyg_model_classes() -> dict[str, type]:
    """The classes ``spec.model.pyg`` may name: every class of ``torch_geometric.nn.models`` constructed as
    ``(in_channels, hidden_channels, num_layers, out_channels, **kwargs)``."""
    models = _torch_geometric().nn.models
    found: dict[str, type] = {}
    for name in getattr(models, "__all__", dir(models)):
        cls = getattr(models, name, None)
        if not (inspect.isclass(cls) and issubclass(cls, torch.nn.Module)):
            continue
        try:
            params = list(inspect.signature(cls.__init__).parameters)[1:5]
        except (TypeError, ValueError):
            continue
        if params == ["in_channels", "hidden_channels", "num_layers", "out_channels"]:
            found[name] = cls
    return found


@cache
def conv_classes() -> dict[str, type]:
    """The layers ``spec.model.conv`` may name: message-passing classes constructed as ``(in_channels,
    out_channels, ...)``."""
    pyg = _torch_geometric()
    conv = pyg.nn.conv
    found: dict[str, type] = {}
    for name in conv.__all__:
        cls = getattr(conv, name, None)
        if not (inspect.isclass(cls) and issubclass(cls, pyg.nn.conv.MessagePassing)):
            continue
        try:
            params = list(inspect.signature(cls.__init__).parameters)[1:3]
        except (TypeError, ValueError):
            continue
        if params == ["in_channels", "out_channels"]:
            found[name] = cls
    return found


def _closest(name: str, known: list[str]) -> str:
    import difflib

    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    if close:
        return f"; did you mean {close[0]!r}?"
    lowered = {k.lower(): k for k in known}
    if name.lower() in lowered:
        return f"; did you mean {lowered[name.lower()]!r}?"
    return f"; known: {', '.join(sorted(known))}"


# --- option checking -----------------------------------------------------------------------------------------------


def _hints(func: Callable[..., Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(func)
    except Exception:  # forward references PyG never resolves: fall back to the raw annotations
        return dict(getattr(func, "__annotations__", {}))


def _init_parameters(cls: type) -> dict[str, tuple[inspect.Parameter, Any]]:
    """Every named constructor parameter along the class's bases up to ``torch.nn.Module``, with its type hint (a
    class passing ``**kwargs`` to its base accepts the base's parameters too)."""
    found: dict[str, tuple[inspect.Parameter, Any]] = {}
    for klass in cls.__mro__:
        if klass is torch.nn.Module or klass is object or "__init__" not in vars(klass):
            continue
        init = vars(klass)["__init__"]
        hints = _hints(init)
        params = inspect.signature(init).parameters
        for name, param in params.items():
            if name == "self" or param.kind in (param.VAR_KEYWORD, param.VAR_POSITIONAL):
                continue
            found.setdefault(name, (param, hints.get(name, param.annotation)))
        if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
            break
    return found


_JSON_TYPES = (bool, int, float, str, list, dict, type(None))


def _accepts(hint: Any, value: Any) -> bool | None:
    """Whether ``value`` (a YAML value) fits the annotation: True, False, or None when the annotation admits no YAML
    value at all (a module, a tensor, a function)."""
    if hint is inspect.Parameter.empty or hint is Any:
        return True
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        answers = [_accepts(arg, value) for arg in typing.get_args(hint)]
        if any(a is True for a in answers):
            return True
        return False if any(a is False for a in answers) else None
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if origin in (list, tuple) or hint in (list, tuple):
        if not isinstance(value, list):
            return False
        args = typing.get_args(hint)
        item = args[0] if args and (origin is list or (len(args) == 2 and args[1] is Ellipsis)) else None
        if origin is tuple and args and args[-1] is not Ellipsis:
            return len(value) == len(args) and all(_accepts(a, v) is True for a, v in zip(args, value, strict=True))
        return item is None or all(_accepts(item, v) is True for v in value)
    if origin is dict or hint is dict:
        return isinstance(value, dict)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    return None  # a class YAML cannot build (Aggregation, Tensor, Callable, Module)


def _describe(hint: Any) -> str:
    text = getattr(hint, "__name__", None) if not typing.get_args(hint) else None
    return text or str(hint).replace("typing.", "")


def _check_option(field: str, value: Any, hint: Any) -> None:
    fits = _accepts(hint, value)
    if fits is True:
        return
    if fits is None:
        raise SpecError(field, f"takes a {_describe(hint)}, which YAML cannot give")
    raise SpecError(field, f"must be {_describe(hint)}, got {value!r}")


def _conv_of(pyg_class: type) -> type | None:
    """The layer class a BasicGNN builds (read off a one-layer model built on the meta device), for its options."""
    return _layer_class_cache().get(pyg_class)


@cache
def _layer_class_cache() -> dict[type, type]:
    pyg = _torch_geometric()
    found: dict[type, type] = {}
    for cls in pyg_model_classes().values():
        kwargs = _required_defaults(cls)
        try:
            with torch.device("meta"):
                model = cls(4, 4, 1, 2, **kwargs)
        except Exception:
            continue
        convs = getattr(model, "convs", None)
        if convs is not None and len(convs) and isinstance(convs[0], pyg.nn.conv.MessagePassing):
            found[cls] = type(convs[0])
    return found


def _required_defaults(cls: type) -> dict[str, Any]:
    """Placeholder values for the constructor arguments a class cannot be built without (PNA's aggregators,
    scalers and degree histogram), only to look at what it builds."""
    if cls.__name__ == "PNA":
        return {"aggregators": ["mean"], "scalers": ["identity"], "deg": torch.tensor([0, 1], device="cpu")}
    return {}


def _allowed_options(spec: GNNJobSpec) -> tuple[str, dict[str, tuple[inspect.Parameter | None, Any]], list[str]]:
    """(what the options configure, {option: (parameter, hint)}, required options) for the spec's class."""
    from torch_geometric.nn.models.basic_gnn import BasicGNN

    model = spec.model
    allowed: dict[str, tuple[inspect.Parameter | None, Any]] = {}
    layer: type | None
    if model.pyg is not None:
        cls = pyg_model_classes()[model.pyg]
        what = f"torch_geometric.nn.models.{model.pyg}"
        allowed.update(_init_parameters(cls))
        for name, hint in BASIC_GNN_EXTRAS.get(model.pyg, {}).items():
            allowed[name] = (None, hint)
        layer = _conv_of(cls) if issubclass(cls, BasicGNN) else None
        if model.pyg == "GAT":
            from torch_geometric.nn import GATv2Conv

            allowed.update({k: v for k, v in _init_parameters(GATv2Conv).items() if k not in allowed})
    else:
        assert model.conv is not None
        layer = conv_classes()[model.conv]
        what = f"torch_geometric.nn.conv.{model.conv}"
        allowed.update({k: v for k, v in _init_parameters(BasicGNN).items()})
    required: list[str] = []
    # a model class's init_conv builds what its layer needs beyond in/out (GIN's and EdgeCNN's MLP): not options
    supplied = ("in_channels", "out_channels") + (("nn",) if model.pyg is not None else ())
    if layer is not None:
        for name, (param, hint) in _init_parameters(layer).items():
            allowed.setdefault(name, (param, hint))
            if param.default is inspect.Parameter.empty and name not in supplied:
                required.append(name)
    return what, allowed, required


def check_model(spec: GNNJobSpec) -> None:
    """Raise ``SpecError`` naming the field when the spec's PyG class, layer or options cannot be built by the
    installed PyG (arch and entrypoint specs pass: the arch is a closed set, an entrypoint is the user's code, checked
    where it runs)."""
    model = spec.model
    if model.pyg is not None and model.pyg not in pyg_model_classes():
        raise SpecError(
            "spec.model.pyg",
            f"{model.pyg!r} is not a model class of torch_geometric.nn.models taking (in_channels, hidden_channels, "
            f"num_layers, out_channels){_closest(model.pyg, list(pyg_model_classes()))}",
        )
    if model.conv is not None:
        if model.conv not in conv_classes():
            from torch_geometric.nn import conv as pyg_conv

            why = (
                "is not constructed as (in_channels, out_channels, ...), so it cannot be stacked at width hidden"
                if model.conv in getattr(pyg_conv, "__all__", ())
                else "is not a layer of torch_geometric.nn.conv"
            )
            raise SpecError("spec.model.conv", f"{model.conv!r} {why}{_closest(model.conv, list(conv_classes()))}")
        _check_layer_inputs(model.conv, conv_classes()[model.conv])
    if model.pyg is None and model.conv is None:
        return
    what, allowed, required = _allowed_options(spec)
    options = dict(model.options or {})
    for name, value in options.items():
        field = f"spec.model.options.{name}"
        if name in SET_BY_SPEC:
            raise SpecError(field, f"is set by {SET_BY_SPEC[name]}; remove it from options")
        if name in FROM_GRAPH:
            raise SpecError(field, f"is computed by gnnsched from {FROM_GRAPH[name]}; remove it from options")
        if name not in allowed:
            known = [k for k in allowed if k not in SET_BY_SPEC]
            raise SpecError(field, f"unknown option of {what}{_closest(name, known)}")
        _check_option(field, value, allowed[name][1])
    for name in required:
        if name not in options and name not in FROM_GRAPH:
            hint = allowed[name][1]
            if _accepts(hint, None) is None and _accepts(hint, "") is None and _accepts(hint, 0) is None:
                raise SpecError(f"spec.model.{model.kind}",
                                f"{what} needs {name} (a {_describe(hint)}), which YAML options cannot give")
            raise SpecError(f"spec.model.options.{name}", f"required by {what}")
    try:
        with torch.device("meta"):
            trial = build_network(spec, 4, 2, lambda: torch.tensor([0, 1], device="cpu"))
    except SpecError:
        raise
    except Exception as exc:  # PyG refusing a value (an unknown aggregation name, heads not dividing hidden)
        raise SpecError("spec.model.options", f"{what} refused them: {type(exc).__name__}: {exc}") from None
    recurrent = sorted({type(m).__name__ for m in trial.modules() if isinstance(m, torch.nn.RNNBase)})
    if recurrent:
        field = "spec.model.options.jk" if options.get("jk") == "lstm" else "spec.model.options"
        raise SpecError(
            field,
            f"build a recurrent layer ({', '.join(recurrent)}): PyTorch runs it as one fused kernel (oneDNN on CPU, "
            f"cuDNN on a GPU) whose workspace no trace sees, so its peak cannot be predicted; use jk cat, max or "
            f"last, or give spec.resources.gpuMemory with an entrypoint",
        )


def _check_layer_inputs(name: str, cls: Any) -> None:
    """A layer whose ``forward`` needs more than node features and edges (edge features, positions, edge types)
    cannot run on a GNNJob's graph."""
    params = inspect.signature(cls.forward).parameters
    needed = [
        p for p in list(params)[1:]
        if params[p].default is inspect.Parameter.empty
        and params[p].kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        and p not in LAYER_INPUTS
    ]
    if needed:
        raise SpecError(
            "spec.model.conv",
            f"{name}.forward needs {', '.join(needed)}, which a GNNJob's graph does not have (it gives node features "
            f"and edges only)",
        )


# --- building ------------------------------------------------------------------------------------------------------


def graph_arguments(cls: type, degree_histogram: Callable[[], torch.Tensor]) -> dict[str, Any]:
    """The constructor arguments computed from the job's graph that ``cls`` (or the layer it builds) takes."""
    names = set(_init_parameters(cls))
    layer = _conv_of(cls)
    if layer is not None:
        names |= set(_init_parameters(layer))
    return {"deg": degree_histogram()} if "deg" in names else {}


@cache
def _stack_class(layer: Any) -> type:
    """A ``BasicGNN`` whose layers are ``layer`` (one class per layer type, made once)."""
    from torch_geometric.nn.models.basic_gnn import BasicGNN

    params = inspect.signature(layer.__init__).parameters
    splits_heads = "heads" in params and "concat" in params

    def init_conv(self: Any, in_channels: int, out_channels: int, **kwargs: Any) -> Any:
        if splits_heads:
            heads = kwargs.get("heads", params["heads"].default)
            concat = kwargs.pop("concat", params["concat"].default)
            if getattr(self, "_is_conv_to_out", False):
                concat = False
            if concat:
                if out_channels % heads:
                    raise SpecError(
                        "spec.model.hidden",
                        f"{out_channels} is not divisible by options.heads {heads} (each head gets hidden / heads "
                        f"channels when the heads are concatenated)",
                    )
                out_channels //= heads
            kwargs["concat"] = concat
        return layer(in_channels, out_channels, **kwargs)

    return type(
        f"{layer.__name__}Stack",
        (BasicGNN,),
        {
            "init_conv": init_conv,
            "supports_edge_weight": False,
            "supports_edge_attr": False,
            "__module__": __name__,
            "__doc__": f"``{layer.__name__}`` stacked by PyG's BasicGNN (``spec.model.conv``).",
        },
    )


def build_network(
    spec: GNNJobSpec, features: int, classes: int, degree_histogram: Callable[[], torch.Tensor]
) -> torch.nn.Module:
    """The spec's PyG model class or layer stack with its options (no optimizer; ``gnnsched.models.build_model``
    attaches it). ``degree_histogram`` gives the graph's in-degree histogram when the class needs one."""
    model = spec.model
    options = dict(model.options or {})
    if model.pyg is not None:
        cls = named = pyg_model_classes()[model.pyg]
    elif model.conv is not None:
        named = conv_classes()[model.conv]
        cls = _stack_class(named)
    else:
        raise ValueError(f"build_network: spec.model.{model.kind} is not a PyG class")
    extra = graph_arguments(named, degree_histogram)
    network: torch.nn.Module = cls(features, model.hidden, model.layers, classes, dropout=model.dropout, **options,
                                   **extra)
    return network


def degree_histogram(edge_index: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """The in-degree histogram of a graph (entry d counts the nodes with d incoming edges), as PyG's PNA example
    computes it for ``deg``."""
    counts = torch.zeros(num_nodes, dtype=torch.long, device=edge_index.device)
    counts.scatter_add_(0, edge_index[1], torch.ones_like(edge_index[1]))
    return torch.bincount(counts).cpu()


def typical_degree_histogram(nodes: int, edges: int) -> torch.Tensor:
    """A histogram with the graph's mean in-degree, for building a model without its data (the estimator): PNA
    turns ``deg`` into two scalars, so the histogram changes values, never a tensor's size."""
    mean = max(1, round(edges / max(nodes, 1)))
    histogram = torch.zeros(mean + 1, dtype=torch.long, device="cpu")
    histogram[mean] = nodes
    return histogram


__all__ = [
    "build_network",
    "check_model",
    "conv_classes",
    "degree_histogram",
    "graph_arguments",
    "pyg_model_classes",
    "typical_degree_histogram",
]
