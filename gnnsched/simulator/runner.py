"""Turn a workload into costed jobs and run it under each policy: what ``gnnsched simulate`` does.

The same :class:`~gnnsched.simulator.model.SimJob` list is replayed under every policy, so differences between
policies are the policies' alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from gnnsched.simulator.adapters import Integrations
from gnnsched.simulator.cluster import ClusterSpec
from gnnsched.simulator.costs import STARTUP_S
from gnnsched.simulator.engine import RunResult, Simulation
from gnnsched.simulator.faults import (
    BASELINE_BACKOFF_LIMIT,
    NO_ERROR,
    NO_FAULTS,
    EstimateError,
    FaultModel,
    LoopBooks,
    buggy_points,
    true_multipliers,
)
from gnnsched.simulator.metrics import JCT_STATS, common_jct_stats, completed_jcts, summarise
from gnnsched.simulator.model import JobProfile, SimJob
from gnnsched.simulator.policyspec import PLACEMENT_ONLY, PolicyError, PolicySpec
from gnnsched.simulator.runtime_error import (
    NO_RUNTIME_ERROR,
    RuntimeErrorDist,
    as_oracle,
    oracle_gap,
    runtime_multipliers,
    with_true_runtimes,
)
from gnnsched.simulator.workload_types import Workload
from gnnsched.trust.domain import DEFAULT_TRUST_DOMAIN

MAX_EPOCHS = 1_000_000


@dataclass
class Report:
    """One ``simulate`` invocation's results."""

    workload: str
    cluster: str
    seed: int
    jobs: int
    policies: dict[str, dict[str, Any]]
    results: dict[str, RunResult] = field(default_factory=dict)
    reference: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    closed_loop: dict[str, Any] = field(default_factory=dict)  # {"estimate_error", "hw_fault_rate", ...} when on
    # --runtime-error: {"dist", "oracle": the same run's figures with exact predictions, "gap": per-policy ratios}
    runtime_error: dict[str, Any] = field(default_factory=dict)
    oracle_results: dict[str, RunResult] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        doc = {"workload": self.workload, "cluster": self.cluster, "seed": self.seed, "jobs": self.jobs,
               "policies": self.policies, "reference": self.reference, "notes": self.notes}
        if self.closed_loop:
            doc["closed_loop"] = self.closed_loop
        if self.runtime_error:
            doc["runtime_error"] = self.runtime_error
        return doc


def materialise(workload: Workload, cluster: ClusterSpec, ix: Integrations, *, scaling: bool,
                startup_s: float = STARTUP_S, progress: Callable[[int, int], None] | None = None) -> list[SimJob]:
    """Cost every job on every GPU model of ``cluster`` (estimator, runtime prior, interference profile)."""
    models = sorted({n.gpu_model for n in cluster.nodes if n.gpus})
    ref = models[0]
    jobs: list[SimJob] = []
    templates = workload.templates
    truncated = 0
    for i, t in enumerate(templates):
        if progress is not None:
            progress(i, len(templates))
        if t.spec is None:
            jobs.append(_trace_job(i, t, models))
            continue
        spec = t.spec
        target = t.labels.get("runtime_target")
        cores = t.cpu_milli / 1000
        stretch = 1.0
        if target is not None:
            one = ix.profile(spec, ref, cores)
            wanted = round(float(target) / max(one.solo_s, 1e-9))
            epochs = int(min(MAX_EPOCHS, max(1, wanted)))
            if wanted > MAX_EPOCHS:
                # A lifetime longer than the spec's largest epoch count can express: the job trains the same shape
                # for ``wanted`` epochs, so its runtimes (true and predicted) grow by wanted / MAX_EPOCHS. Cutting
                # them instead removed ~27 % of the resource-demand workload's core-hours (its longest jobs).
                truncated += 1
                stretch = wanted / MAX_EPOCHS
            spec = spec.model_copy(update={"epochs": epochs})
        profiles = {m: ix.profile(spec, m, cores) for m in models}
        if stretch != 1.0:
            profiles = {m: replace(p, solo_s=p.solo_s * stretch, predicted_s=p.predicted_s * stretch)
                        for m, p in profiles.items()}
        qos = None
        if t.qos_factor is not None:
            qos = t.qos_factor * (profiles[ref].solo_s + startup_s)
        scaled_cpu = scaled_mem = None
        factor = 1.0
        if scaling:
            scaled_cpu, scaled_mem, factor = ix.scale(spec, t.cpu_milli, t.memory_bytes, ref)
        jobs.append(SimJob(
            id=i, name=t.name, arrival=t.arrival, mode=spec.mode, cpu_milli=t.cpu_milli,
            memory_bytes=t.memory_bytes, profiles=profiles, spec=spec, qos_target_s=qos,
            backoff_limit=t.backoff_limit, scaled_cpu_milli=scaled_cpu, scaled_memory_bytes=scaled_mem,
            scaled_solo_factor=factor,
            labels=dict(t.labels),
        ))
    if truncated:
        workload.notes.append(f"{truncated} jobs need more than {MAX_EPOCHS} epochs (the spec's bound) to match their "
                              "trace lifetime; their runtime is stretched to the lifetime")
    if workload.reference.get("period_slots"):
        # GNNSched batches: arrival slot k happens at k * T, T = the queue's mean standalone time on the reference
        # GPU, so mean 1 task per slot loads one GPU running jobs one at a time to ~100 %.
        period = sum(j.profile(ref).solo_s + startup_s for j in jobs) / max(len(jobs), 1)
        if workload.reference.get("per_gpu"):  # the gen: family: slots of the mean job per GPU of the cluster
            period /= max(cluster.gpu_count, 1)
        jobs = [_with_arrival(j, j.arrival * period) for j in jobs]
    return jobs


