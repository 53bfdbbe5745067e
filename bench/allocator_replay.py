#!/usr/bin/env python3
"""What the CUDA caching-allocator model adds to an estimate: the replay's CPU time on the heaviest traces.

For each architecture's training step at 10 and 16 layers, hidden 256, on a 100-million-edge graph (the estimator's
latency benchmark's models), prints the number of allocation/free events replayed, the replay's CPU time (median of
5), and the predicted reserved / traced peak. The replay is pure Python over the trace's events, so its cost grows
with the number of events, not with the graph.

Usage::

    python bench/allocator_replay.py
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any


def main() -> int:
    import torch

    torch.set_num_threads(1)
    from gnnsched.cuda_allocator import replay
    from gnnsched.estimator import cuda_allocation_events, trace_step
    from gnnsched.gpu.catalogue import get_gpu_model
    from gnnsched.spec import parse_spec

    workspace = get_gpu_model("A100-80GB").cublas_workspace_bytes
    for arch in ("gcn", "sage", "gin", "gat"):
        for layers in (10, 16):
            model: dict[str, Any] = {"arch": arch, "layers": layers, "hidden": 256}
            if arch == "gat":
                model["heads"] = 4
            spec = parse_spec({"mode": "train", "model": model,
                               "graph": {"nodes": 10_000_000, "edges": 100_000_000, "features": 128, "classes": 40}})
            trace, _, peak = trace_step(spec, device="cuda")
            events = cuda_allocation_events(trace, 1, workspace)
            times = []
            for _ in range(5):
                t0 = time.process_time()
                result = replay(events)
                times.append((time.process_time() - t0) * 1000)
            print(f"{arch:4} train L={layers:<2} h=256 100M edges: {len(events):5} events, replay "
                  f"{statistics.median(times):6.2f} ms cpu (median of 5), reserved/peak "
                  f"{result.reserved_bytes / peak:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
