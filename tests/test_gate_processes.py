"""The gate with real processes: a real ``gnnsched node-agent`` (fake 2 × 80 GiB GPUs, fake MPS daemon on PATH) and
30 short jobs, each a subprocess behind ``gnnsched gate``; then an agent restart under load.

The safety check is independent of the agent's books: every job's workload records (from inside the exec'd process)
when it ran, on which GPU (``CUDA_VISIBLE_DEVICES``) and with which MPS limits; a sweep over those intervals shows
the bytes committed per GPU at every instant.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from fake_mps import start_agent, stop_agent
from gate_helpers import GiB, job_pod, write_pods
from gate_helpers import gnnsched_command as _gnnsched

from gnnsched.contract import ENV_POD_NAME, ENV_POD_NAMESPACE, ENV_POD_UID
from gnnsched.policies import Task, traversal

pytestmark = [pytest.mark.timeout(120), pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="Linux pidfd")]

FAKES = Path(__file__).parent / "fakes"
CAPACITY = 80 * GiB - 2 * GiB
MAX_CLIENTS = 4

WORKLOAD = r"""
import json, os, sys, time
out, key, hold = sys.argv[1], sys.argv[2], float(sys.argv[3])
start = time.time()
go = os.environ.get("GO_FILE")
if go:
    while not os.path.exists(go):
        time.sleep(0.02)
else:
    time.sleep(hold)
rec = {"key": key, "start": start, "end": time.time(), "pid": os.getpid(),
       "gpu": os.environ.get("CUDA_VISIBLE_DEVICES"), "limit": os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"),
       "threads": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
       "pipe": os.environ.get("CUDA_MPS_PIPE_DIRECTORY")}
with open(os.path.join(out, key + ".json"), "x") as f:
    json.dump(rec, f)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Agent:
    def __init__(self, tmp: Path, policy: str, bypass_limit: int = 0) -> None:
        self.tmp = tmp
        self.sock = tmp / "gate.sock"
        self.pods = tmp / "pods.json"
        self.status = tmp / "status.json"
        self.events = tmp / "events.jsonl"
        self.port = _free_port()
        self.policy = policy
        self.bypass_limit = bypass_limit
        self.proc: subprocess.Popen | None = None
        self.env = dict(os.environ, PATH=f"{FAKES}{os.pathsep}{os.environ['PATH']}")

    def start(self, grace: float) -> None:
        cmd = _gnnsched() + [
            "node-agent",
            "--gpus",
            "fake:2x80Gi",
            "--node-name",
            "node-a",
            "--gate-socket",
            str(self.sock),
            "--pods-file",
            str(self.pods),
            "--status-file",
            str(self.status),
            "--event-log",
            str(self.events),
            "--policy",
            self.policy,
            "--bypass-limit",
            str(self.bypass_limit),
            "--reserve-bytes",
            "2Gi",
            "--max-clients-per-gpu",
            str(MAX_CLIENTS),
            "--mps",
            "on",
            "--mps-pipe-dir",
            str(self.tmp / "mps"),
            "--mps-log-dir",
            str(self.tmp / "mps-log"),
            "--peer-check",
            "off",
            "--recovery-grace",
            str(grace),
            "--status-interval",
            "0.5",
            "--state-dir",
            str(self.tmp / "state"),
            "--jobs-uid",
            str(os.getuid()),
            "--metrics-port",
            str(self.port),
            "--metrics-addr",
            "127.0.0.1",
            "--log-level",
            "warning",
        ]
        self.proc = start_agent(cmd, self.env, self.tmp, self.sock, self.tmp / "agent.log", self.tmp / "mps")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        stop_agent(self.proc, self.tmp / "mps")

    def metric(self, name: str) -> float | None:
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5).read().decode()
        for line in text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        return None


def _launch(agent: Agent, pod: dict, out: Path, hold: float, extra_env: dict | None = None) -> subprocess.Popen:
    m = pod["metadata"]
    env = dict(agent.env, **{ENV_POD_UID: m["uid"], ENV_POD_NAME: m["name"], ENV_POD_NAMESPACE: m["namespace"]},
               **(extra_env or {}))
    cmd = _gnnsched() + ["gate", "--socket", str(agent.sock), "--", sys.executable, "-S", "-c", WORKLOAD, str(out),
                         m["name"], str(hold)]
    return subprocess.Popen(
        cmd, env=env, cwd=out, stdout=subprocess.DEVNULL, stderr=open(out / f"{m['name']}.err", "w")
    )


