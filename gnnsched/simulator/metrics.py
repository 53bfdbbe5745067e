"""Numbers from one run: the issue's JSON keys, plus the papers' other measures.

Definitions (the README repeats them):

* ``makespan_s``: last completion (or the horizon) minus the first arrival.
* ``jct_*``: completion minus arrival, over completed jobs. ``queue_mean_s``: first start minus arrival, over jobs
  that started.
* ``qos_violation_rate``: over jobs with a QoS target, the share that did not complete within it (failed and
  unfinished jobs count as violations).
* ``gpu_mem_util``: time-average of the bytes the running jobs really occupy over the cluster's GPU memory, within
  the makespan; ``sm_util`` the same for the modelled SM busy fraction (solo SM utilisation / slowdown, summed per
  GPU, capped at 1).
* ``deployed``: jobs that started at least once; ``completed``: jobs that finished; ``completion_rate``: the
  resource-demand paper's ``#done / (#done + #not done)`` over jobs that arrived.
* ``unallocated_gpus``: mean number of GPUs with nothing running while some job waits.
* ``memory_exceeded``: attempts that failed with CUDA out of memory inside their own MPS limit (gnnsched with
  ``--estimate-error``); ``resize_retries``: of those, the ones retried at a larger reservation.
* ``faults``: fatal faults, ``hw_faults`` of them hardware (``--hw-fault-rate``) and ``app_faults`` buggy jobs' own
  (``--buggy-jobs``); ``fault_victims``: clients killed by a fault they did not cause.
* ``jobs_lost``: innocent jobs (not buggy) that arrived, whose true peak fits a GPU alone, and that failed or were
  found unschedulable. ``buggy_jobs_failed``: buggy jobs that failed (under every policy they should);
  ``innocent_jobs_requeued``: innocent jobs requeued uncharged by a fault at least once (gnnsched's policies);
  ``innocent_jobs_alone``: of those, the ones the undecided rule sent to run alone (two undecided faults, usually
  beside the same buggy job; kept apart on their next attempts since issue 27, the culprit's next fault names it alone).
* ``hw_out_share``: the share of the run's GPU capacity (GPUs x run time) that hardware faults kept out of the pool
  (each fault's repair, cut at the run's end): the capacity every policy lost, whatever it schedules.
* ``failed_by_rule``: jobs a ``FailJob`` failure rule failed (``gnnsched.attempts.failure_policy``; by default a
  job whose own fault came at the same step twice). With ``--checkpoint-every``: ``lost_work_s``, solo-seconds of
  steps that ended attempts had done past their last save; ``kept_work_s``, those their saves kept (the refund).
* ``wasted_gpu_seconds``: seconds held on a GPU by attempts that did not complete (each co-located attempt counts its
  own; an attempt OOM-killed at its first allocation counts its start-up).
"""

from __future__ import annotations

from gnnsched.simulator.engine import RunResult


