"""Policy names and suffixes accepted by ``gnnsched simulate --policies``.

A policy is ``BASE`` followed by any number of suffixes:

========================  ==========================================================================================
``exclusive``             Kubernetes default: one pod per whole GPU, FIFO scheduling queue (CoGNN/GNNSched "Default").
``srtf``, ``drf``          ``exclusive`` with the resource-demand paper's other queue orders: shortest predicted runtime
                          first; smallest dominant resource share first (seed 004).
``temporal``              PipeSwitch-like temporal sharing: one job at a time per GPU from a per-GPU FIFO queue,
                          start-up pipelined behind the running job.
``mps-naive``             MPS, everything admitted at once (GNNSched's MPS-Aggr), no memory check.
``mps-base``              MPS, at most 4 clients per GPU (GNNSched's MPS-Base), no memory check.
``base lmcf bmc sqtf bqt`` gnnsched: operator estimate, extender filter/score, node-agent grouping policy behind the
                          memory-safety gate.
``sqtf-paper bqt-paper``  baselines: GNNSched's SQTF/BQT *as published* (``gnnsched.policies.plan_admissions_paper``):
                          the group advances only once its PMC exceeds gTH, so it can outgrow the GPU, and a GPU takes
                          its next group only when the last one has finished. Same node queue and placement as
                          gnnsched, but no memory-safety gate; overflow is an OOM kill (or UVM paging with ``+uvm``).
``best-fit``, ``fgd``     openb replay only: GPU-share placement by best fit, or by fragmentation gradient descent.
========================  ==========================================================================================

Suffixes: ``+scaling`` (the operator right-sizes CPU/memory requests with ``gnnsched.scaling.scale``), ``+uvm``
(MPS baselines and the ``-paper`` variants: oversubscription pages over the host link instead of OOM-killing),
``+bypassN`` (gnnsched: the gate's bounded-bypass backfill with limit ``N``, as ``node-agent --bypass-limit N``;
``+bypass0`` is the strict prefix of the policy's order; without it the gate's default applies), ``+spread`` (gnnsched:
the gate plans in rounds of one task per GPU, least loaded GPU first, as ``node-agent --spread``, the chart's
default), ``+pays`` (gnnsched: a task joins a GPU where others run only when the interference model predicts that
finishes sooner than waiting for an idle GPU, :func:`gnnsched.policies.share_pays`, as ``node-agent
--share-when-pays``), ``+prestart``
(gnnsched: a pod's start-up begins when it is bound to its node, not when it is admitted: the built-in worker imports,
loads its graph and builds its model on the CPU while it waits at the gate, ``gnnsched gate --prestart``, so only what
is left of ``STARTUP_S`` after the wait delays its first step),
``+rtcal`` (gnnsched: the operator's runtime calibration; each completed attempt's observed ÷ predicted runtime
updates its class's factor, which new and waiting attempts' predictions use, :mod:`gnnsched.simulator.runtime_loop`),
``+progress`` (gnnsched: a running job's seconds left come from its step reports,
:func:`gnnsched.progress.seconds_left`, as the node agent's do once the worker reports),
``-calib`` (gnnsched, with ``--estimate-error`` or faults: new estimates keep the static safety factor
instead of the calibration table's, see :mod:`gnnsched.simulator.faults`),
``-interference`` (gnnsched: placement ignores the interference model; jobs still suffer it), ``-paper`` (sqtf/bqt:
the published algorithm, a baseline, see above), ``+sjf`` (gnnsched: the operator gives each pod the PriorityClass of
its predicted-runtime bucket, :mod:`gnnsched.queue_order`, so kube-scheduler's default PrioritySort tries pending pods
by (bucket priority, highest first; then the order they entered the queue: arrival, or re-queue after an OOM
retry) -- shortest predicted first across the cluster, ties in FIFO order; with ``+scaling`` the bucket is that of the
runtime predicted at the scaled requests, as the operator annotates it; ``+sjfN``: N buckets per doubling of the
runtime, 1..8, default 2 as the chart's default classes), ``+pack`` (kube-scheduler's NodeResourcesFit
scores with ``MostAllocated``, the chart's ``scheduler.nodeResourcesScoring: MostAllocated``, instead of
``LeastAllocated``, the default of gnnsched's profile and of kube-scheduler's -- see
:mod:`gnnsched.simulator.kube_scores`), ``@N`` (cap of co-located jobs per GPU).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gnnsched.errors import FieldError
from gnnsched.queue_order import DEFAULT_PER_DOUBLING, MAX_PER_DOUBLING
from gnnsched.scheduler_config import DEFAULT_SCORING_STRATEGY, LEAST_ALLOCATED, MOST_ALLOCATED

# one suffix: a flag, or ``+sjf`` / ``+bypass`` with an optional count (``+bypass`` requires one, checked below)
_SUFFIX = re.compile(
    r"(?P<token>\+scaling|\+uvm|-interference|-paper|-calib|\+sjf|\+bypass|\+pack|\+spread|\+pays|\+prestart|\+progress|\+rtcal)"
    r"(?P<n>\d*)"
)
GNNSCHED_POLICIES = ("base", "lmcf", "bmc", "sqtf", "bqt")
BASELINES = ("exclusive", "srtf", "drf", "temporal", "mps-naive", "mps-base")
PLACEMENT_ONLY = ("best-fit", "fgd")
PAPER_VARIANTS = ("sqtf", "bqt")  # ``-paper``: GNNSched's published Algorithms 1 and 2
ALL_BASES = BASELINES + GNNSCHED_POLICIES + PLACEMENT_ONLY


class PolicyError(FieldError):
    """A ``--policies`` list that names an unknown policy or suffix."""

    def __init__(self, message: str) -> None:
        super().__init__("policies", message)


@dataclass(frozen=True)
class PolicySpec:
    """A parsed policy name."""

    text: str
    base: str
    scaling: bool = False
    uvm: bool = False
    interference: bool = True
    max_clients: int | None = None
    paper: bool = False
    sjf: int = 0  # +sjf: buckets per doubling of the runtime (gnnsched.queue_order); 0: FIFO queue
    bypass_limit: int | None = None  # ``+bypassN``; None: the gate's default (``policies.DEFAULT_BYPASS_LIMIT``)
    pack: bool = False  # ``+pack``: NodeResourcesFit scores with MostAllocated
    calibration: bool = True  # ``-calib`` turns it off: new estimates keep the static safety factor
    spread: bool = False  # ``+spread``: the gate plans in rounds of one task per GPU (policies.plan_decision)
    share: bool = False  # ``+pays``: a task joins running clients only when that pays (policies.share_pays)
    prestart: bool = False  # ``+prestart``: the worker's CPU start-up runs while it waits at the gate
    runtime_calibration: bool = False  # ``+rtcal``: the operator's per-class runtime factor (simulator.runtime_loop)
    progress: bool = False  # ``+progress``: running jobs' seconds left from their step reports (gnnsched.progress)

    @property
    def runtime_loop(self) -> bool:
        """Whether the run keeps runtime books (:class:`gnnsched.simulator.runtime_loop.RuntimeLoop`)."""
        return self.runtime_calibration or self.progress

    @property
    def scoring_strategy(self) -> str:
        """NodeResourcesFit's strategy in the profile that schedules this policy's pods: ``MostAllocated`` with
        ``+pack``, else gnnsched's profile's default (``scheduler_config.DEFAULT_SCORING_STRATEGY``) or
        kube-scheduler's (``LeastAllocated``)."""
        if self.pack:
            return MOST_ALLOCATED
        return DEFAULT_SCORING_STRATEGY if self.is_gnnsched else LEAST_ALLOCATED

    @property
    def effective_bypass_limit(self) -> int:
        """The ``bypass_limit`` the node agent's ``plan_admissions`` runs with (0: strict prefix of the order)."""
        if self.bypass_limit is not None:
            return self.bypass_limit
        from gnnsched.policies import DEFAULT_BYPASS_LIMIT

        return DEFAULT_BYPASS_LIMIT

    @property
    def is_gnnsched(self) -> bool:
        """Runs on gnnsched's machinery (extender placement, node-agent queue and grouping); true for the
        ``-paper`` variants too, which differ only in the grouping rule and in having no gate."""
        return self.base in GNNSCHED_POLICIES

    @property
    def is_ours(self) -> bool:
        """A gnnsched policy proper (gate and all): what "gnnsched's best" is taken over."""
        return self.is_gnnsched and not self.paper


