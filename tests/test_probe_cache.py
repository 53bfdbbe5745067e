"""The operator's probe cache serves a namespace only its own probes (issue 39, item 7)."""

from __future__ import annotations

from gnnsched.entrypoint_probe import ProbeRecord, cache_key
from gnnsched.operator.probe import ProbeCache

REQUEST = {"entrypoint": "model:build", "mode": "train"}
DIGEST = "sha256:" + "ab" * 32


def test_a_probe_sizes_only_its_own_namespace_and_is_found_by_the_resolved_image() -> None:
    key = cache_key("registry.example/team/gnn:latest", REQUEST)
    record = ProbeRecord(key=key, pod="job-probe", state="Failed", reason="ProbeError", error="traced",
                         image_id=f"registry.example/team/gnn@{DIGEST}", cacheable=True)
    cache = ProbeCache()
    cache.put("team-a", record, REQUEST)
    assert cache.get("team-a", key) == record
    assert cache.get("team-b", key) is None  # another namespace's job of the same tag probes for itself
    pinned = cache_key(f"registry.example/team/gnn@{DIGEST}", REQUEST)
    assert pinned != key and cache.get("team-a", pinned) == record and cache.get("team-b", pinned) is None
    cache.put("team-a", record.model_copy(update={"state": "Running"}))  # running probes are never kept
    assert len(cache._items) == 2
