"""``bench/gpu/validate``, the one prepared command of a GPU session: its plan and verdicts, and that it measures
nothing and says so on a machine without a GPU (the GPU path itself runs only on a lent GPU)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
VALIDATE = ROOT / "bench" / "gpu" / "validate"


def _module():
    loader = importlib.machinery.SourceFileLoader("gpu_validate", str(VALIDATE))
    spec = importlib.util.spec_from_loader("gpu_validate", loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_validate"] = module  # dataclasses look their module up there
    loader.exec_module(module)
    return module


def test_the_plan_covers_every_gpu_check_within_the_budget(tmp_path):
    validate = _module()
    plan = validate.steps(tmp_path)
    assert [s.name for s in plan] == ["pmc_accuracy", "allocator_history", "prestart", "real_gate",
                                      "context_by_share", "colocation"]
    assert sum(s.share for s in plan) == pytest.approx(1.0)
    for step in plan:
        for command in step.commands:
            script = ROOT / command[1]
            assert script.is_file(), command  # every step runs a script that exists
    assert any("--models" in c for c in plan[0].commands)  # the PyG classes and layer stacks too


@pytest.mark.parametrize("name,codes,verdict", [
    ("prestart", [0], "PASS"), ("prestart", [2], "KEPT"), ("prestart", [1], "FAIL"),
    ("pmc_accuracy", [0, 0], "PASS"), ("pmc_accuracy", [0, 1], "FAIL"), ("pmc_accuracy", [124], "FAIL (timeout)"),
    ("colocation", [0], "MEASURED"), ("context_by_share", [0, 0, 3], "FAIL"),
])
def test_verdicts(name, codes, verdict):
    assert _module()._verdict(name, codes) == verdict


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_without_a_gpu_every_step_is_skipped_and_nothing_is_written(tmp_path):
    done = subprocess.run([sys.executable, str(VALIDATE)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 6 and all(line.split()[1:] == ["SKIP", "(no", "CUDA", "device)"] for line in lines)
    assert list(tmp_path.iterdir()) == []
    coloc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu" / "colocation.py")], capture_output=True,
                           text=True, timeout=120)
    assert coloc.returncode == 0 and "SKIPPED: no CUDA device" in coloc.stdout
