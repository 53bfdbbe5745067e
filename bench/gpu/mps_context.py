"""Client context under MPS by active thread percentage: limit - free - reserved after SAGE training steps.

Usage (an MPS daemon running, repository root): CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25 python bench/gpu/mps_context.py"""
import json
import os

import torch

from gnnsched.models import build_model, make_graph
from gnnsched.portable.step import run_step
from gnnsched.spec import parse_spec
from gnnsched.worker import _StepInputs

LIMIT = 4096 * 2**20  # the limit the usage line sets
torch.zeros(1, device="cuda")
free0, _ = torch.cuda.mem_get_info()
ctx0 = LIMIT - free0 - torch.cuda.memory_reserved()
spec = parse_spec({"mode": "train", "model": {"arch": "sage", "layers": 2, "hidden": 64}, "graph": {"dataset": "cora"}})
g = make_graph(spec, 0)
m = build_model(spec, features=g.layout.features, classes=g.layout.classes, device="cuda")
st = _StepInputs(spec, g, "cuda", 0).stream()
for _ in range(3):
    run_step(m, next(st), "train")
torch.cuda.synchronize()
free1, _ = torch.cuda.mem_get_info()
print(json.dumps({"atp": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), "ctx_first_tensor_mib": ctx0 / 2**20,
                  "ctx_after_steps_mib": (LIMIT - free1 - torch.cuda.memory_reserved()) / 2**20,
                  "reserved_mib": torch.cuda.memory_reserved() / 2**20}), flush=True)
