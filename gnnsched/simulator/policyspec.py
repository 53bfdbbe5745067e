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
``best-fit``, ``fgd``     openb replay only: GPU-share placement by best fit, or by fragmentation gradient descent.
========================  ==========================================================================================

Suffixes: ``+scaling`` (the operator right-sizes CPU/memory requests with ``gnnsched.scaling.scale``), ``+uvm``
(MPS baselines: oversubscription pages over the host link instead of OOM-killing), ``-interference`` (gnnsched:
placement ignores the interference model; jobs still suffer it), ``@N`` (cap of co-located jobs per GPU).
"""

from __future__ import annotations

from dataclasses import dataclass

from gnnsched.errors import FieldError

GNNSCHED_POLICIES = ("base", "lmcf", "bmc", "sqtf", "bqt")
BASELINES = ("exclusive", "srtf", "drf", "temporal", "mps-naive", "mps-base")
PLACEMENT_ONLY = ("best-fit", "fgd")
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

    @property
    def is_gnnsched(self) -> bool:
        return self.base in GNNSCHED_POLICIES


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
    scaling = uvm = False
    interference = True
    while suffix:
        for token, flag in (("+scaling", "scaling"), ("+uvm", "uvm"), ("-interference", "nointerf")):
            if suffix.startswith(token):
                if flag == "scaling":
                    scaling = True
                elif flag == "uvm":
                    uvm = True
                else:
                    interference = False
                suffix = suffix[len(token):]
                break
        else:
            raise PolicyError(f"{text!r}: unknown suffix {suffix!r} (known: +scaling, +uvm, -interference, @N)")
    if uvm and base not in ("mps-naive", "mps-base"):
        raise PolicyError(f"{text!r}: +uvm applies to mps-naive and mps-base only")
    if not interference and base not in GNNSCHED_POLICIES:
        raise PolicyError(f"{text!r}: -interference applies to gnnsched policies only")
    return PolicySpec(text=text.strip(), base=base, scaling=scaling, uvm=uvm, interference=interference,
                      max_clients=max_clients)


def parse_policies(text: str) -> list[PolicySpec]:
    specs = [parse_policy(part) for part in text.split(",") if part.strip()]
    if not specs:
        raise PolicyError("no policy given")
    names = [s.text for s in specs]
    if len(set(names)) != len(names):
        raise PolicyError("a policy is listed twice")
    return specs
