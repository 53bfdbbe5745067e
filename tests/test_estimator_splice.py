"""The spliced trace of a deep model (``SPLICE_DEPTH`` layers traced, the rest replayed) against the full trace.

Splicing may reorder allocations within an uninterrupted run of allocations (and frees within a run of frees), so
the comparison is the live-byte total at the end of every such run (every value the peak can take), plus the peak,
its breakdown, the CUDA-rounded peak and the bytes resident at the step's start, which must all be identical.
"""

from __future__ import annotations

from typing import Any

import pytest

import gnnsched.estimator as estimator
from gnnsched.estimator import SPLICE_DEPTH, Trace, estimate, trace_step
from gnnsched.spec import GNNJobSpec, parse_spec

SMALL = {"nodes": 600, "edges": 5_000, "features": 24, "classes": 5}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _spec(arch: str, mode: str, layers: int, hidden: int = 32, **extra) -> GNNJobSpec:
    model = {"arch": arch, "layers": layers, "hidden": hidden}
    if arch == "gat":
        model["heads"] = 2
    return parse_spec({"mode": mode, "model": model, "graph": dict(extra.pop("graph", SMALL)), **extra})


def _assert_same(spec) -> Trace:
    spliced, breakdown_s, peak_s = trace_step(spec)
    full, breakdown_f, peak_f = trace_step(spec, splice=False)
    assert spliced.traced_layers == SPLICE_DEPTH and full.traced_layers is None
    assert (peak_s, breakdown_s) == (peak_f, breakdown_f)
    assert spliced.peak(rounding=512)[0] == full.peak(rounding=512)[0]
    assert spliced.run_totals() == full.run_totals()
    return spliced


@pytest.mark.parametrize("arch", ["gcn", "sage", "gin", "gat"])
@pytest.mark.parametrize("mode", ["train", "infer"])
def test_spliced_timeline_equals_the_full_trace(arch, mode):
    for layers in (SPLICE_DEPTH + 1, 9):
        _assert_same(_spec(arch, mode, layers, hidden=64 if arch in ("sage", "gin") else 16))


def test_splice_with_minibatch_and_parallel_inference():
    mb = {"mode": "minibatch", "batchSize": 64, "fanouts": [5, 4, 3, 3, 3, 2, 2]}
    _assert_same(_spec("gat", "train", 7, graph={"nodes": 3_000, "edges": 20_000, "features": 16, "classes": 4},
                       batching=mb))
    spec = _spec("sage", "infer", 8, parallelism=3)
    _assert_same(spec)
    spliced = estimate(spec)
    assert spliced.pmc_bytes == estimate(spec, engine="fake").pmc_bytes  # the fake engine never splices
    assert spliced.admit_bytes == estimate(spec, engine="fake").admit_bytes


def test_shallow_models_are_traced_in_full():
    trace, _, _ = trace_step(_spec("gcn", "train", SPLICE_DEPTH))
    assert trace.traced_layers is None


def test_a_template_that_does_not_line_up_falls_back_to_the_full_trace(monkeypatch):
    spec = _spec("gin", "train", 8)
    reference = trace_step(spec, splice=False)
    calls = []

    def refuse(*args, **kwargs):
        calls.append(1)
        raise estimator._SpliceMismatch("test")

    monkeypatch.setattr(estimator, "_splice", refuse)
    trace, breakdown, peak = trace_step(spec)
    assert calls and trace.traced_layers is None
    assert (breakdown, peak) == reference[1:] and trace.run_totals() == reference[0].run_totals()


def test_the_splice_rejects_labels_out_of_layer_order():
    """A corrupted labelling (layers out of order) is detected, not silently replayed."""
    spec = _spec("gcn", "train", 8)
    captured: dict[str, Any] = {}
    real = estimator._splice

    def capture(template, labels, owners, model_from, layers, sets):
        captured.update(args=(template, list(labels), list(owners), model_from, layers, sets))
        return real(template, labels, owners, model_from, layers, sets)

    import unittest.mock

    with unittest.mock.patch.object(estimator, "_splice", capture):
        trace_step(spec)
    template, labels, owners, model_from, layers, sets = captured["args"]
    first = next(i for i in range(template.window_start, len(labels)) if labels[i] == 2)
    labels[first] = 4
    with pytest.raises(estimator._SpliceMismatch):
        real(template, labels, owners, model_from, layers, sets)
