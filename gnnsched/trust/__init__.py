"""Trust: what a tenant can and cannot move. Which tenants' workloads may share a GPU (``domain``), facts about a job
that a tenant cannot write (``job_facts``: the GNNJob's status subresource, the node agent's own measurements), and
calibration one namespace cannot move for another (``tenant_calibration``)."""
