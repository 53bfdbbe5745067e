"""A running job's seconds left (gnnsched.progress): the one estimator, and the worker's side of the reports."""

from __future__ import annotations

import json
import os

import pytest

from gnnsched.contract import ENV_PROGRESS_FD
from gnnsched.policies import predicted_end, remaining_seconds
from gnnsched.progress import MIN_PROGRESS_STEPS, StepProgress, StepReporter, seconds_left


def test_measured_pace_replaces_the_prediction_after_a_few_steps() -> None:
    end = predicted_end(60.0, 100.0)  # predicted 60 s from t=100
    assert seconds_left(end, 130.0) == 30.0
    # 3 of 100 steps in 9 s: 3 s per step, 97 steps left = 291 s, less the 2 s since the report
    report = StepProgress(steps=3, total=100, seconds=9.0, at=128.0)
    assert seconds_left(end, 130.0, report) == pytest.approx(291.0 - 2.0)
    # too few steps: the first step's one-off work would skew the pace, so the prediction stays
    early = StepProgress(steps=MIN_PROGRESS_STEPS - 1, total=100, seconds=1.0, at=128.0)
    assert seconds_left(end, 130.0, early) == 30.0
    # a faster job than predicted: 50 of 100 steps in 10 s -> 10 s left at the report
    assert seconds_left(end, 112.0, StepProgress(50, 100, 10.0, 110.0)) == pytest.approx(8.0)
    # done, overdue, or without any prediction: never below 0
    assert seconds_left(end, 500.0, StepProgress(100, 100, 10.0, 110.0)) == 0.0
    assert seconds_left(None, 130.0, StepProgress(10, 100, 10.0, 129.0)) == pytest.approx(89.0)
    assert seconds_left(None, 130.0) == 0.0
    # the gate's entry point passes the report through, from its own prediction otherwise
    assert remaining_seconds(60.0, 100.0, 130.0, report) == pytest.approx(289.0)
    assert remaining_seconds(60.0, 100.0, 130.0) == 30.0


@pytest.mark.parametrize("bad", [
    StepProgress(5, 0, 1.0, 0.0),  # no total
    StepProgress(0, 10, 0.0, 0.0),  # no step yet
    StepProgress(5, 10, 0.0, 0.0),  # no time
    StepProgress(11, 10, 1.0, 0.0),  # more steps than the total
    StepProgress(5, 10, float("inf"), 0.0),
])
def test_an_unusable_report_keeps_the_prediction(bad: StepProgress) -> None:
    assert not bad.usable()
    assert seconds_left(150.0, 100.0, bad) == 50.0


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _lines(fd: int) -> list[dict]:
    os.set_blocking(fd, False)
    try:
        data = os.read(fd, 65536)
    except BlockingIOError:
        return []
    return [json.loads(line) for line in data.splitlines()]


def test_reporter_writes_after_a_few_steps_then_at_a_bounded_rate_and_at_the_end() -> None:
    read_end, write_end = os.pipe()
    clock = _Clock()
    rep = StepReporter(write_end, interval=5.0, min_steps=3, clock=clock)
    rep.start(1000)
    for _ in range(2):
        clock.t += 0.5
        rep.advance()
    assert _lines(read_end) == []  # fewer than min_steps: nothing yet
    clock.t += 0.5
    rep.advance()
    assert _lines(read_end) == [{"steps": 3, "total": 1000, "seconds": 1.5}]
    for _ in range(100):  # 100 steps in 25 s: a line every 5 s, not a hundred
        clock.t += 0.25
        rep.advance()
    sent = _lines(read_end)
    assert [m["steps"] for m in sent] == [23, 43, 63, 83, 103]
    assert sent[-1]["seconds"] == 26.5
    clock.t += 0.25
    rep.advance(897)  # the last step is reported whatever the interval
    assert _lines(read_end) == [{"steps": 1000, "total": 1000, "seconds": 26.75}]
    os.close(read_end)
    clock.t += 10
    rep.advance()  # nobody reads any more: the reports end, the job does not
    assert rep.fd is None
    rep.close()


def test_reporter_from_env_names_the_variable() -> None:
    assert StepReporter.from_env({}) is None
    with pytest.raises(ValueError, match=ENV_PROGRESS_FD):
        StepReporter.from_env({ENV_PROGRESS_FD: "three"})
    read_end, write_end = os.pipe()
    rep = StepReporter.from_env({ENV_PROGRESS_FD: str(write_end)})
    assert rep is not None and rep.fd == write_end
    rep.close()
    os.close(read_end)
