"""``gnnsched predictor``: train, evaluate and apply the runtime models.

Imports stay light (typer only); numpy, xgboost and scikit-learn load inside the commands, so ``gnnsched --help``
is unaffected. Every input error — a CSV with a missing column or a bad cell, an empty file, a broken history line,
a model file that is not one — ends as one line on stderr and exit status 2.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from gnnsched.cliutil import fail, user_errors

if TYPE_CHECKING:  # the models import xgboost and torch: loaded by the command that needs them
    from gnnsched.predictor.gnn import GNNRuntimePredictor
    from gnnsched.predictor.requests_model import RequestsRuntimeModel

app = typer.Typer(
    name="predictor",
    help="Runtime prediction (XGBoost on openb requests; GNNJob prior x residual) and adaptive CPU/memory scaling.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _emit(data: dict[str, Any], as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(data, indent=2, sort_keys=True))
        return
    for key, value in data.items():
        typer.echo(f"{key}: {json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else value}")


def _load_pods(paths: list[Path]) -> Any:
    from gnnsched.traces import PodTable, TraceError, load_openb_pods

    try:
        tables = [load_openb_pods(p) for p in paths]
    except TraceError as exc:
        fail(str(exc))
    return PodTable.concat(tables).deduplicated()


PARAM_TYPES = {"max_depth": int, "n_estimators": int, "learning_rate": float, "min_child_weight": float}


def _parse_params(text: str | None) -> dict[str, Any] | None:
    """``--params`` JSON -> checked dict (known keys, positive numbers of the right type)."""
    if text is None:
        return None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        fail(f"--params: not JSON: {exc.msg}")
    if not isinstance(raw, dict):
        fail("--params: must be a JSON object")
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in PARAM_TYPES:
            fail(f"--params: unknown key {key!r} (known: {', '.join(PARAM_TYPES)})")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            fail(f"--params: {key} must be a positive number, got {value!r}")
        if PARAM_TYPES[key] is int and value != int(value):
            fail(f"--params: {key} must be a whole number, got {value!r}")
        out[key] = PARAM_TYPES[key](value)
    defaults = {"max_depth": 2, "n_estimators": 100, "learning_rate": 0.05, "min_child_weight": 1.0}
    return {**defaults, **out}


@app.command()
def train(
    data: list[Path] | None = typer.Option(
        None, "--data", help="openb pod CSV(s) (Succeeded/Failed pods are the labels)."
    ),
    from_history: Path | None = typer.Option(
        None, "--from-history", help="GNNJob history JSONL (retrains the GNN residual)."
    ),
    out: Path | None = typer.Option(None, "--out", help="Where to write the model (JSON)."),
    model_configmap: str | None = typer.Option(
        None, "--model-configmap",
        help="NAMESPACE/NAME of the ConfigMap holding the GNN model in use (with --from-history, instead of --out): "
             "retrain when --min-new-jobs finished since that model was trained, and store the candidate only if "
             "its error on the newest jobs is not worse. Exit 3 when it is worse (the model in use stays).",
    ),
    min_new_jobs: int = typer.Option(
        20, "--min-new-jobs", min=1, help="With --model-configmap: jobs finished since the model in use was trained "
                                          "needed to retrain (fewer: skipped, exit 0)."
    ),
    holdout_fraction: float = typer.Option(
        0.2, "--holdout-fraction",
        help="With --model-configmap: share of the new jobs (the newest; at least 5) both models are scored on.",
    ),
    params: str | None = typer.Option(
        None,
        "--params",
        help='Fixed hyper-parameters as JSON (e.g. \'{"max_depth": 2, "n_estimators": 100}\'); default: time-ordered '
             'CV search (--data) or built-in (--from-history).',
    ),
    kubeconfig: str | None = typer.Option(
        None, "--kubeconfig", help="With --model-configmap: kubeconfig file (default: in-cluster, then $KUBECONFIG)."
    ),
    context: str | None = typer.Option(None, "--context", help="With --model-configmap: kubeconfig context."),
    as_json: bool = typer.Option(False, "--json", help="Print the training summary as JSON."),
) -> None:
    """Train the requests-only model on openb CSVs (--data), or the GNN residual on the cluster's history
    (--from-history). Hyper-parameters of the requests model are chosen by time-ordered CV on the given rows."""
    with user_errors():
        if bool(data) == (from_history is not None):
            fail("give exactly one of --data CSV... or --from-history FILE")
        if (out is None) == (model_configmap is None):
            fail("give exactly one of --out FILE or --model-configmap NAMESPACE/NAME")
        if model_configmap is not None and from_history is None:
            fail("--model-configmap: retrains the GNN model, so it needs --from-history FILE")
        fixed = _parse_params(params)
        if model_configmap is not None:
            _retrain_into_configmap(from_history, model_configmap, min_new_jobs, holdout_fraction,  # type: ignore[arg-type]
                                    fixed, kubeconfig, context, as_json)
            return
        model: RequestsRuntimeModel | GNNRuntimePredictor  # one of two model kinds, each saved as its own JSON
        if data:
            from gnnsched.predictor.requests_model import RequestsRuntimeModel

            table = _load_pods(list(data))
            try:
                model = RequestsRuntimeModel.fit(table, params=fixed, sources=tuple(str(p) for p in data))
            except ValueError as exc:
                fail(f"--data: {exc}")
            summary = {"kind": "requests", "rows": model.training["rows"], "params": model.params,
                       "in_sample": model.training["in_sample"], "importance": model.importance}
        else:
            from gnnsched.predictor.gnn import GNNRuntimePredictor
            from gnnsched.predictor.history import HistoryError, load_history

            try:
                records = load_history(from_history)  # type: ignore[arg-type]
                model = GNNRuntimePredictor.fit_history(records, params=fixed, source=str(from_history))
            except (HistoryError, ValueError) as exc:
                fail(f"--from-history: {exc}")
            summary = {"kind": "gnn", "rows": model.training["rows"], "in_sample": model.training["in_sample"],
                       "prior_only": model.training["prior_only"], "importance": model.importance}
        try:
            model.save(out)  # type: ignore[arg-type]
        except OSError as exc:
            fail(f"--out: cannot write {out}: {exc.strerror or exc}")
        summary["out"] = str(out)
        _emit(summary, as_json)


#: Exit status of a retrain whose candidate was worse than the model in use: the CronJob's Job is marked failed, so
#: ``kubectl get jobs`` and the usual KubeJobFailed alert show it.
EXIT_REJECTED = 3


def _retrain_into_configmap(history: Path, target: str, min_new_jobs: int, holdout_fraction: float,
                            params: dict[str, Any] | None, kubeconfig: str | None, context: str | None,
                            as_json: bool) -> None:
    """The retrain CronJob's run (``gnnsched.predictor.retrain`` has the rule, ``store`` the ConfigMap's layout)."""
    from datetime import datetime, timezone

    from gnnsched.predictor.gnn import GNNRuntimePredictor
    from gnnsched.predictor.history import HistoryError, load_history
    from gnnsched.predictor.retrain import RetrainPolicy, retrain
    from gnnsched.predictor.store import ModelConfigMap, StoreError, parse_model, store_patch, stored_model_text

    namespace, _, name = target.partition("/")
    if not namespace or not name or "/" in name:
        fail(f"--model-configmap: {target!r} must be NAMESPACE/NAME")
    try:
        policy = RetrainPolicy(min_new_jobs=min_new_jobs, holdout_fraction=holdout_fraction)
    except ValueError as exc:
        field = str(exc).split(":", 1)[0]
        fail(f"--{field.replace('_', '-')}: {str(exc).split(': ', 1)[1]}")
    try:
        records = load_history(history, allow_empty=True)
    except HistoryError as exc:
        fail(f"--from-history: {exc}")
    try:
        store = ModelConfigMap(namespace, name, kubeconfig, context)
    except Exception as exc:  # noqa: BLE001 - kubeconfig missing or unreadable
        fail(f"--kubeconfig: {exc}")
    try:
        configmap = store.read()
        text = stored_model_text(configmap)
        current, in_use = GNNRuntimePredictor.load_default(), "the shipped model"
        if text is not None:
            try:
                current, in_use = parse_model(text, f"configmap {target}"), f"configmap {target}"
            except ValueError as exc:  # the operator refuses it too and predicts with the shipped model
                typer.echo(f"warning: {exc}; comparing against the shipped model, which the operator uses", err=True)
        try:
            outcome, adopted = retrain(records, current, datetime.now(timezone.utc), policy, params,
                                       source=f"history of {len(records)} jobs ({history})")
        except ValueError as exc:
            fail(f"--from-history: {exc}")
        try:
            patch = store_patch(outcome, adopted)
        except ValueError as exc:
            fail(f"--params: {exc}")
        store.write(patch, configmap)
    except StoreError as exc:
        fail(f"--model-configmap: {exc}", code=1)
    finally:
        store.close()
    summary = {**outcome.model_dump(mode="json"), "model_in_use": in_use, "configmap": target}
    if adopted is not None:
        summary["trained_rows"] = adopted.training["rows"]
    _emit(summary, as_json)
    if not as_json:
        typer.echo(outcome.message, err=True)
    if outcome.outcome == "rejected":
        raise typer.Exit(EXIT_REJECTED)


@app.command()
def evaluate(
    data: Path = typer.Option(..., "--data", help="openb pod CSV to score on."),
    model: str | None = typer.Option(
        None,
        "--model",
        help="A trained requests model file, or 'default' for the shipped one; without it: train one on the earlier "
             "part of --data.",
    ),
    train_data: list[Path] | None = typer.Option(
        None,
        "--train-data",
        help="CSV(s) the baselines are fit on when --model is given (default: the model's own training files).",
    ),
    train_fraction: float = typer.Option(
        0.8, "--train-fraction", help="Without --model: share of finished pods (by creation time) to train on."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print n, mae, wmape, r2 and baselines as JSON."),
) -> None:
    """Score the XGBoost model against the random-forest and per-class-median baselines.

    Without --model: time-ordered split of --data (train on the earliest --train-fraction of finished pods, test on
    the rest). With --model: score that model on every finished pod of --data; baselines are fit on --train-data.
    r2 is on log-seconds; mae in seconds; wmape = sum|error| / sum(runtime)."""
    with user_errors():
        from gnnsched.predictor.evaluate import evaluate_model, evaluate_time_split

        table = _load_pods([data])
        if model is None:
            try:
                result = evaluate_time_split(table, train_fraction)
            except ValueError as exc:
                fail(f"--data: {exc}")
        else:
            from gnnsched.predictor.requests_model import RequestsRuntimeModel

            try:
                trained = (
                    RequestsRuntimeModel.load_default() if model == "default" else RequestsRuntimeModel.load(model)
                )
            except ValueError as exc:
                fail(f"--model: {exc}")
            sources = [Path(p) for p in (train_data or trained.training.get("data", []))]
            if not sources:
                fail("--train-data: required (the model does not record its training files)")
            try:
                result = evaluate_model(trained, _load_pods(sources), table)
            except ValueError as exc:
                fail(f"--data: {exc}")
            result["model"] = str(model)
            result["baselines_trained_on"] = [str(p) for p in sources]
        _emit(result, as_json)


@app.command()
def scale(
    job: Path = typer.Argument(..., help="GNNJob manifest (YAML)."),
    model: Path | None = typer.Option(
        None, "--model", help="GNN runtime model (default: the one shipped in the package)."
    ),
    gpu_model: str = typer.Option("A100-80GB", "--gpu-model", help="GPU model the runtime is predicted on."),
    theta: float | None = typer.Option(
        None, "--theta", help="Largest relative runtime change allowed (default: spec.scaling.theta)."
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print requested, scaled, predicted_runtime_seconds and importance as JSON."
    ),
) -> None:
    """Adaptive scaling (seed 004, Algorithm 1) of the job's CPU and memory request, never below its floor."""
    with user_errors():
        from gnnsched.gpu.catalogue import get_gpu_model
        from gnnsched.predictor.gnn import GNNRuntimePredictor
        from gnnsched.quantity import format_cpu, format_quantity_bytes
        from gnnsched.scaling import scale as do_scale
        from gnnsched.spec import load_job

        spec = load_job(job).spec
        try:
            gpu = get_gpu_model(gpu_model).name
        except KeyError as exc:
            fail(f"--gpu-model: {exc.args[0]}")
        if theta is not None and not 0 < theta <= 0.5:
            fail(f"--theta: {theta} must be in (0, 0.5]")
        try:
            predictor = GNNRuntimePredictor.load(model) if model else GNNRuntimePredictor.load_default()
        except ValueError as exc:
            fail(f"--model: {exc}")
        result = do_scale(spec, predictor=predictor, gpu_model=gpu, theta=theta)

        def res(r: Any) -> dict[str, Any]:
            return {"cpu": r.cpu, "memory": r.memory, "cpu_quantity": format_cpu(r.cpu),
                    "memory_quantity": format_quantity_bytes(r.memory)}

        _emit({
            "requested": res(result.requested), "scaled": res(result.scaled), "floor": res(result.floor),
            "predicted_runtime_seconds": {"before": result.predicted_runtime_before,
                                          "after": result.predicted_runtime_after},
            "importance": result.importance, "alpha": result.alpha, "reason": result.reason,
            "gpu_model": gpu, "model": str(model) if model else "default",
        }, as_json)
