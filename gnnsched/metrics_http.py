"""One small HTTP server for a daemon's ``/metrics`` and ``/healthz``, shared by the node agent and the operator.

Why not ``prometheus_client.start_http_server``: the liveness probe must be able to answer 503 when the daemon's own
loop has stalled (a wedged process still serves metrics from its threads), and the server must be closable in tests;
both need the server object, which ``start_http_server`` hides in older releases.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        """Scrapes every 15-30 s would flood the daemon's log; Prometheus records failed scrapes itself."""


def serve_metrics(registry: CollectorRegistry, port: int, addr: str = "0.0.0.0",
                  healthy: Callable[[], bool] = lambda: True,
                  unhealthy_message: str = "unhealthy: the daemon's loop has stalled",
                  ready: Callable[[], tuple[bool, str]] | None = None) -> WSGIServer:
    """Serve ``registry`` at ``/metrics`` (any other path too, as Prometheus' own exporter does), ``/healthz``
    (200, or 503 while ``healthy()`` is false) and ``/readyz`` (200, or 503 with the reason while ``ready()`` says
    not ready; the same as ``/healthz`` when no ``ready`` is given) on ``port`` (0: a free port;
    ``server.server_port`` says which), from a daemon thread. ``server.shutdown()`` stops it.

    Why two probes: liveness restarts a wedged process; readiness only tells kubelet (and ``gnnsched doctor``) that
    the daemon is not serving yet, e.g. a node agent whose MPS daemon is down, which a restart would not fix."""
    metrics_app = make_wsgi_app(registry)

    def app(environ: dict, start_response: Callable) -> list[bytes]:
        path = environ.get("PATH_INFO")
        if path == "/healthz" or (path == "/readyz" and ready is None):
            ok = healthy()
            start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
            return [b"ok\n" if ok else unhealthy_message.encode() + b"\n"]
        if path == "/readyz" and ready is not None:
            is_ready, why = ready()
            start_response("200 OK" if is_ready else "503 Service Unavailable", [("Content-Type", "text/plain")])
            return [(why or ("ready" if is_ready else "not ready")).encode() + b"\n"]
        return metrics_app(environ, start_response)

    server = make_server(addr, port, app, ThreadingWSGIServer, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, daemon=True, name="metrics-http").start()
    return server
