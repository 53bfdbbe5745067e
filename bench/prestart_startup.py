"""Start-up behind the wait, measured: the same job behind ``gnnsched gate`` and ``gnnsched gate --prestart``.

A real ``gnnsched node-agent`` (one fake 80 GiB GPU, fake MPS daemon from ``tests/fakes`` on PATH) and, per run, a
blocker job that holds the whole GPU for ``--wait`` seconds while the measured job queues behind it. The figure is
the time from the agent's admission of the measured job (its event log) to the job's exit, less the wall time of its
steps (the ``seconds`` of its result line): what the job spends after its admission on anything but its steps.
Behind the plain gate the worker starts its interpreter, imports torch and PyG, loads its graph and builds its model
only after the admission; behind ``--prestart`` it did all that while it waited, so only the move to the device (and
the process's exit) is left. Taking the steps out keeps the figure from swinging with the load on a shared machine
while the steps run. The two modes run interleaved (plain, prestart, plain, ...) in one invocation. The worker runs
on the CPU (``--device cpu``): the GPU side (CUDA context, the copy to the device) is not measured here, and it is
paid after the admission in both modes.

    python bench/prestart_startup.py [--reps 2] [--wait 20] [--jobs cora,arxiv]

Prints one line per run and, per job, the median seconds after admission outside the steps in each mode and their
difference (the start-up hidden behind the wait).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from gnnsched.contract import ANN_ADMIT_BYTES, ENV_POD_NAME, ENV_POD_NAMESPACE, ENV_POD_UID
from gnnsched.node_agent.identity import gnnjob_owner_reference
from gnnsched.trust.job_facts import STATUS_FIELD, facts_status

ROOT = Path(__file__).resolve().parents[1]
FAKES = ROOT / "tests" / "fakes"
GiB = 2**30
JOBS = {
    # Cora from the PyG raw files in the data directory (a real graph load), 2-layer GCN, 5 epochs
    "cora": "mode: train\n  model: {arch: gcn, layers: 2, hidden: 64}\n  graph: {dataset: cora}\n  epochs: 5\n",
    # ogbn-arxiv-sized synthetic graph (169,343 nodes, 2.3 M edges, 128 features), 2-layer SAGE, 1 epoch
    "arxiv": "mode: train\n  model: {arch: sage, layers: 2, hidden: 64}\n"
             "  graph: {nodes: 169343, edges: 2315598, features: 128, classes: 40}\n  epochs: 1\n",
}
BLOCKER = r"""
import os, sys, time
open(sys.argv[1], "w").close()
while not os.path.exists(sys.argv[2]):
    time.sleep(0.02)
