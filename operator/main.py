"""Run the operator: credentials, the handlers' dependencies, kopf's event loop.

``gnnsched operator`` watches all namespaces by default (``--all-namespaces``) or the ones given with
``--namespace``. Credentials: the in-cluster service account when running in a pod, else the kubeconfig
(``--kubeconfig``,
``$KUBECONFIG`` or ``~/.kube/config``); kopf's watcher and the handlers' API client use the same ones.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
from typing import Any

from gnnsched.contract import LABEL_MANAGED_BY, MANAGED_BY_VALUE
from gnnsched.kubeclient import load_client_configuration

from .handlers import Operator, OperatorConfig, build_registry
from .kube import Kube, KubeError
from .planning import Planner
from .podwatch import PodWatcher
from .predictor_model import PredictorModelReloader

log = logging.getLogger("gnnsched.operator.main")


def make_operator(config: OperatorConfig, kubeconfig: str | None = None, context: str | None = None) -> Operator:
    configuration = load_client_configuration(kubeconfig, context)
    kube = Kube(configuration, pool_size=max(4, config.workers * 2))
    return Operator(config, kube, Planner(default_gpu_model=config.default_gpu_model))


async def run_async(op: Operator, stop_flag: asyncio.Event | threading.Event | None = None,
                    ready_flag: asyncio.Event | threading.Event | None = None) -> None:
    """kopf's operator loop with ``op``'s handlers until ``stop_flag`` is set (or the process is signalled), and
    the metrics server while it runs (its bound port in ``op.metrics_port``)."""
    import kopf

    registry = build_registry(op)
    namespaces = op.config.namespaces
    watchers: list[PodWatcher] = []

    @kopf.on.startup(registry=registry)
    async def _start_pod_watch(**_: Any) -> None:
        # Started from kopf's start-up so that its threads carry kopf's context (events, settings).
        watcher = pod_watcher(op, contextvars.copy_context())
        watcher.start()
        watchers.append(watcher)

    @kopf.on.cleanup(registry=registry)
    async def _stop_pod_watch(**_: Any) -> None:
        while watchers:
            await asyncio.to_thread(watchers.pop().stop)

    reloader = predictor_reloader(op)
    if reloader is not None:
        await asyncio.to_thread(_first_poll, reloader)  # the first plans already use the cluster's model
        reloader.start()
    server = None
    if op.config.metrics_port is not None:
        from gnnsched.metrics_http import serve_metrics

        server = serve_metrics(op.metrics.registry, op.config.metrics_port)
        op.metrics_port = server.server_port
    try:
        await kopf.operator(
            registry=registry,
            standalone=True,
            clusterwide=not namespaces,
            namespaces=namespaces or (),
            stop_flag=stop_flag,
            ready_flag=ready_flag,
            liveness_endpoint=(f"http://0.0.0.0:{op.config.health_port}/healthz"
                               if op.config.health_port else None),
        )
    finally:
        while watchers:
            await asyncio.to_thread(watchers.pop().stop)
        if reloader is not None:
            await asyncio.to_thread(reloader.stop)
        if server is not None:
            server.shutdown()
            server.server_close()


def predictor_reloader(op: Operator) -> PredictorModelReloader | None:
    """The poll of the runtime model's ConfigMap (``--predictor-model-configmap``); ``op.predictor_reloader`` keeps
    it for inspection. ``None`` without the flag: the shipped model only."""
    target = op.config.predictor_model_configmap
    if target is None:
        return None
    namespace, name = target.split("/", 1)
    reloader = PredictorModelReloader(op.kube, op.planner, op.metrics, namespace, name,
                                      op.config.predictor_reload_seconds)
    op.predictor_reloader = reloader
    return reloader


def _first_poll(reloader: PredictorModelReloader) -> None:
    try:
        reloader.poll()
    except KubeError as exc:  # the operator starts anyway, on the shipped model; the poll retries
        log.warning("cannot read the runtime model's configmap (%s); starting with the shipped model", exc)


def pod_watcher(op: Operator, context: contextvars.Context | None = None) -> PodWatcher:
    """The watch on the operator's own pods (label ``app.kubernetes.io/managed-by=gnnsched``, selected by the API
    server), delivering to ``op.on_pod_event``; ``op.pod_watcher`` keeps it for inspection."""

    def handle(body: dict[str, Any], event_type: str | None) -> None:
        op.on_pod_event(body, event={"type": event_type} if event_type else None)

    watcher = PodWatcher(op.kube, f"{LABEL_MANAGED_BY}={MANAGED_BY_VALUE}", handle,
                         namespaces=op.config.namespaces or None, workers=op.config.workers,
                         timeout_seconds=op.config.watch_client_timeout, context=context)
    op.pod_watcher = watcher
    return watcher


def run(config: OperatorConfig, kubeconfig: str | None = None, context: str | None = None) -> None:
    op = make_operator(config, kubeconfig, context)
    try:
        asyncio.run(run_async(op))
    finally:
        op.kube.close()


def export_history(kube: Kube, namespace: str | None) -> list[dict[str, Any]]:
    """History records of finished jobs (see ``history.py``)."""
    from .history import gpu_models_by_uuid, records_from_jobs

    try:
        models = gpu_models_by_uuid(kube.list_gpunodes())
    except Exception:  # noqa: BLE001 - without GPUNodes the predicted-on model is recorded instead
        models = {}
    return records_from_jobs(kube.list_jobs(namespace), models)
