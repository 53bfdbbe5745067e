"""The wheel, built from exactly what the Dockerfile copies and installed outside the checkout, holds every package and
starts every subcommand.

Why: an editable install (the README's) imports from the checkout and hides a package missing from the wheel; a
hand-kept package list once left out ``gnnsched.simulator``, so ``pip install .`` (the image's install) gave a CLI that
crashed on every command. Here the wheel is built from a copy of the sources only, installed into a fresh virtual
environment in a temporary folder, and run from there. Dependencies come from this environment's site-packages
through a ``.pth`` line (a plain path: the editable install's finder in that folder is not loaded), so the test needs
no index and takes seconds.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path
from typing import Any

import pytest
import typer

if sys.version_info >= (3, 11):
    import tomllib
else:  # 3.10: the dev extra's tomli
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIR: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
SKIP = {"__pycache__"}
#: The files the Dockerfile's build stage copies before ``pip install .`` (``COPY a b ./`` or ``COPY dir ./dir``).
DOCKERFILE_SOURCES = [s for line in re.findall(r"^COPY (?!--)(.+)$", (ROOT / "Dockerfile").read_text(), re.M)
                      for s in line.split()[:-1]]


def test_the_package_list_is_the_tree() -> None:
    """pyproject's explicit list names every folder with an ``__init__.py`` under the package-dir roots."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    assert listed == tree_packages(), (sorted(tree_packages() - listed), sorted(listed - tree_packages()))


def tree_packages() -> set[str]:
    """Every folder with an ``__init__.py`` under each mapped root, named as it imports."""
    found = set()
    for name, folder in PACKAGE_DIR.items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base)
            if SKIP & set(rel.parts):
                continue
            found.add(".".join((name, *rel.parts)) if rel.parts else name)
    return found


def wheel_packages(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as zf:
        return {str(Path(n).parent).replace("/", ".") for n in zf.namelist() if n.endswith("/__init__.py")}


def command_paths(command: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command and subcommand of the CLI as argument tuples (``()`` is ``gnnsched`` itself); groups are
    recognised by their ``commands`` (typer may bring its own click)."""
    out = [prefix]
    if isinstance(getattr(command, "commands", None), dict):
        for name, sub in sorted(command.commands.items()):
            out += command_paths(sub, (*prefix, name))
    return out


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv outside the checkout with only the built wheel installed into it; returns its bin folder."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for source in DOCKERFILE_SOURCES:  # exactly what the image's build stage has when it runs `pip install .`
        if (ROOT / source).is_dir():
            shutil.copytree(ROOT / source, src / source, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(ROOT / source, src / source)
    dist = tmp / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist),
                    str(src)], check=True, cwd=tmp, timeout=300)
    (wheel,) = dist.glob("gnnsched-*.whl")
    missing = tree_packages() - wheel_packages(wheel)
    assert not missing, f"packages in the tree but not in the wheel: {sorted(missing)}"

    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    (Path(purelib) / "deps-from-test-env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q",
                    str(wheel)], check=True, cwd=tmp, timeout=300)
    return venv / "bin"


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(args, check=False, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_the_wheel_imports_from_its_install_not_the_checkout(installed: Path) -> None:
    code = ("import importlib, gnnsched; names = sorted(" + repr(sorted(tree_packages())) + ");"
            "mods = [importlib.import_module(n) for n in names];"
            "print('\\n'.join(m.__file__ for m in [gnnsched, *mods]))")
    p = _run([str(installed / "python"), "-c", code], cwd=installed)
    assert p.returncode == 0, p.stderr
    files = p.stdout.split()
    assert files and all(str(installed.parent) in f for f in files), files
    assert not [f for f in files if str(ROOT) in f]


def test_every_subcommand_starts_from_the_installed_wheel(installed: Path) -> None:
    from gnnsched.cli import app

    paths = command_paths(typer.main.get_command(app))
    assert len(paths) >= 10  # gnnsched itself and every component's command
    for args in paths:
        p = _run([str(installed / "gnnsched"), *args, "--help"], cwd=installed)
        assert p.returncode == 0, (args, p.stderr[-2000:])
        assert "Usage" in p.stdout, (args, p.stdout[:500])


def test_the_image_script_starts_every_subcommand() -> None:
    """scripts/build-image starts each subcommand in the built image as UID 65532; its list must be the CLI's."""
    from gnnsched.cli import app

    script = (ROOT / "scripts" / "build-image").read_text()
    match = re.search(r'for cmd in ((?:"[^"]*"\s*|[\w-]+\s*|\\\n\s*)+); do', script)
    assert match, "the subcommand loop of scripts/build-image"
    listed = {tuple(m.group(1).split()) if m.group(1) is not None else (m.group(2),)
              for m in re.finditer(r'"([^"]*)"|([\w-]+)', match.group(1))}
    assert listed == set(command_paths(typer.main.get_command(app)))
    assert subprocess.run(["bash", "-n", str(ROOT / "scripts" / "build-image")], check=False).returncode == 0
