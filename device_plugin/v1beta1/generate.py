"""Regenerate ``api_pb2.py`` and ``api_pb2_grpc.py`` from ``api.proto`` (needs ``grpcio-tools``, the dev extra).

Why the generated files are committed and both grpc packages are pinned to one version in pyproject.toml:
``api_pb2_grpc.py`` refuses to import under a grpcio older than the grpcio-tools that wrote it, and
``api_pb2.py`` refuses a protobuf runtime older than the protoc inside grpcio-tools. Generating at import time
would drag grpcio-tools (and its bundled protoc) into every node image; generating at build time would make
editable installs depend on a build hook. A pin plus committed output keeps runtime dependencies small, and
``tests/test_device_plugin_proto.py`` fails when the committed files no longer match what the pinned
grpcio-tools produces from ``api.proto``.

The proto is compiled from a scratch tree ``gnnsched/device_plugin/v1beta1/api.proto`` so the generated
``api_pb2_grpc.py`` imports ``gnnsched.device_plugin.v1beta1.api_pb2`` (a package import) rather than a
top-level ``api_pb2``.

Usage: ``python -m gnnsched.device_plugin.v1beta1.generate [--check]``
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACKAGE_PATH = Path("gnnsched/device_plugin/v1beta1")
OUTPUTS = ("api_pb2.py", "api_pb2_grpc.py")


def generate() -> dict[str, str]:
    """Compile ``api.proto`` and return ``{file name: text}`` for the generated modules."""
    from grpc_tools import protoc  # noqa: PLC0415 - dev-only dependency

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / PACKAGE_PATH).mkdir(parents=True)
        shutil.copy(HERE / "api.proto", root / PACKAGE_PATH / "api.proto")
        out = root / "out"
        out.mkdir()
        rc = protoc.main(
            ["protoc", f"-I{root}", f"--python_out={out}", f"--grpc_python_out={out}", str(PACKAGE_PATH / "api.proto")]
        )
        if rc != 0:
            raise RuntimeError(f"protoc failed with exit status {rc}")
        return {name: (out / PACKAGE_PATH / name).read_text() for name in OUTPUTS}


def main(argv: list[str]) -> int:
    files = generate()
    if "--check" in argv:
        stale = [n for n, text in files.items() if (HERE / n).read_text() != text]
        if stale:
            print(f"stale generated files: {', '.join(stale)}; run python -m gnnsched.device_plugin.v1beta1.generate",
                  file=sys.stderr)
            return 1
        return 0
    for name, text in files.items():
        (HERE / name).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
