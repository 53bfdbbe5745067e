"""gnnsched: memory-safe GPU sharing for GNN jobs on Kubernetes.

The core package holds what every component shares (job spec types, contracts, catalogues, the estimator, the
predictor, the grouping policies and the simulator); the components import the core and never each other.
"""

__version__ = "0.1.0"
