"""An admin's session with the real kubectl against ``local_cluster.py --serve`` (docs/local-cluster.md).

Every command goes through kubectl's own client code (discovery, OpenAPI, Tables, strict field validation, watches,
the pods/log subresource), so a difference between the emulated API server and kube-apiserver that kubectl notices
fails here. kubectl is Debian's ``kubernetes-client`` (``.ci/run`` installs it); without it the module is skipped.

Budget: one 1-node cluster and one tiny job, about a minute on two shared cores.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))

from jobs import tiny_example  # noqa: E402

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed (.ci/run does)")]
SCRIPT = HERE / "local_cluster.py"


class Session:
    def __init__(self, proc: subprocess.Popen[str], kubeconfig: Path) -> None:
        self.proc = proc
        self.kubeconfig = kubeconfig
        self.env = {**os.environ, "KUBECONFIG": str(kubeconfig)}

    def kubectl(self, *args: str, ok: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(["kubectl", *args], capture_output=True, text=True, timeout=timeout, env=self.env)
        if ok:
            assert proc.returncode == 0, f"kubectl {' '.join(args)}: {proc.stderr}"
            assert "Unhandled Error" not in proc.stderr, proc.stderr  # client-go's complaints (watch decoding ...)
        return proc


@pytest.fixture(scope="module")
def session() -> Iterator[Session]:
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--serve", "--nodes", "1", "--gpus", "fake:1x8Gi"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline().strip()
        m = re.fullmatch(r"export KUBECONFIG=(\S+)", first)
        assert m, f"first stdout line {first!r}; stderr: {proc.stderr.read() if proc.stderr else ''}"
        yield Session(proc, Path(m.group(1)))
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_apply_wait_describe_logs_explain_delete(session: Session, tmp_path: Path) -> None:
    job = tiny_example(REPO / "examples" / "gcn-train-cora.yaml")
    name = job["metadata"]["name"]
    manifest = tmp_path / "job.yaml"
    manifest.write_text(yaml.safe_dump(job))
    watch = subprocess.Popen(["kubectl", "get", "gj", "-w"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=session.env)
    try:
        out = session.kubectl("apply", "-f", str(manifest)).stdout
        assert out.strip() == f"gnnjob.gnnsched.io/{name} created"
        assert session.kubectl("apply", "-f", str(manifest)).stdout.strip() == f"gnnjob.gnnsched.io/{name} unchanged"

        out = session.kubectl("wait", "--for=jsonpath={.status.phase}=Succeeded", f"gj/{name}", "--timeout=240s",
                              timeout=250).stdout
        assert out.strip() == f"gnnjob.gnnsched.io/{name} condition met"
    finally:
        time.sleep(1.5)
        watch.terminate()
        watched, watch_err = watch.communicate(timeout=10)
    lines = watched.splitlines()
    assert lines[0].split() == ["NAME", "PHASE", "MODEL", "MODE", "PMC", "NODE", "GPU", "AGE"], watched
    assert [ln for ln in lines if ln.startswith("NAME")] == lines[:1]  # one header, rows follow as they change
    assert any(ln.split()[:2] == [name, "Succeeded"] for ln in lines[1:]), watched
    assert "Unhandled Error" not in watch_err, watch_err

    table = session.kubectl("get", "gj").stdout.splitlines()
    row = next(ln.split() for ln in table if ln.startswith(name))
    assert row[1] == "Succeeded" and row[2] == "gcn" and row[3] == "train"
    assert re.fullmatch(r"\d+s|\d+m(\d+s)?", row[-1]), table  # an age as kube's HumanDuration writes it

    described = session.kubectl("describe", "gj", name).stdout
    assert f"Name:         {name}" in described
    assert re.search(r"Phase:\s+Succeeded", described), described
    events = described.split("Events:", 1)[1]
    assert re.search(r"Normal\s+Estimated\s+\S+\s+kopf\s+PMC", events), events
    assert "Succeeded" in events
    assert "gnnsched-scheduler" not in events  # the pod's events (Scheduled) are the pod's: involvedObject selects

    pod = yaml.safe_load(session.kubectl("get", "gj", name, "-o", "yaml").stdout)["status"]["podName"]
    log = session.kubectl("logs", pod).stdout
    assert log.strip(), "the pod's log is empty"
    assert session.kubectl("logs", "-f", pod).stdout == log  # a finished pod's follow ends at the end of its log

    got = session.kubectl("get", "events").stdout.splitlines()
    assert got[0].split() == ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"], got[:2]
    assert any(f"gnnjob/{name}" in ln for ln in got[1:])

    explained = session.kubectl("explain", "gnnjob.spec.model").stdout
    assert "FIELD: model <Object>" in explained and re.search(r"\n  arch\s+<string>\n", explained), explained
    assert session.kubectl("auth", "can-i", "create", "gnnjobs").stdout.strip() == "yes"

    typo = yaml.safe_load(manifest.read_text())
    typo["spec"]["modle"] = typo["spec"].pop("model")
    manifest.write_text(yaml.safe_dump(typo))
    refused = session.kubectl("apply", "-f", str(manifest), ok=False)  # the stored job: a merge patch
    assert refused.returncode == 1
    said = refused.stderr.rstrip()
    assert said.startswith('The request is invalid: patch: Invalid value: "{'), said
    assert said.endswith('": strict decoding error: unknown field "spec.modle"'), said
    typo["metadata"]["name"] = "typo"
    manifest.write_text(yaml.safe_dump(typo))
    refused = session.kubectl("apply", "-f", str(manifest), ok=False)  # a new job: a create
    assert refused.returncode == 1
    assert ('Error from server (BadRequest): error when creating "' in refused.stderr
            and 'GNNJob in version "v1alpha1" cannot be handled as a GNNJob: strict decoding error: '
                'unknown field "spec.modle"' in refused.stderr), refused.stderr
    assert session.kubectl("get", "gj", "typo", ok=False).returncode == 1  # nothing stored
    nowhere = session.kubectl("apply", "-n", "nosuch", "-f", str(REPO / "examples" / "gcn-train-cora.yaml"), ok=False)
    assert nowhere.returncode == 1 and 'namespaces "nosuch" not found' in nowhere.stderr, nowhere.stderr
    namespaces = session.kubectl("get", "ns").stdout.split()
    assert {"default", "kube-system", "kube-public", "kube-node-lease"} <= set(namespaces), namespaces

    out = session.kubectl("delete", "gj", name, timeout=240).stdout
    assert out.strip() == f'gnnjob.gnnsched.io "{name}" deleted'
    gone = session.kubectl("get", "gj", name, ok=False)
    assert gone.returncode == 1 and "NotFound" in gone.stderr


@pytest.mark.parametrize("example", sorted((REPO / "examples").rglob("*.yaml")),
                         ids=lambda p: str(p.relative_to(REPO / "examples")))
def test_server_dry_run_of_each_example(session: Session, example: Path) -> None:
    name = yaml.safe_load(example.read_text())["metadata"]["name"]
    out = session.kubectl("apply", "--dry-run=server", "-f", str(example)).stdout
    assert out.strip() == f"gnnjob.gnnsched.io/{name} created (server dry run)"
    assert session.kubectl("get", "gj", name, ok=False).returncode == 1  # a dry run stores nothing


def test_ctrl_c_ends_the_session_and_leaves_nothing(session: Session) -> None:
    run_dir = session.kubeconfig.parent
    session.proc.send_signal(signal.SIGINT)
    assert session.proc.wait(timeout=90) == 0
    assert not run_dir.exists()  # kubeconfig, logs, sockets: the whole run directory is gone
