"""Package discovery for the package-dir mapping in pyproject.toml (everything else is declared there).

setuptools' ``packages.find`` searches one tree for one namespace; this project maps five top-level folders into the
``gnnsched`` namespace (``operator/`` imports as ``gnnsched.operator``). So the packages are found here, under each
mapped root, and named by their mapped prefix: adding a folder with an ``__init__.py`` adds it to the wheel.
"""

from __future__ import annotations

import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # the build requirement in pyproject.toml pulls tomli for Python 3.10
    import tomli as tomllib

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent


def discover_packages() -> list[str]:
    """Every importable package under each ``package-dir`` root, under the name it is mapped to."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mapping: dict[str, str] = config["tool"]["setuptools"]["package-dir"]
    found: set[str] = set()
    for name, folder in mapping.items():
        found.add(name)
        found.update(f"{name}.{sub}" for sub in find_packages(where=str(ROOT / folder)))
    # a mapped component folder sits beside gnnsched/, never inside it, so no package is found twice under two names
    return sorted(found)


setup(packages=discover_packages())
