"""What NVML counts for one process beyond PyTorch's reserved bytes: the CUDA context and library state, by stage."""
import json
import os
import sys

import pynvml

pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
pid = os.getpid()


def used() -> int | None:
    for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
        if p.pid == pid:
            return int(p.usedGpuMemory) if p.usedGpuMemory is not None else None
    return None


def dev_used() -> int:
    return int(pynvml.nvmlDeviceGetMemoryInfo(h).used)


rows: list[dict[str, object]] = []
base_dev = dev_used()
import torch  # noqa: E402


def stage(name: str) -> None:
    torch.cuda.synchronize()
    u = used()
    r = int(torch.cuda.memory_reserved())
    rows.append({"stage": name, "nvml_process_used": u, "torch_reserved": r,
                 "nvml_minus_reserved": None if u is None else u - r,
                 "device_used_delta": dev_used() - base_dev, "max_reserved": int(torch.cuda.max_memory_reserved())})
    print(json.dumps(rows[-1]), flush=True)

torch.zeros(1, device="cuda")
stage("after first tensor (context)")
a = torch.randn(512, 512, device="cuda")
(a @ a).sum().item()
stage("after fp32 matmul (cuBLAS handle + workspace)")
idx = torch.randint(0, 1000, (2, 10000), device="cuda")
v = torch.ones(10000, device="cuda")
s = torch.sparse_coo_tensor(idx, v, (1000, 1000)).coalesce()
torch.sparse.mm(s, torch.randn(1000, 64, device="cuda")).sum().item()
stage("after sparse mm (cuSPARSE)")
sys.path.insert(0, "bench")
from gnnsched.models import build_model, make_graph  # noqa: E402
from gnnsched.portable.step import run_step  # noqa: E402
from gnnsched.spec import parse_spec  # noqa: E402
from gnnsched.worker import _StepInputs  # noqa: E402

for arch in ("gcn", "sage", "gin", "gat"):
    model = {"arch": arch, "layers": 2, "hidden": 64}
    if arch == "gat":
        model["heads"] = 4
    spec = parse_spec({"mode": "train", "model": model, "graph": {"dataset": "cora"}})
    g = make_graph(spec, 0)
    m = build_model(spec, features=g.layout.features, classes=g.layout.classes, device="cuda")
    inp = _StepInputs(spec, g, "cuda", 0)
    st = inp.stream()
    for _ in range(3):
        run_step(m, next(st), "train")
    stage(f"after {arch} train steps on cora")
    del m, inp, st, g
torch.cuda.empty_cache()
stage("after empty_cache")
with open(sys.argv[1], "w") as fh:
    json.dump(rows, fh, indent=1)
