#!/usr/bin/env python3
"""The real caching-allocator event sequence of chosen cases (``torch.cuda.memory._record_memory_history``), compact.

Why: ``gnnsched.cuda_allocator`` replays an alloc/free sequence through a model of PyTorch's allocator; comparing the
sequence PyTorch really produced with the estimator's is how the estimator's gaps were found (docs/gpu-measurements.md
section 1). The histories are large, so they go to a file; stdout gets one line per case (label, peak reserved and
allocated bytes, number of events) as soon as it is measured, and the file is rewritten after every case so that a
run cut short keeps the cases it finished.

Usage (a GPU node, repository root or anywhere)::

    python bench/gpu/allocator_history.py OUT.json

Exit status: 0 measured, 2 usage error (no output path), 5 with a ``SKIP:`` line when there is no CUDA device.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[1]
SKIP_EXIT = 5  # bench/gpu/validate reads this status as SKIP, with the reason from the last "SKIP:" line


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parsed before torch is imported, so that a missing path is a usage error at once, not after the measurement."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", metavar="OUT.json", type=Path,
                        help="where the histories go (JSON: case label -> reserved, allocated, events)")
    args = parser.parse_args(argv)
    if not args.out.parent.is_dir():
        parser.error(f"the output folder {args.out.parent} does not exist")
    return args


def _pmc() -> Any:
    """``bench/pmc_accuracy.py`` (its cases and its CUDA measurement), importable from any working directory."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    import pmc_accuracy

    return pmc_accuracy


def cases() -> list[Any]:
    """The reference cases of docs/gpu-measurements.md section 1 (four synthetic graphs, one real)."""
    pa = _pmc()
    return [
        pa.Case("gin", "train", 10, 16, None, {"nodes": 60_000, "edges": 600_000, "features": 100, "classes": 40}),
        pa.Case("sage", "infer", 6, 128, None, {"nodes": 40_000, "edges": 300_000, "features": 128, "classes": 3}),
        pa.Case("gcn", "infer", 6, 32, None, {"nodes": 60_000, "edges": 600_000, "features": 100, "classes": 40}),
        pa.Case("gcn", "infer", 2, 128, None,
                {"nodes": 2_449_029, "edges": 61_859_140, "features": 100, "classes": 47}),
        pa.Case("sage", "train", 2, 64, None, {"dataset": "cora"}, kind="real"),
    ]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("SKIP: no CUDA device; nothing measured", flush=True)
        return SKIP_EXIT
    from gnnsched.spec import parse_spec

    pa = _pmc()
    out: dict[str, Any] = {}
    for case in cases():
        spec = parse_spec(case.spec_dict())
        torch.cuda.memory._record_memory_history(max_entries=2_000_000, context="alloc", stacks="python")
        try:
            res, alloc = pa.measure_cuda(spec, 3)
            snap = torch.cuda.memory._snapshot()
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
        evs = []
        for dev in snap["device_traces"]:
            for e in dev:
                frames = e.get("frames") or []
                where = next((f"{f['filename'].split('/')[-1]}:{f['line']}:{f['name']}" for f in frames
                              if "torch/" not in f["filename"] or "torch_geometric" in f["filename"]), None)
                evs.append([e["action"], e["addr"], e["size"], e.get("stream", 0), where])
        out[case.label()] = {"reserved": res, "allocated": alloc, "events": evs}
        args.out.write_text(json.dumps(out))
        print(case.label(), res, alloc, len(evs), flush=True)
        torch.cuda.empty_cache()
    print(f"written: {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
