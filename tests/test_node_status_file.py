"""The node agent's status file, as the device plugin reads it."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from gnnsched.contract import API_VERSION, GPUNODE_KIND, GPUNodeStatus, GPUStatus, MPSStatus
from gnnsched.node_status_file import (
    StatusFileError,
    read_status_file,
    status_age_seconds,
    status_file_path,
    write_status_file,
)


def _status() -> GPUNodeStatus:
    return GPUNodeStatus(
        node_name="n1", updated_at=datetime(2026, 1, 1, tzinfo=timezone.utc), mps=MPSStatus(healthy=False, message="x"),
        gpus=[GPUStatus(index=0, uuid="GPU-a", model="A100-80GB", total_bytes=1, mps_healthy=False)],
    )


def test_round_trip_bare_and_wrapped(tmp_path):
    path = status_file_path(tmp_path / "mps")
    assert path.name == "gnnsched-node-status.json"
    write_status_file(path, _status())
    got = read_status_file(path)
    assert got == _status()
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left behind
    path.write_text(json.dumps({"apiVersion": API_VERSION, "kind": GPUNODE_KIND, "metadata": {"name": "n1"},
                                "status": _status().wire()}))
    assert read_status_file(path) == _status()


def test_errors_are_one_line(tmp_path):
    path = tmp_path / "s.json"
    with pytest.raises(StatusFileError, match="does not exist"):
        read_status_file(path)
    path.write_text("{oops")
    with pytest.raises(StatusFileError, match="not JSON"):
        read_status_file(path)
    path.write_text(json.dumps({"gpus": []}))
    with pytest.raises(StatusFileError, match="nodeName"):
        read_status_file(path)


def test_age():
    s = _status()
    assert status_age_seconds(s, now=s.updated_at + timedelta(seconds=7)) == 7
    assert status_age_seconds(GPUNodeStatus(node_name="x")) is None
