"""The agent's view of an MPS control daemon it does not own (``gnnsched node-agent --mps external``).

The daemon runs in its own privileged container (``gnnsched mps-daemon``) and publishes its health to a file in the
node state directory; this reader turns that file into the same ``healthy`` / ``restarts`` / ``message`` the agent
reads from an :class:`~gnnsched.node_agent.mps.MPSManager`, so the gate admits nothing while MPS is down. A missing,
unreadable, disabled or stale file counts as unhealthy: a client that cannot reach the control daemon runs without
MPS, that is without any memory limit.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from pydantic import ValidationError

from gnnsched.contract import MPSDaemonHealth

log = logging.getLogger("gnnsched.node_agent.mps")


def read_daemon_health(path: Path) -> MPSDaemonHealth:
    """Parse the daemon's health file; raises ``ValueError`` with a one-line reason."""
    try:
        raw = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ValueError(f"no MPS daemon health at {path} (is the gnnsched mps-daemon running on this node?)") from None
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not JSON: {exc.msg}") from None
    try:
        return MPSDaemonHealth.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(root)"
        raise ValueError(f"{path}: {where}: {first['msg']}") from None


@dataclass(slots=True)
class ExternalMPS:
    """Duck-types the parts of ``MPSManager`` the agent uses: ``healthy``, ``restarts``, ``message``, ``check()``
    and ``run_forever()``."""

    health_path: Path
    max_age_s: float = 60.0
    healthy: bool = False
    restarts: int = 0
    message: str = "MPS daemon health not read yet"
    last: MPSDaemonHealth | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def check(self) -> bool:
        h: MPSDaemonHealth | None = None
        try:
            h = read_daemon_health(self.health_path)
        except ValueError as exc:
            ok, msg, restarts = False, str(exc), self.restarts
        else:
            ok, msg, restarts = h.healthy, h.message, h.restarts
            if h.updated_at is not None:
                at = h.updated_at if h.updated_at.tzinfo else h.updated_at.replace(tzinfo=timezone.utc)
                age = (datetime.now(timezone.utc) - at).total_seconds()
                if age > self.max_age_s:
                    ok, msg = False, f"MPS daemon health is {age:.0f} s old (limit {self.max_age_s:g} s): {h.message}"
        with self._lock:
            if ok != self.healthy:
                (log.info if ok else log.error)("MPS daemon %s: %s", "healthy" if ok else "unhealthy", msg)
            self.healthy, self.message, self.restarts, self.last = ok, msg, restarts, h
        return ok

    def run_forever(self, interval: float, stop: threading.Event) -> None:
        while not stop.is_set():
            self.check()
            stop.wait(interval)
