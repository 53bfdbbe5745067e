"""The chart's queue PriorityClasses (real Helm SDK): the same classes as gnnsched.queue_order, valid Kubernetes
objects, and operator flags that make the operator pick from exactly that set."""

from __future__ import annotations

from pathlib import Path

import helm_python
import kubernetes_validate
import pytest
import yaml

from gnnsched.queue_order import QueueOrder

CHART = Path(__file__).resolve().parents[1] / "charts" / "gnnsched"
K8S_VERSIONS = ["1.30", kubernetes_validate.latest_version()]


@pytest.fixture(scope="module")
def chart():
    loaded = helm_python.Chart.load(str(CHART))
    yield loaded
    loaded.close()


def render(chart, values: dict | None) -> list[dict]:
    out = chart.render(values or None, name="gs", namespace="gnnsched", is_install=True)
    return [d for name, text in out.items() if name.endswith(".yaml") for d in yaml.safe_load_all(text) if d]


def operator_args(docs: list[dict]) -> list[str]:
    deploy = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-operator"))
    return deploy["spec"]["template"]["spec"]["containers"][0]["args"]


def flags_to_order(args: list[str]) -> QueueOrder:
    """What ``gnnsched operator`` builds from the chart's flags (defaults as in the CLI)."""
    opts = dict(a[2:].split("=", 1) for a in args if a.startswith("--queue-priority-"))
    return QueueOrder(base=int(opts["queue-priority-base"]), prefix=opts["queue-priority-prefix"],
                      per_doubling=int(opts["queue-priority-per-doubling"]))


@pytest.mark.parametrize("values, order", [
    (None, QueueOrder(prefix="gs-gnnsched-runtime-")),  # release "gs": the prefix follows the fullname
    ({"queuePriority": {"base": -50, "perDoubling": 8, "prefix": "acme-q-"}},
     QueueOrder(base=-50, prefix="acme-q-", per_doubling=8)),
    ({"queuePriority": {"base": 999_999_871, "perDoubling": 8}, "fullnameOverride": "acme-gpu-share"},
     QueueOrder(base=999_999_871, per_doubling=8, prefix="acme-gpu-share-runtime-")),
])
def test_classes_match_the_core_and_the_operator_flags(chart, values, order):
    docs = render(chart, values)
    classes = [d for d in docs if d["kind"] == "PriorityClass"]
    expected = [(e.name, e.value) for e in order.classes()] + [(order.retry_name, order.retry_value)]
    assert [(c["metadata"]["name"], c["value"]) for c in classes] == expected
    for c in classes:
        assert c["preemptionPolicy"] == "Never" and c["globalDefault"] is False
        assert "never preempts" in c["description"]
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(c, version, strict=True)
    assert "up to 1 min" in classes[0]["description"]
    args = operator_args(docs)
    assert "--queue-priority" in args and "--retry-priority" in args
    assert flags_to_order(args) == order


def test_retry_class_alone_when_the_runtime_order_is_off(chart):
    docs = render(chart, {"queuePriority": {"enabled": False}})
    classes = [d for d in docs if d["kind"] == "PriorityClass"]
    order = QueueOrder(prefix="gs-gnnsched-runtime-")
    assert [(c["metadata"]["name"], c["value"]) for c in classes] == [(order.retry_name, order.retry_value)]
    args = operator_args(docs)
    assert "--retry-priority" in args and "--queue-priority" not in args
    assert flags_to_order(args) == order  # the operator names the same class


def test_disabled_renders_no_class_and_no_flag_but_keeps_the_read_permission(chart):
    docs = render(chart, {"queuePriority": {"enabled": False, "retryFirst": False}})
    assert not [d for d in docs if d["kind"] == "PriorityClass"]
    assert not [a for a in operator_args(docs) if a.startswith(("--queue-priority", "--retry-priority"))]
    # the operator still checks a user's spec.priorityClassName exists
    role = next(d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("-operator"))
    assert {"apiGroups": ["scheduling.k8s.io"], "resources": ["priorityclasses"], "verbs": ["get"]} in role["rules"]


@pytest.mark.parametrize("bad", [
    {"queuePriority": {"base": 999_999_872}},  # the band's top could pass 1e9
    {"queuePriority": {"base": 1.5}},
    {"queuePriority": {"perDoubling": 0}},
    {"queuePriority": {"perDoubling": 9}},
    {"queuePriority": {"prefix": "system-queue-"}},
    {"queuePriority": {"prefix": "Queue"}},
    {"queuePriority": {"enable": True}},
])
def test_values_schema_rejects_bad_queue_priority(chart, bad):
    with pytest.raises(helm_python.HelmValuesError):
        chart.validate_schema(bad)
