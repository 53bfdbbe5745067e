"""On a failed local-cluster test, the components' own account of what happened.

The timeline the harness prints says what the pods and GNNJobs did; why (the node agent's fault roles, a refused
write, a retried annotation) is in the components' logs under the cluster's directory, which a CI run does not keep.
So a failed test's report gets one more section: every WARNING or ERROR line of each component's log, the last
``LOG_LINES`` of them per component."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

LOG_LINES = 60
_NOTEWORTHY = re.compile(r" (WARNING|ERROR|CRITICAL) |Traceback|Error:")


def _log_lines(path: Path) -> list[str]:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [line[:400] for line in lines if _NOTEWORTHY.search(line)][-LOG_LINES:]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
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
