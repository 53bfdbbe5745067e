"""Fixtures shared by several test modules."""

from __future__ import annotations

import os
from collections.abc import Iterator

# gRPC's fork handlers, off before any test module imports grpc. Tests that serve or call gRPC in-process (the test
# kubelet, the e2e kubelet stand-in) also start processes with a preexec_fn, which forks: with the handlers on, a fork
# while gRPC threads are busy skips the parent's handlers ("Other threads are currently calling into gRPC, skipping
# fork() handlers") and the child can abort in its epoll poller before it reaches exec ("epoll_wait error: Bad file
# descriptor", SIGABRT). No test uses gRPC in a forked child, so the handlers only add that risk.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

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
