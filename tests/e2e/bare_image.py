"""A user's image without gnnsched, for the local cluster: a Python that has torch and PyG and cannot import gnnsched.

Why: the kubelet stand-in has no container runtime, so every container runs a local Python. The harness' Python has
gnnsched (an editable install, and the checkout on ``PYTHONPATH``), which would hide a GPU pod that still needs
gnnsched in the user's image. A user's image (``examples/custom-entrypoint/Dockerfile``: a PyTorch base image, PyG,
the user's package) has torch and PyG and no gnnsched; so does this:

* a throwaway virtual environment of the same base interpreter, without pip and without the system's site-packages;
* one ``.pth`` line naming the directory where this environment's torch and torch_geometric are installed. Python adds
  that directory to ``sys.path`` but, unlike a site directory, runs none of the ``.pth`` files in it, so gnnsched's
  editable-install hook there never runs: ``import gnnsched`` fails, ``import torch, torch_geometric`` works.

The kubelet stand-in runs a container of such an image with this environment's ``bin`` alone before ``/usr/bin:/bin``
on ``PATH`` (so ``python`` is this one and there is no ``gnnsched`` command) and only the image's own directories on
``PYTHONPATH``. ``make_bare_python`` checks both promises before the cluster uses it.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path


class BareImageError(RuntimeError):
    """The bare Python could not be made, or imports gnnsched after all."""


def _site_dir(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise BareImageError(f"{package} is not installed in this environment: the bare image needs it")
    return Path(list(spec.submodule_search_locations)[0]).resolve().parent


def make_bare_python(directory: Path) -> Path:
    """Create the bare environment under ``directory``; returns its ``bin`` directory."""
    base = getattr(sys, "_base_executable", sys.executable)
    made = subprocess.run([base, "-m", "venv", "--without-pip", str(directory)], capture_output=True, text=True,
                          timeout=120)
    if made.returncode != 0:
        raise BareImageError(f"python -m venv {directory}: {made.stderr.strip()[-500:]}")
    python = directory / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"], capture_output=True,
                          text=True, timeout=60)
    if site.returncode != 0:
        raise BareImageError(f"{python}: cannot find its site-packages: {site.stderr.strip()[-500:]}")
    dirs = sorted({str(_site_dir("torch")), str(_site_dir("torch_geometric"))})
    (Path(site.stdout.strip()) / "image-torch.pth").write_text("".join(f"{d}\n" for d in dirs))
    check = subprocess.run(
        [str(python), "-c", "import importlib.util, torch, torch_geometric; "
                            "print(importlib.util.find_spec('gnnsched') is None)"],
        capture_output=True, text=True, timeout=300, env={"PATH": f"{directory / 'bin'}:/usr/bin:/bin"},
        cwd=str(directory))  # not the checkout: ``-c`` puts the working directory first on sys.path
    if check.returncode != 0 or check.stdout.strip() != "True":
        raise BareImageError(f"{python}: expected torch and PyG without gnnsched: {check.stdout}{check.stderr}"[-800:])
    return directory / "bin"


def bare_env(env: dict[str, str], bare_bin: Path, image_dirs: list[str]) -> dict[str, str]:
    """A container's environment in the bare image: the harness' Python, gnnsched and its commands gone."""
    out = {k: v for k, v in env.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    out["PATH"] = f"{bare_bin}:/usr/bin:/bin"
    if image_dirs:
        out["PYTHONPATH"] = ":".join(image_dirs)
    return out
