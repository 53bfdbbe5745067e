"""The agent's Kubernetes side against kmock (an in-memory API server over real HTTP): pods and GNNJob ownership read
through the kubernetes client, annotations patched onto the pod, adoption after a restart, and the GPUNode status
created and patched through the status subresource."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import datetime, timezone
from typing import Any

import pytest
from gate_helpers import GiB

from gnnsched.contract import (
    ANN_ADMIT_BYTES,
    ANN_GPU,
    ANN_GROUP,
    GNNJOB_PLURAL,
    GPUNODE_PLURAL,
    GROUP,
    VERSION,
    GPUNodeStatus,
    GPUStatus,
)
from gnnsched.node_agent.books import Books, GPUSlot
from gnnsched.node_agent.gate import GateConfig, GateServer
from gnnsched.node_agent.identity import KubePodLookup, PeerVerifier, gnnjob_owner_reference
from gnnsched.node_agent.status import KubeStatusSink
from gnnsched.trust.job_facts import STATUS_FIELD, facts_status

pytestmark = [pytest.mark.timeout(30)]


def _api(kmock):
    from kubernetes import client

    cfg = client.Configuration()
    cfg.host = str(kmock.url).rstrip("/")
    return client.ApiClient(cfg)


async def _create_job_pod(api, name: str, admit: int, node: str = "node-a", owned: bool = True) -> dict:
    from kubernetes import client

    job_uid = str(uuid.uuid4())
    meta: dict[str, Any] = {"name": name, "namespace": "default", "uid": str(uuid.uuid4()),
            "annotations": {ANN_ADMIT_BYTES: str(admit)}}
    # the operator's status names the pod with its facts (gnnsched.trust.job_facts), for the owned pod only
    job = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "GNNJob",
           "metadata": {"name": f"job-{name}", "namespace": "default", "uid": job_uid},
           "status": {STATUS_FIELD: facts_status({"metadata": meta})}}
    await asyncio.to_thread(client.CustomObjectsApi(api).create_namespaced_custom_object, GROUP, VERSION, "default",
                            GNNJOB_PLURAL, job)
    if owned:
        meta["ownerReferences"] = [gnnjob_owner_reference(f"job-{name}", job_uid)]
    pod: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
           "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]}, "status": {"phase": "Running"}}
    body: Any = pod  # the client serialises a plain dict as it would a V1Pod
    await asyncio.to_thread(client.CoreV1Api(api).create_namespaced_pod, "default", body)
    return pod


async def _server(tmp_path, api, name: str) -> GateServer:
    books = Books([GPUSlot(i, f"GPU-{i}", "Fake-GPU", 80 * GiB, 2 * GiB, 48) for i in range(2)], "base")
    # one seal key for both servers: the node's, which the agent reads from its state directory (gate_checks)
    server = GateServer(books, GateConfig("node-a", "/run/mps", recovery_grace=0, reconcile_seconds=0,
                                          seal_key=b"node-a-seal-key-for-this-test-32b"),
                        pods=KubePodLookup(api), verifier=PeerVerifier(enabled=False))
    await server.start(tmp_path / f"{name}.sock")
    return server


async def _admit(sock, pod: dict) -> tuple[dict, asyncio.StreamWriter]:
    r, w = await asyncio.open_unix_connection(str(sock))
    m = pod["metadata"]
    w.write(
        json.dumps({"op": "admit", "podUid": m["uid"], "podName": m["name"], "podNamespace": m["namespace"]}).encode()
        + b"\n"
    )
    return json.loads(await asyncio.wait_for(r.readline(), 10)), w


@pytest.mark.asyncio
async def test_gate_reads_pods_and_annotates_them_through_the_api(kmock, tmp_path) -> None:
    from kubernetes import client

    api = _api(kmock)
    owned = await _create_job_pod(api, "owned", 12 * GiB)
    unowned = await _create_job_pod(api, "unowned", 1, owned=False)  # writes its own admit-bytes: not trusted
    server = await _server(tmp_path, api, "a")
    try:
        msg, w1 = await _admit(tmp_path / "a.sock", owned)
        assert msg["status"] == "admitted" and msg["bytes"] == 12 * GiB
        msg, w2 = await _admit(tmp_path / "a.sock", unowned)
        assert msg["status"] == "admitted" and msg["bytes"] == 78 * GiB  # whole GPU
        core = client.CoreV1Api(api)
        for _ in range(200):
            got = await asyncio.to_thread(core.read_namespaced_pod, "owned", "default")
            if (got.metadata.annotations or {}).get(ANN_GPU):
                break
            await asyncio.sleep(0.02)
        assert got.metadata.annotations[ANN_GPU] == msg_gpu(server, "owned") and got.metadata.annotations[ANN_GROUP]
        w2.close()
    finally:
        await server.close()
    # A new agent adopts the pod the API server shows as admitted (and not finished) before admitting anything.
    server2 = await _server(tmp_path, api, "b")
    try:
        keys = {e.name: e.bytes for e in server2.books.running.values()}
        assert keys.get("owned") == 12 * GiB
    finally:
        await server2.close()


def msg_gpu(server: GateServer, name: str) -> str:
    e = next(e for e in server.books.running.values() if e.name == name)
    return server.books.gpus[e.gpu_index].uuid


@pytest.mark.asyncio
async def test_pods_on_other_nodes_are_refused(kmock, tmp_path) -> None:
    api = _api(kmock)
    pod = await _create_job_pod(api, "far", GiB, node="node-b")
    server = await _server(tmp_path, api, "c")
    try:
        msg, _ = await _admit(tmp_path / "c.sock", pod)
        assert msg["status"] == "rejected" and msg["reason"] == "wrong-node"
        lookup = KubePodLookup(api)
        assert [p.name for p in await asyncio.to_thread(lookup.on_node, "node-a")] == []
        assert [p.name for p in await asyncio.to_thread(lookup.on_node, "node-b")] == ["far"]
    finally:
        await server.close()


@pytest.mark.asyncio
async def test_gpunode_status_created_then_patched(kmock) -> None:
    from kubernetes import client

    api = _api(kmock)
    sink = KubeStatusSink(api)
    status = GPUNodeStatus(node_name="node-a", updated_at=datetime.now(timezone.utc),
                           gpus=[GPUStatus(index=0, uuid="GPU-0", model="A100-80GB", total_bytes=80 * GiB,
                                           committed_bytes=GiB)])
    await asyncio.to_thread(sink.publish, status)  # creates GPUNode/node-a, then writes its status
    status.gpus[0].committed_bytes = 3 * GiB
    await asyncio.to_thread(sink.publish, status)
    obj = await asyncio.to_thread(client.CustomObjectsApi(api).get_cluster_custom_object, GROUP, VERSION,
                                  GPUNODE_PLURAL, "node-a")
    assert obj["kind"] == "GPUNode"
    got = GPUNodeStatus.model_validate(obj["status"])
    assert got.gpus[0].committed_bytes == 3 * GiB and got.node_name == "node-a"
