"""The ``gen:`` workload family and the robustness grid's CI slice (``bench/robustness.py --quick``)."""

from __future__ import annotations

import ast
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from gnnsched.simulator.workloads import (
    GEN_SIZES,
    WorkloadError,
    default_cluster,
    generated,
    is_file,
    parse_gen,
    resolve_workload,
)

ROOT = Path(__file__).resolve().parents[1]


def test_no_import_circle_between_generators_and_types():
    """``openb`` and ``workload_types`` import nothing from ``workloads`` (the generators import them, not back)."""
    for name in ("openb.py", "workload_types.py"):
        tree = ast.parse((ROOT / "gnnsched" / "simulator" / name).read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert "gnnsched.simulator.workloads" not in imported, name
    # either module first, in a fresh interpreter
    for first in ("gnnsched.simulator.openb", "gnnsched.simulator.workloads"):
        out = subprocess.run([sys.executable, "-c", f"import {first}; import gnnsched.simulator.workloads as w; "
                              "print(w.builtin_workload.__name__)"], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr


def test_gen_is_seeded_and_canonical():
    a = generated("gen:load=1.5,arrival=burst", 3)
    b = generated("gen: arrival=burst , load=1.5", 3)
    assert a.name == b.name == "gen:load=1.5,arrival=burst,mix=mixed,size=medium,jobs=40,burst=10"
    assert [t.spec for t in a.templates] == [t.spec for t in b.templates]
    assert [t.spec for t in generated("gen:load=1.5,arrival=burst", 4).templates] != [t.spec for t in a.templates]


def test_gen_arrivals_follow_the_load():
    """Arrivals are in mean-service-per-GPU units: a burst of 10 every 10 / load; Poisson gaps of mean 1 / load."""
    burst = generated("gen:load=2,arrival=burst,jobs=30,burst=10", 0).templates
    assert [t.arrival for t in burst] == [0.0] * 10 + [5.0] * 10 + [10.0] * 10
    slow = generated("gen:load=0.3,arrival=poisson,jobs=400", 0).templates
    fast = generated("gen:load=1.5,arrival=poisson,jobs=400", 0).templates
    gap_slow, gap_fast = slow[-1].arrival / 399, fast[-1].arrival / 399
    assert 1 / 0.3 * 0.85 < gap_slow < 1 / 0.3 * 1.15 and 1 / 1.5 * 0.85 < gap_fast < 1 / 1.5 * 1.15
    assert generated("gen:", 0).reference == {"period_slots": True, "per_gpu": True}


@pytest.mark.parametrize(("mix", "lo", "hi"), [("train", 0.65, 0.95), ("mixed", 0.35, 0.65), ("infer", 0.05, 0.35)])
def test_gen_mix_and_qos(mix: str, lo: float, hi: float):
    ts = generated(f"gen:mix={mix},jobs=200", 1).templates
    train = [t for t in ts if t.spec is not None and t.spec.mode == "train"]
    assert lo < len(train) / len(ts) < hi
    for t in ts:
        assert (t.qos_factor == 2.0) == (t.spec is not None and t.spec.mode == "infer")


def test_gen_sizes_and_fit():
    for size, (lo, hi) in GEN_SIZES.items():
        nodes = [t.spec.graph.nodes for t in generated(f"gen:size={size},jobs=60", 0).templates if t.spec]
        assert all(lo <= n <= hi for n in nodes), size
    # a predicate that takes nothing over 150k nodes: large graphs are shrunk until they fit
    fitted = generated("gen:size=large,jobs=20", 0, fits=lambda spec, share: (spec.graph.nodes or 0) <= 150_000)
    assert all(t.spec is not None and (t.spec.graph.nodes or 0) <= 150_000 for t in fitted.templates)


@pytest.mark.parametrize(("text", "field"), [
    ("gen:load=0", "workload.gen.load"), ("gen:load=x", "workload.gen.load"),
    ("gen:arrival=trickle", "workload.gen.arrival"), ("gen:mix=all", "workload.gen.mix"),
    ("gen:size=huge", "workload.gen.size"), ("gen:jobs=0", "workload.gen.jobs"), ("gen:burst=-1", "workload.gen.burst"),
    ("gen:colour=red", "workload"), ("gen:load", "workload"),
])
def test_gen_bad_input_names_the_field(text: str, field: str):
    with pytest.raises(WorkloadError) as err:
        parse_gen(text)
    assert err.value.field == field and "\n" not in str(err.value)


def test_gen_resolves_from_the_cli_text(tmp_path: Path):
    assert not is_file("gen:load=1") and default_cluster("gen:load=1") == "small"
    assert resolve_workload("GEN:load=1", 0, tmp_path).name.startswith("gen:load=1,")


def test_cli_help_documents_gen():
    out = subprocess.run([sys.executable, "-m", "gnnsched.cli", "simulate", "--help"], capture_output=True, text=True,
                         timeout=120, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert "gen:KEY=VALUE" in out.stdout and "arrival" in out.stdout


def test_robustness_quick_slice(tmp_path: Path):
    """The CI slice runs the chart's default and the baselines on 4 cells; its exit status is the bound's verdict on
    what it printed, gnnsched loses no job and has no OOM kill in any cell."""
    out_json = tmp_path / "cells.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "robustness.py"), "--quick", "--json", str(out_json)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode in (0, 1), proc.stderr
    cells = json.loads(out_json.read_text())
    assert len(cells) == 4
    for c in cells:
        assert set(c["metrics"]) >= {c["policy"], "exclusive", "mps-naive", "mps-base", "temporal"}
        bases = [c["metrics"][b] for b in ("exclusive", "mps-naive", "mps-base")]
        most = max(m["completed"] for m in bases)
        best = min(m["jct_mean_s"] for m in bases if m["completed"] == most)
        assert c["ratio_mean"] == pytest.approx(c["metrics"][c["policy"]]["jct_mean_s"] / best)
        assert c["lost"] == 0 and c["metrics"][c["policy"]]["oom_kills"] == 0, c["cell"]
        assert c["cell"] in proc.stdout
    worse = [c for c in cells if c["ratio_mean"] > 1.02]
    assert proc.returncode == (1 if worse else 0)
    assert f"cells worse than 1.02: {len(worse)}" in proc.stdout
    # the summary table: all cells, then one row per value present; geometric means of the printed ratios
    geo = math.exp(sum(math.log(c["ratio_mean"]) for c in cells) / len(cells))
    assert f"| all | 4 | {geo:.3f} |" in proc.stdout
    assert "| worst mean ratio | cells > 1.02 |" in proc.stdout
    assert f"| {max(c['ratio_mean'] for c in cells):.3f} | {len(worse)} |" in proc.stdout
    for cluster in {c["cluster"] for c in cells}:
        assert f"| cluster {cluster} | 1 |" in proc.stdout


def test_spread_suffix_parses_for_gnnsched_policies_only():
    from gnnsched.simulator.policyspec import PolicyError, parse_policy

    assert parse_policy("bmc+sjf2+bypass4+spread").spread and not parse_policy("bmc").spread
    for bad in ("exclusive+spread", "sqtf-paper+spread"):
        with pytest.raises(PolicyError):
            parse_policy(bad)


def test_spread_runs_a_burst_on_idle_gpus_in_the_simulator(tmp_path: Path):
    """A burst of 4 small jobs on one node of 4 GPUs: the plain gate groups them on one GPU (slowdown > 1), the
    spread gate gives each its own GPU (no interference at all)."""
    from gnnsched.simulator.adapters import Integrations
    from gnnsched.simulator.cli import fits_on
    from gnnsched.simulator.cluster import parse_cluster
    from gnnsched.simulator.policyspec import parse_policies
    from gnnsched.simulator.runner import run

    ix = Integrations()
    cl = parse_cluster("1x4xV100-32GB")
    wl = resolve_workload("gen:arrival=burst,burst=4,jobs=4,size=small,mix=train", 0, tmp_path, fits=fits_on(cl, ix))
    rep = run(wl, cl, parse_policies("bmc+bypass4,bmc+bypass4+spread"), 0, ix, record_timeline=False)
    plain, spread = rep.policies["bmc+bypass4"], rep.policies["bmc+bypass4+spread"]
    assert plain["max_slowdown"] > 1.0 and spread["max_slowdown"] == 1.0
    assert spread["completed"] == plain["completed"] == 4 and spread["jct_mean_s"] < plain["jct_mean_s"]


def test_pays_suffix_runs_the_share_rule_in_the_simulator(tmp_path: Path):
    """``+pays`` is the gate's ``--share-when-pays``: in a burst of 6 large training jobs on 2 GPUs it holds a job
    back instead of grouping it beside one that outlasts it (lower worst slowdown), with every job completed and no
    OOM kill; it parses for gnnsched policies only."""
    from gnnsched.simulator.adapters import Integrations
    from gnnsched.simulator.cli import fits_on
    from gnnsched.simulator.cluster import parse_cluster
    from gnnsched.simulator.policyspec import PolicyError, parse_policies, parse_policy
    from gnnsched.simulator.runner import run

    assert parse_policy("sqtf+spread+pays").share and not parse_policy("sqtf+spread").share
    for bad in ("exclusive+pays", "bqt-paper+pays"):
        with pytest.raises(PolicyError):
            parse_policy(bad)
    ix = Integrations()
    cl = parse_cluster("1x2xV100-32GB")
    # the share rule charges a slowdown only while the pods overlap (policies.share_pays), so it holds a job back
    # only beside pods that outlast it: this burst (every model family, seed 1) has one
    wl = resolve_workload("gen:arrival=burst,burst=6,jobs=6,size=large,mix=train,models=all", 1, tmp_path,
                          fits=fits_on(cl, ix))
    rep = run(wl, cl, parse_policies("sqtf+spread,sqtf+spread+pays"), 1, ix, record_timeline=False)
    plain, pays = rep.policies["sqtf+spread"], rep.policies["sqtf+spread+pays"]
    assert pays["max_slowdown"] < plain["max_slowdown"]
    assert pays["completed"] == plain["completed"] == 6 and pays["oom_kills"] == plain["oom_kills"] == 0


def test_chart_default_reads_the_share_rule(tmp_path: Path):
    import importlib.util

    import yaml

    spec = importlib.util.spec_from_file_location("robustness", ROOT / "bench" / "robustness.py")
    assert spec is not None and spec.loader is not None
    robustness = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("robustness", robustness)  # its dataclass looks its module up
    spec.loader.exec_module(robustness)
    doc = yaml.safe_load(robustness.CHART_VALUES.read_text())
    assert robustness.chart_default_policy().startswith("sqtf+sjf2+bypass4+spread")
    assert "+pays" not in robustness.chart_default_policy()
    # operator.workerPrestart: true, then the loops a cluster always runs (issue 37)
    assert robustness.chart_default_policy().endswith("+prestart+rtcal+progress")
    assert robustness.chart_default_policy(loops=False).endswith("+prestart")
    spec_ = robustness.parse_policies(robustness.chart_default_policy())[0]
    assert spec_.runtime_calibration and spec_.progress
    doc["operator"]["workerPrestart"] = False
    off = tmp_path / "off.yaml"
    off.write_text(yaml.safe_dump(doc))
    assert "+prestart" not in robustness.chart_default_policy(off)
    doc["operator"]["workerPrestart"] = True
    doc["node"]["agent"]["shareWhenPays"] = True
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert "+spread+pays" in robustness.chart_default_policy(path)


def _two_exclusive_jobs(second_arrival: float, custom_command: bool = False) -> list:
    """Two jobs on one V100-32GB whose reservations (20 GiB each) cannot share it: the second waits at the gate."""
    from gnnsched.simulator.model import JobProfile, SimJob
    from gnnsched.spec import parse_spec

    gib = 2**30
    prof = JobProfile(admit_bytes=20 * gib, peak_bytes=18 * gib, solo_s=100.0, predicted_s=100.0, sm_util=0.5)
    spec = parse_spec({"mode": "train", "model": {"arch": "gcn"}, "epochs": 100,
                       "graph": {"nodes": 1000, "edges": 5000, "features": 8, "classes": 2}})
    if custom_command:
        spec = spec.model_copy(update={"command": ["python", "train.py"]})
    return [SimJob(id=i, name=f"j{i}", arrival=at, mode="train", cpu_milli=1000, memory_bytes=gib, spec=spec,
                   profiles={"V100-32GB": prof}) for i, at in enumerate((0.0, second_arrival))]


@pytest.mark.parametrize("second_arrival", [0.0, 100.0 + 4.4 - 1.5])
def test_prestart_hides_the_start_up_behind_the_wait_at_the_gate(second_arrival: float):
    """``+prestart``: a pod's start-up runs from its bind, so a job that waited ``w`` at the gate pays only
    ``max(0, STARTUP_S - w)`` after its admission. The first job (no wait) is unchanged; the second saves the whole
    start-up when it waited longer than that (a burst), and exactly its wait when it waited less."""
    from gnnsched.simulator.adapters import Integrations
    from gnnsched.simulator.cluster import parse_cluster
    from gnnsched.simulator.costs import STARTUP_S
    from gnnsched.simulator.policyspec import parse_policies
    from gnnsched.simulator.runner import run
    from gnnsched.simulator.workload_types import Workload

    jobs = _two_exclusive_jobs(second_arrival)
    wl = Workload(name="two", description="two jobs that cannot share a GPU", templates=[])
    rep = run(wl, parse_cluster("1x1xV100-32GB"), parse_policies("bmc,bmc+prestart"), 0, Integrations(),
              record_timeline=False, jobs=jobs)
    plain = [o.jct for o in rep.results["bmc"].outcomes]
    pre = [o.jct for o in rep.results["bmc+prestart"].outcomes]
    assert plain[0] == pytest.approx(STARTUP_S + 100.0) and pre[0] == pytest.approx(plain[0])
    waited = plain[0] - second_arrival  # the second is admitted when the first finishes
    assert plain[1] == pytest.approx(waited + STARTUP_S + 100.0)
    assert pre[1] == pytest.approx(plain[1] - min(waited, STARTUP_S))
    # a user's own command (spec.command) runs behind the plain gate: nothing changes
    custom = run(wl, parse_cluster("1x1xV100-32GB"), parse_policies("bmc+prestart"), 0, Integrations(),
                 record_timeline=False, jobs=_two_exclusive_jobs(second_arrival, custom_command=True))
    assert [o.jct for o in custom.results["bmc+prestart"].outcomes] == pytest.approx(plain)


def test_prestart_suffix_parses_for_gnnsched_policies_only():
    from gnnsched.simulator.policyspec import PolicyError, parse_policy

    assert parse_policy("bmc+sjf2+bypass4+spread+prestart").prestart and not parse_policy("bmc+spread").prestart
    for bad in ("exclusive+prestart", "mps-naive+prestart", "sqtf-paper+prestart"):
        with pytest.raises(PolicyError, match="prestart"):
            parse_policy(bad)


def test_scale_benchmark_runs_the_charts_default_configuration(monkeypatch: pytest.MonkeyPatch):
    """``bench/simulate_scale.py``'s default list (``--policies all``) includes the configuration of record, what the
    chart installs (read from its values), once, and every name in it parses."""
    import importlib.util

    from gnnsched.simulator.policyspec import parse_policies

    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location("simulate_scale", ROOT / "bench" / "simulate_scale.py")
    assert spec is not None and spec.loader is not None
    scale = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(scale)
    names = [p.text for p in parse_policies(scale.all_policies())]
    assert names.count(scale.chart_default_policy()) == 1
    assert scale.chart_default_policy().startswith("sqtf+sjf2+bypass4+spread")
