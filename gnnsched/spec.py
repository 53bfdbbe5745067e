"""The GNNJob resource as Python types: what users write, what the operator reports, and one error type for both.

The CRD in ``crds/gnnjob.yaml`` and these models must accept and reject the same manifests (``tests/test_spec.py``
checks both on ``examples/`` and on a set of bad manifests). Bounds live in ``LIMITS`` so the test can compare them
with the CRD's ``minimum``/``maximum``. Cross-field rules (exactly one way to name the graph, heads only for GAT,
train-only and infer-only fields) are CEL rules in the CRD and validators here, with the same wording.

Every error is a ``SpecError`` that names the field as the user wrote it (``spec.model.layers``), so the CLI can
print one line and exit 2 and the operator can put the same line in a status condition.
"""

from __future__ import annotations

import contextlib
import re
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from gnnsched.attempts.checkpointing import CheckpointSpec
from gnnsched.attempts.failure_policy import FailurePolicy
from gnnsched.contract import API_VERSION, GNNJOB_KIND
from gnnsched.datasets import dataset_names, get_dataset
from gnnsched.errors import FieldError
from gnnsched.quantity import QuantityError, parse_bytes, parse_cpu

Arch = Literal["gcn", "sage", "gin", "gat"]
Mode = Literal["train", "infer"]
Phase = Literal["Pending", "Estimated", "Scheduled", "Queued", "Running", "Succeeded", "Failed", "Unschedulable"]

LIMITS: dict[str, tuple[float, float]] = {
    # field path: (minimum, maximum), inclusive; the CRD carries the same numbers.
    "spec.model.layers": (1, 16),
    "spec.model.hidden": (1, 16384),
    "spec.model.heads": (1, 64),
    "spec.graph.nodes": (1, 10_000_000_000),
    "spec.graph.edges": (0, 100_000_000_000),
    "spec.graph.features": (1, 1_000_000),
    "spec.graph.classes": (2, 100_000),
    "spec.epochs": (1, 1_000_000),
    "spec.requests": (1, 1_000_000_000),
    "spec.parallelism": (1, 64),
    "spec.batching.batchSize": (1, 10_000_000),
    "spec.batching.fanouts[]": (1, 1000),
    "spec.backoffLimit": (0, 10),
    "spec.memory.maxResizes": (0, 10),  # gnnsched.closed_loop.MAX_RESIZES_LIMIT
}
DEFAULT_EPOCHS = 200
DEFAULT_REQUESTS = 100
DEFAULT_FANOUT = 10
DEFAULT_THETA = 0.05


class SpecError(FieldError):
    """A manifest that cannot be a GNNJob. ``field`` is the dotted path as written in YAML (``spec.model.layers``)."""


def _integral(value: Any) -> Any:
    """Accept ``5.0`` for an integer field, as the API server's JSON decoding does; everything else stays strict."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


Int = Annotated[int, BeforeValidator(_integral)]


def _bounded(path: str, **kwargs: Any) -> Any:
    low, high = LIMITS[path]
    return Field(ge=low, le=high, **kwargs)


DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
"""A Kubernetes object name such as a PriorityClass's (RFC 1123 subdomain)."""


class _Spec(BaseModel):
    """Spec models: camelCase in YAML, snake_case in Python, unknown keys rejected (typos must not pass silently).

    Strict types, so that ``layers: "3"`` or ``enabled: "yes"`` is rejected here exactly as the API server rejects it.
    """

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True, strict=True
    )


ENTRYPOINT = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
"""``package.module:function``: the user's model factory, imported in the user's image (see ``gnnsched.portable``)."""
MODEL_KINDS = ("arch", "pyg", "conv", "entrypoint")
"""The four ways to name a model; a spec names exactly one."""


