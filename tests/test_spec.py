"""The GNNJob spec: the pydantic model and the CRD schema accept and reject the same manifests, naming the field."""

from __future__ import annotations

import copy
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml
from crd_schema import ROOT, load_crd, structural_problems, validate, version_schema
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gnnsched.contract import GPUJob, GPUNodeStatus, GPUStatus, MPSStatus
from gnnsched.datasets import dataset_names, get_dataset
from gnnsched.spec import LIMITS, SpecError, load_job, parse_job

EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
GNNJOB_CRD = load_crd("gnnjob.yaml")
GPUNODE_CRD = load_crd("gpunode.yaml")

BASE = {
    "apiVersion": "gnnsched.io/v1alpha1",
    "kind": "GNNJob",
    "metadata": {"name": "j", "namespace": "default"},
    "spec": {
        "mode": "train",
        "model": {"arch": "gat", "layers": 3, "hidden": 64, "heads": 4},
        "graph": {"nodes": 1000, "edges": 5000, "features": 32, "classes": 4},
        "epochs": 10,
    },
}


def _mutated(path: str, value: object) -> dict:
    """BASE with one field set (``value`` is ``...`` to delete it)."""
    obj = copy.deepcopy(BASE)
    *parents, leaf = path.split(".")
    node: dict[str, Any] = obj
    for part in parents:
        node = node.setdefault(part, {})
    if value is ...:
        node.pop(leaf, None)
    else:
        node[leaf] = value
    return obj


def test_examples_exist():
    assert len(EXAMPLES) >= 3


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_is_accepted_by_both(path: Path):
    job = load_job(path)
    assert job.spec.graph.resolve().nodes > 0
    assert validate(GNNJOB_CRD, yaml.safe_load(path.read_text())) == []


BAD = [
    # (description, field path to mutate, value, field the error must name)
    ("missing graph", "spec.graph", ..., "graph"),
    ("negative layers", "spec.model.layers", -2, "layers"),
    ("zero layers", "spec.model.layers", 0, "layers"),
    ("too many layers", "spec.model.layers", 17, "layers"),
    ("unknown arch", "spec.model.arch", "transformer", "arch"),
    ("gat without heads", "spec.model.heads", ..., "heads"),
    ("heads on gcn", "spec.model", {"arch": "gcn", "heads": 2}, "heads"),
    ("absurd node count", "spec.graph.nodes", 10**15, "nodes"),
    ("absurd edge count", "spec.graph.edges", 10**14, "edges"),
    ("absurd features", "spec.graph.features", 10**9, "features"),
    ("absurd hidden", "spec.model.hidden", 10**6, "hidden"),
    ("edges beyond nodes squared", "spec.graph", {"nodes": 10, "edges": 101, "features": 3, "classes": 2}, "edges"),
    ("dataset and dims", "spec.graph", {"dataset": "cora", "nodes": 5}, "graph"),
    ("partial dims", "spec.graph", {"nodes": 5, "edges": 5}, "graph"),
    ("unknown dataset", "spec.graph", {"dataset": "imagenet"}, "dataset"),
    ("dataset not canonical", "spec.graph", {"dataset": "Cora"}, "dataset"),
    ("unknown mode", "spec.mode", "serve", "mode"),
    ("requests on train", "spec.requests", 5, "requests"),
    ("epochs on infer", "spec.mode", "infer", "epochs"),
    ("minibatch gcn", "spec.model", {"arch": "gcn"}, None),  # filled below with batching
    ("fanouts per layer", "spec.batching", {"mode": "minibatch", "batchSize": 8, "fanouts": [5, 5]}, "fanouts"),
    ("minibatch without batch size", "spec.batching", {"mode": "minibatch"}, "batchSize"),
    ("bad cpu quantity", "spec.resources", {"cpu": "two"}, "cpu"),
    ("string layers", "spec.model.layers", "3", "layers"),
    ("string bool", "spec.scaling", {"enabled": "yes"}, "enabled"),
    ("theta too large", "spec.scaling", {"theta": 0.9}, "theta"),
    ("dropout one", "spec.model.dropout", 1.0, "dropout"),
    ("typo field", "spec.epoch", 3, "epoch"),
    ("parallelism on train", "spec.parallelism", 2, "parallelism"),
    ("negative backoff", "spec.backoffLimit", -1, "backoffLimit"),
    ("negative gpuMemory", "spec.resources", {"gpuMemory": "-1Gi"}, "gpuMemory"),
    ("zero gpuMemory", "spec.resources", {"gpuMemory": "0"}, "gpuMemory"),
    ("zero int gpuMemory", "spec.resources", {"gpuMemory": 0}, "gpuMemory"),
    ("bad gpuMemory", "spec.resources", {"gpuMemory": "lots"}, "gpuMemory"),
    ("maxResizes too large", "spec.memory", {"maxResizes": 11}, "maxResizes"),
    ("negative maxResizes", "spec.memory", {"maxResizes": -1}, "maxResizes"),
    ("pod condition status", "spec.failurePolicy",
     {"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "Yes"}]}]}, "status"),
    ("two requirements", "spec.failurePolicy",
     {"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}],
                 "onExitCodes": {"operator": "In", "values": [3]}}]}, "onPodConditions"),
    ("no requirement", "spec.failurePolicy", {"rules": [{"action": "Ignore"}]}, "onExitCodes"),
]


