"""The residual model's retraining rule (gnnsched.predictor.retrain) and the ConfigMap layout it is kept in
(gnnsched.predictor.store): enough new jobs, the newest held out, a worse candidate kept out."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from history_seed import records

from gnnsched.predictor.gnn import GNNRuntimePredictor
from gnnsched.predictor.retrain import RetrainOutcome, RetrainPolicy, history_through, retrain
from gnnsched.predictor.store import (
    MODEL_KEY,
    RETRAIN_ANNOTATION,
    digest,
    last_retrain,
    parse_model,
    store_patch,
    stored_model_text,
)

NOW = datetime(2026, 11, 27, 8, 0, tzinfo=timezone.utc)
SMALL = {"n_estimators": 40, "max_depth": 2, "learning_rate": 0.2, "min_child_weight": 1.0}


def test_too_few_new_jobs_skip_the_run() -> None:
    outcome, model = retrain(records(0, 19, 3.0), GNNRuntimePredictor.load_default(), NOW, RetrainPolicy(),
                             SMALL)
    assert model is None and outcome.outcome == "skipped" and outcome.new_jobs == 19
    assert "19 jobs finished since the model in use was trained; retraining needs 20" in outcome.message


def test_a_candidate_that_learns_the_bias_is_adopted_with_its_held_out_error_and_counts_only_newer_jobs() -> None:
    """30 jobs that ran 3x the shipped prediction: the newest 6 are held out, the candidate trains on 24 and
    predicts them within a few percent, where the shipped model is off by 2/3 of every runtime (WMAPE 0.667)."""
    history = records(0, 30, 3.0)
    outcome, model = retrain(history, GNNRuntimePredictor.load_default(), NOW, RetrainPolicy(), SMALL)
    assert outcome.outcome == "adopted" and model is not None, outcome
    assert (outcome.held_out_rows, outcome.new_jobs, model.training["rows"]) == (6, 30, 24)
    assert outcome.current_wmape == pytest.approx(2 / 3, abs=1e-3)
    assert outcome.candidate_wmape is not None and outcome.candidate_wmape < 0.05
    assert model.training["held_out"]["n"] == 6
    assert model.training["held_out"]["wmape"] == pytest.approx(outcome.candidate_wmape, abs=1e-6)
    assert model.training["trained_at"] == "2026-11-27T08:00:00Z"
    assert history_through(model) == history[-1].finished_at  # the newest job this run looked at
    # the next run counts only jobs finished since: none yet, then 20 more
    again, _ = retrain(history, model, NOW, RetrainPolicy(), SMALL)
    assert (again.outcome, again.new_jobs) == ("skipped", 0)
    later, newer = retrain(history + records(30, 20, 3.0), model, NOW, RetrainPolicy(), SMALL)
    assert later.new_jobs == 20 and later.held_out_rows == 5 and later.outcome in ("adopted", "rejected")


def test_a_worse_candidate_is_kept_out() -> None:
    """The model in use learnt 3x. Then 24 jobs ran 20x (a slow period) and the newest 6 ran 3x again: the candidate,
    trained on a majority of 20x jobs, predicts the held-out ones far worse, and is not adopted."""
    in_use = retrain(records(0, 20, 3.0), GNNRuntimePredictor.load_default(), NOW, RetrainPolicy(), SMALL)[1]
    assert in_use is not None
    history = records(0, 20, 3.0) + records(20, 24, 20.0) + records(44, 6, 3.0)
    outcome, model = retrain(history, in_use, NOW, RetrainPolicy(), SMALL)
    assert model is None and outcome.outcome == "rejected", outcome
    assert outcome.held_out_rows == 6 and outcome.new_jobs == 30
    assert outcome.current_wmape is not None and outcome.candidate_wmape is not None
    assert outcome.candidate_wmape > outcome.current_wmape
    assert "worse than the model in use's" in outcome.message and "the model in use stays" in outcome.message


def test_too_little_left_to_train_on_is_skipped_not_an_error() -> None:
    outcome, model = retrain(records(0, 12, 3.0), GNNRuntimePredictor.load_default(), NOW,
                             RetrainPolicy(min_new_jobs=10, min_holdout=5), SMALL)
    assert model is None and outcome.outcome == "skipped" and "training needs 10" in outcome.message


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"holdout_fraction": 1.0}, "holdout_fraction: 1.0 must be between 0 and 1"),
    ({"min_new_jobs": 3}, "min_new_jobs: 3 must be at least min_holdout (5)"),
    ({"min_holdout": 0}, "min_holdout: 0 must be at least 1"),
])
def test_policy_rejects_bad_numbers_naming_the_field(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        RetrainPolicy(**kwargs)


def test_the_configmap_keeps_the_model_only_when_adopted_and_the_outcome_always() -> None:
    model = retrain(records(0, 20, 3.0), GNNRuntimePredictor.load_default(), NOW, RetrainPolicy(), SMALL)[1]
    assert model is not None
    rejected = RetrainOutcome(outcome="rejected", at=NOW, message="worse", history_rows=50, new_jobs=30,
                              held_out_rows=6, candidate_wmape=1.2, current_wmape=0.1)
    patch = store_patch(rejected, None)
    assert "data" not in patch  # the model in use is untouched
    configmap = {"metadata": patch["metadata"], "data": {}}
    assert last_retrain(configmap) == rejected and stored_model_text(configmap) is None
    adopted = store_patch(rejected.model_copy(update={"outcome": "adopted"}), model)
    text = adopted["data"][MODEL_KEY]
    assert parse_model(text, "configmap x/y").to_dict() == model.to_dict()
    assert len(text) < 256 * 1024 and digest(text) != digest(text + " ")
    assert last_retrain({"metadata": {"annotations": {RETRAIN_ANNOTATION: "{not json"}}}) is None


@pytest.mark.parametrize(("text", "message"), [
    ("{not json", "configmap gs/model: model.json is not JSON"),
    (json.dumps({"kind": "something else"}), "configmap gs/model: model.json: not a GNN runtime model"),
])
def test_a_broken_stored_model_is_an_error_naming_the_configmap(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_model(text, "configmap gs/model")
