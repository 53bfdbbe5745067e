"""``gnnsched doctor``: a preflight of a live cluster for administrators, against the current kubeconfig context.

Why: every component passes its tests against stand-ins, but a real cluster can still miss what gnnsched needs (a
RuntimeClass, a namespace that admits privileged pods, a second device plugin handing out the same GPUs, a
kube-scheduler newer than the API server). Each check reads the cluster (never writes, except ``--run-test-job``),
says PASS, WARN or FAIL, and gives the command or setting that fixes a failure. A FAIL is a blocker: the exit status
is 1 when there is one.

Checks (the names are stable, ``--json`` prints them):

* ``server-version``: kube-scheduler's image (the scheduler Deployment's ``kube-scheduler`` container) against the
  API server's version. Its version-skew policy: never newer than the API server, at most one minor older.
* ``crds``: both CRDs exist and their schemas equal the ones in ``crds/`` (Helm never upgrades CRDs).
* ``runtime-class``: the jobs' RuntimeClass exists.
* ``namespace-privileged``: the release namespace's Pod Security ``enforce`` label admits the node DaemonSets'
  privileged pods.
* ``gpu-nodes``: nodes carry the GPU label; their NoSchedule/NoExecute taints are tolerated by the job pods.
* ``node-agents``: per GPU node, a Ready node-agent pod and a fresh ``GPUNode`` whose MPS is up, compute mode
  ``EXCLUSIVE_PROCESS`` and ``/dev/shm`` shared (what the agent and the MPS daemon report).
* ``gpu-constants``: every GPU a ``GPUNode`` lists has device constants to plan shared jobs with: a WARN names each
  GPU that is not in the catalogue and not measured by its node (its jobs run alone: ``UnknownGPUModel``), whose
  node measured an allocator gnnsched cannot model (``AllocatorModelMismatch``), or that is planned on catalogue
  constants no GPU of its model ever measured, with what it means and what to do.
* ``other-device-plugin``: no GPU node also advertises ``nvidia.com/gpu`` (NVIDIA's plugin would hand the same GPUs
  to pods outside the gate).
* ``admission-policies``: the chart's three ValidatingAdmissionPolicies (``gpu-share-pods``, ``pod-fields``,
  ``node-agent-scope``) exist for this namespace's service accounts and are bound with ``Deny``: without them any
  tenant may create a pod that takes a GPU share outside the gate or write the annotations placement trusts
  (docs/security.md).
* ``test-job`` (``--run-test-job``): one tiny GNNJob runs to ``Succeeded``; it is deleted afterwards.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from gnnsched.contract import (
    API_VERSION,
    GNNJOB_PLURAL,
    GPUNODE_PLURAL,
    GROUP,
    OTHER_GPU_RESOURCE,
    VERSION,
)

Status = Literal["PASS", "WARN", "FAIL"]
DEFAULT_GPU_LABEL = "nvidia.com/gpu.present=true"
COMPONENT_LABEL = "app.kubernetes.io/component"
PSA_ENFORCE = "pod-security.kubernetes.io/enforce"
STALE_SECONDS = 120.0
ADMISSION_API = "/apis/admissionregistration.k8s.io/v1"
ADMISSION_POLICY_LABEL = "gnnsched.io/admission-policy"  # the chart's label on each policy: its role
ADMISSION_ROLES = ("gpu-share-pods", "pod-fields", "node-agent-scope")
TEST_JOB_SPEC = {"mode": "train", "model": {"arch": "gcn", "layers": 2, "hidden": 16},
                 "graph": {"nodes": 100, "edges": 400, "features": 8, "classes": 2}, "epochs": 1}


class Check(BaseModel):
    """One line of the checklist."""

    name: str
    status: Status
    message: str
    fix: str = ""


class DoctorError(Exception):
    """The cluster could not be read at all (no kubeconfig, API server unreachable)."""


Getter = Callable[[str], Any]


class ClusterReader:
    """GET/POST/DELETE of raw JSON through the ``kubernetes`` client (the kubeconfig's credentials)."""

    def __init__(self, api_client: Any) -> None:
        self.api = api_client

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        import urllib.parse

        import kubernetes
        import urllib3

        resource, _, query = path.partition("?")
        try:
            serialized = self.api.param_serialize(
                method, resource, query_params=urllib.parse.parse_qsl(query), body=body,
                header_params={"Content-Type": "application/json", "Accept": "application/json"},
                auth_settings=["BearerToken"])
            response = self.api.call_api(*serialized, _request_timeout=30)
            response.read()
        except kubernetes.client.ApiException as exc:
            return int(exc.status or 0), None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise DoctorError(f"cannot reach the API server: {exc}") from None
        try:
            data = json.loads(response.data or b"{}")
        except ValueError:
            data = None
        return int(response.status), data

    def get(self, path: str) -> Any:
        """The object, or None on 404; a refusal or server error is a ``DoctorError``."""
        status, data = self.request("GET", path)
        if status == 404:
            return None
        if status != 200:
            raise DoctorError(f"GET {path}: HTTP {status}")
        return data


def _version(text: str) -> tuple[int, int] | None:
    match = re.match(r"^v?(\d+)\.(\d+)", text or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def check_server_version(get: Getter, namespace: str) -> Check:
    server = (get("/version") or {}).get("gitVersion", "")
    deployments = (get(f"/apis/apps/v1/namespaces/{namespace}/deployments?labelSelector={COMPONENT_LABEL}%3Dscheduler")
                   or {}).get("items") or []
    images = [c.get("image", "") for d in deployments
              for c in (((d.get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers") or []
              if c.get("name") == "kube-scheduler"]
    if not images:
        return Check(name="server-version", status="FAIL",
                     message=f"no gnnsched scheduler Deployment in namespace {namespace} (API server {server})",
                     fix=f"helm install gnnsched charts/gnnsched --namespace {namespace} (or pass --namespace)")
    tag = images[0].rsplit(":", 1)[-1] if ":" in images[0] else ""
    sv, tv = _version(server), _version(tag)
    if sv is None or tv is None:
        return Check(name="server-version", status="WARN",
                     message=f"cannot compare kube-scheduler {images[0]} with API server {server!r}")
    if tv > sv:
        return Check(name="server-version", status="FAIL",
                     message=f"kube-scheduler {tag} is newer than the API server {server}; the version-skew policy "
                             "forbids it",
                     fix="leave scheduler.image.tag empty (the chart then uses the cluster's version) or set it "
                         f"to v{sv[0]}.{sv[1]}.x")
    if sv[0] != tv[0] or sv[1] - tv[1] > 1:
        return Check(name="server-version", status="FAIL",
                     message=f"kube-scheduler {tag} is more than one minor version older than the API server {server}",
                     fix="leave scheduler.image.tag empty so the chart follows the cluster's version")
    if sv[1] != tv[1]:
        return Check(name="server-version", status="WARN",
                     message=f"kube-scheduler {tag} is one minor version older than the API server {server} "
                             "(allowed during an upgrade)",
                     fix="helm upgrade once the control plane upgrade is done")
    return Check(name="server-version", status="PASS", message=f"kube-scheduler {tag} matches the API server {server}")


def _schemas(crd: dict[str, Any]) -> dict[str, Any]:
    return {v.get("name"): (v.get("schema") or {}).get("openAPIV3Schema")
            for v in (crd.get("spec") or {}).get("versions") or []}


def check_crds(get: Getter, crds_dir: Path | None) -> Check:
    import yaml

    if crds_dir is None or not crds_dir.is_dir():
        return Check(name="crds", status="WARN", message="no crds/ directory to compare with (pass --crds DIR)",
                     fix="run from a checkout of the chart's version, or pass --crds charts/gnnsched/crds")
    missing, stale = [], []
    for path in sorted(crds_dir.glob("*.yaml")):
        wanted = yaml.safe_load(path.read_text())
        name = wanted["metadata"]["name"]
        live = get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        if live is None:
            missing.append(name)
        elif _schemas(live) != _schemas(wanted):
            stale.append(name)
    fix = f"kubectl apply --server-side -f {crds_dir}/  (Helm installs CRDs once and never upgrades them)"
    if missing:
        return Check(name="crds", status="FAIL", message=f"missing: {', '.join(missing)}", fix=fix)
    if stale:
        return Check(name="crds", status="FAIL",
                     message=f"not current (schema differs from {crds_dir}): {', '.join(stale)}", fix=fix)
    return Check(name="crds", status="PASS", message=f"present and current ({crds_dir})")


def check_runtime_class(get: Getter, name: str) -> Check:
    if not name:
        return Check(name="runtime-class", status="WARN",
                     message="job pods use no RuntimeClass: the node's default runtime must inject the GPU (CDI)")
    if get(f"/apis/node.k8s.io/v1/runtimeclasses/{name}") is None:
        return Check(name="runtime-class", status="FAIL", message=f"RuntimeClass {name!r} does not exist",
                     fix="install the NVIDIA container toolkit / GPU Operator (it creates 'nvidia'), or set "
                         "jobs.runtimeClassName (and node.runtimeClassName) to the cluster's GPU RuntimeClass")
    return Check(name="runtime-class", status="PASS", message=f"RuntimeClass {name!r} exists")


def check_namespace(get: Getter, namespace: str) -> Check:
    ns = get(f"/api/v1/namespaces/{namespace}")
    if ns is None:
        return Check(name="namespace-privileged", status="FAIL", message=f"namespace {namespace} does not exist",
                     fix=f"helm install ... --namespace {namespace} --create-namespace")
    level = ((ns.get("metadata") or {}).get("labels") or {}).get(PSA_ENFORCE)
    fix = f"kubectl label namespace {namespace} {PSA_ENFORCE}=privileged --overwrite"
    if level in (None, ""):
        return Check(name="namespace-privileged", status="WARN",
                     message=f"namespace {namespace} has no {PSA_ENFORCE} label: the cluster's default level applies "
                             "(privileged unless the admission configuration says otherwise)", fix=fix)
    if level != "privileged":
        return Check(name="namespace-privileged", status="FAIL",
                     message=f"namespace {namespace} enforces Pod Security {level!r}: the node DaemonSets' privileged "
                             "pods are refused", fix=fix)
    return Check(name="namespace-privileged", status="PASS", message=f"namespace {namespace} admits privileged pods")


def _tolerates(tolerations: list[dict[str, Any]], taint: dict[str, Any]) -> bool:
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        if not t.get("key"):
            if t.get("operator") == "Exists":
                return True
            continue
        if t.get("key") != taint.get("key"):
            continue
        if t.get("operator") == "Exists" or (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def gpu_nodes(get: Getter, label: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(nodes carrying the GPU label, all nodes)."""
    nodes = (get("/api/v1/nodes") or {}).get("items") or []
    key, _, value = label.partition("=")
    labelled = [n for n in nodes if ((n.get("metadata") or {}).get("labels") or {}).get(key) == value]
    return labelled, nodes


def check_gpu_nodes(labelled: list[dict[str, Any]], nodes: list[dict[str, Any]], label: str,
                    tolerations: list[dict[str, Any]]) -> list[Check]:
    if not labelled:
        return [Check(name="gpu-nodes", status="FAIL", message=f"no node is labelled {label}",
                      fix=f"kubectl label node <gpu-node> {label} (NVIDIA's GPU feature discovery sets it), or set "
                          "node.nodeSelector to your GPU nodes' label")]
    checks = []
    for n in labelled:
        name = n["metadata"]["name"]
        taints = [t for t in (n.get("spec") or {}).get("taints") or []
                  if t.get("effect") in ("NoSchedule", "NoExecute")]
        blocked = [t for t in taints if not _tolerates(tolerations, t)]
        if blocked:
            text = ", ".join(f"{t.get('key')}={t.get('value', '')}:{t.get('effect')}" for t in blocked)
            checks.append(Check(name="gpu-nodes", status="FAIL",
                                message=f"node {name}: job pods do not tolerate its taint {text}",
                                fix="add the taint to jobs.tolerations (operator --tolerations)"))
        elif not taints:
            checks.append(Check(name="gpu-nodes", status="WARN",
                                message=f"node {name} is not tainted: other workloads may take its CPU and memory",
                                fix=f"kubectl taint node {name} nvidia.com/gpu=present:NoSchedule"))
    unlabelled = [n["metadata"]["name"] for n in nodes if n not in labelled and
                  int(str(((n.get("status") or {}).get("capacity") or {}).get(OTHER_GPU_RESOURCE, "0")) or 0) > 0]
    if unlabelled:
        checks.append(Check(name="gpu-nodes", status="WARN",
                            message=f"nodes with GPUs but without {label}: {', '.join(unlabelled)}",
                            fix=f"kubectl label node <node> {label} to let gnnsched use them"))
    if not any(c.status == "FAIL" for c in checks):
        checks.insert(0, Check(name="gpu-nodes", status="PASS",
                               message=f"{len(labelled)} GPU node(s) labelled {label}, taints tolerated"))
    return checks


def _ready(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def check_node_agents(get: Getter, namespace: str, labelled: list[dict[str, Any]], now: datetime) -> list[Check]:
    pods = (get(f"/api/v1/namespaces/{namespace}/pods?labelSelector={COMPONENT_LABEL}%3Dnode") or {}).get("items") or []
    checks: list[Check] = []
    for n in labelled:
        name = n["metadata"]["name"]
        agents = [p for p in pods if (p.get("spec") or {}).get("nodeName") == name]
        problems: list[tuple[str, str]] = []
        if not agents:
            problems.append(("no node-agent pod", f"kubectl -n {namespace} describe ds -l {COMPONENT_LABEL}=node "
                                                  "(node selector, tolerations, Pod Security)"))
        elif not any(_ready(p) for p in agents):
            problems.append(("node-agent pod not Ready",
                             f"kubectl -n {namespace} logs {agents[0]['metadata']['name']} --all-containers"))
        gpunode = get(f"/apis/{GROUP}/{VERSION}/{GPUNODE_PLURAL}/{name}")
        status = (gpunode or {}).get("status") or {}
        mps = status.get("mps") or {}
        if gpunode is None:
            problems.append(("no GPUNode object (the agent never reported)",
                             f"kubectl -n {namespace} logs -l {COMPONENT_LABEL}=node -c agent"))
        else:
            updated = status.get("updatedAt")
            try:
                age = (now - datetime.fromisoformat(str(updated).replace("Z", "+00:00"))).total_seconds()
            except ValueError:
                age = float("inf")
            if age > STALE_SECONDS:
                problems.append((f"GPUNode not updated for {age:.0f} s" if age != float("inf")
                                 else "GPUNode has no updatedAt", "check the agent's logs and liveness"))
            if mps.get("healthy") is False:
                problems.append((f"MPS down: {mps.get('message') or 'no reason given'}",
                                 "check the MPS daemon pod's logs and /var/log/gnnsched/mps/control.log on the node"))
            if "computeMode" in mps and mps.get("computeMode") != "EXCLUSIVE_PROCESS":
                problems.append((f"compute mode {mps.get('computeMode') or 'unknown'}, not EXCLUSIVE_PROCESS",
                                 "the MPS daemon sets it (it needs a privileged pod); check its logs"))
            if mps.get("shmShared") is False:
                problems.append(("/dev/shm is not the shared MPS tmpfs",
                                 "the MPS daemon pod must mount <mps root>/shm at /dev/shm (chart's mps DaemonSet)"))
        for message, fix in problems:
            checks.append(Check(name="node-agents", status="FAIL", message=f"node {name}: {message}", fix=fix))
    if labelled and not checks:
        checks.append(Check(name="node-agents", status="PASS",
                            message=f"{len(labelled)} agent(s) Ready, MPS up, exclusive compute, shared /dev/shm"))
    return checks


def check_gpu_constants(gpunodes: list[dict[str, Any]]) -> list[Check]:
    """Per GPU that lacks measured device constants, a WARN with what it means for its jobs and what to do.

    Why a warning and not a blocker: such a GPU still runs jobs, only alone (no constants) or on figures nobody
    measured on that model (catalogue only); the cluster works, it shares less or less safely than it could."""
    from pydantic import ValidationError

    from gnnsched.contract import GPUNodeStatus
    from gnnsched.gpu.catalogue import find_gpu_model
    from gnnsched.gpu.measured import ALLOCATOR_MISMATCH, missing_constants

    checks: list[Check] = []
    count = 0
    for obj in gpunodes:
        name = str(((obj.get("metadata") or {}).get("name")) or "?")
        try:
            status = GPUNodeStatus.model_validate({"nodeName": name, **(obj.get("status") or {})})
        except (ValidationError, TypeError):
            continue  # node-agents reports a GPUNode it cannot read
        for g in status.gpus:
            count += 1
            where = f"node {name} GPU {g.index} ({g.model})"
            reason = missing_constants(g.model, g.measured, g.catalogued)
            if reason == ALLOCATOR_MISMATCH:
                detail = g.measured.allocator_detail if g.measured is not None else ""
                checks.append(Check(
                    name="gpu-constants", status="WARN",
                    message=f"{where}: the node measured a CUDA caching allocator that does not behave as gnnsched "
                            f"models it{f' ({detail})' if detail else ''}; reserved memory cannot be predicted "
                            "there, so its jobs run alone (AllocatorModelMismatch)",
                    fix="remove PYTORCH_CUDA_ALLOC_CONF settings such as expandable_segments from the node's jobs "
                        "and the agent's environment, then restart the node agent so it measures again"))
            elif reason is not None:
                checks.append(Check(
                    name="gpu-constants", status="WARN",
                    message=f"{where}: not in gnnsched's GPU catalogue and not measured by its node; its jobs run "
                            "alone, never on another model's constants (UnknownGPUModel)",
                    fix="check the node agent's log for its measurement at start (it publishes "
                        "status.gpus[].measured in the GPUNode); once it does, jobs share this GPU"))
            elif g.measured is None:
                model = find_gpu_model(g.model)
                unmeasured = model.unmeasured() if model is not None else []
                if unmeasured:
                    checks.append(Check(
                        name="gpu-constants", status="WARN",
                        message=f"{where}: not measured by its node; plans use the catalogue's constants, of which "
                                f"{', '.join(unmeasured)} were never measured on a {model.name if model else g.model} "
                                "(an estimate on them can be tens of percent off)",
                        fix="let the node agent measure its GPUs at start (see its log); its measurement then "
                            "replaces the catalogue's figures for this node"))
    if not checks:
        checks.append(Check(name="gpu-constants", status="PASS",
                            message=f"{count} GPU(s): every one has measured or catalogue-measured device constants"))
    return checks


def check_other_device_plugin(labelled: list[dict[str, Any]]) -> Check:
    doubled = []
    for n in labelled:
        amount = str(((n.get("status") or {}).get("allocatable") or {}).get(OTHER_GPU_RESOURCE, "0"))
        if amount.isdigit() and int(amount) > 0:
            doubled.append(f"{n['metadata']['name']} ({amount})")
    if doubled:
        return Check(name="other-device-plugin", status="FAIL",
                     message=f"{OTHER_GPU_RESOURCE} is also advertised on: {', '.join(doubled)}: a second device "
                             "plugin hands the same GPUs to pods outside the gate",
                     fix="keep NVIDIA's device plugin off these nodes (GPU Operator: label the nodes "
                         "nvidia.com/gpu.deploy.device-plugin=false)")
    return Check(name="other-device-plugin", status="PASS", message=f"no GPU node advertises {OTHER_GPU_RESOURCE}")


def check_admission_policies(get: Getter, namespace: str) -> Check:
    """The chart's admission policies for this release: each role present, naming this namespace's service accounts
    (a policy of a release in another namespace would refuse this one's operator), and bound with ``Deny``."""
    name = "admission-policies"
    fix = (f"helm upgrade <release> charts/gnnsched --namespace {namespace} --reuse-values "
           "--set admissionPolicies.enabled=true (Kubernetes 1.30+; docs/security.md)")
    listed = get(f"{ADMISSION_API}/validatingadmissionpolicies")
    if listed is None:
        return Check(name=name, status="FAIL", fix="upgrade the control plane to Kubernetes 1.30 or newer",
                     message="the API server serves no admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy "
                             "(GA in Kubernetes 1.30): nothing keeps tenants' pods off the GPU shares")
    bindings = (get(f"{ADMISSION_API}/validatingadmissionpolicybindings") or {}).get("items") or []
    accounts = f"system:serviceaccount:{namespace}:"
    mine: dict[str, str] = {}
    elsewhere: set[str] = set()
    for policy in listed.get("items") or []:
        meta = policy.get("metadata") or {}
        role = (meta.get("labels") or {}).get(ADMISSION_POLICY_LABEL)
        if role not in ADMISSION_ROLES:
            continue
        if accounts in json.dumps(policy.get("spec") or {}):
            mine[role] = str(meta.get("name"))
        else:
            elsewhere.add(role)
    missing = [r for r in ADMISSION_ROLES if r not in mine]
    if missing:
        other = [r for r in missing if r in elsewhere]
        detail = (f" (installed for service accounts of another namespace: {', '.join(other)})" if other else "")
        return Check(name=name, status="FAIL", fix=fix,
                     message=f"missing for namespace {namespace}: {', '.join(missing)}{detail}; any tenant may "
                             "create pods that take a GPU share outside the gate or write gnnsched.io annotations")
    enforced = {str((b.get("spec") or {}).get("policyName")) for b in bindings
                if "Deny" in ((b.get("spec") or {}).get("validationActions") or [])}
    unbound = [r for r in ADMISSION_ROLES if mine[r] not in enforced]
    if unbound:
        return Check(name=name, status="FAIL", fix=fix,
                     message="not enforced (no ValidatingAdmissionPolicyBinding with validationActions Deny): "
                             + ", ".join(f"{r} ({mine[r]})" for r in unbound))
    return Check(name=name, status="PASS",
                 message=f"{len(ADMISSION_ROLES)} policies installed and bound with Deny: {', '.join(ADMISSION_ROLES)}")


def run_test_job(reader: ClusterReader, namespace: str, timeout: float, poll: float = 2.0) -> Check:
    name = f"gnnsched-doctor-{uuid.uuid4().hex[:6]}"
    path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{GNNJOB_PLURAL}"
    body = {"apiVersion": API_VERSION, "kind": "GNNJob", "metadata": {"name": name}, "spec": TEST_JOB_SPEC}
    status, _ = reader.request("POST", path, body)
    if status not in (200, 201):
        return Check(name="test-job", status="FAIL", message=f"could not create GNNJob {name} (HTTP {status})",
                     fix="check the CRDs and your permissions (create gnnjobs)")
    deadline = time.monotonic() + timeout
    phase, message = None, ""
    try:
        while time.monotonic() < deadline:
            job = reader.get(f"{path}/{name}") or {}
            phase = (job.get("status") or {}).get("phase")
            message = (job.get("status") or {}).get("message") or ""
            if phase in ("Succeeded", "Failed"):
                break
            time.sleep(poll)
    finally:
        reader.request("DELETE", f"{path}/{name}")
    if phase == "Succeeded":
        return Check(name="test-job", status="PASS", message=f"GNNJob {name} Succeeded (deleted)")
    return Check(name="test-job", status="FAIL",
                 message=f"GNNJob {name} ended {phase or 'without a phase'} after {timeout:.0f} s"
                         + (f": {message}" if message else ""),
                 fix=f"kubectl -n {namespace} describe gj,pods -l gnnsched.io/job-name={name} while it runs")


def run_checks(reader: ClusterReader, namespace: str, crds_dir: Path | None, runtime_class: str,
               gpu_label: str, tolerations: list[dict[str, Any]], test_job: bool = False,
               test_namespace: str = "default", timeout: float = 300.0) -> list[Check]:
    get = reader.get
    checks = [check_server_version(get, namespace), check_crds(get, crds_dir), check_runtime_class(get, runtime_class),
              check_namespace(get, namespace)]
    labelled, nodes = gpu_nodes(get, gpu_label)
    checks += check_gpu_nodes(labelled, nodes, gpu_label, tolerations)
    checks += check_node_agents(get, namespace, labelled, datetime.now(tz=timezone.utc))
    checks += check_gpu_constants((get(f"/apis/{GROUP}/{VERSION}/{GPUNODE_PLURAL}") or {}).get("items") or [])
    checks.append(check_other_device_plugin(labelled))
    checks.append(check_admission_policies(get, namespace))
    if test_job:
        checks.append(run_test_job(reader, test_namespace, timeout))
    return checks


def render(checks: list[Check]) -> str:
    lines = []
    for c in checks:
        lines.append(f"[{c.status}] {c.name}: {c.message}")
        if c.fix and c.status != "PASS":
            lines.append(f"       fix: {c.fix}")
    blockers = sum(c.status == "FAIL" for c in checks)
    warnings = sum(c.status == "WARN" for c in checks)
    lines.append(f"{blockers} blocker(s), {warnings} warning(s)")
    return "\n".join(lines)


def default_crds_dir() -> Path | None:
    """``crds/`` of the checkout this package runs from, if there is one."""
    here = Path(__file__).resolve().parent.parent / "crds"
    return here if here.is_dir() else None
