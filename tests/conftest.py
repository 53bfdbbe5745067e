"""Fixtures shared by several test modules."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """torch on one intra-op thread: the CI box has 2 cores shared with other tests, and one thread keeps the
    estimator, the models and the worker deterministic in speed; restored afterwards."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
