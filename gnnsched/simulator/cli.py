"""``gnnsched simulate``: run a workload on a simulated cluster under several policies and compare them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from gnnsched.cliutil import UserError, fail, user_errors

if TYPE_CHECKING:  # the simulator's modules load on first use (the CLI starts without numpy's import cost)
    from gnnsched.simulator.adapters import Integrations
    from gnnsched.simulator.cluster import ClusterSpec
    from gnnsched.simulator.faults import EstimateError, FaultModel
    from gnnsched.simulator.policyspec import PolicySpec
    from gnnsched.simulator.runtime_error import RuntimeErrorDist
    from gnnsched.simulator.workload_types import Fits, Workload


def default_data_dir() -> Path:
    """``$GNNSCHED_DATA_DIR``, else ``../shared/data`` beside the checkout or the working directory."""
    env = os.environ.get("GNNSCHED_DATA_DIR")
    if env:
        return Path(env)
    here = Path(__file__).resolve().parents[2]
    for cand in (here.parent / "shared" / "data", Path.cwd().parent / "shared" / "data"):
        if cand.exists():
            return cand
    return here.parent / "shared" / "data"


def simulate(
    workload: str = typer.Option("", "--workload", "-w", help="Built-in workload name, a workload YAML file "
                                 "(list of GNNJob manifests with an 'arrival' key), or a seeded generated workload "
                                 "gen:KEY=VALUE,... with load (offered load x what one job per GPU serves, default "
                                 "0.7), arrival (burst, poisson), mix (train, mixed, infer), size (small, medium, "
                                 "large), jobs (default 40), burst (jobs per burst, default 10); e.g. "
                                 "gen:load=1.5,arrival=burst,mix=train,size=large. Default: cognn-mix."),
    cluster: str = typer.Option("", "--cluster", "-c", help="Built-in cluster (v100, a100, pai32, small, openb), "
                                "N[xG][xMODEL] such as 4x2xV100-32GB, or a YAML file. Default: the workload's."),
    policies: str = typer.Option("", "--policies", "-p", help="Comma-separated policies, e.g. "
                                 "exclusive,mps-naive,lmcf+scaling. Default: the workload's. Baselines: exclusive, "
                                 "srtf, drf, temporal, mps-naive, mps-base, sqtf-paper, bqt-paper (GNNSched's "
                                 "published SQTF/BQT: groups may exceed the GPU); gnnsched: base, lmcf, bmc, sqtf, "
                                 "bqt. Suffixes: +scaling, +uvm (MPS and -paper), -interference, +sjf[N] (gnnsched: "
                                 "pods carry runtime-bucket PriorityClasses, kube-scheduler's queue tries the "
                                 "shortest predicted first), +bypassN (gnnsched: the gate's backfill limit, "
                                 "node-agent --bypass-limit N; default 4, +bypass0 = strict policy order), "
                                 "+spread (gnnsched: the gate plans one pod per GPU per round, least loaded GPU "
                                 "first, node-agent --spread), +pays (gnnsched: a pod joins running pods only when "
                                 "that is predicted to finish sooner than waiting, node-agent --share-when-pays), "
                                 "@N."),
    seed: int = typer.Option(0, "--seed", help="Seed of the built-in workload generators."),
    json_out: Path | None = typer.Option(None, "--json", help="Write the metrics as JSON here."),
    plots: Path | None = typer.Option(None, "--plots", help="Write PNG plots (JCT CDF, utilisation, group memory)."),
    data_dir: Path | None = typer.Option(None, "--data-dir", help="The shared data folder (traces); "
                                         "default $GNNSCHED_DATA_DIR or ../shared/data."),
    list_workloads: bool = typer.Option(False, "--list", help="List built-in workloads and clusters and exit."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar on stderr."),
    estimate_error: str = typer.Option("none", "--estimate-error", help="Each job's true peak against its estimate: "
                                       "none, or lognormal:SIGMA[:BIAS] (true = estimate x BIAS x exp(N(0, SIGMA)), "
                                       "seeded by --seed). gnnsched policies retry larger and calibrate ('-calib' "
                                       "turns calibration off); baselines fail as Kubernetes does."),
    hw_fault_rate: float = typer.Option(0.0, "--hw-fault-rate", help="Hardware faults per GPU-hour (Poisson on wall "
                                        "time, busy and idle GPUs alike, seeded by --seed): every client on the GPU "
                                        "dies, no job is charged (gnnsched), the GPU is out for "
                                        "--hw-repair-seconds."),
    hw_repair_seconds: float = typer.Option(600.0, "--hw-repair-seconds", help="How long a GPU with a hardware fault "
                                            "stays out of the pool."),
    buggy_jobs: float = typer.Option(0.0, "--buggy-jobs", help="Fraction of jobs (seeded) that carry a deterministic "
                                     "application fault at a fixed point of their run, on every attempt."),
    checkpoint_every: float = typer.Option(0.0, "--checkpoint-every", help="gnnsched jobs save a checkpoint every "
                                           "this many seconds and a requeued attempt resumes from the last one (0: "
                                           "none, every attempt starts from step 0)."),
    checkpoint_write_seconds: float = typer.Option(0.06, "--checkpoint-write-seconds", help="What one save costs "
                                                   "the job, and what loading it costs a resumed attempt (default: "
                                                   "the largest save bench/checkpoint_cost.py measured)."),
    runtime_error: str = typer.Option("none", "--runtime-error", help="Each job's true runtime against its "
                                      "prediction: none (the oracle), lognormal:SIGMA[:BIAS] (true = predicted x "
                                      "BIAS x exp(N(0, SIGMA)), seeded by --seed) or measured (drawn per arch from "
                                      "the measured table's held-out residuals). The report adds the same run "
                                      "with exact predictions."),
    backoff_limit: int | None = typer.Option(None, "--backoff-limit", help="Every job's backoffLimit (0-10: failed "
                                             "pods a job survives) in place of the workload's (3 in the built-in "
                                             "generators; a workload file's spec.backoffLimit, default 0). "
                                             "Without it a closed-loop run's baselines get 0: a failed pod fails "
                                             "the job."),
) -> None:
    """Simulate a cluster of GPU nodes: arrivals, the operator's estimate, placement, node queues with grouping
    policies behind the memory-safety gate, MPS co-location with interference, completion. Prints a comparison."""
    from gnnsched.errors import FieldError
    from gnnsched.simulator.adapters import IntegrationMissing, Integrations
    from gnnsched.simulator.cluster import BUILTIN_CLUSTERS, ClusterError, parse_cluster
    from gnnsched.simulator.faults import parse_estimate_error, parse_faults
    from gnnsched.simulator.policyspec import PLACEMENT_ONLY, PolicyError, parse_policies
    from gnnsched.simulator.runtime_error import parse_runtime_error
    from gnnsched.simulator.workloads import (
        BUILTIN,
        DEFAULT_WORKLOAD,
        WorkloadError,
        default_cluster,
        is_file,
        resolve_workload,
    )

    if list_workloads:
        typer.echo("workloads:")
        for name, text in BUILTIN.items():
            typer.echo(f"  {name:24s} {text}")
        typer.echo("clusters:")
        for name, text in BUILTIN_CLUSTERS.items():
            typer.echo(f"  {name:24s} {text}")
        return
    data = data_dir or default_data_dir()
    with user_errors():
        try:
            name = workload or DEFAULT_WORKLOAD
            cl = parse_cluster(cluster or ("small" if is_file(name) else default_cluster(name)), data)
            ix = Integrations()
            wl = resolve_workload(name, seed, data, fits=fits_on(cl, ix))
            specs = parse_policies(policies or ",".join(wl.policies))
            error = parse_estimate_error(estimate_error)
            runtime = parse_runtime_error(runtime_error)
            faults = parse_faults(hw_fault_rate, hw_repair_seconds, buggy_jobs, checkpoint_every,
                                  checkpoint_write_seconds if checkpoint_every else 0.0)
            if backoff_limit is not None and not 0 <= backoff_limit <= 10:
                raise FieldError("--backoff-limit", f"{backoff_limit}: must be between 0 and 10")
            if runtime.active and any(p.base in PLACEMENT_ONLY for p in specs):
                raise PolicyError("--runtime-error needs a simulated run, not the openb placement replay "
                                  "(best-fit, fgd)")
            if (error.active or faults.active) and any(p.base in PLACEMENT_ONLY for p in specs):
                raise PolicyError("--estimate-error, --hw-fault-rate and --buggy-jobs need a simulated run, not "
                                  "the openb "
                                  "placement replay (best-fit, fgd)")
        except (ClusterError, PolicyError, WorkloadError, FieldError) as exc:
            raise UserError(str(exc)) from None
        except IntegrationMissing as exc:
            fail(f"integration: {exc}", code=3)
        if json_out is not None:
            if json_out.is_dir():
                raise UserError(f"--json: {json_out} is a directory")
            _writable_dir("--json", json_out.parent)
        if plots is not None:
            if plots.exists() and not plots.is_dir():
                raise UserError(f"--plots: {plots} exists and is not a directory")
            _writable_dir("--plots", plots)
    _run(wl, cl, specs, seed, json_out, plots, progress, ix, error, faults, backoff_limit, runtime)


def _writable_dir(flag: str, directory: Path) -> None:
    """Create an output folder and check it takes files before the run, not after minutes of simulation."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{flag}: cannot create {directory}: {exc.strerror or exc}") from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise UserError(f"{flag}: {directory} is not writable")


