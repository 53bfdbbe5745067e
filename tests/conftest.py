"""Fixtures shared by several test modules."""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from collections.abc import Generator, Iterator
from pathlib import Path

# gRPC's fork handlers, off before any test module imports grpc. Tests that serve or call gRPC in-process (the test
# kubelet, the e2e kubelet stand-in) also start processes with a preexec_fn, which forks: with the handlers on, a fork
# while gRPC threads are busy skips the parent's handlers ("Other threads are currently calling into gRPC, skipping
# fork() handlers") and the child can abort in its epoll poller before it reaches exec ("epoll_wait error: Bad file
# descriptor", SIGABRT). No test uses gRPC in a forked child, so the handlers only add that risk.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import pytest

BASETEMP_PREFIX = "pt-"
_OWN_BASETEMP = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    """A short temporary root when none is given: the local cluster's unix sockets live under a test's temporary
    directory, and a socket path has at most 107 bytes. pytest's default root (``/tmp/pytest-of-USER/pytest-N``) plus
    the ``popen-gwN`` directory pytest-xdist adds per worker leaves too little of them. Only the controller picks it
    (each worker gets ``<root>/popen-gwN``); a run without failures removes it at the end."""
    if config.option.basetemp is None and not hasattr(config, "workerinput"):
        config.option.basetemp = tempfile.mkdtemp(prefix=BASETEMP_PREFIX)
        config.stash[_OWN_BASETEMP] = config.option.basetemp


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    own = session.config.stash.get(_OWN_BASETEMP, None)
    if own is not None and exitstatus == 0:
        shutil.rmtree(own, ignore_errors=True)


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """torch on one intra-op thread: the CI box has 2 cores shared with other tests, and one thread keeps the
    estimator, the models and the worker deterministic in speed; restored afterwards."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# On a failed local-cluster test (tests/e2e), the components' own account of what happened. The timeline the harness
# prints says what the pods and GNNJobs did; why (the node agent's fault roles, a refused write, a retried
# annotation) is in the components' logs under the cluster's directory, which a CI run does not keep. So a failed
# test's report gets one more section: the WARNING and ERROR lines of each component's log, the last LOG_LINES.
LOG_LINES = 60
_NOTEWORTHY = re.compile(r" (WARNING|ERROR|CRITICAL) |Traceback|Error:")


def _log_lines(path: Path) -> list[str]:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [line[:400] for line in lines if _NOTEWORTHY.search(line)][-LOG_LINES:]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport,
                                                                                         pytest.TestReport]:
    report = yield
    if report.failed:
        _add_cluster_logs(item, report)
    return report


def _add_cluster_logs(item: pytest.Item, report: pytest.TestReport) -> None:
    harness = sys.modules.get("local_cluster")  # loaded by every test module that runs a cluster
    if harness is None:
        return
    funcargs = getattr(item, "funcargs", {})
    for cluster in (v for v in funcargs.values() if isinstance(v, harness.LocalCluster)):
        parts = []
        for log in sorted(cluster.dir.glob("*.log")):
            lines = _log_lines(log)
            if lines:
                parts.append(f"--- {log.name} ---\n" + "\n".join(lines))
        if parts:
            report.sections.append(("component logs (warnings and errors)", "\n".join(parts)))
