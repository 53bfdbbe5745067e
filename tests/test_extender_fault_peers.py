"""The extender keeps a pod off nodes where it could only wait beside its fault peers (the apart rule,
docs/faults.md): over real HTTP on loopback with kube-scheduler's JSON, and the core functions it calls."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from datetime import datetime, timezone

import httpx
import numpy as np
import pytest
from test_extender_cache import gpu, make_pod, status

from gnnsched import placement as pl
from gnnsched.colocation.interference import load_default
from gnnsched.contract import ANN_ADMIT_BYTES, ANN_FAULT_PEERS, ANN_RESERVATION, API_VERSION, GNNJOB_KIND, GPUJob
from gnnsched.extender import create_app
from gnnsched.extender.binder import FakeBinder
from gnnsched.extender.cache import ClusterCache, reservation_from_pod
from gnnsched.extender.testing import LoopbackServer
from gnnsched.gpu.catalogue import GiB
from gnnsched.trust.job_facts import STATUS_FIELD, facts_status


def owned_pod(binder: FakeBinder, name: str, gib: float = 8, *, peers: object = None,
              runtime: float = 600.0) -> dict:
    """A pod of GNNJob ``ns/<name>`` (ownerReferences as the operator sets them), optionally with fault peers on its
    annotation, and that GNNJob in ``binder`` (the fake cluster's API server) with ``status.podFacts`` naming the pod,
    as the operator writes it: the peers there are the ones ``peers`` can be read as (the CRD's schema takes a list
    of strings only), and they, not the pod's annotation, are what the extender believes."""
    pod = make_pod(name, None, runtime=runtime)
    pod["metadata"]["annotations"][ANN_ADMIT_BYTES] = str(int(gib * GiB))
    pod["metadata"]["ownerReferences"] = [{"apiVersion": API_VERSION, "kind": GNNJOB_KIND, "name": name,
                                           "uid": f"job-uid-{name}", "controller": True}]
    clean = dict(pod, metadata=dict(pod["metadata"], annotations=dict(pod["metadata"]["annotations"])))
    if peers is not None:
        pod["metadata"]["annotations"][ANN_FAULT_PEERS] = peers
        if isinstance(peers, str):
            clean["metadata"]["annotations"][ANN_FAULT_PEERS] = peers
    binder.add_gnnjob({"metadata": {"name": name, "namespace": "ns", "uid": f"job-uid-{name}"},
                       "status": {STATUS_FIELD: facts_status(clean)}})
    return pod


def running(name: str, *, peers: tuple[str, ...] = (), remaining: float = 300.0, gib: float = 8) -> GPUJob:
    """A pod of GNNJob ``ns/<name>`` running on a GPU, as the node agent reports it."""
    return GPUJob(pod_uid=f"uid-run-{name}", namespace="ns", name=f"{name}-0", job=f"ns/{name}", bytes=int(gib * GiB),
                  predicted_remaining_seconds=remaining, fault_peers=list(peers))


def _cache(*statuses) -> ClusterCache:
    cache = ClusterCache(load_default())
    now = datetime.now(tz=timezone.utc)
    for st in statuses:
        st.updated_at = now
        cache.upsert_gpunode(st)
    return cache


@pytest.fixture()
def two_nodes() -> Iterator[tuple[httpx.Client, FakeBinder]]:
    """``peer``: one GPU, running job ns/b; ``other``: one GPU, running ns/c. Both have room for an 8 GiB pod."""
    binder = FakeBinder()
    cache = _cache(status("peer", gpu(0, running=[running("b")])), status("other", gpu(0, running=[running("c")])))
    with LoopbackServer(create_app(cache, binder)) as srv, httpx.Client(base_url=srv.url, timeout=10) as client:
        yield client, binder


def _decide(client: httpx.Client, pod: dict, nodes: list[str]) -> tuple[dict, dict[str, int]]:
    f = client.post("/filter", json={"Pod": pod, "NodeNames": nodes, "Nodes": None})
    assert f.status_code == 200
    p = client.post("/prioritize", json={"Pod": pod, "NodeNames": nodes})
    assert p.status_code == 200, p.text
    return f.json(), {x["Host"]: x["Score"] for x in p.json()}


def test_a_pod_goes_to_the_node_whose_gpu_is_free_of_its_peers(two_nodes) -> None:
    client, binder = two_nodes
    body, scores = _decide(client, owned_pod(binder, "a", peers="ns/b"), ["peer", "other"])
    assert body["Error"] == "" and body["NodeNames"] == ["other"], body
    assert "runs one of its fault peers (ns/b)" in body["FailedNodes"]["peer"], body
    assert not body["FailedAndUnresolvableNodes"]  # resolvable: the peer finishes
    assert scores == {"peer": 0, "other": 10}
    b = client.post("/bind", json={"PodName": "a", "PodNamespace": "ns", "PodUID": "uid-a", "Node": "other"}).json()
    assert b["Error"] == ""
    assert json.loads(binder.pods()[0]["metadata"]["annotations"][ANN_RESERVATION])["node"] == "other"


def test_the_running_pods_list_is_enough(two_nodes) -> None:
    """The other direction: the running job lists the pod's job among its peers; the pod's own list is empty (its
    annotation lost, e.g. recreated by hand)."""
    binder = FakeBinder()
    cache = _cache(status("peer", gpu(0, running=[running("b", peers=("ns/a",))])),
                   status("other", gpu(0, running=[running("c")])))
    with LoopbackServer(create_app(cache, binder)) as srv, httpx.Client(base_url=srv.url, timeout=10) as client:
        body, scores = _decide(client, owned_pod(binder, "a"), ["peer", "other"])
        assert body["NodeNames"] == ["other"], body
        assert "runs a job whose fault peers list ns/a" in body["FailedNodes"]["peer"], body
        assert scores == {"peer": 0, "other": 10}
        # a pod of another job is not kept from ns/b's GPU
        body, _ = _decide(client, owned_pod(binder, "d"), ["peer", "other"])
        assert body["NodeNames"] == ["peer", "other"] and not body["FailedNodes"], body


def test_pods_the_rule_does_not_concern_are_unaffected(two_nodes) -> None:
    client, binder = two_nodes
    # no annotation: both nodes pass, scored as before (the same GPUs, the same load)
    body, scores = _decide(client, owned_pod(binder, "a"), ["peer", "other"])
    assert body["NodeNames"] == ["peer", "other"] and not body["FailedNodes"], body
    assert scores["peer"] == scores["other"] == 10
    # peers that run nowhere here
    body, _ = _decide(client, owned_pod(binder, "a", peers="ns/zz"), ["peer", "other"])
    assert body["NodeNames"] == ["peer", "other"], body
    # the annotation on a pod no GNNJob owns is not believed (as the node agent's gate): nothing is kept apart
    stranger = make_pod("s", 8, annotations={ANN_FAULT_PEERS: "ns/b"})
    body, scores = _decide(client, stranger, ["peer", "other"])
    assert body["NodeNames"] == ["peer", "other"] and scores["peer"] == scores["other"], (body, scores)


def test_when_every_node_runs_a_peer_the_pod_still_has_a_node(two_nodes) -> None:
    """Filtering every candidate would leave the pod unschedulable although peers finish: they all pass, and the
    one whose peer leaves first ranks best."""
    binder = FakeBinder()
    cache = _cache(status("late", gpu(0, running=[running("b", remaining=3000)])),
                   status("soon", gpu(0, running=[running("c", remaining=60)])))
    with LoopbackServer(create_app(cache, binder)) as srv, httpx.Client(base_url=srv.url, timeout=10) as client:
        pod = owned_pod(binder, "a", peers="ns/b,ns/c")
        body, scores = _decide(client, pod, ["late", "soon"])
        assert body["NodeNames"] == ["late", "soon"] and not body["FailedNodes"], body
        assert scores["soon"] == 10 and scores["late"] < scores["soon"], scores
        # the only candidate passes even when it is blocked (kube-scheduler would otherwise give up on the pod)
        body, _ = _decide(client, pod, ["late"])
        assert body["NodeNames"] == ["late"], body
        b = client.post("/bind", json={"PodName": "a", "PodNamespace": "ns", "PodUID": "uid-a", "Node": "late"}).json()
        assert b["Error"] == "", b


def test_a_gpu_free_of_peers_on_the_same_node_is_enough() -> None:
    """A node passes when one GPU that can hold the pod is clear of its peers, and bind reserves that GPU."""
    binder = FakeBinder()
    # without the rule GPU 0 is the cheaper (one co-runner against two)
    cache = _cache(status("two", gpu(0, running=[running("b")]), gpu(1, running=[running("c"), running("e")])),
                   status("other", gpu(0, running=[running("d"), running("f")])))
    with LoopbackServer(create_app(cache, binder)) as srv, httpx.Client(base_url=srv.url, timeout=10) as client:
        pod = owned_pod(binder, "a", peers="ns/b")
        body, scores = _decide(client, pod, ["two", "other"])
        assert body["NodeNames"] == ["two", "other"], body
        assert scores["two"] == scores["other"] == 10, scores  # each node's best clear GPU: two co-runners
        client.post("/bind", json={"PodName": "a", "PodNamespace": "ns", "PodUID": "uid-a", "Node": "two"})
        assert json.loads(binder.pods()[0]["metadata"]["annotations"][ANN_RESERVATION])["gpu"] == 1


def test_peers_bound_by_the_extender_are_kept_apart_before_the_agent_reports_them() -> None:
    """The clients of one undecided fault are requeued together and scheduled one after another, faster than the
    node agents report: the extender's own reservations carry their jobs and peers."""
    binder = FakeBinder()
    cache = _cache(status("n1", gpu(0)), status("n2", gpu(0)))
    with LoopbackServer(create_app(cache, binder)) as srv, httpx.Client(base_url=srv.url, timeout=10) as client:
        first = owned_pod(binder, "a", peers="ns/b")
        body, _ = _decide(client, first, ["n1", "n2"])
        assert body["NodeNames"] == ["n1", "n2"]
        assert client.post("/bind", json={"PodName": "a", "PodNamespace": "ns", "PodUID": "uid-a",
                                          "Node": "n1"}).json()["Error"] == ""
        for pod in (owned_pod(binder, "b", peers="ns/a"), owned_pod(binder, "b")):  # its own list, or only a's
            body, scores = _decide(client, pod, ["n1", "n2"])
            assert body["NodeNames"] == ["n2"], body
            assert scores == {"n1": 0, "n2": 10}, scores
    # a restarted extender rebuilds the reservation, with its peers, from the pod's annotations
    res = reservation_from_pod(binder.pods()[0])
    assert res is not None and res.job == "ns/a" and res.apart == {"ns/b"}


@pytest.mark.parametrize("raw", ["ns/b,not-a-job,,a/b/c", 17, ["ns/b"]])
def test_a_malformed_annotation_never_fails_the_request(two_nodes, raw, caplog) -> None:
    """The pod's own annotation, however malformed, never fails the request: the extender believes the peers its
    GNNJob's status lists (what the operator could read of it: ``ns/b``, or none for a value that is not a string).
    Read directly (the parser under that boundary), what can be read is kept and the rest is left out with a log
    line."""
    from gnnsched.extender.pods import pod_apart

    client, binder = two_nodes
    pod = owned_pod(binder, "a", peers=raw)
    body, scores = _decide(client, pod, ["peer", "other"])
    assert body["Error"] == "" and not body["FailedAndUnresolvableNodes"], body
    if isinstance(raw, str):
        assert body["NodeNames"] == ["other"], body
    else:
        assert body["NodeNames"] == ["peer", "other"], body
    with caplog.at_level(logging.WARNING, logger="gnnsched.extender"):
        _, apart = pod_apart(pod["metadata"], "ns", "a")
    assert apart == ({"ns/b"} if isinstance(raw, str) else set())
    assert any(ANN_FAULT_PEERS in r.getMessage() for r in caplog.records)


def test_core_rule_functions() -> None:
    occ = [((0, 0), [pl.Occupant("ns/b", frozenset(), 100.0), pl.Occupant("ns/x", frozenset({"ns/a"}), 50.0)]),
           ((1, 0), [pl.Occupant("ns/c", frozenset(), 10.0)]), ((0, 1), [pl.Occupant(None, frozenset(), 5.0)])]
    assert pl.apart_blocked("ns/a", frozenset({"ns/b"}), occ) == {(0, 0): 100.0}
    assert pl.apart_blocked("ns/a", frozenset(), occ) == {(0, 0): 50.0}  # the other side's list
    assert pl.apart_blocked(None, frozenset(), occ) == {}
    passed = np.array([True, True, False])
    keep, refused = pl.apart_filter(passed, np.array([False, True, False]))
    assert keep.tolist() == [False, True, False] and refused.tolist() == [True, False, False]
    keep, refused = pl.apart_filter(passed, np.zeros(3, dtype=bool))  # none clear: keep them all
    assert keep.tolist() == passed.tolist() and not refused.any()
    cost = np.array([[1.0, 2.0], [np.inf, 1.5]])
    clear, waiting = pl.apart_costs(cost, {(0, 0): 700.0}, 600.0, 100.0)
    assert clear.tolist() == [[np.inf, 2.0], [np.inf, 1.5]] and waiting[0, 0] == 2.0
    assert pl.apart_ranked(clear, waiting) is clear
    clear, waiting = pl.apart_costs(cost[:, :1], {(0, 0): 700.0}, 600.0, 100.0)
    assert pl.apart_ranked(clear, waiting) is waiting


def test_apart_index_follows_the_agent_reports() -> None:
    """When the peer leaves (the agent's next report), its node is clear again."""
    cache = _cache(status("peer", gpu(0, running=[running("b")])), status("other", gpu(0, running=[running("c")])))
    from gnnsched.extender.pods import parse_pod

    demand = parse_pod(owned_pod(FakeBinder(), "a", peers="ns/b"))
    rows = cache.index_of(["peer", "other"])
    assert cache.filter(demand, rows).passed.tolist() == [False, True]
    st = status("peer", gpu(0))
    st.updated_at = datetime.fromtimestamp(time.time(), tz=timezone.utc)
    cache.upsert_gpunode(st)
    assert cache.filter(demand, rows).passed.tolist() == [True, True]