def _pct(sorted_vals: list[float], q: float) -> float:
    if not sorted_vals:
        return float("nan")
    k = (len(sorted_vals) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (k - lo)


def summarise(res: RunResult) -> dict[str, float | int | None]:
    outs = res.outcomes
    arrived = [o for o in outs if o.job.arrival <= res.end_time]
    done = [o for o in arrived if o.status == "completed"]
    jcts = sorted(o.jct for o in done if o.jct is not None)
    queues = [o.queue_time for o in arrived if o.queue_time is not None]
    first = min((o.job.arrival for o in outs), default=0.0)
    last = max((o.finish for o in done if o.finish is not None), default=first)
    makespan = (res.horizon - first) if res.horizon is not None else (last - first)
    span = max(res.end_time - first, 1e-9)
    with_qos = [o for o in arrived if o.job.qos_target_s is not None]
    violations = sum(1 for o in with_qos if o.jct is None or o.jct > (o.job.qos_target_s or 0.0) + 1e-9)
    deployed = sum(1 for o in arrived if o.ran)
    return {
        "makespan_s": round(makespan, 3),
        **{metric: jct_stat(jcts, metric) for metric in JCT_STATS},
        "queue_mean_s": _r(sum(queues) / len(queues)) if queues else None,
        "qos_violation_rate": _r(violations / len(with_qos), 4) if with_qos else None,
        "oom_kills": sum(o.oom_kills for o in outs),
        "failed": sum(1 for o in outs if o.status == "failed"),
        "unschedulable": sum(1 for o in outs if o.status == "unschedulable"),
        "arrived": len(arrived),
        "deployed": deployed,
        "completed": len(done),
        "completion_rate": _r(len(done) / len(arrived), 4) if arrived else None,
        "gpu_mem_util": _r(res.gpu_mem_area / (res.gpu_mem_capacity * span), 4),
        "sm_util": _r(res.sm_area / (res.gpu_count * span), 4),
        "cpu_alloc_util": _r(res.cpu_alloc_area / (res.cpu_capacity * span), 4),
        "mem_alloc_util": _r(res.mem_alloc_area / (res.mem_capacity * span), 4),
        "unallocated_gpus": _r(res.idle_gpu_waiting_area / res.waiting_time, 3) if res.waiting_time > 0 else 0.0,
        "max_slowdown": _r(max((o.slowdown_max for o in outs), default=1.0), 3),
        "gate_checks": res.gate_checks,
        # the closed loop (gnnsched.simulator.faults); 0 without its options, except that
        # wasted_gpu_seconds and jobs_lost also count OOM kills and failures of the open-loop run
        "memory_exceeded": int(res.extra.get("memory_exceeded", 0)),
        "resize_retries": int(res.extra.get("resize_retries", 0)),
        "faults": int(res.extra.get("faults", 0)),
        "fault_victims": int(res.extra.get("fault_victims", 0)),
        "jobs_lost": int(res.extra.get("jobs_lost", 0)),
        "buggy_jobs_failed": int(res.extra.get("buggy_jobs_failed", 0)),
        "innocent_jobs_requeued": int(res.extra.get("innocent_jobs_requeued", 0)),
        "innocent_jobs_alone": int(res.extra.get("innocent_jobs_alone", 0)),
        "hw_faults": int(res.extra.get("hw_faults", 0)),
        "app_faults": int(res.extra.get("app_faults", 0)),
        "hw_out_share": _r(res.extra.get("hw_out_share", 0.0), 4),
        "wasted_gpu_seconds": _r(res.extra.get("wasted_gpu_seconds", 0.0), 1),
        # the failure rules (gnnsched.attempts.failure_policy) and checkpoints (--checkpoint-every): closed-loop runs
        **({"failed_by_rule": int(res.extra["failed_by_rule"])} if "failed_by_rule" in res.extra else {}),
        **({"lost_work_s": _r(res.extra["lost_work_s"], 1), "kept_work_s": _r(res.extra["kept_work_s"], 1)}
           if "kept_work_s" in res.extra else {}),
        # the runtime loop (+rtcal, +progress; gnnsched.simulator.runtime_loop): only in runs that keep it
        **({"slowdown_samples": int(res.extra["slowdown_samples"])} if "slowdown_samples" in res.extra else {}),
        **({"runtime_samples": int(res.extra["runtime_samples"]),
            "runtime_replans": int(res.extra.get("runtime_replans", 0))}
           if "runtime_samples" in res.extra else {}),
    }


JCT_STATS = {"jct_mean_s": None, "jct_median_s": 0.5, "jct_p90_s": 0.9, "jct_p99_s": 0.99}
"""The JCT figures of :func:`summarise`: a mean (None) or the quantile each one is."""


def completed_jcts(res: RunResult) -> dict[int, float]:
    """Job id -> JCT of the jobs that arrived within the run and completed (what the ``jct_*`` figures are over)."""
    return {o.job.id: o.jct for o in res.outcomes
            if o.job.arrival <= res.end_time and o.status == "completed" and o.jct is not None}


def common_jct_stats(a: RunResult, b: RunResult, metric: str) -> tuple[float, float, int] | None:
    """``metric`` of each run over the jobs both completed, and how many those are; None when there are none. Why:
    each run's own JCT figures are over its own completed jobs, and two runs that completed different jobs (one
    OOM-killed or refused some) compare different sets."""
    jcts_a, jcts_b = completed_jcts(a), completed_jcts(b)
    both = sorted(jcts_a.keys() & jcts_b.keys())
    stat_a = jct_stat([jcts_a[i] for i in both], metric)
    stat_b = jct_stat([jcts_b[i] for i in both], metric)
    if stat_a is None or stat_b is None:
        return None
    return stat_a, stat_b, len(both)


def jct_stat(jcts: list[float], metric: str) -> float | None:
    """``metric`` (one of :data:`JCT_STATS`) over ``jcts``, rounded as :func:`summarise` rounds it."""
    if not jcts:
        return None
    q = JCT_STATS[metric]
    return _r(sum(jcts) / len(jcts)) if q is None else _r(_pct(sorted(jcts), q))


def _r(x: float, nd: int = 3) -> float:
    return round(float(x), nd)
