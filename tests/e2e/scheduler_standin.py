"""A kube-scheduler stand-in: one scheduling profile driving the gnnsched extender as kube-scheduler does.

It reads the ``KubeSchedulerConfiguration`` that ``gnnsched extender --print-scheduler-config`` prints (the chart's)
and follows kube-scheduler's scheduling cycle for pods whose ``spec.schedulerName`` is the profile's:

* **Queue**: pending pods in priority order, then creation time (``PrioritySort``); a pod that failed waits out a
  back-off of 1 s doubling to 10 s (``podInitialBackoffSeconds``/``podMaxBackoffSeconds`` defaults,
  ``pkg/scheduler/backend/queue/scheduling_queue.go``).
* **Filter, own plugins first** (``findNodesThatFitPod`` in ``pkg/scheduler/schedule_one.go``): ``NodeUnschedulable``,
  ``TaintToleration`` (NoSchedule/NoExecute), ``NodeAffinity`` (``nodeSelector``), ``NodeResourcesFit`` (cpu, memory,
  pods and every extended resource *except* those the extender manages with ``ignoredByScheduler: true``), with the
  upstream reason strings ("Insufficient cpu", "node(s) had untolerated taint ...").
* **Filter, then the extender** (``findNodesThatPassExtenders``) for pods it ``IsInterested`` in (a managed resource
  in requests or limits): ``ExtenderArgs`` with ``NodeNames`` when ``nodeCacheCapable`` (else a full ``NodeList``);
  returned names must come from the input; ``FailedNodes`` and ``FailedAndUnresolvableNodes`` reasons join the
  diagnosis; an error fails the cycle unless the extender is ``ignorable`` (``pkg/scheduler/extender.go``,
  ``HTTPExtender.Filter``/``send``: POST ``urlPrefix/verb``, HTTP 200 required, ``httpTimeout``).
* **Score**: skipped when one node is feasible (upstream does the same); else NodeResourcesFit with the profile's
  scoring strategy and resources, NodeResourcesBalancedAllocation, each 0-100 times plugin weight 1, plus the
  extender's ``prioritize`` scores x ``weight`` x 10 (``MaxNodeScore / MaxExtenderPriority``); a prioritize error is
  ignored. The highest total wins; ties are broken at random (``selectHost``'s reservoir sampling).
* **Bind** through the extender's ``bind`` verb (it is the binder: ``ExtenderBindingArgs``); an error is a
  ``FailedScheduling`` event and a back-off.
* **Unschedulable**: the ``FitError`` message ``0/N nodes are available: <count> <reason>, ...`` (reasons sorted) goes
  into a ``FailedScheduling`` Warning event and the pod's ``PodScheduled=False`` condition (reason
  ``Unschedulable``); a successful bind gets a ``Scheduled`` event ``Successfully assigned NS/NAME to NODE``.

Not reproduced: informers and the scheduler cache (it polls the API server every ``poll`` seconds, and a bound pod
is seen on the next poll), preemption (``PostFilter``), inter-pod affinity and topology spread (no such pods here),
the other default score plugins (they score every node here alike), percentageOfNodesToScore (all nodes are scored),
leader election.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import requests
from kubeapi import ALL_PODS, NODES, PODS, Api, ApiError, now

from gnnsched.quantity import parse_bytes

log = logging.getLogger("e2e.scheduler")

MAX_NODE_SCORE = 100
MAX_EXTENDER_PRIORITY = 10
INITIAL_BACKOFF = 1.0
MAX_BACKOFF = 10.0
DEFAULT_PODS_PER_NODE = 110


def cpu_millis(value: str | int | float) -> int:
    """A CPU quantity in millicores ("500m", "2", 1.5)."""
    text = str(value).strip()
    if text.endswith("m"):
        return int(float(text[:-1]))
    return int(round(float(text) * 1000))


def quantity(resource: str, value: Any) -> int:
    """cpu in millicores, everything else as an integer count of units (bytes for memory)."""
    if resource == "cpu":
        return cpu_millis(value)
    return int(parse_bytes(str(value)))


def pod_requests(pod: dict[str, Any]) -> dict[str, int]:
    """Effective requests: the sum over containers, at least the largest init container (``resource.PodRequests``).
    A container that names only a limit requests that limit (API defaulting)."""
    spec = pod.get("spec") or {}

    def of(container: dict[str, Any]) -> dict[str, int]:
        res = container.get("resources") or {}
        merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        return {k: quantity(k, v) for k, v in merged.items()}

    total: Counter[str] = Counter()
    for c in spec.get("containers") or []:
        total.update(of(c))
    for c in spec.get("initContainers") or []:
        for k, v in of(c).items():
            total[k] = max(total[k], v)
    return dict(total)


def node_allocatable(node: dict[str, Any]) -> dict[str, int]:
    status = node.get("status") or {}
    alloc = status.get("allocatable") or status.get("capacity") or {}
    return {k: quantity(k, v) for k, v in alloc.items()}


def _tolerates(tolerations: list[dict[str, Any]], taint: dict[str, Any]) -> bool:
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        if t.get("operator") == "Exists":
            if not t.get("key") or t.get("key") == taint.get("key"):
                return True
        elif t.get("key") == taint.get("key") and (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


@dataclass
class ExtenderConfig:
    """One ``extenders[]`` entry of the KubeSchedulerConfiguration."""

    url_prefix: str
    filter_verb: str
    prioritize_verb: str
    bind_verb: str
    weight: int
    node_cache_capable: bool
    ignorable: bool
    timeout: float
    managed: set[str]
    ignored_by_scheduler: set[str]

    @classmethod
    def from_config(cls, entry: dict[str, Any]) -> ExtenderConfig:
        timeout = str(entry.get("httpTimeout", "5s"))
        seconds = float(timeout[:-2]) / 1000 if timeout.endswith("ms") else float(timeout.rstrip("s"))
        managed = entry.get("managedResources") or []
        return cls(url_prefix=str(entry["urlPrefix"]).rstrip("/"), filter_verb=entry.get("filterVerb", ""),
                   prioritize_verb=entry.get("prioritizeVerb", ""), bind_verb=entry.get("bindVerb", ""),
                   weight=int(entry.get("weight", 1)), node_cache_capable=bool(entry.get("nodeCacheCapable")),
                   ignorable=bool(entry.get("ignorable")), timeout=seconds,
                   managed={m["name"] for m in managed},
                   ignored_by_scheduler={m["name"] for m in managed if m.get("ignoredByScheduler")})

    def interested(self, pod: dict[str, Any]) -> bool:
        """``HTTPExtender.IsInterested``: no managed resources means every pod."""
        if not self.managed:
            return True
        spec = pod.get("spec") or {}
        for c in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
            res = c.get("resources") or {}
            if self.managed & (set(res.get("requests") or {}) | set(res.get("limits") or {})):
                return True
        return False


class ExtenderError(Exception):
    pass


@dataclass
class _Backoff:
    attempts: int = 0
    not_before: float = 0.0


@dataclass
class SchedulerStats:
    cycles: int = 0
    scheduled: int = 0
    failed: int = 0
    extender_calls: Counter[str] = field(default_factory=Counter)


class SchedulerStandIn:
    """The scheduling loop in a thread; ``stop()`` ends it."""

    def __init__(self, api: Api, config: dict[str, Any], on_event: Callable[[str, dict[str, Any], str], None],
                 poll: float = 0.2, seed: int = 0) -> None:
        self.api = api
        profile = (config.get("profiles") or [{}])[0]
        self.scheduler_name = str(profile.get("schedulerName", "default-scheduler"))
        self.extenders = [ExtenderConfig.from_config(e) for e in config.get("extenders") or []]
        strategy: dict[str, Any] = {"type": "LeastAllocated", "resources": [{"name": "cpu", "weight": 1},
                                                                             {"name": "memory", "weight": 1}]}
        for pc in profile.get("pluginConfig") or []:
            if pc.get("name") == "NodeResourcesFit":
                strategy = (pc.get("args") or {}).get("scoringStrategy") or strategy
        self.strategy = strategy
        self.on_event = on_event
        self.poll = poll
        self.rng = random.Random(seed)
        self.stats = SchedulerStats()
        self._backoff: dict[str, _Backoff] = {}
        self._event_names: dict[tuple[str, str], str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scheduler-standin", daemon=True)
        self._http = requests.Session()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    # -- loop --------------------------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.cycle()
            except ApiError as exc:
                log.debug("scheduler: API unavailable (%s)", exc)
            except Exception:  # a bug in the stand-in must not end the run silently
                log.exception("scheduler stand-in cycle failed")
            self._stop.wait(self.poll)

    def cycle(self) -> None:
        pods = self.api.items(ALL_PODS)
        nodes = self.api.items(NODES)
        pending = [p for p in pods if (p.get("spec") or {}).get("schedulerName") == self.scheduler_name
                   and not (p.get("spec") or {}).get("nodeName")
                   and not (p.get("metadata") or {}).get("deletionTimestamp")
                   and (p.get("status") or {}).get("phase", "Pending") == "Pending"]
        live = {(p.get("metadata") or {}).get("uid") for p in pending}
        for uid in list(self._backoff):
            if uid not in live:
                del self._backoff[uid]
        pending.sort(key=lambda p: (-int((p.get("spec") or {}).get("priority") or 0),
                                    (p.get("metadata") or {}).get("creationTimestamp") or ""))
        t = time.monotonic()
        for pod in pending:
            if self._stop.is_set():
                return
            uid = str(pod["metadata"]["uid"])
            b = self._backoff.setdefault(uid, _Backoff())
            if t < b.not_before:
                continue
            self.stats.cycles += 1
            node = self.schedule_one(pod, nodes, pods)
            if node is None:
                b.attempts += 1
                b.not_before = time.monotonic() + min(MAX_BACKOFF, INITIAL_BACKOFF * 2 ** (b.attempts - 1))
                self.stats.failed += 1
            else:
                self._backoff.pop(uid, None)
                self.stats.scheduled += 1
                pod.setdefault("spec", {})["nodeName"] = node  # assumed, as the scheduler cache does
                pods = [p for p in pods if (p.get("metadata") or {}).get("uid") != uid] + [pod]

    # -- one pod ----------------------------------------------------------------------------------------------
    def schedule_one(self, pod: dict[str, Any], nodes: list[dict[str, Any]],
                     pods: list[dict[str, Any]]) -> str | None:
        ignored = set().union(*(e.ignored_by_scheduler for e in self.extenders)) if self.extenders else set()
        reasons: dict[str, list[str]] = {}
        feasible = []
        for node in nodes:
            why = self._own_filter(pod, node, pods, ignored)
            if why:
                reasons[node["metadata"]["name"]] = why
            else:
                feasible.append(node)
        try:
            for ext in self.extenders:
                if not feasible or not ext.filter_verb or not ext.interested(pod):
                    continue
                feasible = self._extender_filter(ext, pod, feasible, reasons)
        except ExtenderError as exc:
            self._fail(pod, str(exc))
            return None
        if not feasible:
            self._fail(pod, self._fit_error(len(nodes), reasons))
            return None
        host = feasible[0]["metadata"]["name"] if len(feasible) == 1 else self._select(pod, feasible, pods)
        return host if self._bind(pod, host) else None

    def _own_filter(self, pod: dict[str, Any], node: dict[str, Any], pods: list[dict[str, Any]],
                    ignored: set[str]) -> list[str]:
        spec = pod.get("spec") or {}
        nspec = node.get("spec") or {}
        if nspec.get("unschedulable"):
            return ["node(s) were unschedulable"]
        for taint in nspec.get("taints") or []:
            if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerates(spec.get("tolerations") or [],
                                                                                      taint):
                return [f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value', '')}}}"]
        labels = (node.get("metadata") or {}).get("labels") or {}
        if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
            return ["node(s) didn't match Pod's node affinity/selector"]
        alloc = node_allocatable(node)
        used = self._used(node["metadata"]["name"], pods)
        want = pod_requests(pod)
        out = []
        if used.get("pods", 0) + 1 > alloc.get("pods", DEFAULT_PODS_PER_NODE):
            out.append("Too many pods")
        for res, amount in sorted(want.items()):
            if res in ignored or amount == 0:
                continue
            if used.get(res, 0) + amount > alloc.get(res, 0):
                out.append(f"Insufficient {res}")
        return out

    @staticmethod
    def _used(node_name: str, pods: list[dict[str, Any]]) -> Counter[str]:
        used: Counter[str] = Counter()
        for p in pods:
            if (p.get("spec") or {}).get("nodeName") != node_name:
                continue
            if (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            used.update(pod_requests(p))
            used["pods"] += 1
        return used

    def _send(self, ext: ExtenderConfig, verb: str, args: dict[str, Any]) -> Any:
        self.stats.extender_calls[verb] += 1
        url = f"{ext.url_prefix}/{verb}"
        try:
            resp = self._http.post(url, json=args, timeout=ext.timeout)
        except requests.RequestException as exc:
            raise ExtenderError(f"Post \"{url}\": {exc}") from None
        if resp.status_code != 200:
            raise ExtenderError(f"failed {verb} with extender at URL {url}, code {resp.status_code}")
        return resp.json()

    def _args(self, ext: ExtenderConfig, pod: dict[str, Any], nodes: list[dict[str, Any]]) -> dict[str, Any]:
        if ext.node_cache_capable:
            return {"Pod": pod, "Nodes": None, "NodeNames": [n["metadata"]["name"] for n in nodes]}
        return {"Pod": pod, "Nodes": {"items": nodes}, "NodeNames": None}

    def _extender_filter(self, ext: ExtenderConfig, pod: dict[str, Any], nodes: list[dict[str, Any]],
                         reasons: dict[str, list[str]]) -> list[dict[str, Any]]:
        try:
            result = self._send(ext, ext.filter_verb, self._args(ext, pod, nodes))
            if result.get("Error"):
                raise ExtenderError(str(result["Error"]))
        except ExtenderError:
            if ext.ignorable:
                return nodes
            raise
        by_name = {n["metadata"]["name"]: n for n in nodes}
        if ext.node_cache_capable and result.get("NodeNames") is not None:
            out = []
            for name in result["NodeNames"]:
                if name not in by_name:
                    raise ExtenderError(f"extender {ext.url_prefix!r} claims a filtered node {name!r} which is not "
                                        "found in the input node list")
                out.append(by_name[name])
        elif result.get("Nodes") is not None:
            out = list((result["Nodes"] or {}).get("items") or [])
        else:
            out = []  # both null: every node filtered out (upstream behaviour)
        for key in ("FailedNodes", "FailedAndUnresolvableNodes"):
            for name, why in (result.get(key) or {}).items():
                reasons.setdefault(name, []).append(str(why))
        return out

    def _select(self, pod: dict[str, Any], nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> str:
        totals = {n["metadata"]["name"]: self._own_score(pod, n, pods) for n in nodes}
        for ext in self.extenders:
            if not ext.prioritize_verb or not ext.interested(pod):
                continue
            try:
                result = self._send(ext, ext.prioritize_verb, self._args(ext, pod, nodes))
            except ExtenderError as exc:
                log.info("prioritize error ignored (as kube-scheduler does): %s", exc)
                continue
            for hp in result or []:
                if hp.get("Host") in totals:
                    totals[hp["Host"]] += int(hp.get("Score", 0)) * ext.weight * (MAX_NODE_SCORE //
                                                                                 MAX_EXTENDER_PRIORITY)
        best = max(totals.values())
        winners = [name for name, total in totals.items() if total == best]
        return winners[0] if len(winners) == 1 else self.rng.choice(sorted(winners))

    def _own_score(self, pod: dict[str, Any], node: dict[str, Any], pods: list[dict[str, Any]]) -> int:
        alloc = node_allocatable(node)
        used = self._used(node["metadata"]["name"], pods)
        want = pod_requests(pod)
        kind = self.strategy.get("type", "LeastAllocated")
        weighted = 0
        weights = 0
        fractions = []
        for res in self.strategy.get("resources") or []:
            name, weight = res["name"], int(res.get("weight", 1))
            cap = alloc.get(name, 0)
            if cap <= 0:
                continue
            requested = min(cap, used.get(name, 0) + want.get(name, 0))
            share = requested * MAX_NODE_SCORE // cap
            weighted += (share if kind == "MostAllocated" else MAX_NODE_SCORE - share) * weight
            weights += weight
            fractions.append(requested / cap)
        fit = weighted // weights if weights else 0
        if len(fractions) >= 2:
            mean = sum(fractions) / len(fractions)
            std = (sum((f - mean) ** 2 for f in fractions) / len(fractions)) ** 0.5
            balanced = int((1 - std) * MAX_NODE_SCORE)
        else:
            balanced = MAX_NODE_SCORE
        return fit + balanced

    def _bind(self, pod: dict[str, Any], host: str) -> bool:
        meta = pod["metadata"]
        binder = next((e for e in self.extenders if e.bind_verb and e.interested(pod)), None)
        try:
            if binder is not None:
                result = self._send(binder, binder.bind_verb, {"PodName": meta["name"],
                                                               "PodNamespace": meta.get("namespace", "default"),
                                                               "PodUID": meta["uid"], "Node": host})
                if result.get("Error"):
                    raise ExtenderError(str(result["Error"]))
            else:  # the default binder: the pod's binding subresource
                self.api.post(f"{PODS.format(ns=meta.get('namespace', 'default'))}/{meta['name']}/binding",
                              {"apiVersion": "v1", "kind": "Binding",
                               "metadata": {"name": meta["name"], "uid": meta["uid"]},
                               "target": {"apiVersion": "v1", "kind": "Node", "name": host}})
        except (ExtenderError, ApiError) as exc:
            self._fail(pod, f"Binding rejected: {exc}")
            return False
        self._record(pod, "Normal", "Scheduled",
                     f"Successfully assigned {meta.get('namespace', 'default')}/{meta['name']} to {host}")
        self.on_event("bound", pod, host)
        return True

    @staticmethod
    def _fit_error(total: int, reasons: dict[str, list[str]]) -> str:
        """``FitError.Error()``: a histogram of the reasons, sorted, behind ``0/N nodes are available:``."""
        histogram: Counter[str] = Counter()
        for why in reasons.values():
            for r in dict.fromkeys(why):
                histogram[r] += 1
        parts = sorted(f"{count} {reason}" for reason, count in histogram.items())
        return f"0/{total} nodes are available: {', '.join(parts)}." if parts else \
            f"0/{total} nodes are available."

    def _fail(self, pod: dict[str, Any], message: str) -> None:
        meta = pod["metadata"]
        self._record(pod, "Warning", "FailedScheduling", message)
        conditions = [c for c in ((pod.get("status") or {}).get("conditions") or []) if c.get("type") != "PodScheduled"]
        conditions.append({"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
                           "lastTransitionTime": now()})
        try:
            self.api.patch(f"{PODS.format(ns=meta.get('namespace', 'default'))}/{meta['name']}/status",
                           {"status": {"conditions": conditions}})
        except ApiError as exc:
            log.debug("cannot update the condition of %s: %s", meta["name"], exc)
        self.on_event("unschedulable", pod, message)

    def _record(self, pod: dict[str, Any], event_type: str, reason: str, message: str) -> None:
        """One Event per (pod, reason, message); repeats bump its count, as client-go's event correlator does."""
        meta = pod["metadata"]
        key = (str(meta["uid"]), f"{reason}\n{message}")
        ns = meta.get("namespace", "default")
        try:
            name = self._event_names.get(key)
            if name is not None:
                current = self.api.get_or_none(f"/api/v1/namespaces/{ns}/events/{name}")
                if current is not None:
                    self.api.patch(f"/api/v1/namespaces/{ns}/events/{name}",
                                   {"count": int(current.get("count") or 1) + 1, "lastTimestamp": now()})
                    return
            pod_ref = {"apiVersion": "v1", "kind": "Pod", "metadata": meta}
            self._event_names[key] = self.api.event(pod_ref, event_type, reason, message,
                                                    component=self.scheduler_name)
        except ApiError as exc:
            log.debug("cannot record event for %s: %s", meta["name"], exc)
