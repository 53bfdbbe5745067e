#!/usr/bin/env python3
"""Run mypy over gnnsched as it is installed, not as it is laid out.

The repository keeps the four components at the top level (``operator/``, ``extender/``, ``device_plugin/``,
``node_agent/``) and setuptools maps them to ``gnnsched.<component>`` (``package-dir`` in pyproject.toml). mypy knows
nothing of that mapping, and it cannot see through setuptools' editable-install import hook either, so run against
the checkout it would check the components as four unrelated top-level packages (one of them shadowing the stdlib's
``operator``). This script builds the installed layout out of symlinks in a temporary directory, runs mypy there with
the project's configuration, and rewrites the reported paths back to the checkout's, so findings point at files you
can open.

Usage: ``scripts/mypy_tree.py`` checks the package strictly (pyproject's [tool.mypy]); ``scripts/mypy_tree.py --loose
PATH...`` checks tests, benchmarks and scripts with untyped defs allowed, against the same package tree.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # the project supports 3.10, which has no tomllib (the dev extra installs tomli there)
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]

# Tests poke at internals with dicts from JSON and hand-written doubles; they are checked for what mypy can prove
# without annotations (calls, attribute names, imports), not held to the package's strictness.
LOOSE_FLAGS = [
    "--allow-untyped-defs",
    "--allow-incomplete-defs",
    "--no-strict-optional",
    "--disable-error-code=union-attr",
    "--disable-error-code=index",
    "--follow-imports=silent",
    # an ignore a test needs under the strict flags may be unused under these; not a finding here
    "--no-warn-unused-ignores",
]


def package_dirs() -> dict[str, Path]:
    """``gnnsched.*`` package name -> its directory in the checkout, from pyproject's package-dir mapping."""
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mapping = cfg["tool"]["setuptools"].get("package-dir", {})
    return {name: ROOT / path for name, path in mapping.items() if name.startswith("gnnsched")}


def build_tree(dest: Path) -> dict[str, str]:
    """Lay out ``dest/gnnsched`` as the installed package (symlinks into the checkout); returns the path rewrites
    (tree prefix -> checkout prefix), longest first so a component's prefix wins over the package's."""
    dirs = package_dirs()
    top = dest / "gnnsched"
    top.mkdir()
    rewrites: dict[str, str] = {}
    for entry in dirs["gnnsched"].iterdir():
        if entry.name == "__pycache__":
            continue
        (top / entry.name).symlink_to(entry)
    rewrites[str(top) + os.sep] = str(dirs["gnnsched"].relative_to(ROOT)) + os.sep
    for name, path in dirs.items():
        if name == "gnnsched":
            continue
        link = dest / Path(*name.split("."))
        if link.is_symlink() or link.exists():
            link.unlink() if link.is_symlink() else None
        link.symlink_to(path)
        rewrites[str(link) + os.sep] = str(path.relative_to(ROOT)) + os.sep
    return dict(sorted(rewrites.items(), key=lambda kv: -len(kv[0])))


def main(argv: list[str]) -> int:
    loose = bool(argv) and argv[0] == "--loose"
    paths = argv[1:] if loose else []
    with tempfile.TemporaryDirectory(prefix="gnnsched-mypy-") as tmp:
        tree = Path(tmp)
        rewrites = build_tree(tree)
        cmd = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml")]
        env = dict(os.environ)
        if loose:
            # the package from the tree, the tests' own helpers (kube_emulator, shared_data, ...) from tests/
            # (and bench/'s scripts import each other as plain modules, as run from bench/)
            env["MYPYPATH"] = os.pathsep.join(
                [str(tree), str(ROOT / "tests"), str(ROOT / "tests" / "e2e"), str(ROOT / "bench")]
            )
            cmd += [*LOOSE_FLAGS, "--explicit-package-bases", *paths]
            cwd = ROOT
        else:
            cmd += ["-p", "gnnsched"]
            cwd = tree
        proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
        out = proc.stdout + proc.stderr
        for prefix, repl in rewrites.items():
            out = out.replace(prefix, repl)
        # mypy names tree files relative to its cwd: gnnsched/operator/x.py -> operator/x.py
        for name, path in package_dirs().items():
            if name != "gnnsched":
                out = out.replace(name.replace(".", "/") + "/", str(path.relative_to(ROOT)) + "/")
        sys.stdout.write(out)
        return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
