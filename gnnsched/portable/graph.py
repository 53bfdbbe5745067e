"""The synthetic graph a job runs on when no dataset files are at hand: the built-in worker's and the portable step
runner's one generator (``gnnsched.models.synthetic_graph`` wraps it), so a job gets the same tensors in gnnsched's
image and in the user's own. Standard library and torch only (see the package's docstring).
"""

from __future__ import annotations

import torch


def synthetic_tensors(nodes: int, edges: int, features: int, classes: int,
                      seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x, edge_index, y, target)`` of a random graph with these shapes and no self-loops; works unchanged under
    ``FakeTensorMode``.

    Every node is labelled (``target`` is every node). Features are standard normal, labels uniform. Edges are uniform
    random pairs with ``dst = (src + offset) % nodes`` and ``offset`` in ``[1, nodes)``, so no self-loops appear and
    no boolean filtering is needed (``edges`` may therefore exceed the number of distinct pairs only by repeating
    pairs, which a multigraph allows)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(nodes, features, generator=generator)
    y = torch.randint(0, classes, (nodes,), generator=generator)
    edge_index = torch.empty(2, edges, dtype=torch.long)
    if nodes > 1:
        torch.randint(0, nodes, (edges,), generator=generator, out=edge_index[0])
        torch.randint(1, nodes, (edges,), generator=generator, out=edge_index[1])
        edge_index[1].add_(edge_index[0]).remainder_(nodes)
    else:
        edge_index.zero_()
    return x, edge_index, y, torch.arange(nodes)
