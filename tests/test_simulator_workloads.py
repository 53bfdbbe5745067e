"""Built-in workload generators follow the papers' descriptions (no costing: generation only, fast)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gnnsched.simulator.adapters import IntegrationMissing, Integrations
from gnnsched.simulator.cluster import uniform_cluster
from gnnsched.simulator.engine import Simulation
from gnnsched.simulator.model import JobProfile, SimJob
from gnnsched.simulator.policyspec import parse_policy
from gnnsched.simulator.workloads import COGNN_DATASETS, GNNSCHED_DATASETS, cognn, gnnsched_queue, resource_demand

DATA = Path("/work/shared/data")


@pytest.mark.parametrize("queue", ["gcn", "sage", "gat", "gin"])
def test_cognn_queue(queue: str):
    wl = cognn(queue, seed=0)
    assert len(wl.templates) == 20 and wl.max_clients == 2
    for t in wl.templates:
        s = t.spec
        assert t.arrival == 0.0 and s.mode == "train" and s.model.arch == queue and s.epochs == 200
        assert 4 <= s.model.layers <= 10 and s.model.hidden == 64 and s.graph.dataset in COGNN_DATASETS
    assert len({(t.spec.graph.dataset, t.spec.model.layers) for t in wl.templates}) == 20  # distinct combinations


def test_cognn_mix_and_seeds():
    mix = cognn("mix", seed=0)
    assert len({t.spec.model.arch for t in mix.templates}) >= 3
    assert [t.name for t in cognn("mix", seed=0).templates] == [t.name for t in mix.templates]
    assert [t.name for t in cognn("mix", seed=1).templates] != [t.name for t in mix.templates]


@pytest.mark.parametrize("load, mean", [("low", 1.0), ("high", 2.0)])
def test_gnnsched_queue(load: str, mean: float):
    wl = gnnsched_queue("gin", load, seed=0)
    assert len(wl.templates) == 100
    for t in wl.templates:
        assert t.spec.mode == "infer" and t.spec.model.layers == 8 and t.spec.model.hidden == 256
        assert t.qos_factor == 2.0 and float(t.arrival).is_integer()  # batch slot, scaled to seconds later
    slots = max(t.arrival for t in wl.templates) + 1
    # Poisson batches: 100 tasks over about 100/mean slots (loose bound, 5 sigma)
    assert abs(slots - 100 / mean) < 5 * (100 / mean) ** 0.5 + 2
    sizes = {t.spec.graph.features for t in wl.templates}
    assert len(sizes) == len(GNNSCHED_DATASETS)  # the four datasets' feature widths


def test_resource_demand_arrivals():
    if not (DATA / "traces" / "openb_pod_list_default.csv").exists():
        pytest.skip("shared openb trace not available")
    wl = resource_demand(seed=0, data_dir=DATA)
    n = len(wl.templates)
    assert abs(n - 840) < 5 * 840 ** 0.5  # Poisson, 70/h for 12 h
    assert all(0 < t.arrival < 12 * 3600 for t in wl.templates) and wl.horizon == 12 * 3600
    assert all(t.cpu_milli > 0 and t.memory_bytes > 0 and float(t.labels["runtime_target"]) > 0
               for t in wl.templates)


def test_gnnsched_policies_on_several_nodes_say_what_is_missing():
    # The extender's filter/score live in the extender component; until they are core functions the simulator
    # refuses multi-node gnnsched placement instead of inventing one.
    prof = JobProfile(admit_bytes=1 << 30, peak_bytes=1 << 30, solo_s=1.0, predicted_s=1.0, sm_util=0.5)
    jobs = [SimJob(id=0, name="a", arrival=0.0, mode="train", cpu_milli=1000, memory_bytes=1 << 30,
                   profiles={"V100-32GB": prof})]
    sim = Simulation(jobs, uniform_cluster(2, 1, "V100-32GB"), parse_policy("lmcf"), Integrations())
    with pytest.raises(IntegrationMissing, match="extender"):
        sim.run()
