"""Trace loaders on the real files (skipped only if the shared data folder is absent) and on broken copies."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from gnnsched.gpu.catalogue import get_gpu_model
from gnnsched.traces import (
    GIB,
    MIB,
    Censoring,
    PodTable,
    TraceError,
    load_dlrm,
    load_openb_nodes,
    load_openb_pods,
    load_pai_machines,
)

TRACES = Path(__file__).resolve().parents[1].parent.parent / "shared" / "data" / "traces"
if not TRACES.is_dir():
    TRACES = Path("/work/shared/data/traces")
needs_traces = pytest.mark.skipif(not TRACES.is_dir(), reason="shared/data/traces not present")

HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
)


@needs_traces
def test_openb_default_pods_units_and_censoring() -> None:
    pods = load_openb_pods(TRACES / "openb_pod_list_default.csv")
    assert len(pods) == 7637
    counts = {c: sum(1 for x in pods.censoring if x is c) for c in Censoring}
    phases = {p: pods.phase.count(p) for p in set(pods.phase)}
    assert counts[Censoring.EXACT] == phases["Succeeded"] + phases["Failed"] == 1547
    assert counts[Censoring.RIGHT] == phases["Running"] == 5193
    assert counts[Censoring.NONE] == phases["Pending"] == 897
    # Row 1 of the file: 12000 millicores, 16384 MiB, one whole GPU.
    assert pods.cpu_cores[0] == 12.0 and pods.memory_bytes[0] == 16 * GIB and pods.gpu_share[0] == 1.0
    # Row 2: a sharing pod with 460 thousandths of one GPU.
    assert pods.gpu_share[1] == pytest.approx(0.46)
    exact = np.array([c is Censoring.EXACT for c in pods.censoring])
    np.testing.assert_array_equal(pods.runtime_seconds[exact], (pods.deletion_time - pods.scheduled_time)[exact])
    assert np.all(pods.runtime_seconds[exact] >= 0)
    pending = np.array([c is Censoring.NONE for c in pods.censoring])
    assert np.all(np.isnan(pods.runtime_seconds[pending])) and np.all(np.isnan(pods.scheduled_time[pending]))
    finished = pods.finished()
    assert len(finished) == 1547 and set(finished.phase) == {"Succeeded", "Failed"}
    ordered = finished.time_ordered()
    assert np.all(np.diff(ordered.creation_time) >= 0)


@needs_traces
def test_openb_variants_and_deduplication() -> None:
    default = load_openb_pods(TRACES / "openb_pod_list_default.csv")
    cpu050 = load_openb_pods(TRACES / "openb_pod_list_cpu050.csv")
    both = PodTable.concat([default, cpu050])
    assert len(both) == len(default) + len(cpu050)
    unique = both.deduplicated()
    assert len(default) <= len(unique) < len(both)
    assert len(unique.finished()) < len(default.finished()) + len(cpu050.finished())
    # The multi-GPU variant has requests only (no phases or times), which the pod loader must refuse by name.
    with pytest.raises(TraceError, match=r"openb_pod_list_multigpu50\.csv, header, column 'qos': missing"):
        load_openb_pods(TRACES / "openb_pod_list_multigpu50.csv")


@needs_traces
def test_openb_nodes_and_models_resolve() -> None:
    gpu_nodes = load_openb_nodes(TRACES / "openb_node_list_gpu_node.csv")
    assert len(gpu_nodes) == 1213
    assert gpu_nodes[0].cpu_cores == 64.0 and gpu_nodes[0].memory_bytes == 262144 * MIB and gpu_nodes[0].gpus == 2
    models = {n.gpu_model for n in gpu_nodes}
    assert models == {"G2", "T4", "P100", "V100M16", "V100M32", "G3", "A10"}
    for model in models:
        get_gpu_model(model)  # every trace code is in the GPU catalogue
    all_nodes = load_openb_nodes(TRACES / "openb_node_list_all_node.csv")
    cpu_only = [n for n in all_nodes if n.gpus == 0]
    assert cpu_only and all(n.gpu_model is None for n in cpu_only)


@needs_traces
def test_pai_machines() -> None:
    machines = load_pai_machines(TRACES / "pai_machine_spec.csv")
    assert len(machines) == sum(1 for line in (TRACES / "pai_machine_spec.csv").read_text().splitlines() if line)
    first = machines[0]
    assert (first.cpu_cores, first.memory_bytes, first.gpus, first.gpu_model) == (96.0, 512 * 10**9, 0, None)
    assert {m.gpu_model for m in machines if m.gpus} >= {"V100", "T4", "P100"}


@needs_traces
def test_dlrm_units_and_censoring() -> None:
    rows = load_dlrm(TRACES / "disaggregated_DLRM_trace.csv")
    assert len(rows) == 23871
    assert {r.role for r in rows} == {"CN", "HN"}
    first = rows[0]  # instance_0: HN, 12 vCPU, 1 GPU, 120 GiB, existed before and after the trace window
    assert (first.cpu_cores, first.gpus, first.memory_bytes) == (12.0, 1.0, 120 * GIB)
    assert first.censoring is Censoring.NONE and first.runtime_seconds is None
    for r in rows:
        if r.censoring is Censoring.EXACT:
            assert r.runtime_seconds == r.deletion_time - r.scheduled_time >= 0
        elif r.censoring is Censoring.LEFT:
            assert r.scheduled_time is None and r.runtime_seconds == r.deletion_time
        elif r.censoring is Censoring.RIGHT:
            assert r.deletion_time is None and r.runtime_seconds >= 0
    assert any(r.max_instance_per_node is None for r in rows)  # -1 in the file means no density limit


def _write(tmp_path: Path, text: str, name: str = "pods.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_missing_column_names_file_and_column(tmp_path: Path) -> None:
    path = _write(tmp_path, HEADER.replace("memory_mib,", "") + "p0,1000,1,1000,,LS,Failed,0,10,0\n")
    with pytest.raises(TraceError) as err:
        load_openb_pods(path)
    assert str(err.value).startswith(f"{path}, header, column 'memory_mib': missing")


def test_non_numeric_value_names_row_and_column(tmp_path: Path) -> None:
    path = _write(tmp_path, HEADER + "p0,1000,512,1,1000,,LS,Failed,0,10,0\np1,1000,lots,1,1000,,LS,Failed,0,10,0\n")
    with pytest.raises(TraceError) as err:
        load_openb_pods(path)
    assert str(err.value) == f"{path}, row 2, column 'memory_mib': 'lots' is not a number"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("", "file is empty"),
        (HEADER, "has a header but no data rows"),
        (HEADER + "p0,1000,512,1,1000,,LS,Failed,0,10\n", "row 1, column 'scheduled_time': missing value"),
        (HEADER + "p0,-5,512,1,1000,,LS,Failed,0,10,0\n", "row 1, column 'cpu_milli': -5 is negative"),
        (HEADER + "p0,1000,512,1,1500,,LS,Failed,0,10,0\n", "row 1, column 'gpu_milli': 1500 exceeds 1000"),
        (HEADER + "p0,1000,512,1,1000,,LS,Done,0,10,0\n", "row 1, column 'pod_phase': 'Done' is not one of"),
        (HEADER + "p0,1000,512,1,1000,,XX,Failed,0,10,0\n", "row 1, column 'qos': 'XX' is not one of"),
        (HEADER + "p0,1000,512,1,1000,,LS,Failed,0,5,10\n", "row 1, column 'deletion_time': 5 is before"),
        (HEADER + "p0,1000,512,1,1000,,LS,Running,0,5,\n", "row 1, column 'scheduled_time': empty, but a Running"),
        (HEADER + "p0,1000,512,1,1000,,LS,Failed,0,inf,0\n", "row 1, column 'deletion_time': 'inf' is not a finite"),
    ],
)
def test_bad_pod_files(tmp_path: Path, body: str, expected: str) -> None:
    path = _write(tmp_path, body)
    with pytest.raises(TraceError, match=expected.replace("(", r"\(")):
        load_openb_pods(path)


def test_pending_pod_without_schedule_is_fine(tmp_path: Path) -> None:
    path = _write(tmp_path, HEADER + "p0,1000,512,1,1000,,LS,Pending,3,9,\np1,2000,1024,0,0,,BE,Succeeded,1,61,1\n")
    pods = load_openb_pods(path)
    assert pods.censoring == (Censoring.NONE, Censoring.EXACT)
    assert math.isnan(pods.runtime_seconds[0]) and pods.runtime_seconds[1] == 60.0
    assert pods.cpu_cores[1] == 2.0 and pods.memory_bytes[1] == 1024 * MIB


def test_byte_order_mark_is_tolerated(tmp_path: Path) -> None:
    path = tmp_path / "bom.csv"
    path.write_bytes(b"\xef\xbb\xbf" + (HEADER + "p0,1000,512,1,1000,,LS,Failed,0,10,0\n").encode())
    assert load_openb_pods(path).runtime_seconds[0] == 10.0


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no such file"):
        load_openb_pods(tmp_path / "absent.csv")
