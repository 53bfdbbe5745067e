"""The benchmarks under ``bench/`` as modules, for tests that reuse their cases and parsers.

``bench/`` is not a package (its scripts run by path), so a test loads a script by its path, once per process, under
the script's own name in ``sys.modules``: its dataclasses resolve their module there, and every test of a worker
shares the one copy."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parent.parent / "bench"


def load(name: str) -> ModuleType:
    """``bench/<name>.py`` as the module ``name``."""
    module = sys.modules.get(name)
    if module is not None:
        return module
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
