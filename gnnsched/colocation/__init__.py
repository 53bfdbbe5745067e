"""What co-location costs: the GNN-measured interference model (:mod:`.measured`) and what a running cluster learns
about it (:mod:`.learned`)."""
