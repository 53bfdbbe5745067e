"""Start-up behind the wait, with real processes: ``gnnsched gate --prestart -- gnnsched worker JOB`` against a real
``gnnsched node-agent`` (one fake 80 GiB GPU whose memory the worker enforces, ``--fake-gpu-memory enforce:1.3``; fake
MPS daemon on PATH).

A blocker job holds the GPU, so the workers queue. While they wait, each worker process (the gate's pid, already
exec'd into ``gnnsched worker``) has done its imports, built its graph and its model, and says so; it runs with no GPU
visible and no MPS limit, and the agent has admitted nothing for it. Each runs under tests/cuda_init_trap.py, which
records any call that would initialise CUDA on a CUDA build: none may come before the admission. The agent is
killed and restarted while they wait (the keepers re-ask the new agent). Once the blocker ends, both are admitted and
run under the limits the gate set: the one admitted at its byte-exact estimate overruns its limit on the fake GPU
(``memory-exceeded``), the one admitted 1.5x larger succeeds with the same observed peak as a worker behind the plain
gate.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fake_mps import start_agent, stop_agent
from gate_helpers import GiB, job_pod, write_pods
from gate_helpers import gnnsched_command as _gnnsched

from gnnsched.closed_loop import AttemptResult
from gnnsched.contract import (
    ENV_GATE_HANDOFF_FD,
    ENV_POD_NAME,
    ENV_POD_NAMESPACE,
    ENV_POD_UID,
    ENV_PRESTART_FALLBACK,
    ENV_RESULT_FILE,
)
from gnnsched.estimator import estimate
from gnnsched.spec import load_job

pytestmark = [pytest.mark.timeout(300), pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="Linux pidfd")]

TESTS = Path(__file__).parent
FAKES = TESTS / "fakes"
MIB = 2**20
JOB = """apiVersion: gnnsched.io/v1alpha1
kind: GNNJob
metadata: {name: j}
spec:
  mode: train
  model: {arch: gcn, layers: 2, hidden: 16}
  graph: {nodes: 2000, edges: 16000, features: 32, classes: 4}
  epochs: 2
"""
BLOCKER = r"""
import os, sys, time
open(sys.argv[1], "w").write(os.environ.get("CUDA_VISIBLE_DEVICES", ""))
while not os.path.exists(sys.argv[2]):
    time.sleep(0.02)
"""


class Agent:
    """A real node agent on one fake 80 GiB GPU (1 GiB reserved) that hands the fake GPU's enforcement to workers."""

    def __init__(self, tmp: Path, fake_memory: bool = True) -> None:
        self.tmp = tmp
        self.fake_memory = fake_memory
        self.sock = tmp / "gate.sock"
        self.pods = tmp / "pods.json"
        self.events = tmp / "events.jsonl"
        self.env = dict(os.environ, PATH=f"{FAKES}{os.pathsep}{os.environ['PATH']}")
        self.proc: subprocess.Popen | None = None

    def start(self, grace: float) -> None:
        if self.sock.exists():
            self.sock.unlink()
        cmd = _gnnsched() + [
            "node-agent", "--gpus", "fake:1x80Gi", *(["--fake-gpu-memory", "enforce:1.3"] if self.fake_memory else []),
            "--node-name", "node-a",
            "--gate-socket", str(self.sock), "--pods-file", str(self.pods),
            "--status-file", str(self.tmp / "status.json"), "--event-log", str(self.events),
            "--state-dir", str(self.tmp / "state"), "--jobs-uid", str(os.getuid()), "--reserve-bytes", "1Gi",
            "--mps", "on", "--mps-pipe-dir", str(self.tmp / "mps"), "--mps-log-dir", str(self.tmp / "mps-log"),
            "--peer-check", "off", "--recovery-grace", str(grace), "--metrics-port", "-1", "--log-level", "warning",
        ]
        self.proc = start_agent(cmd, self.env, self.tmp, self.sock, self.tmp / "agent.log", self.tmp / "mps",
                                timeout=60)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        stop_agent(self.proc, self.tmp / "mps")

    def event_list(self) -> list[dict]:
        return [json.loads(line) for line in self.events.read_text().splitlines()] if self.events.exists() else []

    def admitted_keys(self) -> set[str]:
        return {k for e in self.event_list() if e["event"] == "admitted" for k in e["keys"]}


