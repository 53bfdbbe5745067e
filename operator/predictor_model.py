"""The runtime model in use, reloaded from its ConfigMap while the operator runs (issue 28, item 5).

The retrain CronJob writes a model into the ConfigMap only when it is not worse than the one in use
(``gnnsched.predictor.retrain``); this side reads the object every ``interval`` seconds and swaps the planner's
model when the content hash of ``model.json`` changed. Why a poll and not a watch: one GET of one object per minute
costs the API server nothing, needs only ``get`` on ConfigMaps (which the operator already has for its jobs' spec
ConfigMaps), and survives restarts of the API server without any resume logic. A model that does not parse is
refused (logged, counted as ``invalid``) and the model in use stays; a ConfigMap without a model (or none at all)
means the shipped model.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime
from typing import Any

from gnnsched.predictor.gnn import GNNRuntimePredictor
from gnnsched.predictor.store import digest, last_retrain, parse_model, stored_model_text

from .kube import Kube, KubeError
from .metrics import OperatorMetrics
from .planning import Planner

log = logging.getLogger("gnnsched.operator.predictor_model")


def _timestamp(value: Any) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class PredictorModelReloader:
    """Polls ``namespace/name`` and keeps ``planner``'s runtime model and ``metrics`` in step with it."""

    def __init__(self, kube: Kube, planner: Planner, metrics: OperatorMetrics, namespace: str, name: str,
                 interval: float) -> None:
        self.kube, self.planner, self.metrics = kube, planner, metrics
        self.namespace, self.name, self.interval = namespace, name, interval
        self.digest: str | None = None  # of the model.json in use; None: the shipped model
        self._refused: str | None = None  # digest of the last invalid content, so it is logged once
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll(self) -> bool:
        """Read the ConfigMap once; returns True when the model in use changed. API errors propagate."""
        configmap = self.kube.read_config_map(self.namespace, self.name)
        self._export_retrain(configmap)
        text = stored_model_text(configmap)
        if text is None:
            if self.digest is None:
                return False
            self.planner.use_predictor(None)  # its id: shipped
            self.digest = None
            self._export_model(GNNRuntimePredictor.load_default())
            self.metrics.model_reloads.labels("removed").inc()
            log.warning("configmap %s/%s holds no model any more: back to the shipped runtime model",
                        self.namespace, self.name)
            return True
        new = digest(text)
        if new in (self.digest, self._refused):
            return False
        try:
            model = parse_model(text, f"configmap {self.namespace}/{self.name}")
        except ValueError as exc:
            self._refused = new
            self.metrics.model_reloads.labels("invalid").inc()
            log.error("%s; the runtime model in use stays", exc)
            return False
        self.planner.use_predictor(model, new)
        self.digest, self._refused = new, None
        self._export_model(model)
        self.metrics.model_reloads.labels("loaded").inc()
        held_out = model.training.get("held_out") or {}
        log.info("runtime model %s loaded from configmap %s/%s: trained on %s jobs at %s, held-out WMAPE %s", new,
                 self.namespace, self.name, model.training.get("rows"), model.training.get("trained_at"),
                 held_out.get("wmape"))
        return True

    def _export_model(self, model: GNNRuntimePredictor) -> None:
        held_out = model.training.get("held_out")
        wmape = held_out.get("wmape") if isinstance(held_out, dict) else None
        rows = model.training.get("rows")
        self.metrics.model_in_use(int(rows) if isinstance(rows, int) else 0,
                                  float(wmape) if isinstance(wmape, (int, float)) else None,
                                  _timestamp(model.training.get("trained_at")))

    def _export_retrain(self, configmap: dict[str, Any] | None) -> None:
        outcome = last_retrain(configmap)
        if outcome is None:
            return
        self.metrics.last_retrain.labels(outcome.outcome).set(outcome.at.timestamp())
        for label, value in (("candidate", outcome.candidate_wmape), ("in_use", outcome.current_wmape)):
            if value is not None:
                self.metrics.retrain_wmape.labels(label).set(value)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.poll()
            except KubeError as exc:
                log.warning("cannot read the runtime model's configmap %s/%s (%s); the model in use stays",
                            self.namespace, self.name, exc)
            except Exception:  # noqa: BLE001 - a reload failure must never stop the operator's poll
                log.exception("reloading the runtime model failed; the model in use stays")

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="predictor-model-reload", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
