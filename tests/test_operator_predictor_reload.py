"""The residual model retrains itself (issue 28, item 5), end to end against the emulated API server.

The chart's CronJob commands (``operator export-history`` then ``predictor train --model-configmap``) run on a
seeded history; the running operator reloads the adopted model from its ConfigMap without a restart and plans the
next job with it; a worse candidate is kept out (exit 3); a broken or removed model is handled without a restart."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from history_seed import records, succeeded_job
from operator_harness import Cluster, a100, emulated_cluster, manifest, running_operator, wait_for
from test_operator import job_in_phase, scrape

from gnnsched.predictor.store import MODEL_KEY, RETRAIN_ANNOTATION, digest

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]

CONFIGMAP = "gs-predictor-model"
CONFIGMAPS = "/api/v1/namespaces/default/configmaps"
SMALL = json.dumps({"n_estimators": 40, "max_depth": 2, "learning_rate": 0.2, "min_child_weight": 1.0})


async def cronjob_run(cluster: Cluster, tmp_path: Path) -> tuple[int, dict[str, Any], str]:
    """The CronJob's two containers' commands through the real CLI (in-process, in a thread: two processes would add
    ~10 s of imports per run on this machine): the history export, then the gated retrain (exit, summary)."""
    from typer.testing import CliRunner

    from gnnsched.cli import app

    history = tmp_path / "history.jsonl"
    runner = CliRunner()
    export = await asyncio.to_thread(runner.invoke, app, [
        "operator", "export-history", "--out", str(history), "--kubeconfig", str(cluster.kubeconfig)])
    assert export.exit_code == 0, export.output
    train = await asyncio.to_thread(runner.invoke, app, [
        "predictor", "train", "--from-history", str(history), "--model-configmap", f"default/{CONFIGMAP}",
        "--min-new-jobs", "20", "--params", SMALL, "--json", "--kubeconfig", str(cluster.kubeconfig)])
    return train.exit_code, json.loads(train.stdout or "{}"), train.stderr


async def seed(cluster: Cluster, first: int, count: int, factor: float) -> None:
    for i, record in enumerate(records(first, count, factor), start=first):
        await cluster.create_job(succeeded_job(record, f"done-{i}"))


async def configmap(cluster: Cluster) -> dict[str, Any]:
    status, data = await cluster.request("GET", f"{CONFIGMAPS}/{CONFIGMAP}")
    assert status == 200, data
    return data


async def set_model(cluster: Cluster, text: str | None) -> None:
    status, data = await cluster.request("PATCH", f"{CONFIGMAPS}/{CONFIGMAP}", json={"data": {MODEL_KEY: text}},
                                         headers={"Content-Type": "application/merge-patch+json"})
    assert status == 200, data


def gauge(metrics: dict, name: str, **labels: str) -> float | None:
    return metrics.get((name, tuple(sorted(labels.items()))))


async def test_the_cronjob_retrains_the_operator_reloads_and_a_worse_model_is_kept_out(tmp_path: Path) -> None:
    async with emulated_cluster(tmp_path) as cluster:
        await cluster.add_gpunode("node-a", [a100(0)])
        # what the chart renders: the ConfigMap without a model (the CronJob may only patch it)
        status, data = await cluster.request("POST", CONFIGMAPS, json={
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": CONFIGMAP}})
        assert status in (200, 201), data
        await seed(cluster, 0, 30, 3.0)  # 30 jobs that ran 3x the shipped model's prediction
        async with running_operator(cluster, metrics_port=0, predictor_model_configmap=f"default/{CONFIGMAP}",
                                    predictor_reload_seconds=0.3) as op:
            before = await scrape(op.metrics_port)
            assert gauge(before, "gnnsched_predictor_model_training_rows") == 0
            await cluster.create_job(manifest("before"))
            planned_before = (await job_in_phase(cluster, "before", "Estimated", "Scheduled", "Queued"))["status"]

            code, summary, err = await cronjob_run(cluster, tmp_path)
            assert code == 0, err
            assert summary["outcome"] == "adopted" and summary["model_in_use"] == "the shipped model", summary
            assert (summary["held_out_rows"], summary["trained_rows"]) == (6, 24)
            stored = (await configmap(cluster))["data"][MODEL_KEY]

            async def reloaded() -> dict | None:
                m = await scrape(op.metrics_port)
                return m if gauge(m, "gnnsched_predictor_model_training_rows") == 24 else None

            after = await wait_for(reloaded, 20, what="the operator to reload the adopted model")
            assert op.predictor_reloader.digest == digest(stored)
            assert gauge(after, "gnnsched_predictor_model_reloads_total", result="loaded") == 1
            assert gauge(after, "gnnsched_predictor_model_held_out_wmape") == pytest.approx(summary["candidate_wmape"],
                                                                                            abs=1e-6)
            assert 0 <= gauge(after, "gnnsched_predictor_model_age_seconds") < 120
            assert gauge(after, "gnnsched_predictor_last_retrain_timestamp_seconds", outcome="adopted") > 0
            # the next job is planned with the retrained model, by the same operator process
            await cluster.create_job(manifest("after"))
            planned_after = (await job_in_phase(cluster, "after", "Estimated", "Scheduled", "Queued"))["status"]
            ratio = planned_after["predictedRuntimeSeconds"] / planned_before["predictedRuntimeSeconds"]
            assert 2.7 < ratio < 3.3, (planned_before["predictedRuntimeSeconds"], planned_after)

            # a slow period (24 jobs at 20x), then 6 at 3x again: the candidate is worse on those 6 and kept out
            await seed(cluster, 30, 24, 20.0)
            await seed(cluster, 54, 6, 3.0)
            code, summary, err = await cronjob_run(cluster, tmp_path)
            assert code == 3, (code, summary, err)
            assert summary["outcome"] == "rejected" and summary["model_in_use"] == f"configmap default/{CONFIGMAP}"
            assert summary["candidate_wmape"] > summary["current_wmape"]
            kept = await configmap(cluster)
            assert kept["data"][MODEL_KEY] == stored  # the model in use is untouched
            assert json.loads(kept["metadata"]["annotations"][RETRAIN_ANNOTATION])["outcome"] == "rejected"

            async def rejection_seen() -> dict | None:
                m = await scrape(op.metrics_port)
                return m if gauge(m, "gnnsched_predictor_last_retrain_timestamp_seconds", outcome="rejected") else None

            m = await wait_for(rejection_seen, 20, what="the rejection's metric")
            assert gauge(m, "gnnsched_predictor_last_retrain_held_out_wmape", model="candidate") == \
                summary["candidate_wmape"]
            assert gauge(m, "gnnsched_predictor_model_training_rows") == 24
            assert gauge(m, "gnnsched_predictor_model_reloads_total", result="loaded") == 1

            # a model broken by hand is refused and the one in use stays; removing it goes back to the shipped model
            await set_model(cluster, "{not json")

            async def refused() -> dict | None:
                m = await scrape(op.metrics_port)
                return m if gauge(m, "gnnsched_predictor_model_reloads_total", result="invalid") == 1 else None

            m = await wait_for(refused, 20, what="the broken model to be refused")
            assert gauge(m, "gnnsched_predictor_model_training_rows") == 24
            assert op.predictor_reloader.digest == digest(stored)
            await set_model(cluster, None)

            async def removed() -> dict | None:
                m = await scrape(op.metrics_port)
                return m if gauge(m, "gnnsched_predictor_model_reloads_total", result="removed") == 1 else None

            m = await wait_for(removed, 20, what="the shipped model to return")
            assert gauge(m, "gnnsched_predictor_model_training_rows") == 0
            assert op.predictor_reloader.digest is None
