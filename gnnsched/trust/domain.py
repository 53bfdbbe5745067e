"""Trust domains: which pods may be MPS clients of the same GPU at the same time.

Why a rule at all: MPS is cooperative. The clients of one GPU share one MPS server, one pipe directory and one POSIX
shared-memory tmpfs; a client can read and delete what the others put there, and a fatal fault in one takes down every
client of the GPU (docs/gpu-measurements.md). So a tenant must not be placed beside a tenant it is not trusted with.
A *trust domain* is the set of namespaces whose pods may share: by default one namespace, or every namespace an
administrator gives the same value of a label, or (the behaviour before issue 39) the whole cluster.

Where the fact comes from: the pod's namespace is set by the API server (a tenant cannot create a pod in another
namespace), and a *Namespace's* labels can be changed only by who may update the Namespace object, which a tenant
holding the usual namespace-scoped ``admin``/``edit`` role cannot (Namespaces are cluster-scoped; the same trust
Pod Security Admission puts in its ``pod-security.kubernetes.io/*`` namespace labels). A label on the GNNJob or the
pod would be tenant-writable, so it is never read.

The one rule, applied wherever co-location is decided (the node agent's gate and the simulator's through
``gnnsched.policies.apart_allows``, the simulator's extender through ``gnnsched.placement.apart_blocked``, the
extender's filter, score and bind through ``gnnsched.placement.domain_blocked``, the same rule over arrays): a pod
may join a GPU only when every client there, and every member of the group admitted with it, is of its own domain
(:func:`may_share`). ``None`` is the domain under ``cluster`` (everyone shares). The operator decides no
co-location (it plans each job alone), so it takes no setting.

The setting is one string (chart ``sharing.trustDomain``, the components' ``--trust-domain``):

* ``namespace`` (default): each namespace is a domain of its own;
* ``label:<key>``: namespaces with the same value of the Namespace label ``<key>`` form one domain; a namespace
  without the label (or whose labels cannot be read) is a domain of its own: the fallback never lets more share;
* ``cluster``: no domains, any pods share a GPU (the behaviour before issue 39).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict

#: The setting's default: the namespace is the trust domain.
DEFAULT_TRUST_DOMAIN = "namespace"

#: How long a namespace's resolved domain is kept before its labels are read again (seconds). A relabelled
#: namespace's new pods take the new domain within this time; running clients keep the domain they were admitted in.
LABEL_CACHE_SECONDS = 60.0

# A label key as Kubernetes validates it: an optional DNS-subdomain prefix and "/", then a name of at most 63
# characters, alphanumeric at both ends, with "-", "_" and "." inside.
_LABEL_NAME = r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?"
_LABEL_KEY = re.compile(rf"^([a-z0-9]([a-z0-9.-]{{0,251}}[a-z0-9])?/)?{_LABEL_NAME}$")


class TrustDomainSetting(BaseModel):
    """A parsed ``--trust-domain`` / ``sharing.trustDomain``: ``kind`` and, for ``label``, the Namespace label key."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["namespace", "label", "cluster"]
    label_key: str | None = None

    def __str__(self) -> str:
        return f"label:{self.label_key}" if self.kind == "label" else self.kind


def parse_trust_domain(text: str | TrustDomainSetting, field: str = "trustDomain") -> TrustDomainSetting:
    """``"namespace"``, ``"cluster"`` or ``"label:<key>"``; raises ``ValueError`` naming ``field`` otherwise."""
    if isinstance(text, TrustDomainSetting):
        return text
    if not isinstance(text, str):
        raise ValueError(f"{field}: must be a string (namespace, cluster or label:<key>), got {text!r}")
    value = text.strip()
    if value in ("namespace", "cluster"):
        return TrustDomainSetting(kind=value)
    if value.startswith("label:"):
        key = value[len("label:"):]
        if not _LABEL_KEY.match(key):
            raise ValueError(f"{field}: {key!r} is not a Kubernetes label key (label:<[prefix/]name>)")
        return TrustDomainSetting(kind="label", label_key=key)
    raise ValueError(f"{field}: must be namespace, cluster or label:<key>, got {text!r}")


