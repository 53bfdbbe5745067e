"""Issue 39, item 1 against the local cluster: the emulated API server enforces the chart's ValidatingAdmissionPolicies
as kube-apiserver does, and each component acts as its own service account (``identities.py``).

A tenant (``system:serviceaccount:team-b:default``) is refused a plain pod that requests ``gnnsched.io/gpu-share``
and a patch of a ``gnnsched.io/*`` annotation (over the REST API and with kubectl), while the GNNJob it creates runs
to ``Succeeded`` through the operator's, the scheduler's and the node agent's writes, all checked by the same
policies. On a main without the policies the tenant's pod is created and its patch applied: both asserts fail.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from identities import TENANT_NAMESPACE  # noqa: E402
from jobs import small_job  # noqa: E402
from kubeapi import JOBS, PODS, ApiError  # noqa: E402
from local_cluster import ClusterOptions, LocalCluster, gnnjob_table  # noqa: E402

from gnnsched.contract import ANN_ADMIT_BYTES, ANN_PREDICTED_RUNTIME, GPU_SHARE_RESOURCE  # noqa: E402

pytestmark = pytest.mark.slow
NS = TENANT_NAMESPACE


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    opts = ClusterOptions(nodes=1, gpus="fake:1x4Gi", reserve="256Mi", timeout=300,
                          keep=tmp_path_factory.mktemp("adm"))
    with LocalCluster(opts) as c:
        c.start()
        assert c.api is not None
        c.api.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        yield c
    assert c.pids() == []


def _refusal(call: Any) -> ApiError:
    with pytest.raises(ApiError) as refused:
        call()
    return refused.value


def _share_pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": {"containers": [{"name": "main", "image": "python:3.11", "command": ["sleep", "1"],
                                     "resources": {"requests": {GPU_SHARE_RESOURCE: "1"},
                                                   "limits": {GPU_SHARE_RESOURCE: "1"}}}]}}


def test_tenants_are_refused_and_the_operators_pods_still_run(cluster: LocalCluster) -> None:
    assert cluster.api is not None
    tenant = cluster.api_as("tenant")
    pods = PODS.format(ns=NS)

    # (1) a plain pod asking for a GPU share, created by a tenant in its own namespace: 403 from the policy
    refused = _refusal(lambda: tenant.post(pods, _share_pod("grab-a-share")))
    assert refused.status == 403, refused
    assert ("ValidatingAdmissionPolicy 'gnnsched-gpu-share-pods' with binding 'gnnsched-gpu-share-pods' denied "
            "request: only gnnsched's operator (system:serviceaccount:gnnsched:gnnsched-operator)") in str(refused)
    assert cluster.api.get_or_none(f"{pods}/grab-a-share") is None
    tenant.post(pods, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain", "namespace": NS},
                       "spec": {"containers": [{"name": "main", "image": "python:3.11", "command": ["true"]}]}})

    # (3) the tenant's GNNJob: the operator creates its pod, the scheduler binds it, the agent admits it
    job = small_job("tenant-job", epochs=1)
    job["metadata"]["namespace"] = NS
    tenant.post(JOBS.format(ns=NS), job)
    jobs = cluster.wait_jobs({"tenant-job"}, timeout=240)
    assert jobs and (jobs[0].get("status") or {}).get("phase") == "Succeeded", gnnjob_table(jobs)
    (job_pod,) = [p for p in cluster.pods() if p["metadata"]["name"].startswith("tenant-job-")]
    assert job_pod["status"]["phase"] == "Succeeded" and job_pod["spec"]["nodeName"] == "node-1"
    annotations = job_pod["metadata"]["annotations"]
    assert "gnnsched.io/gpu" in annotations  # written by the agent of node-1, as its service account

    # (2) the tenant's patch of a gnnsched.io/* annotation, on the job's pod and on its own plain pod: 403
    for name, key in ((job_pod["metadata"]["name"], ANN_ADMIT_BYTES), ("plain", ANN_PREDICTED_RUNTIME)):
        refused = _refusal(lambda n=name, k=key: tenant.patch(f"{pods}/{n}", {"metadata": {"annotations": {k: "1"}}}))
        assert refused.status == 403, refused
        assert "ValidatingAdmissionPolicy 'gnnsched-pod-fields' with binding 'gnnsched-pod-fields' denied request: " \
               "gnnsched.io/* annotations on pods are written only by gnnsched's service accounts" in str(refused)
    stored = cluster.api.get(f"{pods}/{job_pod['metadata']['name']}")
    assert stored["metadata"]["annotations"][ANN_ADMIT_BYTES] == annotations[ANN_ADMIT_BYTES]
    assert ANN_PREDICTED_RUNTIME not in (cluster.api.get(f"{pods}/plain")["metadata"].get("annotations") or {})
    tenant.patch(f"{pods}/plain", {"metadata": {"annotations": {"team-b/note": "mine"}}})  # its own keys stay its own

    if shutil.which("kubectl") is not None:  # what a tenant sees from kubectl
        env = {"PATH": "/usr/bin:/bin", "HOME": str(cluster.dir), "KUBECONFIG": str(cluster.kubeconfig_of("tenant"))}
        proc = subprocess.run(["kubectl", "-n", NS, "annotate", "pod", "plain", f"{ANN_PREDICTED_RUNTIME}=0.001"],
                              capture_output=True, text=True, timeout=60, env=env)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert proc.stderr.startswith("Error from server (Forbidden): ") and "gnnsched-pod-fields" in proc.stderr, \
            proc.stderr
