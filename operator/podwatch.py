"""The operator's watch on its own pods, filtered by label on the API server.

Why not a kopf pod handler: kopf's ``labels=`` filter runs in the operator, after the API server has sent every pod
of the watched namespaces (all of them with ``--all-namespaces``), and kopf keeps a stream worker per object it
sees. On a shared cluster that is every pod there is, for pods this operator never touches. kopf 1.45 has no setting
that passes a ``labelSelector`` to its LIST/WATCH requests (an open pull request, nolar/kopf#1311, proposes one), so
this module does the list-then-watch itself, with ``labelSelector=app.kubernetes.io/managed-by=gnnsched`` on both
requests: unrelated pods never leave the API server. ``bench/operator_pod_memory.py`` measures the difference.

The protocol is the one informers use: LIST (with the selector), then WATCH from the list's ``resourceVersion``
with bookmarks; a watch that ends (server timeout, dropped connection) resumes from the last version seen; ``410
Gone`` (the version was compacted away) or an ``ERROR`` event starts over with a LIST. Every pod listed is delivered
as an event with no type (as kopf does on start-up), so a restarted operator re-derives every job from its pods.

Events go to ``handler(body, event_type)`` on a thread pool, one event at a time per pod and in order; while an
event of a pod is being handled, later ones of the same pod are coalesced to the latest (the handler derives the
job's state from the whole pod, so only the latest state matters), except that a deletion is never replaced.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .kube import Kube, KubeError

log = logging.getLogger("gnnsched.operator.podwatch")

Handler = Callable[[dict[str, Any], str | None], None]


class _KeyedDispatcher:
    """Per-pod serialised, coalescing dispatch onto a thread pool; each call runs in a copy of ``context`` (kopf's
    operator context, so that ``kopf.event`` works from these threads as from kopf's own handler threads)."""

    def __init__(self, handler: Handler, workers: int, context: contextvars.Context | None = None) -> None:
        self._handler = handler
        self._context = context
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gnnsched-podwatch")
        self._lock = threading.Lock()
        self._busy: set[str] = set()
        self._pending: dict[str, tuple[dict[str, Any], str | None]] = {}

    def submit(self, body: dict[str, Any], event_type: str | None) -> None:
        meta: dict[str, Any] = body["metadata"] if isinstance(body.get("metadata"), dict) else {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        with self._lock:
            if key in self._busy:
                previous = self._pending.get(key)
                if previous is None or previous[1] != "DELETED" or event_type == "DELETED":
                    self._pending[key] = (body, event_type)
                return
            self._busy.add(key)
        self._pool.submit(self._run, key, body, event_type)

    def _run(self, key: str, body: dict[str, Any], event_type: str | None) -> None:
        while True:
            try:
                if self._context is not None:
                    self._context.copy().run(self._handler, body, event_type)
                else:
                    self._handler(body, event_type)
            except Exception:
                log.exception("pod %s: handler failed", key)
            with self._lock:
                nxt = self._pending.pop(key, None)
                if nxt is None:
                    self._busy.discard(key)
                    return
            body, event_type = nxt

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class PodWatcher:
    """List-then-watch of the pods ``label_selector`` selects, in each namespace (None: every namespace)."""

    def __init__(self, kube: Kube, label_selector: str, handler: Handler, namespaces: list[str] | None = None,
                 workers: int = 4, timeout_seconds: float | None = None, retry_seconds: float = 1.0,
                 context: contextvars.Context | None = None) -> None:
        self.kube = kube
        self.label_selector = label_selector
        self.namespaces: list[str | None] = list(namespaces) if namespaces else [None]
        # Server-side watch timeout: short in tests (the emulator streams), a few minutes by default (as kopf).
        self.timeout_seconds = max(1, round(timeout_seconds)) if timeout_seconds else 300
        self.retry_seconds = retry_seconds
        self._dispatch = _KeyedDispatcher(handler, workers, context)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._responses: dict[str | None, Any] = {}
        self.lists = 0  # LIST requests made (a re-list follows a 410 Gone or an error event)
        self.events = 0  # events delivered to the handler, listed pods included

    def start(self) -> None:
        for namespace in self.namespaces:
            thread = threading.Thread(target=self._loop, args=(namespace,), daemon=True,
                                      name=f"gnnsched-podwatch-{namespace or 'all'}")
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop watching: open streams are ended at once, then the threads are joined (daemon threads: a stuck one
        never holds the process).

        A watch thread is usually blocked reading a quiet stream. ``close()`` alone would wait for that read to
        return (the reader holds the socket file's lock), which is only when the server sends an event or ends the
        stream after ``timeout_seconds``: minutes. ``shutdown()`` (urllib3 >= 2.3, urllib3/urllib3#2868) shuts the
        socket for reading, so the blocked read returns at once and the close that follows does not wait.
        """
        self._stop.set()
        for response in list(self._responses.values()):
            with contextlib.suppress(Exception):  # already released by its thread
                response.shutdown()
                response.close()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._dispatch.shutdown()

    def _deliver(self, body: Any, event_type: str | None) -> None:
        if isinstance(body, dict):
            self.events += 1
            self._dispatch.submit(body, event_type)

    def _loop(self, namespace: str | None) -> None:
        version: str | None = None
        while not self._stop.is_set():
            try:
                if version is None:
                    page = self.kube.list_pods_page(namespace, self.label_selector)
                    self.lists += 1
                    for item in page.get("items") or []:
                        self._deliver(item, None)
                    version = str((page.get("metadata") or {}).get("resourceVersion") or "") or None
                    if version is None:
                        version = ""  # a server that gives no version: watch from "now" (still no re-list)
                version = self._watch(namespace, version)
            except KubeError as exc:
                if self._stop.is_set():
                    return
                if exc.status == 410:
                    version = None
                    continue
                log.warning("pod watch (%s): %s; retrying", namespace or "all namespaces", exc)
                self._stop.wait(self.retry_seconds)

    def _watch(self, namespace: str | None, version: str) -> str | None:
        """One watch request; returns the version to resume from, or None to re-list."""

        def opened(response: Any) -> None:
            self._responses[namespace] = response

        try:
            for event in self.kube.watch_pods(namespace, self.label_selector, version or None, self.timeout_seconds,
                                              on_open=opened):
                if self._stop.is_set():
                    return version
                kind = event.get("type")
                obj: dict[str, Any] = event["object"] if isinstance(event.get("object"), dict) else {}
                if kind == "ERROR":
                    code = obj.get("code")
                    log.info("pod watch (%s): error event %s (%s); re-listing", namespace or "all namespaces",
                             code, obj.get("message"))
                    return None
                seen = (obj.get("metadata") or {}).get("resourceVersion")
                if isinstance(seen, str) and seen and seen != "...":
                    version = seen
                if kind == "BOOKMARK":
                    continue
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self._deliver(obj, str(kind))
        finally:
            self._responses.pop(namespace, None)
        return version