"""
READY = re.compile(r"ready in ([0-9.]+) s")


def _gnnsched() -> list[str]:
    exe = Path(sys.executable).parent / "gnnsched"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "gnnsched.cli"]


def _pod(name: str, admit_bytes: int) -> tuple[dict[str, Any], dict[str, Any]]:
    job_uid = str(uuid.uuid4())
    meta = {"name": name, "namespace": "default", "uid": str(uuid.uuid4()),
            "annotations": {ANN_ADMIT_BYTES: str(admit_bytes)},
            "ownerReferences": [gnnjob_owner_reference(f"job-{name}", job_uid)]}
    pod = {"metadata": meta, "spec": {"nodeName": "node-a"}, "status": {"phase": "Running"}}
    # the job's status names the pod with its facts, as the operator writes it (gnnsched.trust.job_facts)
    job = {"metadata": {"name": f"job-{name}", "namespace": "default", "uid": job_uid},
           "status": {STATUS_FIELD: facts_status(pod)}}
    return pod, job


def _pod_env(base: dict[str, str], pod: dict[str, Any]) -> dict[str, str]:
    m = pod["metadata"]
    return dict(base, **{ENV_POD_UID: m["uid"], ENV_POD_NAME: m["name"], ENV_POD_NAMESPACE: m["namespace"]})


def _wait_for(cond: Any, what: str, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out: {what}")
        time.sleep(0.02)


def _admitted_at(events: Path, uid: str) -> float | None:
    for line in events.read_text().splitlines():
        e = json.loads(line)
        if e["event"] == "admitted" and uid in e["keys"]:
            return float(e["t"])
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=2, help="runs per job and mode")
    ap.add_argument("--wait", type=float, default=20.0, help="seconds the blocker holds the GPU after the job starts")
    ap.add_argument("--jobs", default="cora,arxiv", help=f"comma-separated, of {', '.join(JOBS)}")
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.jobs.split(",") if n.strip()]
    unknown = [n for n in names if n not in JOBS]
    if unknown:
        raise SystemExit(f"--jobs: unknown job {unknown[0]!r} (known: {', '.join(JOBS)})")
    runs = [(job, mode, rep) for rep in range(args.reps) for job in names for mode in ("plain", "prestart")]
    tmp = Path(tempfile.mkdtemp(prefix="gnnsched-prestart-"))
    pods, jobs, plan = [], [], []
    for i, run in enumerate(runs):
        blocker, bjob = _pod(f"blocker-{i}", 79 * GiB)  # the whole GPU: 80 GiB less the 1 GiB reserve
        measured, mjob = _pod(f"job-{i}", 1 * GiB)
        pods += [blocker, measured]
        jobs += [bjob, mjob]
        plan.append((run, blocker, measured))
    (tmp / "pods.json").write_text(json.dumps({"pods": pods, "gnnjobs": jobs}))
    for name in names:
        header = f"apiVersion: gnnsched.io/v1alpha1\nkind: GNNJob\nmetadata: {{name: {name}}}\n"
        (tmp / f"{name}.yaml").write_text(f"{header}spec:\n  {JOBS[name]}")
    env = dict(os.environ, PATH=f"{FAKES}{os.pathsep}{os.environ['PATH']}")
    sock, events = tmp / "gate.sock", tmp / "events.jsonl"
    with open(tmp / "agent.log", "w") as agent_log:  # the child keeps its own copy of the descriptor
        agent = subprocess.Popen(_gnnsched() + [
            "node-agent", "--gpus", "fake:1x80Gi", "--node-name", "node-a", "--gate-socket", str(sock),
            "--pods-file", str(tmp / "pods.json"), "--status-file", str(tmp / "status.json"),
            "--event-log", str(events), "--state-dir", str(tmp / "state"), "--jobs-uid", str(os.getuid()),
            "--reserve-bytes", "1Gi", "--mps", "on", "--mps-pipe-dir", str(tmp / "mps"),
            "--mps-log-dir", str(tmp / "mps-log"), "--peer-check", "off", "--recovery-grace", "0",
            "--metrics-port", "-1", "--log-level", "warning",
        ], env=env, cwd=tmp, stderr=agent_log)
    children: list[subprocess.Popen[bytes]] = []
    results: dict[tuple[str, str], list[float]] = {}
    ready: dict[str, list[float]] = {}
    print(f"node agent on a fake 80 GiB GPU; blocker holds it {args.wait:g} s after each job starts; worker on the "
          f"CPU; scratch {tmp}")
    print(f"{'job':8s} {'mode':9s} {'rep':>3s} {'after admission s':>18s} {'steps s':>8s} {'other s':>8s} "
          f"{'worker ready s':>15s}")
    try:
        _wait_for(sock.exists, "the node agent did not start", 60)
        for i, ((job, mode, rep), blocker, measured) in enumerate(plan):
            go, started = tmp / f"go-{i}", tmp / f"started-{i}"
            block = subprocess.Popen(_gnnsched() + ["gate", "--socket", str(sock), "--", sys.executable, "-S", "-c",
                                                    BLOCKER, str(started), str(go)],
                                     env=_pod_env(env, blocker), cwd=tmp, stderr=subprocess.DEVNULL)
            children.append(block)
            _wait_for(started.exists, "the blocker was not admitted")
            gate = ["gate", "--prestart"] if mode == "prestart" else ["gate"]
            err_file = tmp / f"job-{i}.err"
            with open(err_file, "w") as err:
                proc = subprocess.Popen(_gnnsched() + [*gate, "--socket", str(sock), "--"] + _gnnsched()
                                        + ["worker", str(tmp / f"{job}.yaml"), "--no-progress", "--device", "cpu"],
                                        env=_pod_env(env, measured), cwd=tmp, stdout=subprocess.PIPE, stderr=err)
            children.append(proc)
            time.sleep(args.wait)
            go.touch()
            block.wait(60)
            out, _ = proc.communicate(timeout=600)
            ended = time.time()
            if proc.returncode != 0:
                raise SystemExit(f"{job} {mode}: worker exited {proc.returncode}: {err_file.read_text()[-1000:]}")
            admitted = _admitted_at(events, measured["metadata"]["uid"])
            if admitted is None:
                raise SystemExit(f"{job} {mode}: no admission event")
            after = ended - admitted
            steps = float(json.loads(out.decode().strip().splitlines()[-1])["seconds"])
            results.setdefault((job, mode), []).append(after - steps)
            match = READY.search(err_file.read_text())
            ready_s = float(match.group(1)) if match else None
            if ready_s is not None:
                ready.setdefault(job, []).append(ready_s)
            note = "" if ready_s is None or ready_s < args.wait else "  (start-up longer than the wait)"
            shown = "" if ready_s is None else f"{ready_s:.2f}"
            print(f"{job:8s} {mode:9s} {rep:3d} {after:18.2f} {steps:8.2f} {after - steps:8.2f} {shown:>15s}{note}",
                  flush=True)
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait(5)
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(10)
        except subprocess.TimeoutExpired:
            agent.kill()
        pid_file = tmp / "mps" / "fake-mps.pid"
        if pid_file.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
    print()
    for job in names:
        plain = statistics.median(results[(job, "plain")])
        pre = statistics.median(results[(job, "prestart")])
        print(f"{job}: median seconds after admission outside the steps: plain gate {plain:.2f}, --prestart {pre:.2f}; "
              f"start-up hidden behind the wait {plain - pre:.2f} s ({(plain - pre) / plain:.0%}); worker ready "
              f"(imports, graph, model) in {statistics.median(ready[job]):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