def _start_blocker(agent: Agent, pod: dict, started: Path, go: Path) -> subprocess.Popen:
    """A gated process holding the whole GPU: it writes ``started`` once admitted and runs until ``go`` exists."""
    proc = subprocess.Popen(
        _gnnsched() + ["gate", "--socket", str(agent.sock), "--", sys.executable, "-S", "-c", BLOCKER,
                       str(started), str(go)],
        env=_pod_env(agent, pod), cwd=agent.tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(started.exists, "the blocker was never admitted")
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc


def _pod_env(agent: Agent, pod: dict, **extra: str) -> dict[str, str]:
    m = pod["metadata"]
    return dict(agent.env, **{ENV_POD_UID: m["uid"], ENV_POD_NAME: m["name"], ENV_POD_NAMESPACE: m["namespace"]},
                **extra)


def _wait_for(cond, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def _kill_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(5)


def test_prestart_worker_loads_while_queued_survives_an_agent_restart_and_runs_under_the_admitted_limit(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(JOB)
    need = estimate(load_job(job).spec).pmc_bytes  # byte-exact on the CPU
    blocker, blocker_job = job_pod("blocker", 79 * GiB)  # the whole GPU (80 GiB less the 1 GiB reserve)
    small, small_job = job_pod("small", need)
    large, large_job = job_pod("large", need * 3 // 2)
    agent = Agent(tmp_path)
    write_pods(agent.pods, [blocker, small, large], [blocker_job, small_job, large_job])
    go, blocker_started = tmp_path / "go", tmp_path / "blocker.started"
    procs: list[subprocess.Popen] = []
    agent.start(grace=8.0)
    try:
        procs.append(_start_blocker(agent, blocker, blocker_started, go))
        workers: dict[str, subprocess.Popen] = {}
        for pod in (small, large):
            name = pod["metadata"]["name"]
            env = _pod_env(agent, pod, **{ENV_RESULT_FILE: str(tmp_path / f"{name}.result")})
            env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
            # the worker under tests/cuda_init_trap.py: it records any call that would initialise CUDA on a CUDA build
            trapped = [sys.executable, str(TESTS / "cuda_trap_run.py"), str(tmp_path / f"{name}.trap")]
            with open(tmp_path / f"{name}.err", "w") as err:
                workers[name] = subprocess.Popen(
                    _gnnsched() + ["gate", "--prestart", "--socket", str(agent.sock), "--"] + trapped
                    + ["worker", str(job), "--no-progress"], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                    stderr=err, text=True)
            procs.append(workers[name])
        for name, proc in workers.items():
            err_file = tmp_path / f"{name}.err"
            _wait_for(lambda f=err_file: "waiting for the gate" in f.read_text(),
                      f"{name}: the worker never finished its start-up while queued")
            # The worker (the gate's own pid, exec'd) built its graph and model while the agent still held it back.
            assert "queued at position" in err_file.read_text()
            assert b"worker" in Path(f"/proc/{proc.pid}/cmdline").read_bytes()
            env = _environ(proc.pid)
            assert env["CUDA_VISIBLE_DEVICES"] == "" and env["PYTORCH_NVML_BASED_CUDA_CHECK"] == "1"
            assert ENV_GATE_HANDOFF_FD in env and "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in env
            assert proc.poll() is None and not (tmp_path / f"{name}.result").exists()
        uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in (blocker, small, large)}
        assert agent.admitted_keys() == {uids["blocker"]}

        agent.kill()  # the keepers of the queued workers ask the next agent; the blocker's keeper re-books it
        agent.start(grace=8.0)
        _wait_for(lambda: sum(e["event"] == "queued" and e["key"] in (uids["small"], uids["large"])
                              for e in agent.event_list()) >= 4, "the queued workers did not re-ask the new agent")
        assert {uids["small"], uids["large"]}.isdisjoint(agent.admitted_keys())

        go.touch()
        results = {}
        for name, proc in workers.items():
            out, _ = proc.communicate(timeout=180)
            err = (tmp_path / f"{name}.err").read_text()
            result = AttemptResult.model_validate_json((tmp_path / f"{name}.result").read_text())
            assert AttemptResult.model_validate_json(out.strip().splitlines()[-1]) == result
            assert "admitted after" in err, err
            results[name] = (proc.returncode, result, err)
        assert procs[0].wait(30) == 0
    finally:
        go.touch()
        _kill_all(procs)
        agent.stop()
    code, result, err = results["small"]
    # Admitted at its CPU-exact estimate, its fake GPU (1.3x the CPU bytes) overruns the limit the gate set.
    assert code == 1 and result.outcome == "memory-exceeded", err
    assert result.limit_bytes == need // MIB * MIB
    assert result.held_bytes is not None and result.held_bytes <= result.limit_bytes
    code, result, err = results["large"]
    assert code == 0 and result.outcome == "succeeded", err
    assert result.limit_bytes == (need * 3 // 2) // MIB * MIB
    # The graph and model built before admission are counted on the device once moved there: 1.3x the estimate, as
    # behind the plain gate (tests/test_fake_gpu_processes.py).
    assert result.observed_peak_bytes == pytest.approx(1.3 * need, rel=0.01)
    for name in ("small", "large"):
        # Behind the real gate, nothing before the admission reached a call that initialises CUDA on a CUDA build.
        trap = [json.loads(line) for line in (tmp_path / f"{name}.trap").read_text().splitlines()]
        assert [r for r in trap if r["event"] == "call" and r["pre_admission"]] == [], trap
        assert [r["torch_geometric"] for r in trap if r["event"] == "admission"] == [True]
    events = agent.event_list()
    assert {uids["small"], uids["large"]} <= agent.admitted_keys()
    assert sum(e["event"] == "released" and e["key"] in (uids["small"], uids["large"]) for e in events) == 2


def test_prestart_workload_that_exits_while_queued_leaves_the_queue(tmp_path):
    """The keeper watches the workload from the start: one that ends before its admission (a failed start-up) closes
    the connection, which takes it out of the agent's queue; nothing is ever admitted for it."""
    blocker, blocker_job = job_pod("blocker", 79 * GiB)
    quitter, quitter_job = job_pod("quitter", 1 * GiB)
    agent = Agent(tmp_path)
    write_pods(agent.pods, [blocker, quitter], [blocker_job, quitter_job])
    go, blocker_started = tmp_path / "go", tmp_path / "blocker.started"
    procs: list[subprocess.Popen] = []
    agent.start(grace=0.0)
    try:
        procs.append(_start_blocker(agent, blocker, blocker_started, go))
        run = subprocess.run(
            _gnnsched() + ["gate", "--prestart", "--socket", str(agent.sock), "--", sys.executable, "-S", "-c",
                           "import sys; sys.exit(7)"],
            env=_pod_env(agent, quitter), cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
        assert run.returncode == 7  # the workload's own status: it ran at once, before any admission
        uid = quitter["metadata"]["uid"]
        _wait_for(lambda: any(e["event"] == "cancelled" and e["key"] == uid for e in agent.event_list()),
                  "the agent still queues a workload that has exited", timeout=30)
        go.touch()
        assert procs[0].wait(30) == 0
        _wait_for(lambda: any(e["event"] == "released" for e in agent.event_list()), "blocker not released")
        time.sleep(0.5)
        assert uid not in agent.admitted_keys()
    finally:
        go.touch()
        _kill_all(procs)
        agent.stop()


def test_prestart_worker_exits_with_the_gates_status_when_rejected(tmp_path):
    """A pod the agent cannot identify (not in its pod list) is rejected: the keeper tells the worker, which has done
    its start-up and exits 3 (the gate's rejection status) without running a step."""
    job = tmp_path / "job.yaml"
    job.write_text(JOB)
    known, known_job = job_pod("known", 1 * GiB)
    stranger, _ = job_pod("stranger", 1 * GiB)
    agent = Agent(tmp_path)
    write_pods(agent.pods, [known], [known_job])
    agent.start(grace=0.0)
    try:
        run = subprocess.run(
            _gnnsched() + ["gate", "--prestart", "--socket", str(agent.sock), "--"] + _gnnsched()
            + ["worker", str(job), "--no-progress"],
            env=_pod_env(agent, stranger), cwd=tmp_path, capture_output=True, text=True, timeout=180, check=False)
    finally:
        agent.stop()
    assert run.returncode == 3, run.stderr
    assert "rejected" in run.stderr and run.stdout == ""


def _tests_on_path(env: dict[str, str]) -> dict[str, str]:
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def test_prestart_worker_whose_start_up_initialises_cuda_keeps_its_place_and_runs_after_one_reexec(tmp_path):
    """A start-up that initialises CUDA before admission (tests/cuda_init_caller.py: ``torch.cuda.init()`` where a
    library would) is stopped by the guard. The worker still waits at the gate, takes its admission, re-executes itself
    once as a plain admitted worker (same pid) and succeeds; its log and result line say why. The keeper holds the
    reservation across the exec: a job queued meanwhile, which does not fit beside it, is admitted only after the
    worker's release."""
    job = tmp_path / "job.yaml"
    job.write_text(JOB)
    blocker, blocker_job = job_pod("blocker", 79 * GiB)
    worker_pod, worker_job = job_pod("worker", 50 * GiB)
    other, other_job = job_pod("other", 40 * GiB)  # 50 + 40 > 79: only after the worker's release
    uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in (blocker, worker_pod, other)}
    agent = Agent(tmp_path)
    write_pods(agent.pods, [blocker, worker_pod, other], [blocker_job, worker_job, other_job])
    go, blocker_started, other_started = tmp_path / "go", tmp_path / "blocker.started", tmp_path / "other.started"
    record = tmp_path / "calls.jsonl"
    procs: list[subprocess.Popen] = []
    agent.start(grace=0.0)
    try:
        procs.append(_start_blocker(agent, blocker, blocker_started, go))
        env = _tests_on_path(_pod_env(agent, worker_pod, **{ENV_RESULT_FILE: str(tmp_path / "worker.result")}))
        caller = [sys.executable, str(TESTS / "cuda_init_caller.py"), str(record)]
        with open(tmp_path / "worker.err", "w") as err:
            worker = subprocess.Popen(
                _gnnsched() + ["gate", "--prestart", "--socket", str(agent.sock), "--"] + caller
                + ["worker", str(job), "--no-progress"], env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=err,
                text=True)
        procs.append(worker)
        err_file = tmp_path / "worker.err"
        _wait_for(lambda: "will re-execute once admitted" in err_file.read_text(),
                  "the worker's start-up did not hit the guard")
        time.sleep(1.0)  # still queued behind the blocker, still alive: the failed start-up did not end it
        assert worker.poll() is None and uids["worker"] not in agent.admitted_keys()
        go.touch()
        _wait_for(lambda: uids["worker"] in agent.admitted_keys(), "the worker was never admitted")
        # Queued while the worker re-executes and runs again: it must wait for the worker's release.
        procs.append(subprocess.Popen(
            _gnnsched() + ["gate", "--socket", str(agent.sock), "--", sys.executable, "-S", "-c",
                           "import sys; open(sys.argv[1], 'w').write('1')", str(other_started)],
            env=_pod_env(agent, other), cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        _wait_for(lambda: any(e["event"] == "queued" and e["key"] == uids["other"] for e in agent.event_list()),
                  "the other job never queued")
        released = [e for e in agent.event_list() if e["event"] == "released" and e["key"] == uids["worker"]]
        assert released == [], "the worker was released before the other job even queued: nothing to show"
        out, _ = worker.communicate(timeout=240)
        _wait_for(other_started.exists, "the other job was never admitted after the worker's release")
        assert procs[0].wait(30) == 0 and procs[2].wait(30) == 0
    finally:
        go.touch()
        _kill_all(procs)
        agent.stop()
    err = err_file.read_text()
    assert worker.returncode == 0, err
    result = AttemptResult.model_validate_json((tmp_path / "worker.result").read_text())
    assert AttemptResult.model_validate_json(out.strip().splitlines()[-1]) == result
    assert result.outcome == "succeeded" and result.steps
    assert result.prestart_fallback is not None
    assert result.prestart_fallback.startswith("start-up tried to initialise CUDA before admission")
    assert "torch.cuda._lazy_init" in result.prestart_fallback
    assert err.count("re-executing as a plain admitted worker") == 1, err
    assert err.count("prestart fallback: re-executed after admission (start-up tried to initialise CUDA") == 1, err
    # One process (the gate's pid), started twice: prestarted, then re-executed admitted, with the reason.
    starts = [json.loads(line) for line in record.read_text().splitlines()]
    assert [(r["event"], r["pre_admission"], r["fallback"] is not None) for r in starts if r["event"] == "start"] == [
        ("start", True, False), ("start", False, True)]
    assert {r["pid"] for r in starts} == {worker.pid}
    assert sum(r["event"] == "cuda-init" for r in starts) == 1
    # The reservation was held throughout: admitted once, released once (at the worker's exit), and the job that did
    # not fit beside it admitted only after that release.
    events = agent.event_list()
    admitted_at = [i for i, e in enumerate(events) if e["event"] == "admitted" and uids["worker"] in e["keys"]]
    released_at = [i for i, e in enumerate(events) if e["event"] == "released" and e["key"] == uids["worker"]]
    other_at = [i for i, e in enumerate(events) if e["event"] == "admitted" and uids["other"] in e["keys"]]
    assert len(admitted_at) == 1 and len(released_at) == 1 and len(other_at) == 1, events
    assert admitted_at[0] < released_at[0] < other_at[0], events


def test_prestart_cuda_worker_that_sees_no_device_once_admitted_reexecutes_once_then_fails_as_the_plain_gate(tmp_path):
    """The post-admission latch check: a prestarted ``--device cuda`` worker asks the CUDA runtime how many devices it
    sees once admitted; on this CPU build it is 0 although the admission named a GPU, which is what a driver latched
    before admission looks like. It re-executes once as a plain admitted worker, which then fails exactly as the plain
    gate's worker does here (same status, same message): no loop, no second re-exec."""
    job = tmp_path / "job.yaml"
    job.write_text(JOB)
    plain, plain_job = job_pod("plain", 1 * GiB)
    pre, pre_job = job_pod("pre", 1 * GiB)
    agent = Agent(tmp_path, fake_memory=False)
    write_pods(agent.pods, [plain, pre], [plain_job, pre_job])
    agent.start(grace=0.0)
    try:
        runs = {}
        for pod, gate in ((plain, ["gate"]), (pre, ["gate", "--prestart"])):
            runs[pod["metadata"]["name"]] = subprocess.run(
                _gnnsched() + gate + ["--socket", str(agent.sock), "--"] + _gnnsched()
                + ["worker", str(job), "--device", "cuda", "--no-progress"],
                env=_pod_env(agent, pod), cwd=tmp_path, capture_output=True, text=True, timeout=180, check=False)
    finally:
        agent.stop()
    base, fell = runs["plain"], runs["pre"]
    assert base.returncode == 2 and "no CUDA device is available" in base.stderr, base.stderr
    assert fell.returncode == base.returncode, fell.stderr
    assert fell.stderr.strip().splitlines()[-1] == base.stderr.strip().splitlines()[-1]
    assert fell.stdout == base.stdout == ""
    assert fell.stderr.count("re-executing as a plain admitted worker") == 1, fell.stderr
    assert fell.stderr.count("prestart fallback: re-executed after admission (admitted to CUDA_VISIBLE_DEVICES=") == 1
    assert "the CUDA runtime sees no device" in fell.stderr
    assert ENV_PRESTART_FALLBACK not in base.stderr
