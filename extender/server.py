"""Assemble and serve the extender: fake cluster or in-cluster watcher, binder, app, uvicorn."""

from __future__ import annotations

import gc
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from gnnsched.colocation.interference import load_default
from gnnsched.contract import DEFAULT_EXTENDER_PORT
from gnnsched.trust.domain import DEFAULT_TRUST_DOMAIN, DomainResolver, NamespaceLabels, parse_trust_domain

from .binder import DEFAULT_BIND_TIMEOUT, FakeBinder, KubeBinder
from .cache import DEFAULT_RESERVATION_TTL, ClusterCache
from .fake import parse_fake_cluster, populate


class OptionError(ValueError):
    """A bad command-line option; ``option`` names it."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(f"{option}: {message}")
        self.option = option


@dataclass
class ExtenderOptions:
    host: str = "0.0.0.0"
    port: int = DEFAULT_EXTENDER_PORT
    fake_cluster: str | None = None
    fake_state: Path | None = None
    fake_seed: int = 0
    reservation_ttl: float = DEFAULT_RESERVATION_TTL
    kubeconfig: str | None = None
    log_level: str = "info"
    metrics_host: str = "0.0.0.0"
    metrics_port: int | None = None  # None: /metrics, /healthz, /readyz only on the main port
    bind_timeout: float = DEFAULT_BIND_TIMEOUT  # seconds; below kube-scheduler's httpTimeout for the extender
    trust_domain: str = DEFAULT_TRUST_DOMAIN  # whose pods may share a GPU (gnnsched.trust.domain)


def build_app(opts: ExtenderOptions) -> FastAPI:
    """The app for ``opts`` (fake cluster filled synchronously; in-cluster cache filled by the watcher)."""
    from .app import create_app

    if opts.reservation_ttl <= 0:
        raise OptionError("--reservation-ttl", "must be positive seconds")
    if not 0 < opts.bind_timeout <= 60:
        raise OptionError("--bind-timeout", f"{opts.bind_timeout} must be 0..60 seconds (below the scheduler's "
                          "httpTimeout for the extender)")
    try:
        trust = parse_trust_domain(opts.trust_domain, "--trust-domain")
    except ValueError as exc:
        raise OptionError("--trust-domain", str(exc).split(": ", 1)[1]) from None
    if trust.kind == "label" and opts.fake_cluster is not None:
        raise OptionError("--trust-domain", "label:<key> reads Namespace labels: not with --fake-cluster")
    labels: NamespaceLabels | None = None
    if trust.kind == "label":
        labels = _namespace_labels(opts)
    cache = ClusterCache(load_default(), reservation_ttl=opts.reservation_ttl,
                         domains=DomainResolver(trust, labels))
    if opts.fake_cluster is not None:
        try:
            spec = parse_fake_cluster(opts.fake_cluster)
        except ValueError as exc:
            raise OptionError("--fake-cluster", str(exc)) from None
        try:
            binder = FakeBinder(opts.fake_state)
        except (OSError, ValueError, KeyError) as exc:
            raise OptionError("--fake-state", f"cannot read {opts.fake_state}: {exc}") from None
        anchor = binder.anchor if binder.anchor is not None else time.time()
        if binder.anchor is None:
            binder.set_anchor(anchor)
        populate(cache, spec, anchor=anchor, seed=opts.fake_seed)
        cache.rebuild(binder.pods())
        return create_app(cache, binder)

    if opts.fake_state is not None:
        raise OptionError("--fake-state", "only meaningful with --fake-cluster")
    from kubernetes import client, config

    try:
        if opts.kubeconfig:
            config.load_kube_config(config_file=opts.kubeconfig)
        else:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
    except Exception as exc:
        raise OptionError("--kubeconfig", f"no usable Kubernetes configuration: {exc}") from None
    api = client.ApiClient()
    from .watcher import ClusterWatcher

    watcher = ClusterWatcher(cache, api)
    kube_binder = KubeBinder(client.CoreV1Api(api), timeout=opts.bind_timeout)
    return create_app(cache, kube_binder, ready=False, background=[watcher.start])


def _namespace_labels(opts: ExtenderOptions) -> NamespaceLabels:
    """A Namespace-label reader on the extender's API client (``--trust-domain label:<key>``; get on
    namespaces)."""
    from gnnsched.kubeclient import api_client

    try:
        core = __import__("kubernetes").client.CoreV1Api(api_client(opts.kubeconfig))
    except Exception as exc:
        raise OptionError("--kubeconfig", f"no usable Kubernetes configuration: {exc}") from None

    def labels(name: str) -> dict[str, str] | None:
        from kubernetes.client.rest import ApiException

        try:
            meta = core.read_namespace(name).metadata
            return dict((meta.labels if meta is not None else None) or {})
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    return labels


def serve(opts: ExtenderOptions) -> None:
    """Run uvicorn (single process: the cache and its reservations live in this process); with
    ``metrics_port``, a second listener in the same event loop serves /metrics, /healthz and /readyz."""
    import asyncio

    import uvicorn

    from .app import create_ops_app

    logging.basicConfig(level=opts.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if opts.metrics_port is not None and not 0 < opts.metrics_port < 65536:
        raise OptionError("--metrics-port", f"{opts.metrics_port} is not a TCP port")
    if opts.metrics_port is not None and opts.metrics_port == opts.port:
        raise OptionError("--metrics-port", "must differ from --port")
    app = build_app(opts)
    # The cache holds ~10 Python objects per GPU; a full garbage collection walking them all is a tail-latency
    # spike. Move everything alive now (the filled cache) out of the collector's generations.
    gc.collect()
    gc.freeze()
    common: dict[str, Any] = {"log_level": opts.log_level, "access_log": False}
    if opts.metrics_port is None:
        uvicorn.run(app, host=opts.host, port=opts.port, **common)
        return
    main = uvicorn.Server(uvicorn.Config(app, host=opts.host, port=opts.port, **common))
    ops = uvicorn.Server(
        uvicorn.Config(create_ops_app(app.state.service), host=opts.metrics_host, port=opts.metrics_port,
                       lifespan="off", **common)
    )

    async def both() -> None:
        # Each server installs the signal handlers; whichever stops first (SIGTERM), the other follows.
        tasks = [asyncio.ensure_future(main.serve()), asyncio.ensure_future(ops.serve())]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        main.should_exit = ops.should_exit = True
        await asyncio.gather(*tasks, return_exceptions=True)

    try:
        import uvloop

        uvloop.run(both())
    except ImportError:
        asyncio.run(both())
