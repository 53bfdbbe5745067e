"""The pure-torch neighbour sampler of mini-batch jobs: the worker's and the portable step runner's one sampler
(``gnnsched.models.NeighborSampler`` wraps it with the graph's layout), so a mini-batch job samples the same batches in
gnnsched's image and in the user's own. Standard library and torch only (see the package's docstring).

Batches of seed nodes are expanded hop by hop through incoming edges. The constructor allocates everything the sampler
keeps for the whole job (the incoming-edge CSR and a global-to-local id map) with static shapes only, so the estimator
can construct it on fake tensors and count it as resident memory; ``batches`` does the data-dependent sampling and
only runs for real.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch


def incoming_csr(edge_index: torch.Tensor, nodes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rowptr, sources)``: the sources of node v are ``sources[rowptr[v]:rowptr[v + 1]]``. Static-shape operations
    only (``scatter_add_`` instead of ``bincount``), so it builds under ``FakeTensorMode``."""
    src, dst = edge_index[0], edge_index[1]
    order = torch.argsort(dst, stable=True)
    sources = src[order]
    del order
    counts = torch.zeros(nodes + 1, dtype=torch.long)
    counts.scatter_add_(0, dst + 1, torch.ones_like(dst))
    rowptr = counts.cumsum_(0)
    return rowptr, sources


@dataclass
class SampledBatch:
    """One sampled, relabelled subgraph: its first ``labelled`` nodes are the seeds (``target``)."""

    x: torch.Tensor
    edge_index: torch.Tensor
    y: torch.Tensor
    target: torch.Tensor
    nodes: int
    edges: int
    labelled: int

    def to(self, device: str | torch.device) -> SampledBatch:
        return SampledBatch(self.x.to(device), self.edge_index.to(device), self.y.to(device), self.target.to(device),
                            self.nodes, self.edges, self.labelled)


class PortableSampler:
    """One pass over ``target`` in shuffled batches of ``batch_size`` seed nodes, each expanded by ``fanouts`` hops of
    incoming neighbours (all of them when a node has at most ``fanout``, otherwise ``fanout`` drawn uniformly with
    replacement and de-duplicated)."""

    def __init__(self, x: torch.Tensor, edge_index: torch.Tensor, y: torch.Tensor, target: torch.Tensor, nodes: int,
                 batch_size: int, fanouts: list[int]) -> None:
        self.x, self.edge_index, self.y, self.target = x, edge_index, y, target
        self.nodes = nodes
        self.batch_size = batch_size
        self.fanouts = list(fanouts)
        self.rowptr, self.sources = incoming_csr(edge_index, nodes)
        self.position = torch.full((nodes,), -1, dtype=torch.long)  # global id -> batch-local id

    def batches(self, seed: int = 0) -> Iterator[SampledBatch]:
        generator = torch.Generator().manual_seed(seed)
        order = self.target[torch.randperm(self.target.numel(), generator=generator)]
        for start in range(0, order.numel(), self.batch_size):
            seeds = order[start : start + self.batch_size]
            yield self._expand(seeds, generator)
            del seeds

    def _expand(self, seeds: torch.Tensor, generator: torch.Generator) -> SampledBatch:
        rowptr, csr_sources, position = self.rowptr, self.sources, self.position
        nodes = [seeds]
        position[seeds] = torch.arange(seeds.numel())
        count = seeds.numel()
        frontier = seeds
        sources: list[torch.Tensor] = []
        targets: list[torch.Tensor] = []
        try:
            for fanout in self.fanouts:
                first = rowptr[frontier]
                degree = rowptr[frontier + 1] - first
                take = degree.clamp(max=fanout)
                owner = torch.repeat_interleave(torch.arange(frontier.numel()), take)
                offset_in_group = torch.arange(owner.numel()) - torch.repeat_interleave(take.cumsum(0) - take, take)
                deg_e = degree[owner]
                drawn = (torch.rand(owner.numel(), generator=generator) * deg_e).long()
                offset = torch.where(deg_e <= fanout, offset_in_group, drawn)
                src = csr_sources[first[owner] + offset]
                dst = frontier[owner]
                n = self.nodes
                if n < 3_000_000_000:  # n * n fits in int64: a 1-D key sorts much faster than unique(dim=1)
                    keys = torch.unique(src * n + dst)
                    src, dst = keys // n, keys % n
                else:
                    pairs = torch.unique(torch.stack([src, dst]), dim=1)
                    src, dst = pairs[0], pairs[1]
                new = torch.unique(src[position[src] < 0])
                position[new] = torch.arange(count, count + new.numel())
                count += new.numel()
                nodes.append(new)
                sources.append(src)
                targets.append(dst)
                frontier = new
            all_nodes = torch.cat(nodes)
            edge_index = torch.stack([position[torch.cat(sources)], position[torch.cat(targets)]])
        finally:
            for part in nodes:
                position[part] = -1
        return SampledBatch(x=self.x[all_nodes], edge_index=edge_index, y=self.y[all_nodes],
                            target=torch.arange(seeds.numel()), nodes=all_nodes.numel(), edges=edge_index.size(1),
                            labelled=seeds.numel())
