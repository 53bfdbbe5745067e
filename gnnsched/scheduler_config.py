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
* ``managedResources: [gnnsched.io/gpu-share, ignoredByScheduler: false]``: the extender is called only for pods
  that request gpu-share slots, and kube-scheduler *also* counts the slots against each node's allocatable (the
  device plugin's, which turns an unhealthy GPU's slots Unhealthy at once). The extender's cache follows ``GPUNode``
  objects, which can lag the kubelet: with ``ignoredByScheduler: true`` a pod could be bound to a node whose slots
  kubelet no longer offers and then be rejected at admission (``OutOfgnnsched.io/gpu-share``).
* ``percentageOfNodesToScore: 100`` in the profile: kube-scheduler otherwise stops looking after a share of the
  feasible nodes (adaptive, from 50 % down to 5 % above ~100 nodes), so the extender would rank only a sample of the
  GPU nodes and the best GPU could be missed. GNN pods are few and the extender ranks thousands of nodes in
  milliseconds; the profile-level field (v1.27+) leaves other profiles' sampling alone.
* ``weight``: the extender's 0–10 score is multiplied by ``weight × 10``; 5 makes a full score worth 500, more
  than any single default plugin (each ≤ 100 × its weight), so predicted completion time dominates placement
  without silencing the default spreading/affinity plugins entirely.
* ``NodeResourcesFit``'s scoring is explicit and configurable: ``LeastAllocated`` (kube-scheduler's default,
  spreading) by default, ``MostAllocated`` (bin packing) for clusters short of CPU. kube-scheduler binds where the
  extender's score (up to 500) plus the CPU/memory plugins (up to 200 together) is highest, so the strategy decides
  among nodes the extender rates alike, and can outvote it by a few score steps. Measured in the simulator
  (``docs/simulator.md``): packing keeps whole nodes free for pods that ask many cores, which helps a CPU-bound
  cluster a little (resource-demand, five seeds: +2 deployed and +6 completed jobs of 4,201), but it draws pods to
  busy nodes whose GPUs they then wait for: on a GPU-bound cluster (``bench/simulate_scale.py``, 20,000 jobs) mean
  JCT rose 36 % for ``bqt-interference``. Spreading is the safer default.
* ``httpTimeout``: 5 s (kube-scheduler's default); the extender answers filter and prioritize in milliseconds, and
  bind within ``--bind-timeout`` (4 s by default, 80 % of the chart's ``httpTimeout``), so the scheduler always hears
  how the Binding went.
* ``ignorable: false``: without the extender a GNN pod could be placed where it can never fit.
"""

from __future__ import annotations

import re
from typing import Any

from gnnsched.contract import DEFAULT_EXTENDER_PORT, GPU_SHARE_RESOURCE, SCHEDULER_NAME

DEFAULT_WEIGHT = 5
LEAST_ALLOCATED = "LeastAllocated"
MOST_ALLOCATED = "MostAllocated"
SCORING_STRATEGIES = (LEAST_ALLOCATED, MOST_ALLOCATED)
#: NodeResourcesFit's scoring strategy in the gnnsched-scheduler profile (see the module docstring for why).
DEFAULT_SCORING_STRATEGY = LEAST_ALLOCATED
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
    scoring_strategy: str = DEFAULT_SCORING_STRATEGY,
) -> dict[str, Any]:
    """The configuration as a dict (YAML/JSON-ready). ``ValueError`` on a bad argument, naming it.

    The chart runs the extender as a sidecar of kube-scheduler and passes ``url_prefix=http://127.0.0.1:<port>``.
    """
    url = url_prefix if url_prefix is not None else default_url_prefix(namespace=namespace)
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"url_prefix: {url!r} must start with http:// or https://")
    if not 1 <= weight <= 100:
        raise ValueError(f"weight: {weight} must be 1..100")
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", scheduler_name):
        raise ValueError(f"scheduler_name: {scheduler_name!r} must be a DNS label (a-z, 0-9, '-', at most 63)")
    if not 1 <= timeout_seconds <= 60:
        raise ValueError(f"timeout_seconds: {timeout_seconds} must be 1..60")
    if scoring_strategy not in SCORING_STRATEGIES:
        raise ValueError(f"scoring_strategy: {scoring_strategy!r} must be one of {', '.join(SCORING_STRATEGIES)}")
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        # no pprof endpoints; with --config the --profiling flag is ignored, so the file is where it takes effect
        "enableProfiling": False,
        "leaderElection": {
            "leaderElect": leader_elect,
            "resourceLock": "leases",
            "resourceName": scheduler_name,
            "resourceNamespace": namespace,
        },
        "profiles": [{
            "schedulerName": scheduler_name,
            "percentageOfNodesToScore": 100,
            "pluginConfig": [{
                "name": "NodeResourcesFit",
                "args": {"scoringStrategy": {
                    "type": scoring_strategy,
                    "resources": [{"name": "cpu", "weight": 1}, {"name": "memory", "weight": 1}],
                }},
            }],
        }],
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
                "managedResources": [{"name": GPU_SHARE_RESOURCE, "ignoredByScheduler": False}],
            }
        ],
    }


def scheduler_config_yaml(url_prefix: str | None = None, **kwargs: Any) -> str:
    """The configuration as YAML text."""
    import yaml

    return yaml.safe_dump(scheduler_config(url_prefix, **kwargs), sort_keys=False)
