"""A job's attempts: what happens to a failed attempt (``failure_policy``, modelled on the Kubernetes Job's
``podFailurePolicy``) and what an attempt keeps of the work before it (``checkpointing``: the job's checkpoint
contract, and the lost-work arithmetic the operator and the simulator share)."""