def _with_arrival(job: SimJob, arrival: float) -> SimJob:
    from dataclasses import replace

    return replace(job, arrival=arrival)


def _trace_job(i: int, t: Any, models: list[str]) -> SimJob:
    from gnnsched.gpu.catalogue import get_gpu_model

    profiles = {}
    for m in models:
        total = get_gpu_model(m).memory_bytes
        share = min(1.0, t.gpu_milli / 1000) if t.gpu_milli else 0.0
        b = int(total * share)
        profiles[m] = JobProfile(admit_bytes=b, peak_bytes=b, solo_s=float(t.runtime_s or 0.0),
                                 predicted_s=float(t.runtime_s or 0.0), sm_util=share, intensity="memory")
    return SimJob(id=i, name=t.name, arrival=t.arrival, mode="pod", cpu_milli=t.cpu_milli,
                  memory_bytes=t.memory_bytes, profiles=profiles, num_gpus=t.num_gpus, gpu_milli=t.gpu_milli,
                  labels=dict(t.labels))


def run(workload: Workload, cluster: ClusterSpec, policies: list[PolicySpec], seed: int, ix: Integrations,
        *, startup_s: float = STARTUP_S, record_timeline: bool = True,
        progress: Callable[[str, int, int], None] | None = None, jobs: list[SimJob] | None = None,
        estimate_error: EstimateError = NO_ERROR, faults: FaultModel = NO_FAULTS,
        backoff_limit: int | None = None, runtime_error: RuntimeErrorDist = NO_RUNTIME_ERROR,
        engine: type[Simulation] = Simulation, trust_domain: str = DEFAULT_TRUST_DOMAIN) -> Report:
    """Cost the workload once, then simulate it under every policy (with ``estimate_error`` / ``faults``, the closed
    loop of :mod:`gnnsched.simulator.faults`: the same true peaks, hardware faults and buggy jobs for every policy).
    ``backoff_limit``: every job's; without it the workload's, except a closed-loop run's baselines, which get
    :data:`~gnnsched.simulator.faults.BASELINE_BACKOFF_LIMIT`. ``runtime_error``: the engine runs each job's true
    runtime while the policies see the prior's (:mod:`gnnsched.simulator.runtime_error`); the report then also holds
    the same run with exact predictions (``runtime_error["oracle"]``, ``oracle_results``). ``engine``: the simulation
    class; a what-if bench (``bench/fault_what_if.py``) passes a subclass that changes one rule, so that its figures
    differ from the system's by that rule alone. ``trust_domain``: whose jobs may share a GPU (``SimJob.namespace``,
    :mod:`gnnsched.trust.domain`; the chart's ``sharing.trustDomain``)."""
    placement_only = [p for p in policies if p.base in PLACEMENT_ONLY]
    if placement_only:
        if runtime_error.active:
            raise PolicyError("--runtime-error needs a simulated run, not the openb placement replay (best-fit, fgd)")
        return _run_openb(workload, cluster, policies, seed, progress)
    if jobs is None:
        jobs = materialise(workload, cluster, ix, scaling=any(p.scaling for p in policies), startup_s=startup_s,
                           progress=partial(progress, "costing jobs") if progress else None)
    if runtime_error.active:
        ref = sorted({n.gpu_model for n in cluster.nodes if n.gpus})[0]  # materialise's QoS reference
        truth = with_true_runtimes(jobs, runtime_multipliers(jobs, runtime_error, seed), qos_ref=ref,
                                   startup_s=startup_s)
        again = partial(run, workload, cluster, policies, seed, ix, startup_s=startup_s,
                        record_timeline=record_timeline, progress=progress, estimate_error=estimate_error,
                        faults=faults, backoff_limit=backoff_limit, engine=engine, trust_domain=trust_domain)
        report = again(jobs=truth)
        oracle = again(jobs=as_oracle(truth))
        report.oracle_results = oracle.results
        report.runtime_error = {"dist": runtime_error.text(), "oracle": oracle.policies,
                                "gap": oracle_gap(report.policies, oracle.policies)}
        return report
    if backoff_limit is not None:  # --backoff-limit: every job's, in place of the workload's
        jobs = [replace(j, backoff_limit=backoff_limit) for j in jobs]
    report = Report(workload=workload.name, cluster=cluster.name, seed=seed, jobs=len(jobs), policies={},
                    notes=list(workload.notes))
    if estimate_error.active or faults.active:
        report.closed_loop = {"estimate_error": estimate_error.text(), **faults.text()}
    multipliers = true_multipliers(jobs, estimate_error, seed) if estimate_error.active else {}
    buggy = buggy_points(jobs, faults.buggy_fraction, seed)
    baseline_jobs: list[SimJob] | None = None
    alone_jobs: list[SimJob] | None = None
    for spec in policies:
        loop = closed_loop_books(spec, cluster, estimate_error, faults, seed, multipliers, buggy)
        run_jobs = jobs
        if loop is None and spec.is_ours:
            # the closed loop's books plan it themselves (LoopBooks._admit); the open loop needs the operator's plan
            if alone_jobs is None:
                alone_jobs = whole_gpu_fallback(jobs, cluster)
            run_jobs = alone_jobs
        if loop is not None and not loop.gnnsched and backoff_limit is None:
            # a closed-loop baseline: a failed pod fails the job (faults.BASELINE_BACKOFF_LIMIT)
            if baseline_jobs is None:
                baseline_jobs = [replace(j, backoff_limit=BASELINE_BACKOFF_LIMIT) for j in jobs]
            run_jobs = baseline_jobs
        sim = engine(run_jobs, cluster, spec, ix, horizon=workload.horizon, max_clients=workload.max_clients,
                         startup_s=startup_s, record_timeline=record_timeline,
                         progress=partial(progress, spec.text) if progress else None, loop=loop,
                         trust_domain=trust_domain)
        result = sim.run()
        report.results[spec.text] = result
        report.policies[spec.text] = summarise(result)
    report.reference = compare_reference(workload, report.policies, report.results)
    return report


