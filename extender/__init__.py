"""The kube-scheduler extender: filter, prioritize and bind GNN pods from predicted peak memory and GPU state."""
