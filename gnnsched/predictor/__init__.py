"""Runtime prediction for adaptive resource scaling (seed 004), trained on real traces and the cluster's history.

* ``requests_model``: XGBoost of log-runtime from the requests a pod declares (openb), monotone in every resource.
* ``evaluate``: the random-forest and per-class-median baselines and the time-ordered evaluation.
* ``gnn``: GNNJob runtime = analytic prior (``gnnsched.runtime_prior``) × an XGBoost residual correction learnt from
  the cluster's own finished GNNJobs (``history``).
* ``trees``: the boosted trees evaluated in plain Python, so predicting needs no xgboost import.

Nothing here imports xgboost or scikit-learn at module level; only training and evaluation do.
"""
