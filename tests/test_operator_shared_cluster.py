"""The operator on a shared cluster: a pod watch filtered by the API server, refused pod creates retried with
back-off and shown in a condition, and service-account tokens that rotate."""

from __future__ import annotations

import asyncio
import datetime
import time
from pathlib import Path
from typing import Any

import kmock
import pytest
from kmock._internal import enums
from operator_harness import (
    a100,
    emulated_cluster,
    manifest,
    running_operator,
    wait_for,
)

from gnnsched.kubeclient import load_client_configuration
from gnnsched.operator.admission import (
    create_backoff_seconds,
    job_field,
    never_admissible,
)
from gnnsched.operator.kube import Kube, KubeError, connection_info
from gnnsched.operator.podwatch import PodWatcher

UNRELATED = 200


def _unrelated_pod(i: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"web-{i}", "namespace": "default", "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "web", "image": "nginx:1"}]}}


def _condition(job: dict[str, Any] | None, ctype: str) -> dict[str, Any] | None:
    for cond in ((job or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == ctype:
            return cond
    return None


def test_unrelated_pods_never_reach_the_operator_and_its_watch_asks_for_its_own_pods(tmp_path: Path) -> None:
    async def scenario() -> tuple[list[str], int]:
        async with emulated_cluster(tmp_path) as cluster:
            for i in range(UNRELATED):
                status, data = await cluster.request("POST", "/api/v1/namespaces/default/pods", json=_unrelated_pod(i))
                assert status in (200, 201), data
            await cluster.add_gpunode("n1", [a100(0)])
            async with running_operator(cluster) as op:
                seen: list[str] = []
                original = op.on_pod_event

                def spy(body: Any, event: Any = None, **kw: Any) -> None:
                    seen.append(str(body.get("metadata", {}).get("name")))
                    original(body, event=event, **kw)

                op.on_pod_event = spy
                await cluster.create_job(manifest("mine"))
                await wait_for(lambda: _pod(cluster, "mine-0"), 120, what="the job's pod")
                await cluster.patch_pod("mine-0", {"spec": {"nodeName": "n1"}})
                await wait_for(lambda: _phase(cluster, "mine", "Scheduled"), 60, what="Scheduled from a pod event")
                # more unrelated churn while the operator runs
                for i in range(UNRELATED, UNRELATED + 20):
                    await cluster.request("POST", "/api/v1/namespaces/default/pods", json=_unrelated_pod(i))
                await asyncio.sleep(3)  # a watch renewal (2 s in tests) after the churn
                return seen, op.pod_watcher.lists

    seen, lists = asyncio.run(scenario())
    assert seen and set(seen) == {"mine-0"}, set(seen)
    assert lists >= 1


async def _pod(cluster: Any, name: str) -> dict[str, Any] | None:
    return next((p for p in await cluster.pods() if p["metadata"]["name"] == name), None)


async def _phase(cluster: Any, name: str, phase: str) -> dict[str, Any] | None:
    job = await cluster.get_job(name)
    return job if job and (job.get("status") or {}).get("phase") == phase else None


def test_the_watch_requests_carry_the_label_selector(tmp_path: Path) -> None:
    """What goes over the wire: every pod LIST and WATCH the operator makes names the selector."""

    async def scenario() -> list[str]:
        async with emulated_cluster(tmp_path) as cluster:
            async with running_operator(cluster):
                await asyncio.sleep(5)
            return [str(r.params.get("labelSelector")) for r in list(cluster.k8s)
                    if r.resource is not None and r.resource.plural == "pods"
                    and r.action in (enums.action.LIST, enums.action.WATCH)]

    queries = asyncio.run(scenario())
    assert queries, "the operator made no pod LIST/WATCH"
    assert set(queries) == {"app.kubernetes.io/managed-by=gnnsched"}, queries


def test_stop_ends_a_watch_that_is_waiting_for_events_at_once(tmp_path: Path) -> None:
    """The watch thread blocks reading a quiet stream whose server-side timeout is ten minutes away; stop() must not
    wait for it (closing the response alone did: the operator's stop, and each run of
    ``bench/operator_pod_memory.py``, hung until the server ended the stream)."""

    async def scenario() -> tuple[float, int]:
        async with emulated_cluster(tmp_path) as cluster:
            kube = Kube(load_client_configuration(str(cluster.kubeconfig), None))
            watcher = PodWatcher(kube, "app=none", lambda body, event: None, timeout_seconds=600)
            watcher.start()
            try:
                await wait_for(lambda: _watching(cluster), 30, what="the watch request")
                await asyncio.sleep(0.5)  # the thread is now in its blocking read
                started = time.monotonic()
                await asyncio.wait_for(asyncio.to_thread(watcher.stop), 20)
                return time.monotonic() - started, watcher.lists
            finally:
                kube.close()

    took, lists = asyncio.run(scenario())
    assert lists == 1
    assert took < 5, f"stop() took {took:.1f} s"


async def _watching(cluster: Any) -> bool:
    return any(r.action == enums.action.WATCH for r in list(cluster.k8s))


def test_a_quota_refusal_is_retried_with_back_off_and_shown_until_the_pod_is_admitted(tmp_path: Path) -> None:
    async def scenario() -> tuple[dict[str, Any] | None, dict[str, Any] | None, int, list[str]]:
        async with emulated_cluster(tmp_path) as cluster:
            await cluster.add_gpunode("n1", [a100(0)])
            refusals = {"left": 2, "made": 0}

            async def quota(request: Any) -> None:
                if request.action == enums.action.CREATE and request.resource is not None \
                        and request.resource.plural == "pods" and refusals["left"] > 0:
                    refusals["left"] -= 1
                    refusals["made"] += 1
                    raise kmock.KubernetesError(
                        status=403, reason="Forbidden",
                        message='pods "quota-0" is forbidden: exceeded quota: gpu-share, requested: '
                                "gnnsched.io/gpu-share=1, used: gnnsched.io/gpu-share=4, "
                                "limited: gnnsched.io/gpu-share=4")

            cluster.k8s.before_write = quota
            async with running_operator(cluster):
                await cluster.create_job(manifest("quota"))

                async def refused() -> dict[str, Any] | None:
                    cond = _condition(await cluster.get_job("quota"), "PodCreated")
                    return cond if cond and cond["status"] == "False" else None

                shown = await wait_for(refused, 120, what="PodCreated=False")
                await wait_for(lambda: _pod(cluster, "quota-0"), 60, what="the pod after the quota freed")
                job = await wait_for(lambda: _admitted(cluster, "quota"), 30, what="PodCreated=True")
                events = [e.get("reason") for e in await cluster.events()]
            return shown, job, refusals["made"], events

    shown, job, made, events = asyncio.run(scenario())
    assert shown["reason"] == "Forbidden" and "exceeded quota" in shown["message"]
    assert "retrying with back-off" in shown["message"]
    assert job["status"]["phase"] not in ("Failed",)
    assert _condition(job, "PodCreated")["reason"] == "Created"
    assert made == 2 and "FailedCreate" in events


async def _admitted(cluster: Any, name: str) -> dict[str, Any] | None:
    job = await cluster.get_job(name)
    cond = _condition(job, "PodCreated")
    return job if cond and cond["status"] == "True" else None


def test_a_spec_the_api_server_can_never_admit_fails_the_job(tmp_path: Path) -> None:
    async def scenario() -> dict[str, Any]:
        async with emulated_cluster(tmp_path) as cluster:
            await cluster.add_gpunode("n1", [a100(0)])

            async def invalid(request: Any) -> None:
                if request.action == enums.action.CREATE and request.resource is not None \
                        and request.resource.plural == "pods":
                    raise kmock.KubernetesError(
                        status=422, reason="Invalid",
                        message='Pod "bad-0" is invalid: spec.containers[0].image: Invalid value: " me/x:1 ": must '
                                "not have leading or trailing whitespace",
                        details={"name": "bad-0", "kind": "Pod", "causes": [
                            {"reason": "FieldValueInvalid", "field": "spec.containers[0].image",
                             "message": "must not have leading or trailing whitespace"}]})

            cluster.k8s.before_write = invalid
            async with running_operator(cluster):
                await cluster.create_job(manifest("bad"))
                return await wait_for(lambda: _phase(cluster, "bad", "Failed"), 120, what="Failed")

    job = asyncio.run(scenario())
    cond = _condition(job, "PodCreated")
    assert cond["reason"] == "PodSpecInvalid" and cond["message"].startswith("spec.image: the API server refused")


@pytest.mark.parametrize(("status", "fields", "permanent"), [
    (422, ["spec.containers[0].image"], True),
    (422, ["spec.containers[0].command[2]", "spec.containers[0].args"], True),
    (422, ["spec.containers[0].resources.requests"], False),  # a LimitRange default above the limit
    (422, [], False),
    (403, ["spec.containers[0].image"], False),  # a webhook: policy can change
])
def test_only_a_refusal_of_the_jobs_own_fields_is_permanent(status: int, fields: list[str], permanent: bool) -> None:
    exc = KubeError(status, "refused", {"causes": [{"field": f} for f in fields]})
    assert never_admissible(exc) is permanent


def test_back_off_doubles_from_5_s_to_5_min_and_fields_map_back_to_the_job() -> None:
    assert [create_backoff_seconds(n) for n in range(8)] == [5, 10, 20, 40, 80, 160, 300, 300]
    assert create_backoff_seconds(10_000) == 300
    assert job_field("spec.containers[0].command[1]") == "spec.command[1]"


def test_a_rotated_service_account_token_is_read_again(tmp_path: Path) -> None:
    """The in-cluster loader of the kubernetes client (what ``load_client_configuration`` uses in a pod) re-reads the
    token file through ``refresh_api_key_hook``; ``connection_info`` runs it and gives kopf an expiration, so kopf
    logs in again (and so reads the rotated file) at least once per refresh period."""
    import kubernetes

    token, ca = tmp_path / "token", tmp_path / "ca.crt"
    token.write_text("first-token")
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    configuration = kubernetes.client.Configuration()
    loader = kubernetes.config.incluster_config.InClusterConfigLoader(
        token_filename=str(token), cert_filename=str(ca),
        environ={"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"})
    loader.load_and_set(configuration)
    before = datetime.datetime.now(tz=datetime.timezone.utc)
    info = connection_info(configuration)
    assert info.token == "first-token"
    assert info.expiration is not None and before < info.expiration <= before + datetime.timedelta(minutes=1, seconds=5)

    token.write_text("rotated-token")  # kubelet rewrites the projected token
    loader.token_expires_at = datetime.datetime.now()  # the client's one-minute re-read period has passed
    assert connection_info(configuration).token == "rotated-token"
    # and this process's own API client sends the new one
    assert configuration.get_api_key_with_prefix("BearerToken") == "bearer rotated-token"
