"""The only place the simulator calls gnnsched's own decision functions.

What the simulator measures must be what runs in a cluster, so it never re-implements a decision:

======================  ===================================================  =====================================
simulator needs          core function                                        owner (branch)
======================  ===================================================  =====================================
peak memory, admit       ``gnnsched.estimator.estimate``                      estimator
solo runtime             ``gnnsched.runtime_prior.solo_runtime_seconds``      predictor
intensity class          ``gnnsched.runtime_prior.arithmetic_intensity``      predictor
right-sized requests     ``gnnsched.scaling.scale``                           predictor
co-location slowdown     ``gnnsched.interference``                            extender
node filter / score      the extender's pure filter and score functions       extender
grouping, gate check     ``gnnsched.policies``                                nodeagent
======================  ===================================================  =====================================

Each is imported lazily; when one is not on this branch yet, the call raises :class:`IntegrationMissing` (a
``NotImplementedError``) naming the function and the branch, so a run fails loudly instead of silently simulating a
stand-in.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from gnnsched.simulator.model import JobProfile, SimJob


class IntegrationMissing(NotImplementedError):
    """A core function the simulator needs is not on this branch yet."""

    def __init__(self, what: str, owner: str, detail: str = "") -> None:
        msg = f"{what} is not available yet (owned by helper '{owner}')"
        super().__init__(f"{msg}: {detail}" if detail else msg)
        self.what = what
        self.owner = owner


def _import(module: str, attr: str, owner: str) -> Any:
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        raise IntegrationMissing(f"{module}.{attr}", owner, str(exc)) from None
    try:
        return getattr(mod, attr)
    except AttributeError:
        raise IntegrationMissing(f"{module}.{attr}", owner, f"{module} has no attribute {attr!r}") from None


def integration_status() -> dict[str, str]:
    """Which integrations import on this branch: name -> "ok" or the reason it does not."""
    wanted = {
        "estimator.estimate": ("gnnsched.estimator", "estimate", "estimator"),
        "runtime_prior.solo_runtime_seconds": ("gnnsched.runtime_prior", "solo_runtime_seconds", "predictor"),
        "runtime_prior.arithmetic_intensity": ("gnnsched.runtime_prior", "arithmetic_intensity", "predictor"),
        "scaling.scale": ("gnnsched.scaling", "scale", "predictor"),
        "interference": ("gnnsched.interference", "__name__", "extender"),
        "policies": ("gnnsched.policies", "__name__", "nodeagent"),
    }
    status = {}
    for name, (module, attr, owner) in wanted.items():
        try:
            _import(module, attr, owner)
            status[name] = "ok"
        except IntegrationMissing as exc:
            status[name] = str(exc)
    return status


@dataclass
class Integrations:
    """Bound calls into the core for one simulation session.

    ``memo`` caches per-spec work (the estimator traces the real model, 25-140 ms) for this instance only; nothing is
    kept at module level.
    """

    memo: dict = field(default_factory=dict)

    # ------------------------------------------------------------------ loaded lazily
    def _interference(self) -> Any:
        model = self.memo.get("interference")
        if model is None:
            model = _import("gnnsched.interference", "load_default", "extender")()
            self.memo["interference"] = model
        return model

    def _policies(self) -> Any:
        mod = self.memo.get("policies")
        if mod is None:
            _import("gnnsched.policies", "plan_admissions", "nodeagent")
            mod = importlib.import_module("gnnsched.policies")
            self.memo["policies"] = mod
        return mod

    # ------------------------------------------------------------------ job costs
    def profile(self, spec: Any, gpu_model: str, cpu_cores: float | None = None) -> JobProfile:
        """A GNN job's cost on ``gpu_model``: the estimator's PMC and admit bytes (device ``cuda``: the GPU model's
        context, workspace and allocator overheads included), the analytic runtime prior with ``cpu_cores``, its
        roofline intensity class, and the interference model's solo profile for that class."""
        key = ("profile", spec.model_dump_json(), gpu_model, cpu_cores)
        hit = self.memo.get(key)
        if hit is not None:
            return hit
        from gnnsched.gpus import get_gpu_model

        gm = get_gpu_model(gpu_model)
        est = self._estimate(spec, gm)
        solo = _import("gnnsched.runtime_prior", "solo_runtime_seconds", "predictor")
        intensity_class = _import("gnnsched.runtime_prior", "intensity_class", "predictor")
        seconds = float(solo(spec, gm, cpu_cores))
        intensity = str(intensity_class(spec, gm))
        prof = self._interference().profile_for(intensity)
        out = JobProfile(
            admit_bytes=int(est.admit_bytes),
            peak_bytes=int(est.pmc_bytes) + int(est.device_overhead_bytes),
            solo_s=seconds,
            predicted_s=seconds,
            sm_util=float(prof.sm_util),
            mem_util=float(prof.mem_util),
            intensity=intensity,
        )
        self.memo[key] = out
        return out

    def _estimate(self, spec: Any, gm: Any) -> Any:
        """``gnnsched.estimator.estimate`` once per (spec without its step count, GPU model): the peak of one step
        does not depend on how many steps there are."""
        shape = spec.model_dump(mode="json", exclude={"epochs", "requests", "qos_target_seconds", "resources",
                                                      "scaling", "backoff_limit"})
        key = ("estimate", repr(sorted(shape.items())), gm.name)
        hit = self.memo.get(key)
        if hit is None:
            estimate = _import("gnnsched.estimator", "estimate", "estimator")
            hit = estimate(spec, device="cuda", gpu_model=gm)
            self.memo[key] = hit
        return hit

    def scale(self, spec: Any, cpu_milli: int, memory_bytes: int, gpu_model: str) -> tuple[int, int, float]:
        """``gnnsched.scaling.scale`` (seed 004's Algorithm 1 with floors): the right-sized CPU millicores and memory
        bytes, and the factor by which the job's solo runtime changes with the scaled CPU (the runtime prior's
        answer, which is the simulator's ground truth, not the predictor's)."""
        scale = _import("gnnsched.scaling", "scale", "predictor")
        resources = _import("gnnsched.scaling", "Resources", "predictor")
        predictor = self.memo.get("predictor")
        if predictor is None:
            predictor = _import("gnnsched.predictor.gnn", "GNNRuntimePredictor", "predictor").load_default()
            self.memo["predictor"] = predictor
        got = scale(spec, resources(cpu=cpu_milli / 1000, memory=int(memory_bytes)), predictor=predictor,
                    gpu_model=gpu_model)
        cpu = int(round(got.scaled.cpu * 1000))
        solo = _import("gnnsched.runtime_prior", "solo_runtime_seconds", "predictor")
        before = float(solo(spec, gpu_model, cpu_milli / 1000))
        after = float(solo(spec, gpu_model, cpu / 1000))
        return cpu, int(got.scaled.memory), (after / before if before > 0 else 1.0)

    def scaled_request(self, job: SimJob) -> tuple[int, int]:
        """The requests ``scale`` chose for ``job`` (computed once per workload, see ``runner.materialise``)."""
        if job.scaled_cpu_milli is None or job.scaled_memory_bytes is None:
            raise IntegrationMissing("gnnsched.scaling.scale", "predictor", f"job {job.name} was not scaled")
        return job.scaled_cpu_milli, job.scaled_memory_bytes

    # ------------------------------------------------------------------ co-location
    def slowdowns(self, sim: Any, gpu: Any, jobs: list[SimJob]) -> list[float]:
        """Slowdown (>= 1) of each of ``jobs`` running together on ``gpu``: ``gnnsched.interference``."""
        model = self._interference()
        profiles = [model.profile_for(j.profile(gpu.model).intensity) for j in jobs]
        return [model.slowdown(p, profiles[:i] + profiles[i + 1:]) for i, p in enumerate(profiles)]

    # ------------------------------------------------------------------ extender
    def place(self, sim: Any, job: SimJob, outcome: Any) -> Any:
        """Where the extender binds ``job``: a node, None (no node can take it now) or "never" (no node ever can).

        The extender's filter and score live in the ``extender`` component (``ClusterCache.filter/costs/score``),
        which the core must not import. Until they move to a core module, only a cluster with a single GPU node can
        be simulated under gnnsched policies: there the extender has no choice to make, and the feasibility test is
        the gate's own bound (admit bytes <= total - reserve on some GPU, CPU and memory on the node).
        """
        placement = _optional("gnnsched.placement")
        if placement is not None:  # pragma: no cover - not on this branch yet
            raise IntegrationMissing("gnnsched.placement adapter", "simulator", "placement exists but is not wired")
        nodes = sim.gpu_nodes
        if len(nodes) != 1:
            raise IntegrationMissing(
                "extender filter/score as core functions (e.g. gnnsched.placement)", "extender",
                "the scoring math is in extender/cache.py (a component the core may not import); gnnsched "
                "policies can be simulated on single-node clusters only until it moves to the core",
            )
        node = nodes[0]
        admit = max(job.profile(g.model).admit_bytes for g in node.gpus)
        if not any(job.profile(g.model).admit_bytes <= g.total - g.reserve for g in node.gpus) or \
                node.spec.cpu_milli < outcome.cpu_milli or node.spec.memory_bytes < outcome.memory_bytes:
            outcome.reason = f"PredictedPeakExceedsGPU: admit {admit} B fits on no GPU, or requests exceed the node"
            return "never"
        if node.cpu_free < outcome.cpu_milli or node.mem_free < outcome.memory_bytes:
            return None
        return node

    # ------------------------------------------------------------------ node agent
    def next_group(self, sim: Any, node: Any) -> list[tuple[SimJob, Any]]:
        """The node agent's decision: ``gnnsched.policies.plan_admissions`` over the node's queue and GPUs."""
        pol = self._policies()
        cap = sim.per_gpu_cap
        tasks = []
        by_key = {}
        for seq, job in enumerate(node.queue):
            prof = job.profile(node.gpus[0].model)
            key = str(job.id)
            by_key[key] = job
            tasks.append(pol.Task(key=key, bytes=prof.admit_bytes, seq=seq, qt_seconds=prof.predicted_s,
                                  intensity=prof.intensity))
        gpus = [
            pol.GPUFree(index=g.index, free_bytes=g.free_admit_bytes,
                        free_slots=(cap if cap is not None else g.max_clients) - len(g.running),
                        capacity_bytes=g.total - g.reserve)
            for g in node.gpus
        ]
        plan = pol.plan_admissions(sim.base, tasks, gpus)
        return [(by_key[t.key], node.gpus[a.gpu_index]) for a in plan for t in a.tasks]

    def check_gate(self, sim: Any, gpu: Any) -> None:
        """``gnnsched.policies.check_gate_invariant`` on ``gpu``'s books; raises ``GateInvariantError``."""
        pol = self._policies()
        cap = sim.per_gpu_cap
        books = pol.GPUBooks(
            index=gpu.index, total_bytes=gpu.total, reserve_bytes=gpu.reserve,
            committed=tuple(r.job.profile(gpu.model).admit_bytes for r in gpu.running),
            max_clients=cap if cap is not None else gpu.max_clients,
        )
        pol.check_gate_invariant([books])


def _optional(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        return None

