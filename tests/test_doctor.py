"""``gnnsched doctor`` against the emulated API server: a healthy cluster passes; each bad state the issue lists is
a FAIL (exit 1) with its fix; ``--run-test-job`` runs one GNNJob to Succeeded through the real operator."""

from __future__ import annotations

import asyncio
import copy
import datetime
import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kmock
import pytest
import yaml
from chart_policies import admission_objects
from operator_harness import Cluster, emulated_cluster, running_operator

from gnnsched.doctor import ClusterReader, run_checks

ROOT = Path(__file__).resolve().parents[1]
NS = "gnnsched"
GPU_TOL = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def _now() -> str:
    return datetime.datetime.now(tz=datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


ADMISSION = "admissionregistration.k8s.io/v1"
PLURALS = {"ValidatingAdmissionPolicy": "validatingadmissionpolicies",
           "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings"}


@functools.lru_cache(maxsize=1)
def _chart_admission() -> str:
    """The chart's admission policies and bindings for a release in NS, as JSON (rendered once by Helm)."""
    return json.dumps(admission_objects(release="gnnsched", namespace=NS))


def healthy() -> dict[tuple[str, str | None, str], dict[str, Any]]:
    """Every object a working install shows, keyed as kmock stores them."""
    objs: dict[tuple[str, str | None, str], dict[str, Any]] = {}
    for obj in json.loads(_chart_admission()):
        objs[f"{ADMISSION}/{PLURALS[obj['kind']]}", None, obj["metadata"]["name"]] = obj
    objs["v1/namespaces", None, NS] = {"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": NS, "labels": {"pod-security.kubernetes.io/enforce": "privileged"}}}
    objs["apps/v1/deployments", NS, "gnnsched-scheduler"] = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "gnnsched-scheduler", "namespace": NS,
                     "labels": {"app.kubernetes.io/component": "scheduler"}},
        "spec": {"template": {"spec": {"containers": [
            {"name": "kube-scheduler", "image": "registry.k8s.io/kube-scheduler:v1.33.2"},
            {"name": "extender", "image": "ghcr.io/gnnsched/gnnsched:0.1.0"}]}}}}
    for path in sorted((ROOT / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        objs["apiextensions.k8s.io/v1/customresourcedefinitions", None, crd["metadata"]["name"]] = crd
    objs["node.k8s.io/v1/runtimeclasses", None, "nvidia"] = {
        "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"}, "handler": "nvidia"}
    objs["v1/nodes", None, "gpu-1"] = {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "gpu-1", "labels": {"nvidia.com/gpu.present": "true"}},
        "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
        "status": {"capacity": {"gnnsched.io/gpu-share": "96"}, "allocatable": {"gnnsched.io/gpu-share": "96"}}}
    objs["v1/nodes", None, "cpu-1"] = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cpu-1"},
                                       "status": {"capacity": {"cpu": "8"}}}
    objs["v1/pods", NS, "gnnsched-node-abc"] = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "gnnsched-node-abc", "namespace": NS, "labels": {"app.kubernetes.io/component": "node"}},
        "spec": {"nodeName": "gpu-1", "containers": [{"name": "agent", "image": "x"}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
    objs["gnnsched.io/v1alpha1/gpunodes", None, "gpu-1"] = {
        "apiVersion": "gnnsched.io/v1alpha1", "kind": "GPUNode", "metadata": {"name": "gpu-1"},
        "status": {"nodeName": "gpu-1", "updatedAt": _now(),
                   "mps": {"healthy": True, "computeMode": "EXCLUSIVE_PROCESS", "shmShared": True}, "gpus": []}}
    return objs


def _set(path: list[Any], value: Any) -> Callable[[dict[Any, Any]], None]:
    """A mutation of the healthy objects: ``path`` starts with the object's key."""

    def apply(objs: dict[Any, Any]) -> None:
        node = objs[path[0]]
        for part in path[1:-1]:
            node = node[part]
        if value is None:
            node.pop(path[-1], None)
        else:
            node[path[-1]] = value
    return apply


def _drop(key: tuple[str, str | None, str]) -> Callable[[dict[Any, Any]], None]:
    return lambda objs: objs.pop(key)


def _stale_crd(objs: dict[Any, Any]) -> None:
    crd = objs["apiextensions.k8s.io/v1/customresourcedefinitions", None, "gnnjobs.gnnsched.io"]
    props = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    props.pop("tolerations", None)  # an install from before spec.tolerations


SCHED = ("apps/v1/deployments", NS, "gnnsched-scheduler")
NODE = ("v1/nodes", None, "gpu-1")
GPUNODE = ("gnnsched.io/v1alpha1/gpunodes", None, "gpu-1")
AGENT = ("v1/pods", NS, "gnnsched-node-abc")

BAD_STATES: dict[str, tuple[Callable[[dict[Any, Any]], None], str, str, str]] = {
    # name: (mutation, failing check, message fragment, fix fragment)
    "scheduler-newer-than-server": (
        _set([SCHED, "spec", "template", "spec", "containers", 0, "image"], "registry.k8s.io/kube-scheduler:v1.34.2"),
        "server-version", "newer than the API server", "scheduler.image.tag"),
    "scheduler-two-minors-older": (
        _set([SCHED, "spec", "template", "spec", "containers", 0, "image"], "registry.k8s.io/kube-scheduler:v1.31.0"),
        "server-version", "more than one minor version older", "scheduler.image.tag"),
    "no-scheduler": (_drop(SCHED), "server-version", "no gnnsched scheduler Deployment", "helm install"),
    "crd-missing": (_drop(("apiextensions.k8s.io/v1/customresourcedefinitions", None, "gpunodes.gnnsched.io")),
                    "crds", "missing: gpunodes.gnnsched.io", "kubectl apply --server-side"),
    "crd-stale": (_stale_crd, "crds", "not current", "kubectl apply --server-side"),
    "no-runtime-class": (_drop(("node.k8s.io/v1/runtimeclasses", None, "nvidia")), "runtime-class",
                         "RuntimeClass 'nvidia' does not exist", "jobs.runtimeClassName"),
    "namespace-restricted": (
        _set([("v1/namespaces", None, NS), "metadata", "labels", "pod-security.kubernetes.io/enforce"], "restricted"),
        "namespace-privileged", "enforces Pod Security 'restricted'", "enforce=privileged"),
    "no-gpu-label": (_set([NODE, "metadata", "labels"], {}), "gpu-nodes", "no node is labelled", "kubectl label"),
    "untolerated-taint": (
        _set([NODE, "spec", "taints"], [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]),
        "gpu-nodes", "do not tolerate its taint dedicated=ml:NoSchedule", "jobs.tolerations"),
    "agent-not-ready": (_set([AGENT, "status", "conditions"], [{"type": "Ready", "status": "False"}]),
                        "node-agents", "node-agent pod not Ready", "kubectl -n gnnsched logs"),
    "no-agent": (_drop(AGENT), "node-agents", "no node-agent pod", "describe ds"),
    "no-gpunode": (_drop(GPUNODE), "node-agents", "no GPUNode object", "logs"),
    "gpunode-stale": (_set([GPUNODE, "status", "updatedAt"], "2026-01-01T00:00:00Z"), "node-agents",
                      "GPUNode not updated for", "liveness"),
    "mps-down": (_set([GPUNODE, "status", "mps", "healthy"], False), "node-agents", "MPS down", "MPS daemon"),
    "compute-mode-default": (_set([GPUNODE, "status", "mps", "computeMode"], "DEFAULT"), "node-agents",
                             "compute mode DEFAULT, not EXCLUSIVE_PROCESS", "privileged"),
    "shm-not-shared": (_set([GPUNODE, "status", "mps", "shmShared"], False), "node-agents",
                       "/dev/shm is not the shared MPS tmpfs", "/dev/shm"),
    "second-device-plugin": (_set([NODE, "status", "allocatable", "nvidia.com/gpu"], "4"), "other-device-plugin",
                             "nvidia.com/gpu is also advertised on: gpu-1 (4)", "device-plugin=false"),
    "no-admission-policies": (_drop((f"{ADMISSION}/validatingadmissionpolicies", None, "gnnsched-pod-fields")),
                              "admission-policies", "missing for namespace gnnsched: pod-fields",
                              "admissionPolicies.enabled=true"),
    "admission-policies-of-another-namespace": (
        lambda objs: objs.update({k: json.loads(json.dumps(v).replace("system:serviceaccount:gnnsched:",
                                                                      "system:serviceaccount:other:"))
                                  for k, v in list(objs.items()) if k[0].endswith("/validatingadmissionpolicies")}),
        "admission-policies", "installed for service accounts of another namespace: gpu-share-pods",
        "--namespace gnnsched"),
    "admission-policy-audit-only": (
        _set([(f"{ADMISSION}/validatingadmissionpolicybindings", None, "gnnsched-gpu-share-pods"), "spec",
              "validationActions"], ["Audit"]),
        "admission-policies", "not enforced (no ValidatingAdmissionPolicyBinding with validationActions Deny): "
                              "gpu-share-pods (gnnsched-gpu-share-pods)", "admissionPolicies.enabled"),
}


def _declare(k8s: Any) -> None:
    for key, kind, namespaced in (("apps/v1/deployments", "Deployment", True),
                                  ("apiextensions.k8s.io/v1/customresourcedefinitions", "CustomResourceDefinition",
                                   False),
                                  ("node.k8s.io/v1/runtimeclasses", "RuntimeClass", False),
                                  ("v1/nodes", "Node", False)):
        k8s.resources[key] = kmock.ResourceInfo(kind=kind, singular=kind.lower(), namespaced=namespaced,
                                                verbs={"get", "list", "create", "delete"})


async def _seed(cluster: Cluster, objs: dict[Any, Any], version: str = "v1.33.4") -> None:
    _declare(cluster.k8s)
    cluster.k8s.server_version = version
    for key, obj in objs.items():
        cluster.k8s.objects[key] = obj


def _reader(cluster: Cluster) -> ClusterReader:
    import kubernetes

    configuration = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(config_file=str(cluster.kubeconfig), client_configuration=configuration)
    return ClusterReader(kubernetes.client.ApiClient(configuration))


async def _doctor_cli(cluster: Cluster, *extra: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-P", "-m", "gnnsched.cli", "doctor", "--kubeconfig", str(cluster.kubeconfig), *extra,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    return int(proc.returncode or 0), out.decode()


def test_a_healthy_cluster_passes_every_check_and_exits_0(tmp_path: Path) -> None:
    async def scenario() -> tuple[int, str, int, str]:
        async with emulated_cluster(tmp_path) as cluster:
            await _seed(cluster, healthy())
            code, out = await _doctor_cli(cluster)
            jcode, jout = await _doctor_cli(cluster, "--json")
            return code, out, jcode, jout

    code, out, jcode, jout = asyncio.run(scenario())
    assert code == 0, out
    assert "[FAIL]" not in out and out.strip().endswith("0 blocker(s), 0 warning(s)"), out
    for name in ("server-version", "crds", "runtime-class", "namespace-privileged", "gpu-nodes", "node-agents",
                 "other-device-plugin", "admission-policies"):
        assert f"[PASS] {name}:" in out, out
    assert jcode == 0 and {c["name"] for c in json.loads(jout)} >= {"crds", "node-agents"}


@pytest.mark.parametrize("state", list(BAD_STATES))
def test_each_bad_state_is_a_blocker_with_its_fix(tmp_path: Path, state: str) -> None:
    mutate, check, message, fix = BAD_STATES[state]

    async def scenario() -> list[Any]:
        async with emulated_cluster(tmp_path) as cluster:
            objs = copy.deepcopy(healthy())
            mutate(objs)
            await _seed(cluster, objs)
            return await asyncio.to_thread(run_checks, _reader(cluster), NS, ROOT / "crds", "nvidia",
                                           "nvidia.com/gpu.present=true", GPU_TOL)

    checks = asyncio.run(scenario())
    failed = [c for c in checks if c.status == "FAIL"]
    assert [c.name for c in failed] == [check], [(c.name, c.message) for c in failed]
    assert message in failed[0].message and fix in failed[0].fix, failed[0]


def test_the_cli_exits_1_on_a_blocker_and_prints_the_fix(tmp_path: Path) -> None:
    async def scenario() -> tuple[int, str]:
        async with emulated_cluster(tmp_path) as cluster:
            objs = healthy()
            BAD_STATES["second-device-plugin"][0](objs)
            await _seed(cluster, objs)
            return await _doctor_cli(cluster)

    code, out = asyncio.run(scenario())
    assert code == 1, out
    assert "[FAIL] other-device-plugin:" in out and "fix: keep NVIDIA's device plugin off" in out
    assert "1 blocker(s)" in out


def test_an_unreachable_api_server_is_one_line(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "x", "cluster": {"server": "http://127.0.0.1:9"}}],
        "users": [{"name": "x", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "x", "user": "x"}}]}))
    import subprocess

    proc = subprocess.run([sys.executable, "-P", "-m", "gnnsched.cli", "doctor", "--kubeconfig", str(kubeconfig)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: cannot reach the API server") and "Traceback" not in proc.stderr


def test_run_test_job_takes_a_tiny_gnnjob_to_succeeded_and_deletes_it(tmp_path: Path) -> None:
    """The real operator runs the test job; a stand-in kubelet takes its pod to Succeeded."""

    async def kubelet(cluster: Cluster, stop: asyncio.Event) -> None:
        while not stop.is_set():
            for pod in await cluster.pods():
                if pod["metadata"]["name"].startswith("gnnsched-doctor-") and \
                        (pod.get("status") or {}).get("phase") != "Succeeded":
                    await cluster.patch_pod(pod["metadata"]["name"], {"spec": {"nodeName": "gpu-1"}})
                    await cluster.patch_pod(pod["metadata"]["name"], {"status": {
                        "phase": "Succeeded", "containerStatuses": [{"name": "gnn", "state": {"terminated": {
                            "exitCode": 0, "reason": "Completed", "startedAt": _now(), "finishedAt": _now()}}}]}})
            await asyncio.sleep(0.2)

    async def scenario() -> tuple[Any, list[Any]]:
        async with emulated_cluster(tmp_path) as cluster:
            await _seed(cluster, healthy())
            await cluster.add_gpunode("gpu-2", [{"index": 0, "uuid": "GPU-0", "model": "A100-40GB",
                                                 "totalBytes": 40 * 2**30, "reserveBytes": 2**30}])
            async with running_operator(cluster):
                stop = asyncio.Event()
                fake = asyncio.create_task(kubelet(cluster, stop))
                from gnnsched.doctor import run_test_job

                check = await asyncio.to_thread(run_test_job, _reader(cluster), "default", 240.0, 0.5)
                stop.set()
                await fake
                status, jobs = await cluster.request("GET", "/apis/gnnsched.io/v1alpha1/namespaces/default/gnnjobs")
                return check, [j for j in (jobs or {}).get("items") or []
                               if not (j.get("metadata") or {}).get("deletionTimestamp")]

    check, left = asyncio.run(scenario())
    assert check.status == "PASS", check
    assert check.message.endswith("Succeeded (deleted)")
    assert left == []


def test_gpus_without_measured_constants_are_listed_with_what_they_mean_and_what_to_do(tmp_path: Path) -> None:
    """``gpu-constants``: an uncatalogued unmeasured GPU, a measured allocator mismatch and a catalogued GPU planned
    on never-measured constants are each a WARN naming the node and GPU; a measured GPU is not listed."""
    measured = {"source": "nvml", "measuredAt": _now(), "contextBytes": 700 * 2**20,
                "cublasWorkspaceBytes": 32 * 2**20, "cublasltWorkspaceBytes": 2**20}
    gpus = [
        {"index": 0, "uuid": "GPU-0", "model": "NVIDIA X9000", "totalBytes": 96 * 2**30, "catalogued": False},
        {"index": 1, "uuid": "GPU-1", "model": "H200", "totalBytes": 141 * 2**30,
         "measured": {**measured, "allocatorMatchesModel": False, "allocatorDetail": "expandable segments"}},
        {"index": 2, "uuid": "GPU-2", "model": "L40S", "totalBytes": 45 * 2**30},
        {"index": 3, "uuid": "GPU-3", "model": "NVIDIA X9000", "totalBytes": 96 * 2**30, "catalogued": False,
         "measured": measured},
    ]

    async def scenario() -> list[Any]:
        async with emulated_cluster(tmp_path) as cluster:
            objs = copy.deepcopy(healthy())
            _set([GPUNODE, "status", "gpus"], gpus)(objs)
            await _seed(cluster, objs)
            return await asyncio.to_thread(run_checks, _reader(cluster), NS, ROOT / "crds", "nvidia",
                                           "nvidia.com/gpu.present=true", GPU_TOL)

    every = asyncio.run(scenario())
    checks = [c for c in every if c.name == "gpu-constants"]
    assert [c.status for c in checks] == ["WARN"] * 3, checks
    unknown, mismatch, assumed = checks
    assert "node gpu-1 GPU 0 (NVIDIA X9000)" in unknown.message and "UnknownGPUModel" in unknown.message
    assert "run alone" in unknown.message and "status.gpus[].measured" in unknown.fix
    assert "GPU 1 (H200)" in mismatch.message and "expandable segments" in mismatch.message
    assert "AllocatorModelMismatch" in mismatch.message and "PYTORCH_CUDA_ALLOC_CONF" in mismatch.fix
    assert "GPU 2 (L40S)" in assumed.message and "context" in assumed.message and "measure" in assumed.fix
    assert not any("GPU 3" in c.message for c in checks)
    assert not any(c.status == "FAIL" for c in every)  # warnings, not blockers
