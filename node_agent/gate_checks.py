"""The gate's rules for what a client may book, so that nothing a client chooses books more than its pod is owed.

The gate protocol carries a few client-chosen fields. Each one was a way to steer the books (security review of
issue 39); the rules here take that choice away:

* ``container``: the gate key is ``<pod uid>`` or ``<pod uid>/<container>``, and the books hold one live entry per key.
  A client that could name any container could book one pod many times (one 30 GiB pod held four entries). So the
  name must be one of the pod's own containers as the API server shows them (``spec.containers``, plus restartable
  init containers, the sidecars), and a pod with one container has one key whatever the client sends (``""`` and
  that container's name are the same container). :func:`gate_key`.
* ``resume``: after an agent restart a keeper re-books its running workload on the GPU it names. Accepted only for an
  admission this agent made: one in its books (adopted at start, or a keeper that lost its connection), or one whose
  pod carries the agent's *admission seal*, an HMAC the agent wrote at admission over the node, the pod UID, the gate
  key, the GPU and the admission time, with a key only the node's agents hold (``<state dir>/gate-seal.key``, root
  only; the pod cannot read it, and a seal copied from another pod or GPU does not verify). :class:`AdmissionSeal`.
* progress lines: a client may write as fast as it likes. :class:`ProgressLimiter` drops lines that come sooner than
  the keeper's cadence allows *before* parsing them, and logs a connection's bad lines once, so a flood costs the
  agent a read and a clock call per line, not a JSON parse, a log record and a disk write.
* connections: :class:`ConnectionCap` bounds how many a pod may hold at once.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from gnnsched.node_agent.identity import IdentityError, PeerCred, PeerVerifier, PodInfo, pod_uids_in_cgroup

SEAL_KEY_FILE = "gate-seal.key"
"""In the node state directory (the agent's and the MPS daemon's only; never mounted into a job)."""
SEAL_KEY_BYTES = 32
MAX_CONNECTIONS_PER_POD = 8
"""Default cap on a pod's concurrent gate connections. A gated container holds one (its keeper's) and briefly a
second while it reconnects after an agent restart; ``--prestart`` adds none. Eight covers a pod of four gated
containers mid-reconnect; a pod that opens more is flooding the agent's file descriptors and event loop."""
PROGRESS_BURST = 2
"""Progress lines parsed back to back before the rate applies (the keeper's first report and one spare)."""


def gate_key(pod: PodInfo, container: str) -> str:
    """The books' key for ``container`` of ``pod``; :class:`IdentityError` (``unknown-container``) when the pod has
    no such container, or (``container-required``) when a pod of several containers does not say which.

    A pod object without containers (a development pods file, never the API server) counts as one unnamed
    container: only ``""`` names it."""
    names = pod.containers
    if len(names) <= 1:
        if container in ("", *names):
            return pod.uid
        known = names[0] if names else "none listed"
        raise IdentityError("unknown-container", f"container: pod {pod.namespace}/{pod.name} has no container "
                                                 f"{container!r} (its container: {known})")
    if not container:
        raise IdentityError("container-required", f"container: pod {pod.namespace}/{pod.name} has "
                                                  f"{len(names)} containers ({', '.join(names)}); the request must "
                                                  "name the one it gates (gnnsched gate --container NAME)")
    if container not in names:
        raise IdentityError("unknown-container", f"container: pod {pod.namespace}/{pod.name} has no container "
                                                 f"{container!r} (its containers: {', '.join(names)})")
    return f"{pod.uid}/{container}"


def load_seal_key(state_dir: str | Path | None) -> bytes:
    """The node's seal key: read from ``<state_dir>/gate-seal.key``, created there (mode 0600) on first use. Without a
    state directory a fresh key per process: seals then do not survive a restart, so neither does adoption."""
    if state_dir is None:
        return secrets.token_bytes(SEAL_KEY_BYTES)
    path = Path(state_dir) / SEAL_KEY_FILE
    with contextlib.suppress(FileNotFoundError):
        key = path.read_bytes()
        if len(key) >= SEAL_KEY_BYTES:
            return key
    path.parent.mkdir(parents=True, exist_ok=True)
    key = secrets.token_bytes(SEAL_KEY_BYTES)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key)
    os.replace(tmp, path)
    return path.read_bytes()  # the file as it stands (two agents racing at first start agree on the winner)