def _sweep(records: list[dict], bytes_of: dict[str, int]) -> dict[str, tuple[int, int]]:
    """Per GPU, the maximum over time of (committed bytes, clients) from the workloads' own intervals."""
    peaks: dict[str, tuple[int, int]] = {}
    by_gpu: dict[str, list[tuple[float, int, int]]] = {}
    for r in records:
        by_gpu.setdefault(r["gpu"], []).extend(
            [(r["start"], 1, bytes_of[r["key"]]), (r["end"], -1, bytes_of[r["key"]])]
        )
    for gpu, evs in by_gpu.items():
        evs.sort(key=lambda e: (e[0], e[1]))  # ends before starts at equal times
        cur = n = best = best_n = 0
        for _t, d, b in evs:
            cur += d * b
            n += d
            best, best_n = max(best, cur), max(best_n, n)
        peaks[gpu] = (best, best_n)
    return peaks


def _check_policy_order(events: list[dict], policy: str, bypass_limit: int = 0) -> tuple[int, int]:
    """Replay the event log: with ``bypass_limit`` 0 each admission must be a prefix of the policy's order over what
    was queued then; with backfill no queued job may see more than ``bypass_limit`` jobs behind it in that order
    admitted before it. Returns (decisions, the most times any job was overtaken)."""
    rounds = 0
    overtaken: dict[str, int] = {}
    # Admission events of one decision are written consecutively; group them by contiguity.
    queued: dict[str, Task] = {}
    i = 0
    while i < len(events):
        ev = events[i]
        if ev["event"] == "queued":
            queued[ev["key"]] = Task(ev["key"], ev["bytes"], ev["seq"], ev.get("qt"))
        elif ev["event"] == "cancelled":
            queued.pop(ev["key"], None)
        elif ev["event"] == "admitted":
            batch = []
            while i < len(events) and events[i]["event"] == "admitted":
                batch.extend(events[i]["keys"])
                i += 1
            order = [t.key for t in traversal(policy, queued.values())]
            if bypass_limit:
                for j, k in enumerate(order):
                    if k not in batch:
                        overtaken[k] = overtaken.get(k, 0) + sum(1 for later in order[j + 1:] if later in batch)
                        assert overtaken[k] <= bypass_limit, f"{k} overtaken {overtaken[k]} times"
            else:
                assert batch == order[: len(batch)], f"admitted {batch} but the {policy} order was {order}"
            if policy == "lmcf":  # the same, stated without the reference: nothing smaller stays behind
                rest = [queued[k].bytes for k in order[len(batch):]]
                assert not rest or max(queued[k].bytes for k in batch) <= min(rest)
            for k in batch:
                queued.pop(k)
            rounds += 1
            continue
        i += 1
    return rounds, max(overtaken.values(), default=0)


