"""``gnnsched predictor`` end to end through the real typer app: JSON keys, files written, and one-line errors with
exit status 2 for bad CSVs, history files and models."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import pytest
from shared_data import OPENB_PODS
from typer.testing import CliRunner

from gnnsched.cli import app
from gnnsched.predictor.gnn import GNNRuntimePredictor
from gnnsched.predictor.requests_model import RequestsRuntimeModel

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
DEFAULT_CSV = OPENB_PODS
needs_traces = pytest.mark.skipif(not DEFAULT_CSV.is_file(), reason="shared/data/traces not present")
HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
)
METRIC_KEYS = {"n", "mae", "wmape", "r2"}

runner = CliRunner()


def _run(*args: str):
    return runner.invoke(app, ["predictor", *args])


def _assert_one_line_error(result, *fragments: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.output + result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def _small_csv(tmp_path: Path, rows: int = 60) -> Path:
    """A small real slice: the first ``rows`` finished pods of the openb default trace, header kept."""
    lines = DEFAULT_CSV.read_text().splitlines()
    finished = [line for line in lines[1:] if ",Succeeded," in line or ",Failed," in line][:rows]
    path = tmp_path / "slice.csv"
    path.write_text(lines[0] + "\n" + "\n".join(finished) + "\n")
    return path


@pytest.mark.parametrize(
    ("body", "fragments"),
    [
        (HEADER.replace("qos,", ""), ["header", "column 'qos'", "missing"]),
        (HEADER + "p0,1000,512,1,1000,,LS,Failed,0,10,0\np1,1000,512,1,x7,,LS,Failed,0,10,0\n",
         ["row 2", "column 'gpu_milli'", "'x7' is not a number"]),
        ("", ["file is empty"]),
    ],
)
@pytest.mark.parametrize("command", ["train", "evaluate"])
def test_bad_csv_is_one_line_exit_2(tmp_path: Path, body: str, fragments: list[str], command: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(body)
    args = ["--data", str(path)] + (["--out", str(tmp_path / "m.json")] if command == "train" else [])
    _assert_one_line_error(_run(command, *args), str(path), *fragments)


@needs_traces
def test_train_writes_a_loadable_model(tmp_path: Path) -> None:
    out = tmp_path / "m.json"
    result = _run("train", "--data", str(_small_csv(tmp_path, 120)), "--out", str(out), "--json",
                  "--params", '{"max_depth": 3, "n_estimators": 50}')
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["kind"] == "requests" and summary["rows"] == 120
    assert set(summary["importance"]) == {"cpu_cores", "memory_gib", "gpu_share", "num_gpu", "qos_rank"}
    model = RequestsRuntimeModel.load(out)
    assert model.training["rows"] == 120 and model.params == summary["params"]
    assert summary["params"] == {"max_depth": 3, "n_estimators": 50, "learning_rate": 0.05, "min_child_weight": 1.0}
    assert len(model.ensemble.trees) == 50


@needs_traces
def test_evaluate_with_model_reports_the_issue_keys(tmp_path: Path) -> None:
    model = tmp_path / "m.json"
    small = _small_csv(tmp_path, 200)
    assert _run("train", "--data", str(small), "--out", str(model), "--params", "{}").exit_code == 0
    result = _run("evaluate", "--model", str(model), "--data", str(DEFAULT_CSV), "--train-data", str(small), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert set(data) >= METRIC_KEYS and data["n"] == 1547
    assert set(data["baselines"]) == {"random_forest", "median"}
    for baseline in data["baselines"].values():
        assert set(baseline) >= METRIC_KEYS and baseline["n"] == 1547


def test_scale_json_keys_and_values() -> None:
    result = _run("scale", str(EXAMPLES / "gcn-train-cora.yaml"), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert {"requested", "scaled", "predicted_runtime_seconds", "importance"} <= set(data)
    assert data["requested"]["cpu"] == 4 and data["requested"]["memory_quantity"] == "8Gi"
    assert data["scaled"]["cpu"] <= 4 and data["scaled"]["memory"] <= 8 * 2**30
    assert set(data["predicted_runtime_seconds"]) == {"before", "after"}
    assert set(data["importance"]) == {"cpu", "memory"}


def test_scale_errors(tmp_path: Path) -> None:
    _assert_one_line_error(_run("scale", str(EXAMPLES / "gat-infer-parallel.yaml")), "spec.resources.cpu", "required")
    _assert_one_line_error(_run("scale", str(EXAMPLES / "gcn-train-cora.yaml"), "--gpu-model", "Voodoo5"),
                           "--gpu-model", "Voodoo5")
    _assert_one_line_error(_run("scale", str(EXAMPLES / "gcn-train-cora.yaml"), "--theta", "2"), "--theta")
    junk = tmp_path / "junk.json"
    junk.write_text("[]")
    _assert_one_line_error(_run("scale", str(EXAMPLES / "gcn-train-cora.yaml"), "--model", str(junk)),
                           "--model", "not a GNN runtime model")
    _assert_one_line_error(_run("scale", str(tmp_path / "absent.yaml")), "no such file")


def test_train_from_history_and_scale_with_it(tmp_path: Path) -> None:
    from datetime import datetime, timezone

    from gnnsched.predictor.history import HistoryRecord
    from gnnsched.runtime_prior import solo_runtime_seconds
    from gnnsched.spec import parse_spec

    lines = []
    for i, dataset in enumerate(["cora", "citeseer", "pubmed", "ogbn-arxiv", "proteins", "artist"] * 3):
        spec_dict = {
            "mode": "train",
            "model": {"arch": "gcn", "hidden": 32 * (1 + i % 4)},
            "graph": {"dataset": dataset},
            "epochs": 20 * (1 + i % 5),
            "resources": {"cpu": "4", "memory": "8Gi"},
        }
        observed = 2.0 * solo_runtime_seconds(parse_spec(spec_dict), "A100-80GB", 2.0)
        lines.append(HistoryRecord(
            spec=spec_dict, requested={"cpu": 4, "memory": "8Gi"}, scaled={"cpu": 2, "memory": "4Gi"},
            gpu_model="A100-80GB", observed_runtime_seconds=observed, finished_at=datetime.now(timezone.utc),
        ).to_json_line())
    history = tmp_path / "history.jsonl"
    history.write_text("\n".join(lines) + "\n")
    out = tmp_path / "gnn.json"
    result = _run("train", "--from-history", str(history), "--out", str(out), "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["kind"] == "gnn" and summary["rows"] == 18
    assert summary["in_sample"]["wmape"] < summary["prior_only"]["wmape"]
    assert GNNRuntimePredictor.load(out).residual is not None
    scaled = _run("scale", str(EXAMPLES / "gcn-train-cora.yaml"), "--model", str(out), "--json")
    assert scaled.exit_code == 0, scaled.output
    # A bad history line is one line naming file, line and field.
    history.write_text(lines[0] + "\n" + lines[1].replace('"gpu_model":"A100-80GB"', '"gpu_model":"nope"') + "\n")
    _assert_one_line_error(_run("train", "--from-history", str(history), "--out", str(out)),
                           str(history), "line 2", "gpu_model")


def test_train_needs_exactly_one_source_and_sane_params(tmp_path: Path) -> None:
    _assert_one_line_error(_run("train", "--out", str(tmp_path / "m.json")), "exactly one of")
    csv = tmp_path / "x.csv"
    csv.write_text(HEADER + "p0,1000,512,1,1000,,LS,Failed,0,10,0\n")
    for bad, fragment in (("{", "not JSON"), ("[]", "JSON object"), ('{"depth": 2}', "unknown key 'depth'"),
                          ('{"max_depth": -1}', "positive"), ('{"n_estimators": 2.5}', "whole number")):
        _assert_one_line_error(_run("train", "--data", str(csv), "--out", str(tmp_path / "m.json"), "--params", bad),
                               "--params", fragment)
    _assert_one_line_error(_run("train", "--data", str(csv), "--out", str(tmp_path / "m.json")),
                           "--data", "need at least 20 finished pods")


def test_retrain_into_a_configmap_names_each_bad_input_in_one_line(tmp_path: Path) -> None:
    """``train --model-configmap`` (the retrain CronJob): each mistake is one line naming the flag, before any API
    call; an API server that cannot be reached is exit 1 (the CronJob's Job fails and says why)."""
    history = tmp_path / "h.jsonl"
    history.write_text("")  # a cluster with no finished job yet: fine for the CronJob, a skip
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],  # the discard port: refused
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    target = ("--from-history", str(history), "--kubeconfig", str(kubeconfig))
    _assert_one_line_error(_run("train", *target, "--model-configmap", "ns/m", "--out", str(tmp_path / "m.json")),
                           "exactly one of --out FILE or --model-configmap")
    _assert_one_line_error(_run("train", "--data", str(history), "--model-configmap", "ns/m"),
                           "--model-configmap", "needs --from-history")
    _assert_one_line_error(_run("train", *target, "--model-configmap", "no-slash"),
                           "--model-configmap: 'no-slash' must be NAMESPACE/NAME")
    _assert_one_line_error(_run("train", *target, "--model-configmap", "ns/m", "--holdout-fraction", "1.5"),
                           "--holdout-fraction: 1.5 must be between 0 and 1")
    _assert_one_line_error(_run("train", *target, "--model-configmap", "ns/m", "--min-new-jobs", "3"),
                           "--min-new-jobs: 3 must be at least min_holdout (5)")
    history.write_text("{broken\n")
    _assert_one_line_error(_run("train", *target, "--model-configmap", "ns/m"), "--from-history", "line 1")
    history.write_text("")
    # A root handler on a closed stream, as an earlier CLI run in the same process can leave behind: a client that
    # retried would log each retry through it and print "--- Logging error ---" beside the one error line.
    closed = io.StringIO()
    handler = logging.StreamHandler(closed)
    closed.close()
    logging.getLogger().addHandler(handler)
    try:
        unreachable = _run("train", *target, "--model-configmap", "ns/m")
    finally:
        logging.getLogger().removeHandler(handler)
    assert unreachable.exit_code == 1, unreachable.output
    assert unreachable.stderr.strip().startswith("error: --model-configmap: cannot reach the API server")
    assert len(unreachable.stderr.strip().splitlines()) == 1