def fits_on(cluster: ClusterSpec, ix: Integrations) -> Fits | None:
    """Predicate for generators: the job's admit bytes fit the cluster's smallest GPU (it could run alone)."""
    from gnnsched.gpu.catalogue import get_gpu_model
    from gnnsched.spec import GNNJobSpec

    models = sorted({n.gpu_model for n in cluster.nodes if n.gpus}, key=lambda m: get_gpu_model(m).memory_bytes)
    if not models:
        return None
    smallest = get_gpu_model(models[0])

    def fits(spec: GNNJobSpec, share: float = 1.0) -> bool:
        return ix.profile(spec, smallest.name).admit_bytes <= share * smallest.memory_bytes

    return fits


def _run(
    wl: Workload, cl: ClusterSpec, specs: list[PolicySpec], seed: int, json_out: Path | None, plots: Path | None,
    show_progress: bool, ix: Integrations, error: EstimateError, faults: FaultModel, backoff_limit: int | None,
    runtime: RuntimeErrorDist,
) -> None:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

    from gnnsched.simulator.adapters import IntegrationMissing
    from gnnsched.simulator.report import render_table, write_json, write_plots
    from gnnsched.simulator.runner import run

    err = Console(stderr=True)
    err.print(f"workload {wl.name}: {wl.description}; cluster {cl.describe()}")
    with Progress(TextColumn("{task.description:>22}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=err, disable=not show_progress, transient=True) as bar:
        tasks: dict[str, TaskID] = {}

        def tick(name: str, done: int, total: int) -> None:
            if name not in tasks:
                tasks[name] = bar.add_task(name, total=total)
            bar.update(tasks[name], completed=done, total=total)

        try:
            report = run(wl, cl, specs, seed, ix, progress=tick, estimate_error=error, faults=faults,
                         backoff_limit=backoff_limit, runtime_error=runtime)
        except IntegrationMissing as exc:
            fail(f"integration: {exc}", code=3)
    typer.echo(render_table(report))
    try:  # checked before the run; a disk that fills or a folder removed since still gets one line, the table stands
        if json_out is not None:
            write_json(report, json_out)
            err.print(f"wrote {json_out}")
        if plots is not None:
            for path in write_plots(report, plots):
                err.print(f"wrote {path}")
    except OSError as exc:
        fail(f"writing {exc.filename or 'output'}: {exc.strerror or exc}", code=1)
