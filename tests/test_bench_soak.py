"""``bench/soak_local_cluster.py``'s jobs: the shape of issue 38's held-out soak (many jobs, three namespaces)."""

from __future__ import annotations

from collections import Counter

import bench_modules

from gnnsched.spec import parse_job


def test_the_soak_spreads_valid_jobs_over_the_namespaces_with_every_name_in_each() -> None:
    soak = bench_modules.load("soak_local_cluster")
    docs = soak.manifests(80, ["default", "team-a", "team-b"])
    assert len(docs) == 80
    per_ns = Counter(d["metadata"]["namespace"] for d in docs)
    assert per_ns == {"default": 27, "team-a": 27, "team-b": 26}
    keys = {(d["metadata"]["namespace"], d["metadata"]["name"]) for d in docs}
    assert len(keys) == 80  # unique within a namespace
    names = {ns: {n for s, n in keys if s == ns} for ns in per_ns}
    assert names["team-b"] < names["default"] == names["team-a"]  # the same names in every namespace
    for doc in docs:
        parse_job(doc)  # every manifest is a valid GNNJob
    # the user's own model from an image without gnnsched, and checkpointing jobs, are in the mix
    assert any(d["spec"].get("image") and d["spec"]["model"].get("entrypoint") for d in docs)
    assert any("checkpoint" in d["spec"] for d in docs)
