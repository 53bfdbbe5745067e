"""scripts/render_chart.py: the manifests a scanner (checkov) reads are the chart as the tests render it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "render_chart.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120,
                          check=False)


def test_renders_one_file_per_template_with_the_values_given(tmp_path: Path) -> None:
    p = _run(str(tmp_path / "out"), "--kube-version", "1.31.4-gke.100",
             "--values", '{"networkPolicy": {"enabled": true}}')
    assert p.returncode == 0, p.stderr
    files = {f.name: f for f in (tmp_path / "out").iterdir()}
    assert "gnnsched_templates_networkpolicy.yaml" in files and "gnnsched_templates_scheduler.yaml" in files
    docs = [d for f in files.values() for d in yaml.safe_load_all(f.read_text()) if d]
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    assert {d["metadata"]["labels"]["app.kubernetes.io/component"] for d in policies} >= {"node", "mps"}
    scheduler = next(d for d in docs if d["kind"] == "Deployment" and "scheduler" in d["metadata"]["name"])
    images = [c["image"] for c in scheduler["spec"]["template"]["spec"]["containers"]]
    assert any(i.endswith(":v1.31.4") for i in images), images  # the cluster version reached the render


def test_bad_values_are_one_line_errors(tmp_path: Path) -> None:
    for values, message in (("{not json", "--values: not JSON"), ("[1]", "--values: must be a JSON object")):
        p = _run(str(tmp_path / "out"), "--values", values)
        assert p.returncode == 2 and message in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    p = _run(str(tmp_path / "out"), "--kube-version", "1.20.0")  # below the chart's minimum: Helm's own message
    assert p.returncode == 1 and p.stderr.startswith("error: rendering the chart:"), p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr
