"""Render the Helm chart into a folder of manifests, one file per template, with the Helm SDK the tests use.

Why: scanners such as checkov read rendered manifests, and this machine has no helm binary. The render is the one
the tests make (release ``gs`` in namespace ``gnnsched``, an install), for a given cluster version and values:

    python scripts/render_chart.py /tmp/rendered --kube-version 1.33.0 --values '{"networkPolicy": {"enabled": true}}'
    checkov -d /tmp/rendered --framework kubernetes --quiet
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import helm_python
from helm_python import _native

CHART = Path(__file__).resolve().parents[1] / "charts" / "gnnsched"


def render(values: dict[str, object] | None, kube_version: str) -> dict[str, str]:
    """The chart's files as Helm renders them (the SDK's wrapper does not take the cluster version: native call)."""
    chart = helm_python.Chart.load(str(CHART))
    try:
        opts = {"name": "gs", "namespace": "gnnsched", "is_install": True, "kube_version": kube_version}
        raw = _native.call_string("helm_render", chart._raw(), json.dumps(values) if values else None,
                                  json.dumps(opts))
        out: dict[str, str] = json.loads(raw)
        return out
    finally:
        chart.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder for the manifests (created)")
    parser.add_argument("--kube-version", default="1.33.0", help="the cluster's version (.Capabilities.KubeVersion)")
    parser.add_argument("--values", default="", help="chart values as a JSON object")
    args = parser.parse_args(argv)
    try:
        values = json.loads(args.values) if args.values else None
    except json.JSONDecodeError as exc:
        print(f"error: --values: not JSON ({exc.msg} at column {exc.colno})", file=sys.stderr)
        return 2
    if values is not None and not isinstance(values, dict):
        print("error: --values: must be a JSON object", file=sys.stderr)
        return 2
    try:
        files = render(values, args.kube_version)
    except Exception as exc:  # Helm's message (a failed template or schema check) is the useful part
        print(f"error: rendering the chart: {str(exc).strip().splitlines()[-1]}", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    written = 0
    for name, text in sorted(files.items()):
        if name.endswith(".yaml") and text.strip():
            (args.out / name.replace("/", "_")).write_text(text)
            written += 1
    print(f"{written} manifests in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
