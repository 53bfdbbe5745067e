"""The chart's ValidatingAdmissionPolicies (issue 39, items 1 and 7): their CEL, rendered by Helm, evaluated with
celpy against the admission requests a tenant, the operator, the node agent, the scheduler and the kubelet send.
Then the same policies stored in the emulated API server refuse a tenant's writes over HTTP, as kube-apiserver does.
"""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import pytest
import requests
from chart_policies import admission_objects, service_account_user
from kube_admission import Attributes, Denial, PolicyEvaluator, apply_json_patch
from operator_harness import emulated_cluster

from gnnsched.contract import ANN_ADMIT_BYTES, ANN_PREDICTED_RUNTIME, ANN_RESERVATION, GPU_SHARE_RESOURCE

OPERATOR = {"username": service_account_user("operator"),
            "groups": ["system:serviceaccounts", "system:serviceaccounts:gnnsched", "system:authenticated"]}
SCHEDULER = {"username": service_account_user("scheduler"), "groups": ["system:serviceaccounts"]}
TENANT: dict[str, Any] = {"username": "system:serviceaccount:team-b:default", "groups": ["system:serviceaccounts"]}
KUBELET = {"username": "system:node:node-1", "groups": ["system:nodes", "system:authenticated"]}
GC = {"username": "system:serviceaccount:kube-system:generic-garbage-collector", "groups": []}


def agent(node: str | None) -> dict[str, Any]:
    extra = {"authentication.kubernetes.io/pod-name": ["gnnsched-node-x1"]}
    if node is not None:
        extra["authentication.kubernetes.io/node-name"] = [node]
    return {"username": service_account_user("node"), "groups": ["system:serviceaccounts"], "extra": extra}


JOB_OWNER = {"apiVersion": "gnnsched.io/v1alpha1", "kind": "GNNJob", "name": "train-a", "uid": "job-uid-1",
             "controller": True, "blockOwnerDeletion": True}


def pod(name: str = "p", ns: str = "team-b", share: str | None = None, limits: bool = False, init: bool = False,
        annotations: dict[str, str] | None = None, owners: list[dict[str, Any]] | None = None,
        node: str | None = None, scheduler: str | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "python:3.11"}
    if share is not None:
        container["resources"] = {"limits" if limits else "requests": {GPU_SHARE_RESOURCE: share}}
    spec: dict[str, Any] = {"containers": [container]}
    if init and share is not None:
        spec = {"containers": [{"name": "main", "image": "python:3.11"}], "initContainers": [container]}
    if node:
        spec["nodeName"] = node
    if scheduler:
        spec["schedulerName"] = scheduler
    meta: dict[str, Any] = {"name": name, "namespace": ns}
    if annotations:
        meta["annotations"] = annotations
    if owners:
        meta["ownerReferences"] = owners
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def operator_pod(node: str | None = "node-1") -> dict[str, Any]:
    return pod("train-a-1", "team-a", share="1", annotations={ANN_ADMIT_BYTES: "1073741824"}, owners=[JOB_OWNER],
               node=node, scheduler="gnnsched-scheduler")


@pytest.fixture(scope="module")
def chart_objects() -> list[dict[str, Any]]:
    return admission_objects()


def review(objs: list[dict[str, Any]], user: dict[str, Any], operation: str, obj: dict[str, Any] | None,
           old: dict[str, Any] | None = None, resource: str = "pods", subresource: str = "",
           group: str = "", kind: str = "Pod") -> Denial | None:
    policies = [o for o in objs if o["kind"] == "ValidatingAdmissionPolicy"]
    bindings = [o for o in objs if o["kind"] == "ValidatingAdmissionPolicyBinding"]
    meta = (obj or old or {}).get("metadata") or {}
    attrs = Attributes(operation=operation, group=group, version="v1alpha1" if group else "v1", resource=resource,
                       subresource=subresource, kind=kind, user=user, namespace=meta.get("namespace", ""),
                       name=meta.get("name", ""), object=obj, old_object=old)
    return PolicyEvaluator().review(attrs, policies, bindings)


