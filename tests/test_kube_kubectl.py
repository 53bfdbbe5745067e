"""The emulated API server's kubectl-facing answers (``tests/kube_kubectl.py``) against upstream's behaviour.

Ages follow ``k8s.io/apimachinery/pkg/util/duration.HumanDuration``; strict field validation names undeclared fields
as kube-apiserver does; Tables carry the CRD's printer columns. The whole kubectl session is
``tests/e2e/test_kubectl_session.py``.
"""

from __future__ import annotations

import asyncio
import datetime
import re
from pathlib import Path
from typing import Any

import kube_kubectl
import pytest
import yaml
from kube_emulator import REPO
from operator_harness import JOBS, emulated_cluster, manifest


@pytest.mark.parametrize(("seconds", "text"), [
    (-5, "<invalid>"), (-1, "0s"), (0, "0s"), (61, "61s"), (119, "119s"), (120, "2m"), (310, "5m10s"),
    (600, "10m"), (179 * 60, "179m"), (3 * 3600 + 4 * 60, "3h4m"), (5 * 3600, "5h"), (8 * 3600, "8h"),
    (47 * 3600, "47h"), (2 * 86400 + 5 * 3600, "2d5h"), (3 * 86400, "3d"), (8 * 86400, "8d"),
    (2 * 365 * 86400 + 3 * 86400, "2y3d"), (9 * 365 * 86400, "9y"),
])
def test_human_duration_matches_apimachinery(seconds: int, text: str) -> None:
    assert kube_kubectl.human_duration(seconds) == text


def _gnnjob_crd() -> dict:
    return yaml.safe_load((REPO / "crds" / "gnnjob.yaml").read_text())


def _schema() -> dict:
    crd = _gnnjob_crd()
    return next(v for v in crd["spec"]["versions"] if v.get("storage"))["schema"]["openAPIV3Schema"]


def test_unknown_fields_are_named_by_path() -> None:
    job = yaml.safe_load((REPO / "examples" / "gcn-train-cora.yaml").read_text())
    assert kube_kubectl.unknown_fields(job, _schema()) == []
    job["spec"]["modle"] = job["spec"].pop("model")
    job["spec"]["graph"]["datset"] = "cora"
    job["metadata"]["anything"] = 1  # metadata is the server's own type, not the CRD's schema
    fields = kube_kubectl.unknown_fields(job, _schema())
    assert sorted(fields) == [".spec.graph.datset", ".spec.modle"]
    assert kube_kubectl.strict_decoding_message([".spec.modle"]) == 'strict decoding error: unknown field "spec.modle"'
    assert kube_kubectl.strict_decoding_message([".spec.modle", ".spec.graph.datset"]) == (  # sorted, as pruning
        'strict decoding error: unknown field "spec.graph.datset", unknown field "spec.modle"')


def test_a_patch_with_an_unknown_field_is_invalid_as_the_patch_handler_says() -> None:
    """``jsonPatcher.applyPatchToCurrentObject``: 422 Invalid, no kind or name, one cause on the field ``patch``
    whose value is the patched object as Go's encoding/json writes it, quoted."""
    status = kube_kubectl.strict_patch_error({"spec": {"modle": {"a": "<b>"}}, "kind": "GNNJob"}, [".spec.modle"])
    assert status["code"] == 422 and status["reason"] == "Invalid" and status["status"] == "Failure"
    body = ('Invalid value: "{\\"kind\\":\\"GNNJob\\",\\"spec\\":{\\"modle\\":{\\"a\\":'
            '\\"\\\\u003cb\\\\u003e\\"}}}": strict decoding error: unknown field "spec.modle"')
    assert status["details"] == {"causes": [{"reason": "FieldValueInvalid", "message": body, "field": "patch"}]}
    assert status["message"] == f' "" is invalid: patch: {body}'


@pytest.mark.parametrize(("plural", "selector", "terms"), [
    ("events", "involvedObject.name=a,involvedObject.kind==GNNJob",
     [("involvedObject.name", True, "a"), ("involvedObject.kind", True, "GNNJob")]),
    ("events", "source=kopf", [("source.component", True, "kopf")]),
    ("pods", "spec.nodeName!=n1", [("spec.nodeName", False, "n1")]),
    ("gnnjobs", "metadata.name=a", [("metadata.name", True, "a")]),
    ("pods", "", []),
])
def test_field_selectors_take_the_fields_the_kind_supports(plural: str, selector: str, terms: list) -> None:
    assert kube_kubectl.field_selector(plural, selector) == terms


