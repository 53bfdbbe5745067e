"""The GNN-measured interference model and the slowdowns learned while the cluster runs (issue 37 items 1-3)."""

from __future__ import annotations

import pytest

from gnnsched.colocation.interference import load_default, load_lucid
from gnnsched.colocation.learned import SlowdownBook, observed_slowdown, pair_class
from gnnsched.colocation.measured import (
    H200_FIT,
    H200_TIME_SLICING,
    MeasuredSlowdown,
    fit_for,
    fit_pairs,
    job_class,
)
from gnnsched.policies import Client, GPUFree, Task, plan_decision, share_pays

GIB = 1 << 30


def test_refit_reproduces_the_six_measured_h200_pairs_within_15_percent() -> None:
    model = load_default("H200")
    for row in H200_TIME_SLICING:
        got = model.slowdown(model.profile_for(row.job), [model.profile_for(o) for o in row.others])
        assert abs(got - row.slowdown) / row.slowdown <= 0.15, (row, got)
    # the Lucid fit it replaces did not: gcn-train beside gin-train measured 1.84x, Lucid said 1.15x
    lucid = load_lucid()
    old = lucid.slowdown(lucid.profile_for("memory"), [lucid.profile_for("compute")])
    assert abs(old - 1.84) / 1.84 > 0.15


def test_the_model_states_its_source_and_held_out_error() -> None:
    assert "H200" in H200_FIT.source and "time-slicing" in H200_FIT.source
    assert len(H200_FIT.loo_errors) == 6
    # leave-one-out predicts every pair from the other five: worse than the fit, and reported as it is
    assert H200_FIT.loo_mean_abs > max(abs(e) for e in H200_FIT.train_errors)
    assert "transferred" in fit_for("V100-32GB").source
    assert "transferred" not in fit_for("H100-80GB").source


def test_classes_carry_the_mode_and_fall_back_to_what_the_gate_knows() -> None:
    assert job_class("memory", "train") == "memory-train"
    assert job_class("compute", None) == "compute"
    assert job_class(None, "train") is None
    model = load_default()
    # the measured pairs: a training job beside an inference job costs less than beside another training job
    train_pair = model.slowdown(model.profile_for("memory-train"), [model.profile_for("compute-train")])
    mixed_pair = model.slowdown(model.profile_for("memory-train"), [model.profile_for("memory-infer")])
    assert train_pair > mixed_pair > 1.0
    # time-slicing bound: n jobs together are at most n times slower, whatever the pair product extrapolates to
    twin = model.slowdown(model.profile_for("compute-train"), [model.profile_for("compute-train")])
    assert twin <= 2.0


def test_fit_refuses_a_row_set_whose_leave_one_out_leaves_a_class_unmeasured() -> None:
    rows = [MeasuredSlowdown(job="a", others=("b",), slowdown=1.5), MeasuredSlowdown(job="b", others=("a",),
                                                                                     slowdown=1.4)]
    with pytest.raises(ValueError, match="unmeasured"):
        fit_pairs(rows, "test")


def test_observed_slowdown_prefers_the_solo_pace_then_the_prediction() -> None:
    assert observed_slowdown(2.0, 1.0, 4.0) == 2.0
    assert observed_slowdown(2.0, None, 1.6) == 1.25
    assert observed_slowdown(2.0, None, None) is None
    assert observed_slowdown(0.0, 1.0, 1.0) is None


def test_the_learned_value_takes_over_once_a_class_pair_has_three_samples() -> None:
    model = load_default()
    book = SlowdownBook()
    prior = book.slowdown_fn("V100-32GB", model)("compute", (1, 0, 0))
    for _ in range(3):
        before = book.slowdown_fn("V100-32GB", model)("compute", (1, 0, 0))
        assert before == pytest.approx(prior)  # fewer than min_samples: the prior stands
        book = book.record("V100-32GB", "compute", ["memory"], 2.0, prior)
    assert book.slowdown_fn("V100-32GB", model)("compute", (1, 0, 0)) == pytest.approx(2.0, rel=1e-3)
    # another GPU model and another pair keep the prior
    assert book.slowdown_fn("A100-80GB", model)("compute", (1, 0, 0)) == pytest.approx(prior)
    assert book.slowdown_fn("V100-32GB", model)("memory", (0, 1, 0)) != pytest.approx(2.0, rel=1e-3)
    assert pair_class("V100-32GB", "compute", ["memory"]).key() in book.learned(model)


def test_a_pair_observed_at_2x_where_the_prior_says_1_2x_stops_being_co_located() -> None:
    """The issue's test: sharing pays under the prior, and no longer once the pair's true 2x has been observed."""
    model = load_default()
    prior_fn = SlowdownBook().slowdown_fn("V100-32GB", model)

    def prior_at_1_2(intensity: str | None, counts: tuple[int, int, int]) -> float:
        # the prior of this scenario: 1.2x beside anyone (the model's own value for compute beside memory is
        # prior_fn's; the scenario pins 1.2 as the issue states it)
        return 1.0 if sum(counts) == 0 else 1.2

    book = SlowdownBook()
    task = Task(key="t", bytes=4 * GIB, seq=0, qt_seconds=100.0, intensity="compute")
    running = (Client(intensity="memory", remaining_seconds=100.0),)
    gpus = [GPUFree(index=0, free_bytes=20 * GIB, free_slots=4, capacity_bytes=30 * GIB, running=running),
            GPUFree(index=1, free_bytes=0, free_slots=0, capacity_bytes=30 * GIB,
                    running=(Client(intensity="memory", remaining_seconds=60.0),))]
    # waiting for GPU 1 costs 60 s; joining costs ~17 s (slowed 1.2x for the 100 s its neighbour still runs) plus
    # the neighbour's ~17 s: it pays under the prior; at 2x, 50 s plus 50 s: it does not
    assert share_pays(task, running, 60.0, prior_at_1_2)
    first = plan_decision("sqtf", [task], gpus, 0, share_when_pays=True, slowdown=prior_at_1_2)
    assert [a.gpu_index for a in first.admissions] == [0]

    def learned(intensity: str | None, counts: tuple[int, int, int]) -> float:
        prior = prior_at_1_2(intensity, counts)
        others = [k for k, n in zip(("memory", "compute", None), counts, strict=True) for _ in range(n)]
        return book.slowdown("V100-32GB", intensity, others, prior)

    for _ in range(3):  # progress reports: the pair ran at 2x
        book = book.record("V100-32GB", "compute", ["memory"], 2.0, 1.2)
        book = book.record("V100-32GB", "memory", ["compute"], 2.0, 1.2)
    assert learned("compute", (1, 0, 0)) == pytest.approx(2.0, rel=1e-3)
    assert not share_pays(task, running, 60.0, learned)
    after = plan_decision("sqtf", [task], gpus, 0, share_when_pays=True, slowdown=learned)
    assert after.admissions == []  # it waits for an idle GPU instead
    assert prior_fn("compute", (1, 0, 0)) > 1.0  # the shipped model's prior is a slowdown too