def whole_gpu_fallback(jobs: list[SimJob], cluster: ClusterSpec) -> list[SimJob]:
    """``jobs`` as the operator plans them for gnnsched: one whose reservation fits no GPU model of the cluster, but
    whose need (peak plus device overhead) fits a whole GPU, reserves that GPU's whole memory and so runs alone
    (``operator/planning.py``: ``exclusive``, issue 15). Without it the open-loop run left such a job pending
    forever while the real operator runs it, and its mean JCT was over one job fewer than a closed-loop run of the
    same policy, which does plan it so (``LoopBooks._admit``). Jobs that need no change are returned as they are.

    A job whose need itself exceeds the GPU, by less than ``closed_loop.MEASURED_OVERPREDICTION``, is tried alone by
    the operator (``PredictedPeakAboveGPU``) and by the closed loop's books; here it stays refused. Without errors its
    true peak is its prediction, so the real attempt would overrun and fail ``ExceedsLargestGPU`` either way; the few
    seconds that attempt holds an empty GPU (start-up and a first step) are not modelled."""
    capacity = gpu_capacity(cluster)
    out: list[SimJob] = []
    for job in jobs:
        models = [m for m in job.profiles if m in capacity]
        if not models or job.num_gpus != 1 \
                or any(job.profiles[m].admit_bytes <= capacity[m] for m in models):
            out.append(job)
            continue
        profiles = dict(job.profiles)
        for m in models:
            if profiles[m].peak_bytes <= capacity[m]:
                profiles[m] = replace(profiles[m], admit_bytes=capacity[m])
        out.append(replace(job, profiles=profiles))
    return out