def test_thirty_jobs_real_processes(tmp_path: Path) -> None:
    rng = random.Random(5)
    sizes = [rng.choice([4, 8, 12, 20, 30, 45, 60]) * GiB for _ in range(30)]
    made = [job_pod(f"job{i:02d}", b, runtime=rng.uniform(1, 100)) for i, b in enumerate(sizes)]
    pods, jobs = zip(*made, strict=True)
    agent = Agent(tmp_path, "lmcf", bypass_limit=0)  # the strict prefix rule, stated explicitly
    write_pods(agent.pods, list(pods), list(jobs))
    out = tmp_path / "out"
    out.mkdir()
    agent.start(grace=2.0)
    procs: list[subprocess.Popen] = []
    try:
        procs += [_launch(agent, p, out, hold=0.15) for p in pods]
        codes = [p.wait(90) for p in procs]
        assert codes == [0] * 30, [((out / f"job{i:02d}.err").read_text()) for i, c in enumerate(codes) if c]
        records = [json.loads((out / f"job{i:02d}.json").read_text()) for i in range(30)]  # "x" mode: at most once
        bytes_of = {p["metadata"]["name"]: int(p["metadata"]["annotations"]["gnnsched.io/admit-bytes"]) for p in pods}
        status = json.loads(agent.status.read_text())
        gpu_uuids = {g["uuid"] for g in status["status"]["gpus"]}
        for r in records:
            assert r["gpu"] in gpu_uuids
            assert r["limit"] == f"0={bytes_of[r['key']] // 2**20}M"
            assert r["pipe"] == str(tmp_path / "mps") and 1 <= int(r["threads"]) <= 100
        peaks = _sweep(records, bytes_of)
        assert len(peaks) == 2, "both GPUs were used"
        for gpu, (peak, clients) in peaks.items():
            assert peak <= CAPACITY, f"{gpu}: {peak / GiB:.0f} GiB committed at once > {CAPACITY / GiB:.0f}"
            assert clients <= MAX_CLIENTS
        # Let the keepers close their connections, then the agent's own view must agree.
        deadline = time.monotonic() + 10
        while agent.metric("gnnsched_gate_admissions_total") != 30 or agent.metric("gnnsched_gate_queue_length") != 0:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        events = [json.loads(line) for line in agent.events.read_text().splitlines()]
        admitted = [k for e in events if e["event"] == "admitted" for k in e["keys"]]
        assert sorted(admitted) == sorted(p["metadata"]["uid"] for p in pods) and len(admitted) == 30, (
            "each job admitted exactly once"
        )
        rounds, _ = _check_policy_order(events, "lmcf")
        assert rounds >= 5
        while len([e for e in events if e["event"] == "released"]) < 30:  # every keeper let go
            assert time.monotonic() < deadline
            time.sleep(0.1)
            events = [json.loads(line) for line in agent.events.read_text().splitlines()]
        assert agent.metric("gnnsched_mps_daemon_up") == 1.0
        status = json.loads(agent.status.read_text())
        assert status["kind"] == "GPUNode" and status["status"]["nodeName"] == "node-a"
        assert [g["totalBytes"] for g in status["status"]["gpus"]] == [80 * GiB, 80 * GiB]
        assert all(g["reserveBytes"] == 2 * GiB and g["committedBytes"] <= CAPACITY for g in status["status"]["gpus"])
        mps_cmds = (tmp_path / "mps-log" / "fake-commands.log").read_text().splitlines()
        gpu1 = status["status"]["gpus"][1]["uuid"]
        assert "-d" in mps_cmds and f"nvidia-smi -i {gpu1} -c EXCLUSIVE_PROCESS" in mps_cmds  # by UUID
    finally:
        _kill_all(procs)
        agent.stop()


def test_backfill_real_processes(tmp_path: Path) -> None:
    """``--bypass-limit 2``, FIFO: two 50 GiB jobs hold both GPUs, a 60 GiB job waits for one of them; of four 5 GiB
    jobs queued behind it, exactly two start ahead of it (and finish), the other two wait behind it until it starts."""
    names = ["b0", "b1", "big", "s1", "s2", "s3", "s4"]
    sizes = {"b0": 50 * GiB, "b1": 50 * GiB, "big": 60 * GiB, "s1": 5 * GiB, "s2": 5 * GiB, "s3": 5 * GiB,
             "s4": 5 * GiB}
    pods, jobs = zip(*(job_pod(n, sizes[n]) for n in names), strict=True)
    uid = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}
    agent = Agent(tmp_path, "base", bypass_limit=2)
    write_pods(agent.pods, list(pods), list(jobs))
    out = tmp_path / "out"
    out.mkdir()
    go = tmp_path / "go"
    agent.start(grace=0.0)
    procs: dict[str, subprocess.Popen] = {}

    def events() -> list[dict]:
        return [json.loads(line) for line in agent.events.read_text().splitlines()]

    def wait_event(kind: str, name: str) -> None:
        deadline = time.monotonic() + 30
        while not any(e["event"] == kind and e.get("key") == uid[name] for e in events()):
            assert time.monotonic() < deadline, f"no {kind} event for {name}"
            time.sleep(0.05)

    try:
        for n in ("b0", "b1"):
            procs[n] = _launch(agent, pods[names.index(n)], out, 0, {"GO_FILE": str(go)})
        _wait_status(agent, lambda s: sum(len(g["running"]) for g in s["gpus"]) == 2)
        for n in ("big", "s1", "s2", "s3", "s4"):  # one at a time, so the queue's FIFO order is this order
            procs[n] = _launch(agent, pods[names.index(n)], out, 0.1)
            wait_event("queued", n)
        for n in ("s1", "s2"):
            assert procs[n].wait(30) == 0
            wait_event("released", n)  # each exit is a decision too: big is at its limit, s3 and s4 stay behind it
        s = _wait_status(agent, lambda s: sum(len(g["queued"]) for g in s["gpus"]) == 3)
        assert sorted(q["name"] for g in s["gpus"] for q in g["queued"]) == ["big", "s3", "s4"]
        assert not (out / "s3.json").exists() and not (out / "s4.json").exists()
        go.touch()
        assert all(p.wait(60) == 0 for p in procs.values())
        records = {n: json.loads((out / f"{n}.json").read_text()) for n in names}
        for gpu, (peak, clients) in _sweep(list(records.values()), sizes).items():
            assert peak <= CAPACITY and clients <= MAX_CLIENTS, gpu
        assert records["s2"]["end"] <= records["big"]["start"]
        log = events()
        admitted = [k for e in log if e["event"] == "admitted" for k in e["keys"]]
        name_of = {v: k for k, v in uid.items()}
        order = [name_of[k] for k in admitted]
        assert sorted(order[:2]) == ["b0", "b1"] and order[2:4] == ["s1", "s2"]  # b0, b1 raced each other to the gate
        assert order.index("big") < min(order.index("s3"), order.index("s4"))
        _rounds, most = _check_policy_order(log, "base", bypass_limit=2)
        assert most == 2
    finally:
        go.touch()
        _kill_all(list(procs.values()))
        agent.stop()