@pytest.mark.parametrize(("plural", "selector", "error"), [
    ("gnnjobs", "spec.mode=train", "field label not supported: spec.mode"),
    ("pods", "spec.nodeName", "invalid selector: 'spec.nodeName'; can't understand 'spec.nodeName'"),
])
def test_other_field_selectors_are_refused(plural: str, selector: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        kube_kubectl.field_selector(plural, selector)


def test_field_selectors_compare_strings_booleans_and_absent_fields() -> None:
    pod = {"metadata": {"name": "p"}, "spec": {"nodeName": "n1", "hostNetwork": False}}
    assert kube_kubectl.fields_match(pod, kube_kubectl.field_selector("pods", "spec.hostNetwork=false"))
    assert kube_kubectl.fields_match(pod, kube_kubectl.field_selector("pods", "status.phase="))
    assert not kube_kubectl.fields_match(pod, kube_kubectl.field_selector("pods", "spec.nodeName=n2"))
    assert kube_kubectl.fields_match(pod, kube_kubectl.field_selector("pods", "spec.nodeName!=n2,metadata.name=p"))


def test_date_columns_as_the_crd_table_convertor_writes_them() -> None:
    assert kube_kubectl.date_cell("") == "<unknown>"
    assert kube_kubectl.date_cell("yesterday") == "<invalid>"
    assert re.fullmatch(r"\d+y\d*d?", kube_kubectl.date_cell("2000-01-01T00:00:00Z"))


def test_crd_table_uses_printer_columns_and_ages() -> None:
    crd = _gnnjob_crd()
    columns = next(v for v in crd["spec"]["versions"] if v.get("storage"))["additionalPrinterColumns"]
    created = (datetime.datetime.now(tz=datetime.timezone.utc) - datetime.timedelta(seconds=310)).strftime(
        "%Y-%m-%dT%H:%M:%SZ")
    job = {"metadata": {"name": "a", "creationTimestamp": created}, "spec": {"mode": "train", "model": {"arch": "gcn"}},
           "status": {"phase": "Running", "modelClass": "gcn"}}
    table = kube_kubectl.table("gnnjobs", [job], columns)
    names = [c["name"] for c in table["columnDefinitions"]]
    assert names == ["Name", *[c["name"] for c in columns]]
    cells = dict(zip(names, table["rows"][0]["cells"], strict=True))
    assert cells["Name"] == "a" and cells["Phase"] == "Running" and cells["Model"] == "gcn"
    assert cells["Age"] in ("5m10s", "5m11s")
    assert cells["Node"] is None  # kubectl prints <none>


def test_event_table_has_kubectls_columns() -> None:
    event = {"metadata": {"name": "e1"}, "type": "Normal", "reason": "Scheduled", "message": "m",
             "involvedObject": {"kind": "GNNJob", "name": "a"}, "lastTimestamp": "2000-01-01T00:00:00Z"}
    table = kube_kubectl.table("events", [event], None)
    shown = [c["name"] for c in table["columnDefinitions"] if c["priority"] == 0]
    assert shown == ["Last Seen", "Type", "Reason", "Object", "Message"]  # the Name column is last, -o wide only
    assert table["columnDefinitions"][-1]["name"] == "Name"
    row = dict(zip([c["name"] for c in table["columnDefinitions"]], table["rows"][0]["cells"], strict=True))
    assert row["Object"] == "gnnjob/a" and row["Reason"] == "Scheduled"


def test_openapi_v3_offers_kubectl_what_it_checks() -> None:
    """kubectl's QueryParamVerifierV3 needs a PATCH path tagged with the GVK and a fieldValidation query parameter;
    apply uses a merge patch for custom resources because their PATCH lists no strategic merge patch."""
    gv, paths, schemas = kube_kubectl.crd_openapi_v3(_gnnjob_crd())
    assert gv == "apis/gnnsched.io/v1alpha1"
    patch = paths["/apis/gnnsched.io/v1alpha1/namespaces/{namespace}/gnnjobs/{name}"]["patch"]
    assert patch["x-kubernetes-group-version-kind"] == {"group": "gnnsched.io", "version": "v1alpha1",
                                                       "kind": "GNNJob"}
    assert {p["name"] for p in patch["parameters"] if p["in"] == "query"} >= {"fieldValidation", "dryRun"}
    assert "application/strategic-merge-patch+json" not in patch["requestBody"]["content"]
    assert "spec" in schemas["io.gnnsched.v1alpha1.GNNJob"]["properties"]
    root = kube_kubectl.v3_root({gv: kube_kubectl.v3_document(paths, schemas)})
    assert root["paths"][gv]["serverRelativeURL"].startswith(f"/openapi/v3/{gv}?hash=")


def test_the_emulator_selects_fields_checks_namespaces_and_refuses_unknown_fields(tmp_path: Path) -> None:
    """The same answers over HTTP (what kubectl and the components get)."""

    async def scenario() -> dict[str, Any]:
        async with emulated_cluster(tmp_path) as cluster:
            out: dict[str, Any] = {"missing": await cluster.request("POST", JOBS.format(ns="nosuch"), json=manifest())}
            await cluster.create_job(manifest("a"))
            for name, kind in (("a", "GNNJob"), ("a-0", "Pod")):
                await cluster.request("POST", "/api/v1/namespaces/default/events", json={
                    "metadata": {"name": f"{name}.1"}, "involvedObject": {"kind": kind, "name": name},
                    "reason": "Made", "type": "Normal"})
            out["selected"] = await cluster.request(
                "GET", "/api/v1/namespaces/default/events?fieldSelector=involvedObject.kind%3DGNNJob")
            out["unsupported"] = await cluster.request(
                "GET", JOBS.format(ns="default") + "?fieldSelector=spec.mode%3Dx")
            out["patch"] = await cluster.request(
                "PATCH", JOBS.format(ns="default") + "/a?fieldValidation=Strict", json={"spec": {"modle": {}}},
                headers={"Content-Type": "application/merge-patch+json"})
            out["namespaces"] = await cluster.request("GET", "/api/v1/namespaces")
            return out

    got = asyncio.run(scenario())
    assert got["missing"][0] == 404 and got["missing"][1]["message"] == 'namespaces "nosuch" not found'
    assert [e["metadata"]["name"] for e in got["selected"][1]["items"]] == ["a.1"]
    assert got["unsupported"][0] == 400 and got["unsupported"][1]["message"] == "field label not supported: spec.mode"
    status, body = got["patch"]
    assert status == 422 and body["details"]["causes"][0]["field"] == "patch"
    assert body["message"].endswith('strict decoding error: unknown field "spec.modle"')
    assert {n["metadata"]["name"] for n in got["namespaces"][1]["items"]} == {
        "default", "kube-system", "kube-public", "kube-node-lease"}