@dataclass(frozen=True, slots=True)
class AdmissionSeal:
    """Signs and checks the agent's admission annotations (see module docstring)."""

    key: bytes
    node: str

    def seal(self, pod_uid: str, gate_key: str, gpu_uuid: str, admitted_at: str) -> str:
        msg = "\n".join((self.node, pod_uid.lower(), gate_key.lower(), gpu_uuid, admitted_at)).encode()
        return hmac.new(self.key, msg, hashlib.sha256).hexdigest()

    def verifies(self, value: str | None, pod_uid: str, gate_key: str, gpu_uuid: str | None,
                 admitted_at: str | None) -> bool:
        if not value or not gpu_uuid or not admitted_at:
            return False
        return hmac.compare_digest(value, self.seal(pod_uid, gate_key, gpu_uuid, admitted_at))

    def sealed_key(self, pod: PodInfo, value: str | None, gpu_uuid: str | None, admitted_at: str | None) -> str | None:
        """Which of the pod's gate keys the seal on it was written for (None: no valid seal)."""
        candidates = [pod.uid] + [f"{pod.uid}/{c}" for c in pod.containers]
        return next((k for k in candidates if self.verifies(value, pod.uid, k, gpu_uuid, admitted_at)), None)


@dataclass(slots=True)
class ProgressLimiter:
    """One connection's progress lines: which to parse (rate), and whether to log a bad one (once)."""

    min_gap: float
    burst: int = PROGRESS_BURST
    parsed: int = 0
    dropped: int = 0
    logged: bool = False
    _last: float | None = None
    _credit: int = field(init=False)

    def __post_init__(self) -> None:
        self._credit = self.burst

    def admit(self, now: float) -> bool:
        """Whether to parse a line that arrived at ``now``: the first after a quiet ``min_gap``, and up to
        ``burst - 1`` more right behind it; every other line is dropped unread."""
        if self._last is None or now - self._last >= self.min_gap:
            self._credit = self.burst - 1
        elif self._credit > 0:
            self._credit -= 1
        else:
            self.dropped += 1
            return False
        self._last = now
        self.parsed += 1
        return True

    def first_complaint(self) -> bool:
        """True the first time only: a connection's bad lines are logged once, then counted."""
        if self.logged:
            return False
        self.logged = True
        return True


@dataclass(slots=True)
class ConnectionCap:
    """Concurrent gate connections per pod (``limit``); a connection counts from its first identified moment until
    it closes."""

    limit: int = MAX_CONNECTIONS_PER_POD
    open: dict[str, int] = field(default_factory=dict)

    def take(self, pod_uid: str) -> bool:
        n = self.open.get(pod_uid, 0)
        if n >= self.limit:
            return False
        self.open[pod_uid] = n + 1
        return True

    def give(self, pod_uid: str) -> None:
        n = self.open.get(pod_uid, 0) - 1
        if n > 0:
            self.open[pod_uid] = n
        else:
            self.open.pop(pod_uid, None)


def peer_pod(verifier: PeerVerifier, cred: PeerCred | None) -> str | None:
    """The pod a connecting process is in, from its cgroup, before it has said anything (None: the check is off or
    the cgroup names no single pod; then the connection counts once its request is verified). What lets the cap hold
    for connections that never send a line: without it, each could sit out the first-line timeout uncounted."""
    if not verifier.enabled or cred is None:
        return None
    try:
        uids = pod_uids_in_cgroup(verifier.read_cgroup(cred.pid))
    except OSError:
        return None
    return next(iter(uids)) if len(uids) == 1 else None
