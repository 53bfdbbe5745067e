"""The package layout: components import as gnnsched.<component>, and nothing shadows the standard library."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMPONENTS = ("operator", "extender", "device_plugin", "node_agent")


def test_plain_operator_is_the_standard_library_even_from_the_checkout():
    # -S: no site packages, so nothing imports the stdlib operator before the checkout's directory is searched.
    out = subprocess.run(
        [
            sys.executable,
            "-S",
            "-c",
            "import operator, collections; print(operator.__file__); print(operator.eq(1, 1))",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    path, eq = out.stdout.split()
    assert Path(path).name == "operator.py" and Path(path).parent != ROOT / "operator" and eq == "True"


def test_components_import_under_the_gnnsched_namespace():
    import importlib

    for directory in COMPONENTS:
        module = importlib.import_module(f"gnnsched.{directory}")
        assert Path(module.__file__).parent == ROOT / directory


def test_components_do_not_import_each_other_and_the_core_imports_none():
    for component in COMPONENTS:
        for source in (ROOT / component).rglob("*.py"):
            text = source.read_text()
            for other in set(COMPONENTS) - {component}:
                assert f"gnnsched.{other}" not in text, f"{source} imports gnnsched.{other}"
    for source in (ROOT / "gnnsched").rglob("*.py"):
        if source == ROOT / "gnnsched" / "cli.py":
            continue  # the CLI is the composition root: it loads each component when its command runs
        text = source.read_text()
        for other in COMPONENTS:
            assert f"from gnnsched.{other}" not in text and f"import gnnsched.{other}" not in text, (
                f"core module {source} depends on component {other}"
            )