def domain_of(setting: TrustDomainSetting, namespace: str, namespace_labels: Mapping[str, str] | None) -> str | None:
    """The trust domain of a pod in ``namespace`` (``namespace_labels``: that Namespace's labels, None when they
    could not be read). ``None`` under ``cluster``. The names are prefixed by their kind so a namespace called ``x``
    and a label value ``x`` never meet."""
    if setting.kind == "cluster":
        return None
    if setting.kind == "label" and namespace_labels is not None:
        value = namespace_labels.get(setting.label_key or "")
        if value:
            return f"label:{value}"
    return f"ns:{namespace}"


def may_share(a: str | None, b: str | None) -> bool:
    """Whether clients of domains ``a`` and ``b`` may be MPS clients of one GPU at once (``None``: no domains)."""
    return a is None or b is None or a == b


def may_join(domain: str | None, others: Iterable[str | None]) -> bool:
    """Whether a pod of ``domain`` may join a GPU whose clients (and group members) are of the domains ``others``."""
    return all(may_share(domain, o) for o in others)


def mixed(domains: Iterable[str | None]) -> bool:
    """Whether ``domains`` hold two that may not share (a decision where the rule can refuse something)."""
    seen: str | None = None
    for d in domains:
        if d is None:
            continue
        if seen is None:
            seen = d
        elif d != seen:
            return True
    return False


NamespaceLabels = Callable[[str], Mapping[str, str] | None]
"""Reads a Namespace's labels: None when it does not exist or cannot be read (the namespace is then its own
domain). Only the ``label:<key>`` setting calls it."""


class DomainResolver:
    """A component's resolver from namespace to trust domain, under one setting.

    ``labels``: how this component reads a Namespace's labels (its API client); needed only for ``label:<key>``.
    Results are kept ``ttl`` seconds so a gate decision or an extender request does not read the API server for
    every pod; a failed read is kept as long (the namespace is its own domain meanwhile, which never lets more
    share). Thread-safe: the extender resolves from its HTTP threads."""

    def __init__(self, setting: TrustDomainSetting | str = DEFAULT_TRUST_DOMAIN, labels: NamespaceLabels | None = None,
                 *, ttl: float = LABEL_CACHE_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        self.setting = parse_trust_domain(setting)
        if self.setting.kind == "label" and labels is None:
            raise ValueError(f"trustDomain: {self.setting} needs a way to read Namespace labels")
        self._labels = labels
        self._ttl = ttl
        self._clock = clock
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[float, str | None]] = {}

    @property
    def enabled(self) -> bool:
        """False under ``cluster``: every domain is None and nothing is refused."""
        return self.setting.kind != "cluster"

    def of(self, namespace: str) -> str | None:
        """The trust domain of a pod in ``namespace``."""
        if self.setting.kind != "label":
            return domain_of(self.setting, namespace, None)
        now = self._clock()
        with self._lock:
            hit = self._cache.get(namespace)
            if hit is not None and now - hit[0] < self._ttl:
                return hit[1]
        assert self._labels is not None
        try:
            labels = self._labels(namespace)
        except Exception:  # the API server being down must not stop a decision: fall back to the namespace alone
            labels = None
        domain = domain_of(self.setting, namespace, labels)
        with self._lock:
            self._cache[namespace] = (now, domain)
        return domain

    async def of_async(self, namespace: str) -> str | None:
        """:meth:`of` from an event loop: the label read (a blocking API call) runs in a worker thread; the other
        settings need no I/O and answer at once (the gate's admission path stays free of a thread hop)."""
        if self.setting.kind != "label":
            return self.of(namespace)
        import asyncio

        return await asyncio.to_thread(self.of, namespace)


__all__ = [
    "DEFAULT_TRUST_DOMAIN", "LABEL_CACHE_SECONDS", "DomainResolver", "NamespaceLabels", "TrustDomainSetting",
    "domain_of", "may_join", "may_share", "mixed", "parse_trust_domain",
]
