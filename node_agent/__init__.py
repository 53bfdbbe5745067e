"""The node agent: the memory-safety gate, grouping policies at the node, MPS management and GPUNode status."""