class ModelSpec(_Spec):
    """The model, named one of four ways (exactly one):

    * ``arch``: one of the four built-in layer stacks (a shorthand kept from the first release);
    * ``pyg``: a class of ``torch_geometric.nn.models`` taking ``(in_channels, hidden_channels, num_layers,
      out_channels, **kwargs)``, built with ``options`` as its keyword arguments;
    * ``conv``: a class of ``torch_geometric.nn.conv`` stacked ``layers`` times at width ``hidden`` the way PyG's
      ``BasicGNN`` stacks its layers (``options`` holds the layer's keyword arguments and BasicGNN's own: ``act``,
      ``norm``, ``jk``, ...);
    * ``entrypoint``: the user's own function in their image (``gnnsched.portable.step`` states its contract).

    Which class names and options exist depends on the installed PyG, so they are checked against it by
    ``gnnsched.model_catalog.check_model`` (CLI and operator), not here: the CRD cannot know them either, and the
    two validators must accept the same manifests.
    """

    arch: Arch | None = None
    pyg: str | None = Field(default=None, min_length=1, max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    conv: str | None = Field(default=None, min_length=1, max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    entrypoint: str | None = Field(default=None, max_length=512, pattern=ENTRYPOINT)
    layers: Int = _bounded("spec.model.layers", default=2)
    hidden: Int = _bounded("spec.model.hidden", default=64)
    heads: Int | None = _bounded("spec.model.heads", default=None)
    dropout: float = Field(default=0.5, ge=0.0, lt=1.0)
    options: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _one_model(self) -> ModelSpec:
        named = [k for k in MODEL_KINDS if getattr(self, k) is not None]
        if len(named) != 1:
            raise ValueError(
                "give exactly one of arch, pyg, conv, entrypoint"
                + (f" (got {', '.join(named)})" if named else " (arch gcn|sage|gin|gat, a PyG model class, a conv "
                   "layer class, or package.module:function)")
            )
        if self.arch == "gat" and self.heads is None:
            raise ValueError("heads: required when arch is gat (attention heads per layer, 1-64)")
        if self.arch != "gat" and self.heads is not None:
            where = f"arch {self.arch}" if self.arch else named[0]
            raise ValueError(f"heads: applies only to arch gat, not {where} (for pyg and conv give options.heads)")
        if self.options is not None and self.pyg is None and self.conv is None:
            raise ValueError(f"options: apply only to pyg and conv, not {named[0]}")
        return self

    @property
    def kind(self) -> str:
        """Which of ``MODEL_KINDS`` names the model."""
        return next(k for k in MODEL_KINDS if getattr(self, k) is not None)

    @property
    def model_class(self) -> str:
        """The model's class for grouping jobs (calibration classes, the runtime prior, logs): the arch,
        ``pyg-<Class>``, ``conv-<Layer>`` or ``entrypoint-<package-module-function>``. Options do not split a class.
        Letters, digits and dashes only, so it can sit in a dotted calibration key and a ConfigMap key."""
        if self.arch is not None:
            return self.arch
        name = self.pyg or self.conv or self.entrypoint or ""
        text = re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-")[:120]
        return f"{self.kind}-{text}"


class OptimizerSpec(_Spec):
    """The training step's optimizer. Each one holds different state (Adam and AdamW two moments per weight, SGD
    with momentum one buffer, plain SGD none), which is part of the peak."""

    name: Literal["adam", "adamw", "sgd"] = "adam"
    learning_rate: float = Field(default=0.01, gt=0.0, le=10.0)
    weight_decay: float = Field(default=5e-4, ge=0.0, le=1.0)
    momentum: float | None = Field(default=None, ge=0.0, lt=1.0)

    @model_validator(mode="after")
    def _momentum_only_for_sgd(self) -> OptimizerSpec:
        if self.momentum is not None and self.name != "sgd":
            raise ValueError(f"momentum: applies only to sgd, not {self.name}")
        return self


class GraphDims(BaseModel):
    """A graph's dimensions, resolved from a named dataset or given directly."""

    model_config = ConfigDict(frozen=True)

    nodes: int
    edges: int
    features: int
    classes: int
    dataset: str | None = None


class GraphSpec(_Spec):
    dataset: str | None = None
    nodes: Int | None = _bounded("spec.graph.nodes", default=None)
    edges: Int | None = _bounded("spec.graph.edges", default=None)
    features: Int | None = _bounded("spec.graph.features", default=None)
    classes: Int | None = _bounded("spec.graph.classes", default=None)

    @field_validator("dataset")
    @classmethod
    def _known_dataset(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if value in dataset_names():
            return value
        try:
            hint = f"; did you mean {get_dataset(value).name!r}?"
        except KeyError:
            hint = f"; known: {', '.join(dataset_names())}"
        raise ValueError(f"unknown dataset {value!r}{hint}")

    @model_validator(mode="after")
    def _one_way_to_name_the_graph(self) -> GraphSpec:
        dims = {"nodes": self.nodes, "edges": self.edges, "features": self.features, "classes": self.classes}
        given = [k for k, v in dims.items() if v is not None]
        if self.dataset is not None and given:
            raise ValueError(
                f"give either dataset or nodes/edges/features/classes, not both (also got {', '.join(given)})"
            )
        if self.dataset is None:
            missing = [k for k, v in dims.items() if v is None]
            if missing:
                raise ValueError(
                    f"{missing[0]}: required unless dataset is given (missing: {', '.join(missing)})"
                    if given
                    else "required: either dataset or all of nodes, edges, features, classes"
                )
            if self.edges > self.nodes * self.nodes:  # type: ignore[operator]
                raise ValueError(f"edges: {self.edges} exceeds nodes² ({self.nodes}²); not a simple graph")
        return self

    def resolve(self) -> GraphDims:
        """The graph's dimensions, whichever way the spec named it."""
        if self.dataset is not None:
            d = get_dataset(self.dataset)
            return GraphDims(nodes=d.nodes, edges=d.edges, features=d.features, classes=d.classes, dataset=d.name)
        return GraphDims(nodes=self.nodes, edges=self.edges, features=self.features, classes=self.classes)


class BatchingSpec(_Spec):
    mode: Literal["full", "minibatch"] = "full"
    batch_size: Int | None = _bounded("spec.batching.batchSize", default=None)
    fanouts: list[Int] | None = None

    @field_validator("fanouts")
    @classmethod
    def _fanouts_in_range(cls, value: list[int] | None) -> list[int] | None:
        if value is None:
            return None
        low, high = LIMITS["spec.batching.fanouts[]"]
        if not value:
            raise ValueError("must list one fanout per layer")
        for i, fanout in enumerate(value):
            if not low <= fanout <= high:
                raise ValueError(f"fanouts[{i}]: {fanout} is outside {int(low)}-{int(high)}")
        return value

    @model_validator(mode="after")
    def _minibatch_needs_batch_size(self) -> BatchingSpec:
        if self.mode == "minibatch" and self.batch_size is None:
            raise ValueError("batchSize: required when mode is minibatch")
        if self.mode == "full" and (self.batch_size is not None or self.fanouts is not None):
            raise ValueError("batchSize and fanouts apply only to mode minibatch")
        return self


class ResourcesSpec(_Spec):
    """CPU and host memory as the user requests them (Kubernetes quantities)."""

    cpu: str | None = Field(default=None, max_length=64)
    memory: str | None = Field(default=None, max_length=64)
    gpu_memory: str | None = Field(default=None, max_length=64)
    """GPU memory the job reserves on one GPU, replacing the prediction (the estimate is still made and recorded).
    For a custom script the estimator cannot see into, or to pin a reservation the user has measured."""

    @field_validator("cpu", "memory", "gpu_memory", mode="before")
    @classmethod
    def _quantity(cls, value: Any) -> str | None:
        if value is None:
            return None
        if isinstance(value, bool):
            raise ValueError(f"{value!r} is not a Kubernetes quantity")
        text = str(value)
        try:
            amount = parse_cpu(text)
        except QuantityError as exc:
            raise ValueError(str(exc)) from None
        if amount <= 0:
            raise ValueError(f"{text!r} must be positive")
        return text

    def cpu_cores(self) -> float | None:
        return None if self.cpu is None else parse_cpu(self.cpu)

    def memory_bytes(self) -> int | None:
        return None if self.memory is None else parse_bytes(self.memory)

    def gpu_memory_bytes(self) -> int | None:
        return None if self.gpu_memory is None else parse_bytes(self.gpu_memory)


class MemorySpec(_Spec):
    """The closed memory loop's per-job bound (``gnnsched.closed_loop``): how many times an attempt that ran out of
    its GPU memory reservation is retried larger. Resizes do not use ``backoffLimit``."""

    max_resizes: Int = _bounded("spec.memory.maxResizes", default=3)


class ScalingSpec(_Spec):
    """Adaptive resource scaling (seed 004): shrink over-requested CPU/memory while predicted runtime barely changes."""

    enabled: bool = True
    theta: float = Field(default=DEFAULT_THETA, gt=0.0, le=0.5)


LABEL_KEY = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
"""A label key or taint key: an optional DNS-subdomain prefix and ``/``, then a name of at most 63 characters."""
LABEL_VALUE = r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$"


class Toleration(_Spec):
    """A pod toleration (``core/v1 Toleration``), checked by the API server's rules so a bad one is reported on the
    GNNJob (or on the operator's flag) instead of as a pod the API server refuses to create."""

    key: str | None = Field(default=None, max_length=316, pattern=LABEL_KEY)
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str | None = Field(default=None, max_length=63, pattern=LABEL_VALUE)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute", ""] | None = None
    toleration_seconds: Int | None = None

    @model_validator(mode="after")
    def _kubernetes_rules(self) -> Toleration:
        if not self.key and self.operator != "Exists":
            raise ValueError("operator: must be Exists when key is empty (it then tolerates every taint)")
        if self.operator == "Exists" and self.value:
            raise ValueError("value: must be empty when operator is Exists")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("tolerationSeconds: applies only to effect NoExecute")
        return self

    def wire(self) -> dict[str, Any]:
        """The toleration as it goes into a pod spec (camelCase, unset fields left out)."""
        return self.model_dump(by_alias=True, exclude_none=True)


def _node_selector(value: Any) -> Any:
    """``spec.nodeSelector``: label keys to label values, as the API server accepts them."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError("must be a map of node label keys to values")
    for key, item in value.items():
        if not isinstance(key, str) or len(key) > 316 or not re.match(LABEL_KEY, key):
            raise ValueError(f"{key!r} is not a valid label key")
        if not isinstance(item, str) or len(item) > 63 or not re.match(LABEL_VALUE, item):
            raise ValueError(f"{key}: {item!r} is not a valid label value")
    return value


NodeSelector = Annotated[dict[str, str], BeforeValidator(_node_selector)]


class GNNJobSpec(_Spec):
    mode: Mode
    model: ModelSpec
    graph: GraphSpec
    epochs: Int | None = _bounded("spec.epochs", default=None)
    requests: Int | None = _bounded("spec.requests", default=None)
    batching: BatchingSpec = Field(default_factory=BatchingSpec)
    qos_target_seconds: float | None = Field(default=None, gt=0, le=30 * 86400)
    parallelism: Int = _bounded("spec.parallelism", default=1)
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    scaling: ScalingSpec = Field(default_factory=ScalingSpec)
    memory: MemorySpec = Field(default_factory=MemorySpec)
    image: str | None = Field(default=None, min_length=1, max_length=512)
    command: list[str] | None = None
    args: list[str] | None = None
    backoff_limit: Int = _bounded("spec.backoffLimit", default=0)
    optimizer: OptimizerSpec | None = None
    # A PriorityClass the user picks for the job's pods; wins over the operator's runtime-bucket class
    # (gnnsched.queue_order). It must exist: the API server rejects a pod that names a missing class.
    priority_class_name: str | None = Field(default=None, min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)
    # Scheduling constraints of the job's pods, added to the operator's own (``--tolerations``, ``--node-selector``):
    # a job may narrow where it runs (a GPU model's node pool), never widen what the administrator set.
    tolerations: list[Toleration] | None = Field(default=None, max_length=32)
    node_selector: NodeSelector | None = None
    # Checkpoint and resume, and the failure rules (gnnsched.attempts: checkpointing, failure_policy).
    checkpoint: CheckpointSpec | None = None
    failure_policy: FailurePolicy = Field(default_factory=FailurePolicy)

    @model_validator(mode="after")
    def _mode_fields(self) -> GNNJobSpec:
        if self.mode == "train":
            for name, alias in (("requests", "requests"), ("qos_target_seconds", "qosTargetSeconds")):
                if getattr(self, name) is not None:
                    raise ValueError(f"{alias}: applies only to mode infer")
            if self.parallelism != 1:
                raise ValueError("parallelism: applies only to mode infer (workers sharing one model copy)")
        elif self.epochs is not None:
            raise ValueError("epochs: applies only to mode train (use requests for infer)")
        elif self.optimizer is not None:
            raise ValueError("optimizer: applies only to mode train")
        if self.batching.mode == "minibatch" and self.model.arch is not None and self.model.arch not in ("sage", "gat"):
            raise ValueError(f"batching.mode: minibatch is supported for sage and gat, not {self.model.arch}")
        if self.batching.fanouts is not None and len(self.batching.fanouts) != self.model.layers:
            raise ValueError(
                f"batching.fanouts: has {len(self.batching.fanouts)} entries; model.layers is {self.model.layers}"
            )
        return self

    @property
    def steps(self) -> int:
        """Epochs for training, inference requests for inference, with their defaults applied."""
        if self.mode == "train":
            return self.epochs if self.epochs is not None else DEFAULT_EPOCHS
        return self.requests if self.requests is not None else DEFAULT_REQUESTS

    @property
    def training_optimizer(self) -> OptimizerSpec:
        """The optimizer a training step uses, with its defaults applied (Adam when none is given)."""
        return self.optimizer if self.optimizer is not None else OptimizerSpec()

    @property
    def fanouts(self) -> list[int]:
        """Neighbour-sampling fanouts per layer (defaults when minibatch and none given; empty for full-batch)."""
        if self.batching.mode != "minibatch":
            return []
        return list(self.batching.fanouts or [DEFAULT_FANOUT] * self.model.layers)


def layer_dims(spec: GNNJobSpec, features: int, classes: int) -> list[tuple[int, int, int]]:
    """(input width, output width per head, heads) of each layer: hidden GAT layers concatenate their heads, the
    output layer has one. The model builder and the runtime prior both read this, so their shapes cannot drift."""
    m = spec.model
    heads = m.heads or 1
    dims: list[tuple[int, int, int]] = []
    width = features
    for layer in range(m.layers):
        last = layer == m.layers - 1
        out = classes if last else m.hidden
        h = 1 if (last or m.arch != "gat") else heads
        dims.append((width, out, h))
        width = out * h
    return dims


class Condition(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""
    last_transition_time: datetime | None = None
    observed_generation: int | None = None


class ResourceQuantities(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    cpu: str | None = None
    memory: str | None = None


class GNNJobStatus(BaseModel):
    """What the operator reports; every field optional because status is written piecewise as the job advances."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    phase: Phase | None = None
    conditions: list[Condition] = Field(default_factory=list)
    pmc_bytes: int | None = Field(default=None, ge=0)
    pmc: str | None = None  # human form of pmcBytes for the printer column
    admit_bytes: int | None = Field(default=None, ge=0)
    predicted_runtime_seconds: float | None = Field(default=None, ge=0)
    requested_resources: ResourceQuantities | None = None
    scaled_resources: ResourceQuantities | None = None
    pod_name: str | None = None
    node: str | None = None
    gpu: str | None = None
    group: str | None = None
    attempts: int | None = Field(default=None, ge=0)
    admitted_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    observed_peak_bytes: int | None = Field(default=None, ge=0)
    predicted_peak_bytes: int | None = Field(default=None, ge=0)
    """What the estimate says the GPU will count for the job (PMC plus device overheads, no safety factor)."""
    observed_peak_ratio: float | None = Field(default=None, ge=0)
    """observedPeakBytes / predictedPeakBytes of the latest attempt that reported a peak."""
    estimate_admit_bytes: int | None = Field(default=None, ge=0)
    """The estimate's own admit bytes, kept when ``spec.resources.gpuMemory`` or a resize replaced them."""
    reservation_source: str | None = None
    safety_factor: float | None = Field(default=None, ge=0)
    exclusive: bool | None = None
    resizes: int | None = Field(default=None, ge=0)
    requeues: int | None = Field(default=None, ge=0)
    retries_used: int | None = Field(default=None, ge=0)
    suspected: int | None = Field(default=None, ge=0)
    undecided_faults: int | None = Field(default=None, ge=0)
    observed_runtime_seconds: float | None = Field(default=None, ge=0)
    observed_generation: int | None = None
    message: str | None = None


class ObjectMeta(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="allow")

    name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class GNNJob(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid")

    api_version: Literal["gnnsched.io/v1alpha1"] = Field(default=API_VERSION, alias="apiVersion")
    kind: Literal["GNNJob"] = GNNJOB_KIND
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: GNNJobSpec
    status: GNNJobStatus | None = None


def _field_path(loc: tuple[Any, ...], message: str) -> tuple[str, str]:
    """Turn pydantic's location into the YAML path; a validator may name a sub-field as ``name: message``."""
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts[-1:] = [f"{parts[-1]}[{item}]"] if parts else [f"[{item}]"]
        elif item in ("function-after", "function-before") or str(item).startswith(("function-", "literal[")):
            continue
        else:
            parts.append(str(item))
    prefix = message.split(":", 1)
    if len(prefix) == 2 and prefix[0] and " " not in prefix[0].strip():
        sub = prefix[0].strip()
        parts.extend(sub.split("."))
        message = prefix[1].strip()
    return ".".join(parts), message


def _first_error(exc: ValidationError, root: str) -> SpecError:
    err = exc.errors(include_url=False)[0]
    message = err["msg"]
    message = message.removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        message = "unknown field (check the spelling; fields are camelCase)"
    elif err["type"] == "missing":
        message = "required"
    elif err["type"] in ("literal_error", "enum"):
        message = f"{message}; got {err.get('input')!r}"
    elif "input" in err and not isinstance(err["input"], (dict, list)) and "got" not in message:
        message = f"{message} (got {err['input']!r})"
    path, message = _field_path(tuple(err["loc"]), message)
    return SpecError(f"{root}.{path}" if path else root, message)


def parse_spec(obj: Any) -> GNNJobSpec:
    """Validate a ``GNNJob.spec`` mapping; raises ``SpecError`` naming the field."""
    if not isinstance(obj, dict):
        raise SpecError("spec", f"must be a mapping, got {type(obj).__name__}")
    try:
        return GNNJobSpec.model_validate(obj)
    except ValidationError as exc:
        raise _first_error(exc, "spec") from None


def parse_job(obj: Any) -> GNNJob:
    """Validate a whole GNNJob object (a manifest, or what the API server returns); raises ``SpecError``."""
    if not isinstance(obj, dict):
        raise SpecError("", f"a GNNJob manifest must be a mapping, got {type(obj).__name__}")
    if obj.get("apiVersion") != API_VERSION:
        raise SpecError("apiVersion", f"must be {API_VERSION}, got {obj.get('apiVersion')!r}")
    if obj.get("kind") != GNNJOB_KIND:
        raise SpecError("kind", f"must be {GNNJOB_KIND}, got {obj.get('kind')!r}")
    if "spec" not in obj:
        raise SpecError("spec", "required")
    spec = parse_spec(obj["spec"])
    rest = {k: v for k, v in obj.items() if k not in ("spec", "status")}
    try:
        job = GNNJob.model_validate({**rest, "spec": spec})
    except ValidationError as exc:
        raise _first_error(exc, "") from None
    status = obj.get("status")
    if isinstance(status, dict):
        # a status we cannot read is the operator's to rewrite, never a reason to reject the spec
        with contextlib.suppress(ValidationError):
            job = job.model_copy(update={"status": GNNJobStatus.model_validate(status)})
    return job


def load_job(path: str | Path) -> GNNJob:
    """Read a manifest file (YAML or JSON, one document) and return the validated GNNJob."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError("", f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError("", f"{path}: cannot read: {exc}") from None
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError("", f"{path}: not valid YAML{where}: {problem}") from None
    if len(documents) != 1:
        raise SpecError("", f"{path}: expected one GNNJob document, found {len(documents)}")
    try:
        return parse_job(documents[0])
    except SpecError as exc:
        raise SpecError(exc.field, f"{exc.message} (in {path})") from None
