"""Discrete-event simulation of a gnnsched cluster (``gnnsched simulate``).

Modules: ``cluster`` (shapes), ``workloads`` (file format and the papers' experiments), ``openb`` (trace replay and
FGD fragmentation), ``engine`` (event loop), ``adapters`` (the only calls into the estimator, predictor, interference
model, extender math and node-agent policies), ``costs`` (UVM and start-up), ``metrics``, ``report``, ``runner``.
"""