def gpu_capacity(cluster: ClusterSpec) -> dict[str, int]:
    """GPU model -> what one job alone may use on it: its whole memory (the engine's GPUs carry no agent reserve)."""
    from gnnsched.gpu.catalogue import get_gpu_model

    return {get_gpu_model(n.gpu_model).name: get_gpu_model(n.gpu_model).memory_bytes for n in cluster.nodes if n.gpus}


def closed_loop_books(spec: PolicySpec, cluster: ClusterSpec, error: EstimateError, faults: FaultModel, seed: int,
                      multipliers: dict[int, float], buggy: dict[int, float] | None = None) -> LoopBooks | None:
    """The closed loop's books for one policy's run, or None when the run has neither errors nor faults (then the
    engine is the open-loop one, and every figure is what it was before the loop existed)."""
    if not error.active and not faults.active:
        return None
    capacity = gpu_capacity(cluster)
    mode = "baseline" if not spec.is_ours else ("gnnsched" if spec.calibration else "calib-off")
    return LoopBooks(error=error, fault_model=faults, seed=seed, mode=mode, largest_bytes=max(capacity.values()),
                     capacity=capacity, multipliers=dict(multipliers), buggy=dict(buggy or {}))


def _run_openb(workload: Workload, cluster: ClusterSpec, policies: list[PolicySpec], seed: int,
               progress: Callable[[str, int, int], None] | None) -> Report:
    """FGD's saturation experiment (see :mod:`gnnsched.simulator.openb`) for placement-only policies."""
    from gnnsched.simulator.openb import Pod, replay

    bad = [p.text for p in policies if p.base not in PLACEMENT_ONLY]
    if bad:
        raise PolicyError(f"{', '.join(bad)} cannot run in the openb placement replay; use best-fit, fgd")
    pods = [Pod(t.cpu_milli, t.memory_bytes, t.num_gpus, t.gpu_milli) for t in workload.templates]
    if not pods:
        raise PolicyError("best-fit and fgd need a trace workload (--workload openb)")
    report = Report(workload=workload.name, cluster=cluster.name, seed=seed, jobs=len(pods), policies={})
    for spec in policies:
        out = replay(cluster, pods, spec.base, seed,
                     progress=partial(progress, spec.text) if progress else None)
        curve = out.pop("curve")
        report.policies[spec.text] = {
            "makespan_s": None, "jct_mean_s": None, "jct_p99_s": None, "queue_mean_s": None,
            "qos_violation_rate": None, "oom_kills": 0, "completed": None, "deployed": out["pods_placed"],
            "gpu_mem_util": out["gpu_allocated"], **out,
        }
        report.notes.append(f"{spec.text}: fragmentation curve (arrived, allocated, fragmented) = "
                            + ", ".join(f"({a:.2f},{b:.3f},{c:.3f})" for a, b, c in curve[::max(1, len(curve) // 8)]))
    return report


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def _best_of(metrics: dict[str, dict[str, Any]], metric: str | None, higher: bool,
             among: tuple[str, ...] | None = None,
             results: dict[str, RunResult] | None = None) -> dict[str, Any] | None:
    """gnnsched's best policy against the best other policy of the same run, on the workload's headline metric;
    with ``among``, against the best of those policies only (the paper's own, when the run has them). A paper's
    policy may be one of gnnsched's run in the paper's setting (CoGNN's LMCF is ``lmcf`` capped at the paper's 2
    workers): it then counts as the paper's, not as gnnsched's.

    A JCT figure is over the jobs a policy completed, so two policies' figures may be over different jobs (one that
    OOM-killed or left unfinished its longest jobs looks faster). With the runs' ``results``, the two picked policies
    are compared over the jobs both completed (the row's ``simulated`` and verdict; each one's own figure stays in
    ``metrics``); without them, a row whose job sets may differ says so in its ``note``."""
    from gnnsched.simulator.policyspec import parse_policy

    if not metric:
        return None
    paper = set(among or ())
    ours: dict[str, float] = {n: m[metric] for n, m in metrics.items()
                              if parse_policy(n).is_ours and n not in paper and m.get(metric) is not None}
    theirs: dict[str, float] = {n: m[metric] for n, m in metrics.items() if m.get(metric) is not None
                                and (n in paper if among is not None else not parse_policy(n).is_ours)}
    if not ours or not theirs:
        return None
    pick = max if higher else min
    a = pick(ours, key=ours.__getitem__)
    b = pick(theirs, key=theirs.__getitem__)
    value_a, value_b, note = ours[a], theirs[b], None
    if metric in JCT_STATS and results is not None and a in results and b in results:
        jcts_a, jcts_b = completed_jcts(results[a]), completed_jcts(results[b])
        if jcts_a.keys() != jcts_b.keys():
            common = common_jct_stats(results[a], results[b], metric)
            if common is None:
                return None  # no job both completed: nothing to compare
            value_a, value_b, both = common
            note = (f"over the {both} jobs both completed ({a} completed {len(jcts_a)}, {b} {len(jcts_b)}"
                    f"{_oom_note(metrics[b])}); each one's own {metric} is over its own jobs")
    elif metric in JCT_STATS:
        done_a, done_b = metrics[a].get("completed"), metrics[b].get("completed")
        if done_a is not None and done_b is not None and done_a != done_b:
            note = (f"{b} completed {done_b} jobs{_oom_note(metrics[b])}, {a} {done_a}: "
                    "the means are over different job sets")
    better = value_a > value_b if higher else value_a < value_b
    verdict = "better" if better else ("tie" if abs(value_a - value_b) <= 1e-9 * max(abs(value_b), 1) else "worse")
    claim = "gnnsched's best policy against the best other policy" if among is None else \
        "gnnsched's best policy against the paper's best policy"
    row = {"paper": "this run", "claim": claim, "against": "other" if among is None else "paper",
           "metric": metric, "compare": f"{a} vs {b}", "paper_value": None,
           "simulated": round(value_a / value_b, 4) if value_b else None, "unit": "x", "gnnsched_wins": better,
           "verdict": verdict}
    if note is not None:
        row["note"] = note
    return row


def _oom_note(m: dict[str, Any]) -> str:
    return f" ({m['oom_kills']} OOM kills)" if m.get("oom_kills") else ""


def compare_reference(workload: Workload, metrics: dict[str, dict[str, Any]],
                      results: dict[str, RunResult] | None = None) -> list[dict[str, Any]]:
    """The paper's headline figure beside the simulator's, for the policies of this run that it compares
    (``results``: the runs behind ``metrics``, so that gnnsched's best is compared over the jobs both completed)."""
    ref = workload.reference
    out: list[dict[str, Any]] = []
    if not ref:
        return out
    metric = str(ref.get("metric", ""))
    if "ratio" in ref:
        base, ours = ref["ratio"]
        if base in metrics and ours in metrics:
            val = _ratio(metrics[base].get(metric), metrics[ours].get(metric))
            out.append({"paper": ref["paper"], "claim": ref["paper_note"], "metric": metric,
                        "compare": f"{base} / {ours}", "paper_value": ref["paper_value"],
                        "simulated": round(val, 3) if val is not None else None, "unit": "x"})
    for base, ours, pct in ref.get("reduction", ()):
        if base in metrics and ours in metrics:
            a, b = metrics[base].get(metric), metrics[ours].get(metric)
            val = None if a in (None, 0) or b is None else 100.0 * (a - b) / a
            out.append({"paper": ref["paper"], "claim": ref["paper_note"], "metric": metric,
                        "compare": f"{ours} vs {base}", "paper_value": -pct,
                        "simulated": round(-val, 2) if val is not None else None, "unit": "%"})
    higher = ref.get("kind") == "percent higher"
    best = _best_of(metrics, metric, higher=higher, results=results)
    if best is not None:
        out.append(best)
    if ref.get("paper_policies"):
        vs_paper = _best_of(metrics, metric, higher=higher, among=tuple(ref["paper_policies"]), results=results)
        if vs_paper is not None:
            out.append(vs_paper)
    for base, ours, key, pct in ref.get("gain", ()):
        if base in metrics and ours in metrics:
            a, b = metrics[base].get(key), metrics[ours].get(key)
            val = None if a in (None, 0) or b is None else 100.0 * (b - a) / a
            out.append({"paper": ref["paper"], "claim": ref["paper_note"], "metric": key,
                        "compare": f"{ours} vs {base}", "paper_value": pct,
                        "simulated": round(val, 2) if val is not None else None, "unit": "%"})
    return out
