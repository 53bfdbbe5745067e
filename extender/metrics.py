"""Prometheus metrics of one extender instance, on a registry of its own (no process-global state)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class ExtenderMetrics:
    """Request counts and latency per verb, nodes filtered out by reason, reservations, cache size."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "gnnsched_extender_requests",
            "Extender requests by verb and outcome (ok|error|unresolvable: a pod no node can take).",
            ["verb", "outcome"], registry=r,
        )
        self.latency = Histogram(
            "gnnsched_extender_request_seconds", "Time spent handling an extender request (server side).",
            ["verb"], buckets=_BUCKETS, registry=r,
        )
        self.filtered_out = Counter(
            "gnnsched_extender_nodes_filtered_out", "Candidate nodes rejected by filter, by reason.", ["reason"],
            registry=r,
        )
        self.binds = Counter(
            "gnnsched_extender_binds", "Bind calls by result (immediate|queued|refused|failed).", ["result"],
            registry=r,
        )
        self.reservations = Gauge(
            "gnnsched_extender_reservations",
            "Reservations held for bound pods the node agent has not reported yet, by kind (immediate|queued).",
            ["kind"], registry=r,
        )
        self.cache_nodes = Gauge("gnnsched_extender_cache_nodes", "Nodes in the extender's cache.", registry=r)
