"""The ``KubeSchedulerConfiguration`` (``kubescheduler.config.k8s.io/v1``) that wires kube-scheduler to the extender.

Kept in one place: the chart renders this output and ``gnnsched extender --print-scheduler-config`` prints it.

Why these settings:

* One profile, ``gnnsched-scheduler``: the operator creates pods with that ``schedulerName``; other pods keep
  the default scheduler. (Extenders are global to a configuration, so this configuration is meant for a second
  kube-scheduler deployment that runs only this profile.)
* ``filter``, ``prioritize`` and ``bind`` verbs: the extender binds, because binding is where it takes its
  reservation atomically (only one extender may bind).
* ``nodeCacheCapable: true``: kube-scheduler sends node names only; the extender has its own cache of
  ``GPUNode`` and ``Node`` objects. Full ``NodeList`` payloads at 5,000 nodes would be megabytes per call.
* ``managedResources: [gnnsched.io/gpu-share, ignoredByScheduler: true]``: the extender is called only for pods
  that request gpu-share slots, and kube-scheduler does not count the slots itself (the extender checks the
  per-GPU MPS client cap, which the scheduler cannot see).
* ``weight``: the extender's 0–10 score is multiplied by ``weight × 10``; 5 makes a full score worth 500, more
  than any single default plugin (each ≤ 100 × its weight), so predicted completion time dominates placement
  without silencing the default spreading/affinity plugins entirely.
* ``httpTimeout``: 5 s (kube-scheduler's default); the extender answers in milliseconds.
* ``ignorable: false``: without the extender a GNN pod could be placed where it can never fit.
"""

from __future__ import annotations

from typing import Any

from gnnsched.contract import DEFAULT_EXTENDER_PORT, GPU_SHARE_RESOURCE, SCHEDULER_NAME

DEFAULT_WEIGHT = 5
DEFAULT_TIMEOUT_SECONDS = 5


def default_url_prefix(service: str = "gnnsched-extender", namespace: str = "gnnsched-system") -> str:
    """The in-cluster URL of the extender's Service."""
    return f"http://{service}.{namespace}.svc:{DEFAULT_EXTENDER_PORT}"


def scheduler_config(
    url_prefix: str | None = None,
    *,
    weight: int = DEFAULT_WEIGHT,
    timeout_seconds: int = DEFAULT_TIMEOUT_SECONDS,
    leader_elect: bool = True,
    namespace: str = "gnnsched-system",
    scheduler_name: str = SCHEDULER_NAME,
    ignorable: bool = False,
) -> dict[str, Any]:
    """The configuration as a dict (YAML/JSON-ready). ``ValueError`` on a bad argument, naming it.

    The chart runs the extender as a sidecar of kube-scheduler and passes ``url_prefix=http://127.0.0.1:<port>``.
    """
    url = url_prefix if url_prefix is not None else default_url_prefix(namespace=namespace)
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"url_prefix: {url!r} must start with http:// or https://")
    if not 1 <= weight <= 100:
        raise ValueError(f"weight: {weight} must be 1..100")
    if not scheduler_name:
        raise ValueError("scheduler_name: must not be empty")
    if not 1 <= timeout_seconds <= 60:
        raise ValueError(f"timeout_seconds: {timeout_seconds} must be 1..60")
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "leaderElection": {
            "leaderElect": leader_elect,
            "resourceLock": "leases",
            "resourceName": scheduler_name,
            "resourceNamespace": namespace,
        },
        "profiles": [{"schedulerName": scheduler_name}],
        "extenders": [
            {
                "urlPrefix": url.rstrip("/"),
                "filterVerb": "filter",
                "prioritizeVerb": "prioritize",
                "bindVerb": "bind",
                "weight": weight,
                "enableHTTPS": url.startswith("https://"),
                "httpTimeout": f"{timeout_seconds}s",
                "nodeCacheCapable": True,
                "ignorable": ignorable,
                "managedResources": [{"name": GPU_SHARE_RESOURCE, "ignoredByScheduler": True}],
            }
        ],
    }


def scheduler_config_yaml(url_prefix: str | None = None, **kwargs: Any) -> str:
    """The configuration as YAML text."""
    import yaml

    return yaml.safe_dump(scheduler_config(url_prefix, **kwargs), sort_keys=False)
