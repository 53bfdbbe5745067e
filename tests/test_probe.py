"""The probe: the user's entrypoint traced from a copied ``gnnsched/portable`` directory with nothing of gnnsched
importable, giving the estimator's own numbers; a failing entrypoint reports its error lines."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from crd_schema import ROOT, load_crd, validate

from gnnsched.entrypoint_probe import (
    ProbeError,
    estimate_from_probe,
    install_probe,
    parse_probe_result,
    probe_request,
)
from gnnsched.estimator import estimate
from gnnsched.gpu.catalogue import get_gpu_model, gpu_models
from gnnsched.portable.probe import RESULT_LIMIT
from gnnsched.spec import load_job, parse_job

EXAMPLE = ROOT / "examples" / "custom-entrypoint"
# Runs the probe as ``python -I`` would in the user's image: only the copied directories on the path, and an import
# hook that fails any import of gnnsched (installed in this venv, so a stray import would otherwise succeed).
BOOTSTRAP = """
import importlib.abc, runpy, sys
class NoGnnsched(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "gnnsched" or name.startswith("gnnsched."):
            raise ImportError("the probe imported " + name)
        return None
sys.meta_path.insert(0, NoGnnsched())
sys.path[:0] = sys.argv[1].split(":")
sys.argv = ["probe", *sys.argv[2:]]
try:
    runpy.run_module("gnnsched_portable.probe", run_name="__main__")
finally:
    leaked = sorted(m for m in sys.modules if m == "gnnsched" or m.startswith("gnnsched."))
    print("LEAKED", leaked, file=sys.stderr)
"""


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> Path:
    """The user's image, simulated: the probe's directory as the init container copies it, and the user's package."""
    root = tmp_path_factory.mktemp("image")
    install_probe(root / "probe")  # what the probe pod's init container runs
    shutil.copytree(EXAMPLE / "my_gnn", root / "user" / "my_gnn")
    (root / "user" / "broken_gnn.py").write_text(
        "import torch\n"
        "class Picky(torch.nn.Module):\n"
        "    def __init__(self, f, c):\n"
        "        super().__init__()\n"
        "        self.lin = torch.nn.Linear(f, c)\n"
        "    def forward(self, x, edge_index):\n"
        "        top = int(edge_index.max().item())  # a value: no data-less tensor has one\n"
        "        return self.lin(x[: top + 1])\n"
        "def build(dims):\n"
        "    return Picky(dims.num_features, dims.num_classes)\n"
    )
    return root


def _run_probe(image: Path, request: dict, tmp_path: Path) -> tuple[subprocess.CompletedProcess, str]:
    result = tmp_path / "termination-log"
    paths = f"{image / 'probe'}:{image / 'user'}"
    run = subprocess.run(
        [sys.executable, "-I", "-c", BOOTSTRAP, paths, "--request", json.dumps(request), "--result", str(result)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert "LEAKED []" in run.stderr, run.stderr[-2000:]
    return run, result.read_text()


def _spec(mode: str, **extra: object):
    manifest = yaml.safe_load((EXAMPLE / "gnnjob.yaml").read_text())
    manifest["spec"]["graph"] = {"nodes": 3000, "edges": 24000, "features": 48, "classes": 7}
    manifest["spec"]["mode"] = mode
    if mode == "infer":
        manifest["spec"].pop("optimizer")
        manifest["spec"].pop("epochs")
        manifest["spec"]["requests"] = 100
    manifest["spec"].update(extra)
    return parse_job(manifest).spec


@pytest.mark.parametrize("mode,extra", [
    ("train", {}),
    ("infer", {"parallelism": 3}),
    ("train", {"batching": {"mode": "minibatch", "batchSize": 256, "fanouts": [10, 5]}}),
])
def test_the_probe_from_a_copied_directory_gives_the_estimators_numbers(image, tmp_path, monkeypatch, mode, extra):
    spec = _spec(mode, **extra)
    gpus = gpu_models()
    run, message = _run_probe(image, probe_request(spec, gpus), tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert len(message.encode()) <= RESULT_LIMIT
    result = parse_probe_result(message)
    monkeypatch.syspath_prepend(str(EXAMPLE))
    for gpu in gpus:
        expected = estimate(spec, device="cuda", gpu_model=gpu)
        got = estimate_from_probe(result, gpu)
        assert got.as_dict() | {"seconds": 0} == expected.as_dict() | {"seconds": 0}, gpu.name


def test_a_failing_entrypoint_reports_its_last_error_lines(image, tmp_path):
    spec = _spec("train")
    request = probe_request(spec, [get_gpu_model("H100-80GB")]) | {"entrypoint": "broken_gnn:build"}
    run, message = _run_probe(image, request, tmp_path)
    assert run.returncode == 1
    with pytest.raises(ProbeError) as caught:
        parse_probe_result(message)
    text = str(caught.value)
    assert "item" in text and "broken_gnn.py" in text
    assert caught.value.field is None  # a failure to trace: the job still runs
    assert len(text.splitlines()) <= 12


def test_an_entrypoint_that_does_not_import_is_named(image, tmp_path):
    request = probe_request(_spec("infer"), [get_gpu_model("H100-80GB")]) | {"entrypoint": "no_such_pkg.mod:build"}
    run, message = _run_probe(image, request, tmp_path)
    assert run.returncode == 1
    with pytest.raises(ProbeError, match="cannot import 'no_such_pkg.mod'") as caught:
        parse_probe_result(message)
    assert caught.value.field == "spec.model.entrypoint"  # the spec is wrong, not the trace impossible


def test_a_result_not_asked_for_a_gpu_model_is_refused():
    result = parse_probe_result(json.dumps(
        {"v": 1, "pmc": 10, "breakdown": {}, "resident": 0, "allocator": [[1, 2, 30, 20]]}
    ))
    with pytest.raises(ProbeError, match="H100-80GB"):
        estimate_from_probe(result, get_gpu_model("H100-80GB"))
    with pytest.raises(ProbeError, match="not JSON"):
        parse_probe_result("Killed")


def test_the_example_gnnjob_is_accepted_by_both():
    path = EXAMPLE / "gnnjob.yaml"
    assert load_job(path).spec.model.entrypoint == "my_gnn.model:build"
    assert validate(load_crd("gnnjob.yaml"), yaml.safe_load(path.read_text())) == []