@pytest.mark.parametrize("desc,path,value,field", BAD, ids=[b[0] for b in BAD])
def test_bad_manifest_rejected_by_both_naming_the_field(desc, path, value, field):
    obj = _mutated(path, value)
    if desc == "minibatch gcn":
        obj["spec"]["batching"] = {"mode": "minibatch", "batchSize": 64}
        field = "batching.mode"
    with pytest.raises(SpecError) as caught:
        parse_job(obj)
    crd_errors = validate(GNNJOB_CRD, obj)
    assert crd_errors, f"the CRD accepted: {desc}"
    assert field in caught.value.field or field in caught.value.message, caught.value
    leaf = field.split(".")[-1]
    assert any(leaf in e for e in crd_errors), crd_errors


def test_limits_match_the_crd():
    spec = version_schema(GNNJOB_CRD)["properties"]["spec"]
    for path, (low, high) in LIMITS.items():
        node = spec
        for part in path.removeprefix("spec.").split("."):
            node = node["properties"][part[:-2]]["items"] if part.endswith("[]") else node["properties"][part]
        assert (node["minimum"], node["maximum"]) == (low, high), path


def test_dataset_enum_matches_the_catalogue():
    enum = version_schema(GNNJOB_CRD)["properties"]["spec"]["properties"]["graph"]["properties"]["dataset"]["enum"]
    assert tuple(enum) == dataset_names()
    assert get_dataset("Soc-Blog").name == "soc-blogcatalog"


@pytest.mark.parametrize("crd", [GNNJOB_CRD, GPUNODE_CRD], ids=["gnnjob", "gpunode"])
def test_crds_are_structural(crd):
    assert structural_problems(version_schema(crd)) == []


def test_printer_columns():
    columns = {c["name"]: c["jsonPath"] for c in GNNJOB_CRD["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert columns == {
        "Phase": ".status.phase",
        "Model": ".status.modelClass",
        "Mode": ".spec.mode",
        "PMC": ".status.pmc",
        "Node": ".status.node",
        "GPU": ".status.gpu",
        "Attempts": ".status.attempts",
        "Resizes": ".status.resizes",
        "Requeues": ".status.requeues",
        "Resumed": ".status.resumedFromStep",
        "Probation": ".status.probationStep",
        "Age": ".metadata.creationTimestamp",
    }


def test_gpunode_status_model_validates_against_its_crd():
    status = GPUNodeStatus(
        node_name="n1",
        mps=MPSStatus(healthy=False, restarts=2, message="daemon exited"),
        gpus=[
            GPUStatus(
                index=0, uuid="GPU-1", model="A100-80GB", total_bytes=80 << 30, reserve_bytes=1 << 30,
                committed_bytes=3 << 30, running=[GPUJob(pod_uid="u", bytes=3 << 30, intensity="memory")],
            ),
            GPUStatus(  # draining after a fatal MPS fault (node agent quarantine)
                index=1, uuid="GPU-2", model="A100-80GB", total_bytes=80 << 30, mps_healthy=False, draining=True,
                draining_reason="Xid", draining_xid=43,
                draining_since=datetime(2026, 1, 1, tzinfo=timezone.utc),
            ),
            GPUStatus(  # out of service after a hardware Xid
                index=2, uuid="GPU-3", model="A100-80GB", total_bytes=80 << 30, healthy=False,
                unhealthy_reason="Xid 79", unhealthy_xid=79, unhealthy_since=datetime(2026, 1, 1, tzinfo=timezone.utc),
            ),
        ],
    )
    obj = {"apiVersion": "gnnsched.io/v1alpha1", "kind": "GPUNode", "metadata": {"name": "n1"}, "status": status.wire()}
    assert validate(GPUNODE_CRD, obj) == []
    assert obj["status"]["gpuCount"] == 3 and obj["status"]["gpus"][1]["drainingXid"] == 43
    assert obj["status"]["unhealthyGpus"] == 1 and obj["status"]["gpus"][2]["unhealthyXid"] == 79
    assert obj["status"]["gpus"][2]["unhealthySince"] == "2026-01-01T00:00:00Z"
    assert GPUNodeStatus.model_validate(obj["status"]) == status


def test_defaults_resolve_by_mode():
    job = parse_job(BASE)
    assert job.spec.steps == 10 and job.spec.fanouts == []
    infer = _mutated("spec.epochs", ...)
    infer["spec"]["mode"] = "infer"
    assert parse_job(infer).spec.steps == 100


def test_load_job_errors_name_the_file(tmp_path):
    with pytest.raises(SpecError, match="no such file"):
        load_job(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("spec: [unclosed\n")
    with pytest.raises(SpecError, match=r"not valid YAML at line"):
        load_job(bad)
    two = tmp_path / "two.yaml"
    two.write_text(yaml.safe_dump(BASE) + "---\n" + yaml.safe_dump(BASE))
    with pytest.raises(SpecError, match="found 2"):
        load_job(two)
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text(yaml.safe_dump({**BASE, "kind": "Pod"}))
    with pytest.raises(SpecError) as caught:
        load_job(wrong)
    assert caught.value.field == "kind"


# --- property: the two validators agree on random manifests -------------------------------------------------------

_ints = st.one_of(st.integers(-5, 40), st.integers(-(10**12), 10**13), st.sampled_from(["3", 2.5, True]))
_spec_parts = st.fixed_dictionaries(
    {
        "mode": st.sampled_from(["train", "infer", "bogus"]),
        "model": st.fixed_dictionaries(
            {"arch": st.sampled_from(["gcn", "sage", "gin", "gat", "mlp"])},
            optional={"layers": _ints, "hidden": _ints, "heads": _ints, "dropout": st.floats(-0.5, 1.5)},
        ),
        "graph": st.one_of(
            st.fixed_dictionaries({"dataset": st.sampled_from(["cora", "pubmed", "Cora", "nope"])}),
            st.fixed_dictionaries(
                {},
                optional={
                    "nodes": _ints,
                    "edges": _ints,
                    "features": _ints,
                    "classes": _ints,
                    "dataset": st.just("dd"),
                },
            ),
        ),
    },
    optional={
        "epochs": _ints,
        "requests": _ints,
        "parallelism": _ints,
        "batching": st.fixed_dictionaries(
            {},
            optional={
                "mode": st.sampled_from(["full", "minibatch"]),
                "batchSize": _ints,
                "fanouts": st.lists(st.integers(-1, 1200), max_size=5),
            },
        ),
        "resources": st.fixed_dictionaries(
            {},
            optional={
                "cpu": st.sampled_from(["1", "500m", "x", 2, "-1"]),
                "memory": st.sampled_from(["1Gi", "1Gb"]),
                "gpuMemory": st.sampled_from(["20Gi", "0", "0.0", "-1Gi", 0, 5, "1.5Gi", ".5Gi", "x"]),
            },
        ),
        "memory": st.fixed_dictionaries({}, optional={"maxResizes": _ints}),
        "qosTargetSeconds": st.floats(-1, 10),
        "backoffLimit": _ints,
    },
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_spec_parts)
def test_pydantic_and_crd_agree_on_random_specs(spec):
    obj = {"apiVersion": "gnnsched.io/v1alpha1", "kind": "GNNJob", "metadata": {"name": "p"}, "spec": spec}
    crd_ok = validate(GNNJOB_CRD, obj) == []
    try:
        parse_job(obj)
        model_ok = True
    except SpecError:
        model_ok = False
    assert crd_ok == model_ok, (validate(GNNJOB_CRD, obj), spec)


def test_cli_help_lists_subcommands():
    out = subprocess.run([sys.executable, "-m", "gnnsched.cli", "--help"], capture_output=True, text=True, check=True)
    assert "Usage" in out.stdout


def test_gpu_memory_and_max_resizes_parse():
    from gnnsched.spec import parse_spec

    obj = _mutated("spec.resources", {"gpuMemory": "20Gi"})
    obj["spec"]["memory"] = {"maxResizes": 0}
    spec = parse_spec(obj["spec"])
    assert spec.resources.gpu_memory_bytes() == 20 * 2**30 and spec.memory.max_resizes == 0
    assert parse_spec(_mutated("spec.epochs", 3)["spec"]).memory.max_resizes == 3  # the default
    assert validate(GNNJOB_CRD, obj) == []


def test_gpunode_printer_columns_show_unhealthy_gpus():
    columns = {c["name"]: c["jsonPath"] for c in GPUNODE_CRD["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert columns == {"GPUs": ".status.gpuCount", "Unhealthy": ".status.unhealthyGpus", "MPS": ".status.mps.healthy",
                       "Measured": ".status.gpus[0].measured.measuredAt", "Updated": ".status.updatedAt"}
