"""A user's own training script, run by a GNNJob's ``spec.command`` in a user's image that has torch and PyG only.

It refuses to run where gnnsched is importable or on ``PATH``: the local cluster's e2e test uses it to show that the
GPU pod needs nothing of gnnsched in the image (the gate comes from gnnsched's init container). It trains a small GCN
on a random graph on the device the gate admitted (the CPU in the local cluster, whose GPUs are fake).
"""

import importlib.util
import os
import shutil
import sys

import torch
import torch.nn.functional as F
from torch_geometric.nn import GCNConv


def main() -> int:
    if importlib.util.find_spec("gnnsched") is not None or shutil.which("gnnsched") is not None:
        print("user_train: gnnsched is in this image; the test image must not have it", file=sys.stderr)
        return 3
    if not os.environ.get("CUDA_VISIBLE_DEVICES"):
        print("user_train: no admitted GPU in CUDA_VISIBLE_DEVICES (did the gate run?)", file=sys.stderr)
        return 4
    torch.manual_seed(0)
    nodes, features, classes = 300, 8, 3
    x = torch.randn(nodes, features)
    edge_index = torch.randint(0, nodes, (2, 1200))
    y = torch.randint(0, classes, (nodes,))
    conv1, conv2 = GCNConv(features, 16), GCNConv(16, classes)
    opt = torch.optim.Adam([*conv1.parameters(), *conv2.parameters()], lr=0.01)
    for epoch in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3):
        opt.zero_grad()
        loss = F.cross_entropy(conv2(conv1(x, edge_index).relu(), edge_index), y)
        loss.backward()
        opt.step()
        print(f"epoch {epoch} loss {loss.item():.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