def patched(obj: dict[str, Any], annotations: dict[str, str | None] | None = None,
            owners: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    ann = out["metadata"].setdefault("annotations", {})
    for k, v in (annotations or {}).items():
        if v is None:
            ann.pop(k, None)
        else:
            ann[k] = v
    if owners is not None:
        out["metadata"]["ownerReferences"] = owners
    return out


def test_the_chart_renders_three_policies_each_bound_with_deny(chart_objects: list[dict[str, Any]]) -> None:
    policies = {o["metadata"]["labels"]["gnnsched.io/admission-policy"]: o for o in chart_objects
                if o["kind"] == "ValidatingAdmissionPolicy"}
    assert set(policies) == {"gpu-share-pods", "pod-fields", "node-agent-scope"}
    bindings = [o for o in chart_objects if o["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert {b["spec"]["policyName"] for b in bindings} == {p["metadata"]["name"] for p in policies.values()}
    assert all(b["spec"]["validationActions"] == ["Deny"] for b in bindings)
    assert all(p["spec"]["failurePolicy"] == "Fail" for p in policies.values())
    assert all(o["apiVersion"] == "admissionregistration.k8s.io/v1" for o in chart_objects)


def test_the_switch_turns_them_off_and_names_follow_the_release() -> None:
    assert admission_objects({"admissionPolicies": {"enabled": False}}) == []
    objs = admission_objects({"fullnameOverride": "acme"}, release="r1", namespace="gpu-system")
    text = str(objs)
    assert "system:serviceaccount:gpu-system:acme-operator" in text and "acme-node" in text
    assert "gnnsched:gnnsched-operator" not in text
    # the operator of that release may create share pods, the default release's may not
    ok = review(objs, {"username": "system:serviceaccount:gpu-system:acme-operator"}, "CREATE", operator_pod(None))
    assert ok is None
    assert review(objs, OPERATOR, "CREATE", operator_pod(None)) is not None


@pytest.mark.parametrize("variant", ["requests", "limits", "init-container", "scheduler-name"])
def test_a_tenant_pod_asking_for_a_share_or_the_scheduler_is_refused(chart_objects: list[dict[str, Any]],
                                                                      variant: str) -> None:
    obj = {"requests": pod(share="1"), "limits": pod(share="1", limits=True),
           "init-container": pod(share="1", init=True), "scheduler-name": pod(scheduler="gnnsched-scheduler")}[variant]
    denial = review(chart_objects, TENANT, "CREATE", obj)
    assert denial is not None and denial.code == 403 and denial.reason == "Forbidden"
    assert denial.message.startswith("ValidatingAdmissionPolicy 'gnnsched-gpu-share-pods' with binding "
                                     "'gnnsched-gpu-share-pods' denied request: only gnnsched's operator")
    assert TENANT["username"] in denial.message and "may create a GNNJob instead" in denial.message


def test_the_operators_pods_and_plain_pods_are_admitted(chart_objects: list[dict[str, Any]]) -> None:
    assert review(chart_objects, OPERATOR, "CREATE", operator_pod(None)) is None
    assert review(chart_objects, TENANT, "CREATE", pod()) is None
    assert review(chart_objects, TENANT, "CREATE", pod(annotations={"team/owner": "b"}, scheduler="default-scheduler",
                                                       owners=[{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                                                "name": "rs", "uid": "u"}])) is None


def test_gnnsched_annotations_are_written_only_by_gnnsched(chart_objects: list[dict[str, Any]]) -> None:
    mine = pod()
    # a tenant's own pod: adding a placement annotation (the review's 0.001 s runtime) or a reservation
    for key, value in ((ANN_PREDICTED_RUNTIME, "0.001"),
                       (ANN_RESERVATION, '{"node": "node-1", "gpu": 0, "bytes": 1, "at": 9999999999}')):
        denial = review(chart_objects, TENANT, "UPDATE", patched(mine, {key: value}), mine)
        assert denial is not None and denial.code == 403 and "'gnnsched-pod-fields'" in denial.message
        assert "may not add, change or remove them" in denial.message
        assert review(chart_objects, TENANT, "CREATE", pod(annotations={key: value})) is not None
    job_pod = operator_pod()
    changes: list[dict[str, str | None]] = [{ANN_ADMIT_BYTES: "1"}, {ANN_ADMIT_BYTES: None}]
    for change in changes:  # change, remove
        assert review(chart_objects, TENANT, "UPDATE", patched(job_pod, change), job_pod) is not None
    # other annotations stay the tenant's; gnnsched's accounts write theirs
    assert review(chart_objects, TENANT, "UPDATE", patched(job_pod, {"team/note": "x"}), job_pod) is None
    assert review(chart_objects, OPERATOR, "UPDATE", patched(job_pod, {ANN_ADMIT_BYTES: "2"}), job_pod) is None
    assert review(chart_objects, agent("node-1"), "UPDATE", patched(job_pod, {"gnnsched.io/gpu": "GPU-1"}),
                  job_pod) is None
    # the kubelet's status write leaves annotations alone and passes
    status = copy.deepcopy(job_pod)
    status["status"] = {"phase": "Running"}
    assert review(chart_objects, KUBELET, "UPDATE", status, job_pod, subresource="status") is None


def test_a_gnnjob_owner_reference_is_set_only_by_the_operator(chart_objects: list[dict[str, Any]]) -> None:
    forged = {**JOB_OWNER, "name": "mine", "uid": "tenant-job-uid"}
    denial = review(chart_objects, TENANT, "CREATE", pod(owners=[forged]))
    assert denial is not None and denial.code == 403
    assert "an ownerReference to a GNNJob is set only by gnnsched's operator" in denial.message
    plain = pod()
    assert review(chart_objects, TENANT, "UPDATE", patched(plain, owners=[forged]), plain) is not None
    job_pod = operator_pod()
    retarget = [{**JOB_OWNER, "uid": "other"}]
    assert review(chart_objects, TENANT, "UPDATE", patched(job_pod, owners=retarget), job_pod) is not None
    assert review(chart_objects, agent("node-1"), "UPDATE", patched(plain, owners=[forged]), plain) is not None
    # keeping it (a label change) and dropping it (the garbage collector orphaning) are allowed
    assert review(chart_objects, TENANT, "UPDATE", patched(job_pod, {"team/x": "y"}), job_pod) is None
    assert review(chart_objects, GC, "UPDATE", patched(job_pod, owners=[]), job_pod) is None


def test_the_node_agent_writes_only_its_own_nodes_pods_and_gpunode(chart_objects: list[dict[str, Any]]) -> None:
    on_1, on_2, unbound = operator_pod("node-1"), operator_pod("node-2"), operator_pod(None)
    note = {"gnnsched.io/admitted-at": "2026-11-28T00:00:00Z"}
    assert review(chart_objects, agent("node-1"), "UPDATE", patched(on_1, note), on_1) is None
    for target in (on_2, unbound):
        denial = review(chart_objects, agent("node-1"), "UPDATE", patched(target, note), target)
        assert denial is not None and denial.code == 403 and "'gnnsched-node-agent-scope'" in denial.message
        assert "the node agent of node-1 may change only pods bound to node-1" in denial.message
    denial = review(chart_objects, agent(None), "UPDATE", patched(on_1, note), on_1)
    assert denial is not None and "carries no node claim" in denial.message
    gpunode = {"apiVersion": "gnnsched.io/v1alpha1", "kind": "GPUNode", "metadata": {"name": "node-1"}}
    other = {**gpunode, "metadata": {"name": "node-2"}}
    kw: dict[str, Any] = {"resource": "gpunodes", "group": "gnnsched.io", "kind": "GPUNode"}
    assert review(chart_objects, agent("node-1"), "CREATE", gpunode, **kw) is None
    assert review(chart_objects, agent("node-1"), "UPDATE", gpunode, gpunode, subresource="status", **kw) is None
    denial = review(chart_objects, agent("node-1"), "UPDATE", other, other, subresource="status", **kw)
    assert denial is not None and "may write only the GPUNode node-1" in denial.message
    assert review(chart_objects, agent("node-1"), "CREATE", other, **kw) is not None
    # other users are not the agent: the operator's and the kubelet's writes are not narrowed by node
    assert review(chart_objects, OPERATOR, "UPDATE", patched(on_2, {ANN_ADMIT_BYTES: "3"}), on_2) is None


def test_a_binding_carries_gnnsched_annotations_only_from_the_scheduler(chart_objects: list[dict[str, Any]]) -> None:
    binding = {"apiVersion": "v1", "kind": "Binding",
               "metadata": {"name": "p", "namespace": "team-b",
                            "annotations": {ANN_RESERVATION: '{"node": "node-1", "gpu": 0}'}},
               "target": {"apiVersion": "v1", "kind": "Node", "name": "node-1"}}
    kw: dict[str, Any] = {"subresource": "binding", "kind": "Binding"}
    assert review(chart_objects, SCHEDULER, "CREATE", binding, **kw) is None
    assert review(chart_objects, TENANT, "CREATE", binding, **kw) is not None
    assert review(chart_objects, TENANT, "CREATE", binding, resource="bindings", kind="Binding") is not None
    plain = {**binding, "metadata": {"name": "p", "namespace": "team-b"}}
    assert review(chart_objects, {"username": "system:kube-scheduler"}, "CREATE", plain, **kw) is None


def test_json_patches_are_applied_as_the_api_server_stores_them() -> None:
    doc = {"metadata": {"annotations": {"a": "1"}, "ownerReferences": [{"uid": "x"}]}}
    out = apply_json_patch(doc, [{"op": "add", "path": "/metadata/annotations/gnnsched.io~1gpu", "value": "G"},
                                 {"op": "remove", "path": "/metadata/annotations/a"},
                                 {"op": "add", "path": "/metadata/ownerReferences/-", "value": {"uid": "y"}},
                                 {"op": "test", "path": "/metadata/x", "value": 1}])
    assert out == {"metadata": {"annotations": {"gnnsched.io/gpu": "G"}, "ownerReferences": [{"uid": "x"},
                                                                                           {"uid": "y"}]}}
    assert doc["metadata"]["annotations"] == {"a": "1"}
    with pytest.raises(ValueError, match="remove /metadata/nope"):
        apply_json_patch(doc, [{"op": "remove", "path": "/metadata/nope"}])


def test_a_broken_expression_fails_closed_and_ignore_skips_it(chart_objects: list[dict[str, Any]]) -> None:
    broken = copy.deepcopy(chart_objects)
    policy = next(o for o in broken if o["metadata"]["name"] == "gnnsched-gpu-share-pods")
    policy["spec"]["validations"][0]["expression"] = "object.spec.nope == 1"
    denial = review(broken, OPERATOR, "CREATE", operator_pod(None))
    assert denial is not None and "resulted in error" in denial.message and denial.code == 422
    policy["spec"]["failurePolicy"] = "Ignore"
    assert review(broken, OPERATOR, "CREATE", operator_pod(None)) is None


# -- the emulated API server enforces what is stored ---------------------------------------------------------------

TOKENS = {"t-tenant": TENANT, "t-operator": OPERATOR, "t-agent-1": agent("node-1")}


def _install(url: str, objs: list[dict[str, Any]]) -> None:
    for obj in objs:
        plural = "validatingadmissionpolicies" if obj["kind"] == "ValidatingAdmissionPolicy" else \
            "validatingadmissionpolicybindings"
        r = requests.post(f"{url}/apis/admissionregistration.k8s.io/v1/{plural}", json=obj, timeout=10)
        assert r.status_code in (200, 201), r.text


def _as(token: str, method: str, url: str, body: Any, content_type: str = "application/json") -> requests.Response:
    return requests.request(method, url, json=body, timeout=10,
                            headers={"Authorization": f"Bearer {token}", "Content-Type": content_type})


def test_the_emulated_api_server_refuses_a_forged_gnnjob_owner_and_a_share_pod(tmp_path: Path) -> None:
    """Finding 1 ("a plain pod in any namespace may request gpu-share") and finding 3 ("an ownerReference any tenant
    can write"), over HTTP against the emulated API server holding the chart's policies."""

    async def scenario() -> dict[str, Any]:
        async with emulated_cluster(tmp_path) as cluster:
            cluster.k8s.tokens.update(TOKENS)
            objs = admission_objects()
            await asyncio.to_thread(_install, cluster.url, objs)
            pods = f"{cluster.url}/api/v1/namespaces/default/pods"
            forged = pod("forged", "default", owners=[{**JOB_OWNER, "uid": "tenant-job"}])
            share = pod("share", "default", share="1")
            out: dict[str, Any] = {}
            out["forged"] = await asyncio.to_thread(_as, "t-tenant", "POST", pods, forged)
            out["share"] = await asyncio.to_thread(_as, "t-tenant", "POST", pods, share)
            out["plain"] = await asyncio.to_thread(_as, "t-tenant", "POST", pods, pod("plain", "default"))
            out["operator"] = await asyncio.to_thread(_as, "t-operator", "POST", pods,
                                                      {**operator_pod(None), "metadata": {
                                                          **operator_pod(None)["metadata"], "namespace": "default"}})
            out["json-patch"] = await asyncio.to_thread(
                _as, "t-tenant", "PATCH", f"{pods}/plain",
                [{"op": "add", "path": "/metadata/ownerReferences", "value": [JOB_OWNER]}],
                "application/json-patch+json")
            out["merge-patch"] = await asyncio.to_thread(
                _as, "t-tenant", "PATCH", f"{pods}/train-a-1", {"metadata": {"annotations": {ANN_ADMIT_BYTES: "1"}}},
                "application/merge-patch+json")
            out["agent-other-node"] = await asyncio.to_thread(
                _as, "t-agent-1", "PATCH", f"{pods}/train-a-1", {"metadata": {"annotations": {"gnnsched.io/gpu": "G"}}},
                "application/merge-patch+json")
            out["unknown-token"] = await asyncio.to_thread(_as, "nope", "POST", pods, pod("x", "default"))
            out["stored"] = await asyncio.to_thread(lambda: requests.get(f"{pods}/train-a-1", timeout=10).json())
            return out

    out = asyncio.run(scenario())
    for case in ("forged", "share", "json-patch", "merge-patch", "agent-other-node"):
        r = out[case]
        assert r.status_code == 403, (case, r.status_code, r.text)
        body = r.json()
        assert body["kind"] == "Status" and body["reason"] == "Forbidden" and body["code"] == 403
        assert body["message"].startswith("ValidatingAdmissionPolicy 'gnnsched-"), body
    assert "ownerReference to a GNNJob" in out["forged"].json()["message"]
    assert "gnnsched-gpu-share-pods" in out["share"].json()["message"]
    assert out["plain"].status_code in (200, 201) and out["operator"].status_code in (200, 201), out["operator"].text
    assert out["unknown-token"].status_code == 401
    # the refused patches left the operator's pod as it was (the agent's: it is not bound to node-1)
    assert out["stored"]["metadata"]["annotations"] == {ANN_ADMIT_BYTES: "1073741824"}
