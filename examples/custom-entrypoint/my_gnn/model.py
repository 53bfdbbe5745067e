"""A residual GATv2 + GraphSAGE network: not one of gnnsched's built-in shapes, and not a PyG model class either.

gnnsched calls ``build(dims)`` with the graph's dimensions and runs the step around the returned module: it calls
``model(x, edge_index)``, takes the cross-entropy of the per-node logits on the labelled nodes, and steps the
GNNJob's optimizer. Everything here depends only on the dimensions, never on tensor values, so gnnsched can trace it
on data-less tensors before the job runs (docs/custom-models.md).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch_geometric.nn import GATv2Conv, SAGEConv

HIDDEN = 64
HEADS = 4


class ResidualGNN(torch.nn.Module):
    """An input projection, one GATv2 attention layer and two mean-aggregating SAGE layers with residual
    connections and layer norm, then a linear classifier."""

    def __init__(self, features: int, classes: int, hidden: int = HIDDEN, heads: int = HEADS) -> None:
        super().__init__()
        self.project = torch.nn.Linear(features, hidden)
        self.attention = GATv2Conv(hidden, hidden // heads, heads=heads)
        self.sage = torch.nn.ModuleList([SAGEConv(hidden, hidden, aggr="mean") for _ in range(2)])
        self.norms = torch.nn.ModuleList([torch.nn.LayerNorm(hidden) for _ in range(3)])
        self.classify = torch.nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.project(x))
        h = self.norms[0](h + F.elu(self.attention(h, edge_index)))
        for conv, norm in zip(self.sage, self.norms[1:], strict=True):
            h = norm(h + F.relu(conv(h, edge_index)))
            h = F.dropout(h, p=0.2, training=self.training)
        return self.classify(h)


def build(dims: Any) -> torch.nn.Module:
    """The entrypoint: ``dims`` has ``num_nodes``, ``num_edges``, ``num_features`` and ``num_classes``."""
    return ResidualGNN(dims.num_features, dims.num_classes)