def test_the_gate_learns_a_pair_from_progress_and_stops_sharing_it() -> None:
    """The node agent's books: a pod's step reports, alone and then beside another class, give the pair's observed
    slowdown; once the pair runs at 2x the gate's share rule keeps the next pod of that class off the busy GPU."""
    from gnnsched.node_agent.books import Books, GPUSlot
    from gnnsched.progress import StepProgress

    gpus = [GPUSlot(index=i, uuid=f"GPU-{i}", model="V100-32GB", total_bytes=32 * GIB, reserve_bytes=0, max_clients=4)
            for i in range(2)]
    books = Books(gpus, "sqtf", share_when_pays=True, spread=True)
    assert books.learned_slowdowns() == {}
    books.enqueue("long", pod_uid="u-long", bytes=20 * GIB, qt_seconds=1000.0, intensity="memory", now=0.0)
    books.enqueue("hog", pod_uid="u-hog", bytes=4 * GIB, qt_seconds=10_000.0, intensity="memory", now=0.0)
    assert sorted(len(d.entries) for d in books.decide(0.0)) == [1, 1]  # one per idle GPU
    hog = books.running["hog"]
    # the other GPU's client: a compute pod that shares with 'long' (predicted 1 s per step alone)
    books.enqueue("c", pod_uid="u-c", bytes=4 * GIB, qt_seconds=100.0, intensity="compute", now=0.0)
    first = books.decide(0.0)
    assert len(first) == 1
    c = books.running["c"]
    mate = books.running["long" if c.gpu_index == books.running["long"].gpu_index else "hog"]
    # progress: 2 s per step beside a memory pod where 1 s was predicted -> 2x, three reports
    books.report_progress(c, StepProgress(steps=5, total=100, seconds=10.0, at=10.0))
    for k in range(1, 4):
        books.report_progress(c, StepProgress(steps=5 + 5 * k, total=100, seconds=10.0 + 10.0 * k, at=10.0 + 10 * k))
    learned = books.learned_slowdowns()
    key = pair_class("V100-32GB", "compute", [mate.intensity]).key()
    assert learned[key] == pytest.approx(2.0, rel=1e-3)
    # the agent's metrics show it
    from prometheus_client import generate_latest

    from gnnsched.node_agent.metrics import AgentMetrics

    metrics = AgentMetrics()
    metrics.books_changed(books)
    text = generate_latest(metrics.registry).decode()
    assert f'gnnsched_colocation_learned_slowdown{{pair="{key}"}} 2.0' in text
    # and the GPUNode status (what the extender and kubectl read), against the CRD's schema
    from crd_schema import load_crd, validate

    from gnnsched.contract import MPSStatus
    from gnnsched.node_agent.status import build_status

    status = build_status("node-a", books, [], MPSStatus(), 40.0)
    (entry,) = status.learned_slowdowns
    assert (entry.gpu_model, entry.job_class, entry.beside) == ("V100-32GB", "compute", [mate.intensity])
    assert entry.slowdown == pytest.approx(2.0, rel=1e-3) and entry.samples >= 3 and entry.calibrated
    assert entry.prior == pytest.approx(books.interference.slowdown(
        books.interference.profile_for("compute"), [books.interference.profile_for(mate.intensity)]), rel=1e-3)
    gpunode = {"apiVersion": "gnnsched.io/v1alpha1", "kind": "GPUNode", "metadata": {"name": "node-a"},
               "status": status.wire()}
    assert validate(load_crd("gpunode.yaml"), gpunode) == []
    # a new compute pod too large for the room beside 'long' (12 GiB), which ends in 120 s (30 steps left at 4 s);
    # beside 'hog' it would overlap a memory pod for all its run. Under the prior (compute beside memory 1.29x)
    # joining 'hog' costs ~68 s against 120 s of waiting and pays; at the learned 2x it costs ~160 s: it waits
    books.release(c.key)
    books.enqueue("c2", pod_uid="u-c2", bytes=16 * GIB, qt_seconds=100.0, intensity="compute", now=40.0)
    books.running["long"].progress = StepProgress(steps=70, total=100, seconds=280.0, at=40.0)
    task = books.queued["c2"].task()
    clients = (Client(intensity="memory", remaining_seconds=books.seconds_left(hog, 40.0)),)
    assert share_pays(task, clients, 120.0)  # the prior would co-locate it
    assert not share_pays(task, clients, 120.0, books._learned())
    assert books.decide(40.0) == []
