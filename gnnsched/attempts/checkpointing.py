"""``spec.checkpoint``: a job that saves its state while it runs, so its next attempt resumes instead of starting
from step 0 (after a neighbour's fault, a hardware Xid, a resize retry or a drain).

What is here is the contract's core, shared by the operator, the worker and the simulator:

* :class:`CheckpointSpec`, the job's field (``everySeconds``, ``claimName``);
* the environment a job's container gets (:data:`ENV_CHECKPOINT_DIR`, :data:`ENV_CHECKPOINT_EVERY_S`) and the
  mount path the operator puts the volume at;
* :func:`kept_fraction`, the share of an attempt's work that survives its end, which the simulator uses; the
  worker's own book-keeping (``gnnsched.portable.checkpoint``) reports the same quantities as measured
  ``resumed_from_step`` and ``lost_seconds``.

The saving itself (torch state dicts, write then rename) is ``gnnsched.portable.checkpoint``, which imports only the
standard library and torch so that a user's image can run it.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

ENV_CHECKPOINT_DIR = "GNNSCHED_CHECKPOINT_DIR"
"""The directory a job saves its checkpoint in and resumes from (a custom command reads it too)."""
ENV_CHECKPOINT_EVERY_S = "GNNSCHED_CHECKPOINT_EVERY_S"
"""Seconds between two saves (the job's ``everySeconds``, else the chart's ``checkpoint.everySeconds``)."""
MOUNT_PATH = "/var/run/gnnsched/checkpoint"
"""Where the job container mounts the checkpoint volume."""
VOLUME_NAME = "gnnsched-checkpoint"
MIN_EVERY_S = 1
MAX_EVERY_S = 86400
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


class CheckpointSpec(BaseModel):
    """``spec.checkpoint``: save every ``everySeconds`` (the chart's ``checkpoint.everySeconds`` when left out) and at a
    graceful drain (SIGTERM), into the PersistentVolumeClaim ``claimName`` (else one the operator creates for the
    job from the chart's ``checkpoint.storageClass``, owned by the job, so it is deleted with it)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True,
                              strict=True)

    every_seconds: int | None = Field(default=None, ge=MIN_EVERY_S, le=MAX_EVERY_S)
    claim_name: str | None = Field(default=None, min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)


def claim_for(job_name: str, spec: CheckpointSpec) -> str:
    """The PVC the job's pods mount: the user's ``claimName``, else ``<job>-checkpoint`` (the operator's)."""
    return spec.claim_name or f"{job_name}-checkpoint"


def kept_fraction(running_s: float, every_s: float, write_s: float) -> float:
    """The share of an attempt's steps that its last checkpoint holds when it ends after ``running_s`` seconds past
    its start-up, saving every ``every_s`` seconds at ``write_s`` seconds a save: the saves so far cover
    ``floor(running_s / (every_s + write_s)) * every_s`` seconds of steps out of the ``running_s - saves * write_s``
    it ran. 0 without checkpointing (``every_s`` 0)."""
    if every_s <= 0 or running_s <= 0:
        return 0.0
    saves = math.floor(running_s / (every_s + write_s))
    stepped = running_s - saves * write_s
    return min(1.0, saves * every_s / stepped) if stepped > 0 else 0.0


MIN_RUNTIME_SAMPLE_SHARE = 0.25
"""A resumed attempt that ran less than this share of its job's steps gives no runtime sample: its start-up and
checkpoint load weigh too much in so short a run to say how fast the job's steps go."""


def runtime_sample_share(ran_share: float | None) -> float | None:
    """What a completed attempt's runtime sample is scaled by: the share of the job's steps it ran (1 for an attempt
    that started from step 0), or None when it gives no sample (the share is unknown or below
    :data:`MIN_RUNTIME_SAMPLE_SHARE`).

    Why: the runtime calibration records observed ÷ predicted runtime, and the prediction is the whole job's. A
    checkpointing job's attempt that resumed at step k of N ran only the N - k steps left; compared with the whole
    prediction it reads as a job far faster than predicted, and the calibration would shorten every later prediction
    of its class (in a simulated run the ratio of a short tail even rounded to 0). The operator and the simulator
    both scale their sample by this share."""
    if ran_share is None or not math.isfinite(ran_share) or ran_share < MIN_RUNTIME_SAMPLE_SHARE:
        return None
    return min(1.0, ran_share)


def ran_share(resumed_from_step: int | None, steps: int | None) -> float | None:
    """The share of the job's steps an attempt ran, from its result line: ``(steps - resumed) / steps``; 1 for an
    attempt that did not resume; None when it resumed and its step count is unknown."""
    if not resumed_from_step:
        return 1.0
    if steps is None or steps <= 0 or resumed_from_step > steps:
        return None
    return (steps - resumed_from_step) / steps