def test_agent_restart_rebuilds_books(tmp_path: Path) -> None:
    """Kill -9 the agent while 4 jobs run and 4 wait; a new agent adopts the running ones (pod annotations +
    reconnecting keepers), re-queues the waiting ones, and nothing runs twice or over the bound."""
    sizes = [30 * GiB] * 4 + [35 * GiB] * 4  # 2 × 30 per GPU fit; the 35s must wait for exits
    pods, jobs = zip(*(job_pod(f"r{i}", b) for i, b in enumerate(sizes)), strict=True)
    agent = Agent(tmp_path, "base")
    write_pods(agent.pods, list(pods), list(jobs))
    out = tmp_path / "out"
    out.mkdir()
    go = tmp_path / "go"
    agent.start(grace=0.0)
    first: list[subprocess.Popen] = []
    rest: list[subprocess.Popen] = []
    try:
        first += [_launch(agent, p, out, 0, {"GO_FILE": str(go)}) for p in pods[:4]]
        _wait_status(agent, lambda s: sum(len(g["running"]) for g in s["gpus"]) == 4)
        rest += [_launch(agent, p, out, 0.1) for p in pods[4:]]
        _wait_status(agent, lambda s: len(s["gpus"][0]["queued"]) == 4)
        agent.kill()
        agent.status.unlink()  # only the new agent's status counts from here
        agent.start(grace=8.0)  # generous: on a loaded CI machine keepers may take seconds to re-attach
        # Adopted from annotations at start, then the keepers re-attach; the waiting clients re-request.
        s = _wait_status(agent, lambda s: sum(len(g["running"]) for g in s["gpus"]) == 4
                         and len(s["gpus"][0]["queued"]) == 4)
        assert [g["committedBytes"] for g in s["gpus"]] == [60 * GiB, 60 * GiB]
        go.touch()
        codes = [p.wait(60) for p in first + rest]
        assert codes == [0] * 8
        records = [json.loads((out / f"r{i}.json").read_text()) for i in range(8)]
        bytes_of = {p["metadata"]["name"]: s for p, s in zip(pods, sizes, strict=True)}
        for gpu, (peak, _n) in _sweep(records, bytes_of).items():
            assert peak <= CAPACITY, gpu
        events = [json.loads(line) for line in agent.events.read_text().splitlines()]
        start_idx = max(i for i, e in enumerate(events) if e["event"] == "start")
        after = events[start_idx:]
        assert sorted(e["key"] for e in after if e["event"] == "adopted") == sorted(
            p["metadata"]["uid"] for p in pods[:4]
        )
        re_admitted = [k for e in after if e["event"] == "admitted" for k in e["keys"]]
        assert sorted(re_admitted) == sorted(p["metadata"]["uid"] for p in pods[4:]), "running jobs never re-admitted"
    finally:
        go.touch()
        _kill_all(first + rest)
        agent.stop()


def _kill_all(procs: list[subprocess.Popen]) -> None:
    """A failed test must not leave gate clients waiting for a week."""
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(5)


def _wait_status(agent: Agent, cond, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        try:
            s = json.loads(agent.status.read_text())["status"]
            if cond(s):
                return s
        except (FileNotFoundError, ValueError, KeyError, IndexError):
            pass
        assert time.monotonic() < deadline, agent.status.read_text() if agent.status.exists() else "no status"
        time.sleep(0.05)
