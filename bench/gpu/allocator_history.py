"""The real caching-allocator event sequence of chosen cases (torch.cuda.memory._record_memory_history), compact."""
import json
import sys

sys.path.insert(0, "bench")
import pmc_accuracy as pa  # noqa: E402
import torch  # noqa: E402

CASES = [
    pa.Case("gin", "train", 10, 16, None, {"nodes": 60_000, "edges": 600_000, "features": 100, "classes": 40}),
    pa.Case("sage", "infer", 6, 128, None, {"nodes": 40_000, "edges": 300_000, "features": 128, "classes": 3}),
    pa.Case("gcn", "infer", 6, 32, None, {"nodes": 60_000, "edges": 600_000, "features": 100, "classes": 40}),
    pa.Case("gcn", "infer", 2, 128, None, {"nodes": 2_449_029, "edges": 61_859_140, "features": 100, "classes": 47}),
    pa.Case("sage", "train", 2, 64, None, {"dataset": "cora"}, kind="real"),
]
out = {}
for case in CASES:
    from gnnsched.spec import parse_spec
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
    print(case.label(), res, alloc, len(evs), flush=True)
    torch.cuda.empty_cache()
with open(sys.argv[1], "w") as fh:
    json.dump(out, fh)
