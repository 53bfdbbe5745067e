"""Shortest-predicted-runtime-first ordering of the cluster's pending pods, with stock Kubernetes objects only.

Why: when the cluster is short of CPU or memory rather than GPUs (the resource-demand paper's 4 x 96-core cluster),
the order in which kube-scheduler tries pending pods decides how many finish. The paper's SRTF tries the shortest
predicted job first. kube-scheduler's default QueueSort plugin (PrioritySort) already orders its active queue by pod
priority (higher first) and then by the time the pod entered the queue, so mapping a job's predicted runtime to a
PriorityClass gives shortest-predicted-first with no scheduler plugin and no change to the extender.

Why buckets and not one class per second: a PriorityClass is a cluster object that must exist before a pod names it
(the Priority admission plugin rejects a pod whose class is missing, and a pod may not set ``spec.priority`` itself),
so the set is fixed and small. Buckets are log-spaced, ``per_doubling`` of them per doubling of the runtime (default
2: a factor sqrt(2) ~ 1.41 per bucket), from 1 minute to 2**16 minutes (~45 days). Predictions within one bucket keep
arrival (FIFO) order, which also bounds how far a predictor's error can reorder jobs: finer buckets are only worth it
when predictions are better than the bucket width. Shorter runtime -> higher value.

Why ``preemptionPolicy: Never``: the classes only order the queue; a short job must never evict a running one (its
work would be lost). Why the band starts at ``QUEUE_PRIORITY_BASE`` = 1000 > 0: pods without a class have priority
0, and a class below 0 would let any such pod preempt gnnsched's jobs. The band is configurable (``base``); its top
is ``base + buckets - 1`` and must stay at or below 1,000,000,000 (higher values are reserved for system classes).

Why one retry class above the band (``<prefix>retry``, value ``base + buckets``): an attempt that exists because
gnnsched misjudged the job (a memory-exceeded attempt resized) or because a neighbour's fault killed it (a requeued
victim) has already waited its turn once; as a new pod it would enter kube-scheduler's queue behind every pod created
since. In the retry class it goes ahead of every pod that has not run yet (FIFO among retries), which is what keeps a
misestimate from costing the job its place (measured in docs/simulator.md, issue 15's figures). A user's failure
(an attempt charged to ``backoffLimit``) keeps its job's usual class.

The simulator's ``+sjf`` policies and the operator both use :class:`QueueOrder`, and the chart renders the same
classes (its test compares them with :meth:`QueueOrder.classes`), so all three agree.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from gnnsched.contract import QUEUE_CLASS_PREFIX, QUEUE_PRIORITY_BASE
from gnnsched.errors import FieldError

MIN_SECONDS = 60.0
"""Upper bound of the first bucket: everything predicted at or below one minute ties (start-up dominates there)."""
DOUBLINGS = 16
"""The buckets reach ``MIN_SECONDS * 2**DOUBLINGS`` (~45.5 days); everything longer shares the last bucket."""
DEFAULT_PER_DOUBLING = 2
MAX_PER_DOUBLING = 8
MAX_USER_PRIORITY = 1_000_000_000
"""Largest value a non-system PriorityClass may have."""
MIN_PRIORITY = -2_147_483_648
RETRY_SUFFIX = "retry"
_NAME_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?-?$")
_MAX_PREFIX = 60


class QueueOrderError(FieldError):
    """A bad runtime, base, prefix or resolution for the queue classes."""


@dataclass(frozen=True)
class QueueClass:
    """One PriorityClass: its name, value and the predicted-runtime range (seconds) it stands for."""

    bucket: int
    name: str
    value: int
    lower_seconds: float  # exclusive; 0 for the first bucket
    upper_seconds: float | None  # inclusive; None for the open-ended last bucket

    @property
    def description(self) -> str:
        if self.bucket == 0:
            span = f"predicted runtime up to {_human(self.upper_seconds or 0.0)}"
        elif self.upper_seconds is None:
            span = f"predicted runtime above {_human(self.lower_seconds)}"
        else:
            span = f"predicted runtime above {_human(self.lower_seconds)}, up to {_human(self.upper_seconds)}"
        return f"gnnsched shortest-predicted-first queue order: {span}; never preempts"


@dataclass(frozen=True)
class QueueOrder:
    """The class set: value band ``[base, base + buckets - 1]``, names ``<prefix><bucket, 3 digits>``."""

    base: int = QUEUE_PRIORITY_BASE
    prefix: str = QUEUE_CLASS_PREFIX
    per_doubling: int = DEFAULT_PER_DOUBLING

    def __post_init__(self) -> None:
        if isinstance(self.per_doubling, bool) or not isinstance(self.per_doubling, int) \
                or not 1 <= self.per_doubling <= MAX_PER_DOUBLING:
            raise QueueOrderError("queuePriority.perDoubling",
                                  f"must be an integer 1..{MAX_PER_DOUBLING}, got {self.per_doubling!r}")
        if isinstance(self.base, bool) or not isinstance(self.base, int):
            raise QueueOrderError("queuePriority.base", f"must be an integer, got {self.base!r}")
        top = self.retry_value  # the retry class sits just above the band
        if self.base < MIN_PRIORITY or top > MAX_USER_PRIORITY:
            raise QueueOrderError("queuePriority.base", f"{self.base} puts the band [{self.base}, {top}] outside "
                                  f"[{MIN_PRIORITY}, {MAX_USER_PRIORITY}] (higher values are reserved for system "
                                  "classes)")
        p = self.prefix
        if not isinstance(p, str) or not p or len(p) > _MAX_PREFIX or not _NAME_PREFIX.match(p):
            raise QueueOrderError("queuePriority.prefix", f"{p!r} must be lower-case letters, digits and '-', start "
                                  f"with a letter or digit, at most {_MAX_PREFIX} characters")
        if p.startswith("system-"):
            raise QueueOrderError("queuePriority.prefix", f"{p!r}: names starting with 'system-' are reserved")

    @property
    def buckets(self) -> int:
        return DOUBLINGS * self.per_doubling + 1

    @property
    def retry_name(self) -> str:
        """The class of an attempt created by a resize or a fault victim's requeue."""
        return f"{self.prefix}{RETRY_SUFFIX}"

    @property
    def retry_value(self) -> int:
        """Just above the shortest bucket: a retry goes ahead of every first attempt."""
        return self.base + self.buckets

    @property
    def retry_description(self) -> str:
        return ("gnnsched retry queue order: an attempt resized after running out of its GPU memory reservation, or "
                "requeued as the victim of a co-located fault, goes ahead of pods that have not run; never preempts")

    def bucket(self, seconds: float) -> int:
        """The bucket of a predicted runtime: 0 for <= 1 min, ``buckets - 1`` beyond ~45 days; monotone."""
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
            raise QueueOrderError("predictedRuntimeSeconds", f"must be a number, got {type(seconds).__name__}")
        if math.isnan(seconds) or seconds < 0:
            raise QueueOrderError("predictedRuntimeSeconds", f"must be a non-negative number, got {seconds}")
        if seconds <= MIN_SECONDS:
            return 0
        if math.isinf(seconds):
            return self.buckets - 1
        # round() first: a runtime exactly on a bound (60 * 2**(k/d)) must not fall into the next bucket by 1 ulp
        k = math.ceil(round(self.per_doubling * math.log2(seconds / MIN_SECONDS), 9))
        return min(max(k, 1), self.buckets - 1)

    def _check(self, k: int) -> int:
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < self.buckets:
            raise QueueOrderError("bucket", f"must be an integer in [0, {self.buckets - 1}], got {k!r}")
        return k

    def value(self, k: int) -> int:
        """Priority of bucket ``k``: the shortest bucket gets ``base + buckets - 1``, the longest ``base``."""
        return self.base + (self.buckets - 1 - self._check(k))

    def name(self, k: int) -> str:
        return f"{self.prefix}{self._check(k):03d}"

    def upper_seconds(self, k: int) -> float | None:
        """Largest runtime of bucket ``k`` (None for the open-ended last bucket)."""
        return None if self._check(k) == self.buckets - 1 else MIN_SECONDS * 2.0 ** (k / self.per_doubling)

    def queue_class(self, k: int) -> QueueClass:
        lower = 0.0 if self._check(k) == 0 else MIN_SECONDS * 2.0 ** ((k - 1) / self.per_doubling)
        return QueueClass(bucket=k, name=self.name(k), value=self.value(k), lower_seconds=lower,
                          upper_seconds=self.upper_seconds(k))

    def class_for(self, seconds: float) -> QueueClass:
        """The PriorityClass a pod with this predicted runtime gets."""
        return self.queue_class(self.bucket(seconds))

    def classes(self) -> list[QueueClass]:
        """Every class, shortest bucket (highest value) first: what the chart creates."""
        return [self.queue_class(k) for k in range(self.buckets)]


def _human(seconds: float) -> str:
    if seconds < 3600:
        return f"{seconds / 60:.3g} min"
    if seconds < 86400:
        return f"{seconds / 3600:.3g} h"
    return f"{seconds / 86400:.3g} d"
