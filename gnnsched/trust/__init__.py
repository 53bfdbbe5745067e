"""Trust: which tenants' workloads may share what (``gnnsched.trust.domain``)."""
