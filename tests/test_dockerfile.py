"""The Dockerfile cannot be built here (no Docker engine); these checks catch what a build would reveal late."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEXT = (ROOT / "Dockerfile").read_text()


def test_multi_stage_non_root_gnnsched_entrypoint():
    stages = re.findall(r"^FROM\s+\S+(?:\s+AS\s+(\w+))?", TEXT, re.M)
    assert len(stages) >= 2 and "build" in stages
    final = TEXT.rsplit("\nFROM ", 1)[1]
    user = re.search(r"^USER\s+(\S+)", final, re.M)
    assert user and not user.group(1).startswith(("0", "root"))
    assert re.search(r'^ENTRYPOINT \["gnnsched"\]', final, re.M)


def test_torch_flavour_is_a_build_argument_and_installed_first():
    assert re.search(r"^ARG TORCH_FLAVOR=cpu$", TEXT, re.M)
    torch_at = TEXT.index('pip install "torch==')
    assert torch_at < TEXT.index("RUN pip install .")


def test_copied_sources_exist_and_cover_every_package_dir():
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # 3.10: the dev extra's tomli
        import tomli as tomllib

    copied = set(re.findall(r"^COPY (?!--from)(\S+)", TEXT, re.M))
    for source in copied:
        assert (ROOT / source).exists(), source
    package_dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values()
    assert {d.split("/")[0] for d in package_dirs} <= copied
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert not copied & set(ignored)
