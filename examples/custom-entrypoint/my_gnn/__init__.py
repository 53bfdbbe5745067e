"""A user's own GNN, packaged for gnnsched: ``spec.model.entrypoint: "my_gnn.model:build"``."""
