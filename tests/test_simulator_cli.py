"""``gnnsched simulate`` end to end on a tiny workload file: real estimator, runtime prior, policies, gate check."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gnnsched.simulator.report import JSON_KEYS


def _manifest(name: str, arch: str, dataset: str, arrival: float, epochs: int, hidden: int = 64) -> dict:
    model = {"arch": arch, "layers": 3, "hidden": hidden}
    if arch == "gat":
        model["heads"] = 2
    return {"apiVersion": "gnnsched.io/v1alpha1", "kind": "GNNJob", "metadata": {"name": name},
            "spec": {"mode": "train", "model": model, "graph": {"dataset": dataset}, "epochs": epochs,
                     "resources": {"cpu": "2", "memory": "4Gi"}},
            "arrival": arrival}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    pytest.importorskip("gnnsched.colocation.interference")
    d = tmp_path_factory.mktemp("sim")
    jobs = [_manifest(f"j{i}", arch, ds, float(i), 50 + 50 * i)
            for i, (arch, ds) in enumerate([("gcn", "cora"), ("sage", "citeseer"), ("gin", "cora"),
                                            ("gat", "citeseer"), ("gcn", "pubmed"), ("sage", "cora")])]
    (d / "w.yaml").write_text(yaml.safe_dump(jobs))
    out = subprocess.run(
        [sys.executable, "-m", "gnnsched.cli", "simulate", "--workload", str(d / "w.yaml"), "--cluster",
         "1x1xV100-32GB", "--policies", "exclusive,temporal,mps-naive,lmcf,bqt@2", "--json", str(d / "out.json"),
         "--plots", str(d / "plots"), "--no-progress"],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    (d / "stdout.txt").write_text(out.stdout)
    return d


def test_json_has_the_issue_keys_per_policy(run_dir: Path):
    doc = json.loads((run_dir / "out.json").read_text())
    assert set(doc["policies"]) == {"exclusive", "temporal", "mps-naive", "lmcf", "bqt@2"}
    for name, m in doc["policies"].items():
        assert list(m)[: len(JSON_KEYS)] == list(JSON_KEYS)
        assert m["completed"] == 6, name
    for name in ("lmcf", "bqt@2"):
        assert doc["policies"][name]["oom_kills"] == 0
        assert doc["policies"][name]["gate_checks"] > 0
    # co-location shortens the makespan against one job per GPU on the same jobs
    assert doc["policies"]["lmcf"]["makespan_s"] < doc["policies"]["exclusive"]["makespan_s"]


def test_table_and_plots(run_dir: Path):
    table = (run_dir / "stdout.txt").read_text()
    assert table.splitlines()[0].startswith("policy") and "lmcf" in table
    for name in ("jct_cdf.png", "utilisation.png", "group_memory.png"):
        png = run_dir / "plots" / name
        assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_gnnsched_policies_on_a_multi_node_cluster(run_dir: Path):
    # Used to exit 3 ("multi-node placement missing"); now the extender's placement math (gnnsched.placement)
    # spreads the pods over the nodes and the gate keeps every GPU safe.
    out = subprocess.run(
        [sys.executable, "-m", "gnnsched.cli", "simulate", "--workload", str(run_dir / "w.yaml"), "--cluster",
         "4x1xV100-32GB", "--policies", "lmcf,lmcf-interference,bqt", "--json", str(run_dir / "multi.json"),
         "--no-progress"],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads((run_dir / "multi.json").read_text())
    for name in ("lmcf", "lmcf-interference", "bqt"):
        m = doc["policies"][name]
        assert m["completed"] == 6 and m["oom_kills"] == 0 and m["gate_checks"] > 0, name