def parse_policy(text: str) -> PolicySpec:
    """Parse ``lmcf+scaling``, ``mps-naive+uvm``, ``bqt-interference@4`` ... into a :class:`PolicySpec`."""
    raw = text.strip().lower()
    if not raw:
        raise PolicyError("empty policy name")
    rest = raw
    max_clients = None
    if "@" in rest:
        rest, _, cap = rest.partition("@")
        if not cap.isdigit() or int(cap) < 1:
            raise PolicyError(f"{text!r}: '@N' needs a positive integer")
        max_clients = int(cap)
    base = next((b for b in sorted(ALL_BASES, key=len, reverse=True) if rest.startswith(b)), None)
    if base is None:
        raise PolicyError(f"unknown policy {text!r}; known: {', '.join(ALL_BASES)}")
    suffix = rest[len(base):]
    scaling = uvm = paper = False
    sjf = 0
    interference = True
    bypass_limit: int | None = None
    pack = False
    calibration = True
    spread = False
    share = False
    prestart = False
    rtcal = progress = False
    while suffix:
        m = _SUFFIX.match(suffix)
        if m is None:
            raise PolicyError(f"{text!r}: unknown suffix {suffix!r} "
                              "(known: +scaling, +uvm, +sjf, +bypassN, +pack, +spread, +pays, +prestart, +rtcal, "
                              "+progress, -interference, -paper, -calib, @N)")
        token, digits = m.group("token"), m.group("n")
        suffix = suffix[m.end():]
        if digits and token not in ("+sjf", "+bypass"):
            raise PolicyError(f"{text!r}: unknown suffix {digits + suffix!r} after {token!r}")
        if token == "+scaling":
            scaling = True
        elif token == "+uvm":
            uvm = True
        elif token == "-paper":
            paper = True
        elif token == "-interference":
            interference = False
        elif token == "+pack":
            pack = True
        elif token == "+spread":
            spread = True
        elif token == "+pays":
            share = True
        elif token == "+prestart":
            prestart = True
        elif token == "+rtcal":
            rtcal = True
        elif token == "+progress":
            progress = True
        elif token == "-calib":
            calibration = False
        elif token == "+sjf":
            sjf = int(digits) if digits else DEFAULT_PER_DOUBLING
            if not 1 <= sjf <= MAX_PER_DOUBLING:
                raise PolicyError(f"{text!r}: +sjfN needs N in 1..{MAX_PER_DOUBLING} (buckets per doubling)")
        else:  # +bypass
            if not digits:
                raise PolicyError(f"{text!r}: '+bypassN' needs an integer N >= 0 (0: strict prefix of the order)")
            bypass_limit = int(digits)
    if paper and base not in PAPER_VARIANTS:
        raise PolicyError(f"{text!r}: -paper applies to {' and '.join(PAPER_VARIANTS)} only (the published algorithms)")
    if uvm and base not in ("mps-naive", "mps-base") and not paper:
        raise PolicyError(f"{text!r}: +uvm applies to mps-naive, mps-base and the -paper variants only")
    if bypass_limit is not None and (base not in GNNSCHED_POLICIES or paper):
        raise PolicyError(f"{text!r}: +bypassN applies to gnnsched policies only (the gate's backfill rule)")
    if not calibration and (base not in GNNSCHED_POLICIES or paper):
        raise PolicyError(f"{text!r}: -calib applies to gnnsched policies only (the operator's calibration)")
    if not interference and base not in GNNSCHED_POLICIES:
        raise PolicyError(f"{text!r}: -interference applies to gnnsched policies only")
    if spread and (base not in GNNSCHED_POLICIES or paper):
        raise PolicyError(f"{text!r}: +spread applies to gnnsched policies only (the gate's planning rule)")
    if share and (base not in GNNSCHED_POLICIES or paper):
        raise PolicyError(f"{text!r}: +pays applies to gnnsched policies only (the gate's share rule)")
    if prestart and (base not in GNNSCHED_POLICIES or paper):
        raise PolicyError(f"{text!r}: +prestart applies to gnnsched policies only (the start-up before the gate)")
    if (rtcal or progress) and (base not in GNNSCHED_POLICIES or paper):
        raise PolicyError(f"{text!r}: +rtcal and +progress apply to gnnsched policies only (the operator's runtime "
                          "calibration, the node agent's progress reports)")
    if sjf and base not in GNNSCHED_POLICIES:
        raise PolicyError(f"{text!r}: +sjf applies to gnnsched policies only (srtf is the baselines' runtime order)")
    return PolicySpec(text=text.strip(), base=base, scaling=scaling, uvm=uvm, interference=interference,
                      max_clients=max_clients, paper=paper, sjf=sjf, bypass_limit=bypass_limit,
                      pack=pack, calibration=calibration, spread=spread, share=share, prestart=prestart,
                      runtime_calibration=rtcal, progress=progress)


def parse_policies(text: str) -> list[PolicySpec]:
    specs = [parse_policy(part) for part in text.split(",") if part.strip()]
    if not specs:
        raise PolicyError("no policy given")
    names = [s.text for s in specs]
    if len(set(names)) != len(names):
        raise PolicyError("a policy is listed twice")
    return specs
