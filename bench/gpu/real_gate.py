"""Our node agent (real NVML, its own MPS daemon, compute mode kept) and gated `gnnsched worker` jobs on this GPU.

Usage (a GPU node, repository root, gnnsched installed): python bench/gpu/real_gate.py JOB.yaml... ; env
FAULT_LAST=1 makes the last job a client that triggers an illegal address 20 s after admission, EPOCHS sets the
workers' epochs, GR_DIR the state folder, PRESTART=1 runs the workers behind ``gnnsched gate --prestart`` (start-up
before admission, docs/gpu-measurements.md section 7; the fault client stays behind the plain gate). The last
job's reservation is cut to 55 % unless FAULT_LAST is set (it must hit its own MPS limit, not its neighbours)."""
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

T = Path(os.environ.get("GR_DIR", "/tmp/gr"))
T.mkdir(exist_ok=True)
OUT = Path(os.environ.get("OUT", "."))
jobs = sys.argv[1:]
SHRINK = {} if os.environ.get("FAULT_LAST") == "1" else {len(jobs) - 1: 0.55}
env = dict(os.environ)
pods, gnnjobs, meta = [], [], []
for i, job in enumerate(jobs):
    est = json.loads(subprocess.run(["gnnsched", "estimate", job, "--device", "cuda", "--gpu-model", "H100",
                                     "--json"], capture_output=True, text=True, check=True).stdout)
    if i in SHRINK:
        est["admit_bytes"] = int(est["admit_bytes"] * SHRINK[i])
    name = f"job{i}-{Path(job).stem}"
    juid, puid = str(uuid.uuid4()), str(uuid.uuid4())
    # the job's status names the pod and its admit bytes, as the operator writes it (gnnsched.trust.job_facts)
    gnnjobs.append({"metadata": {"name": name, "namespace": "default", "uid": juid},
                    "status": {"podFacts": {"pod": name + "-0", "admitBytes": int(est["admit_bytes"])}}})
    pods.append({"metadata": {"name": name + "-0", "namespace": "default", "uid": puid,
                              "annotations": {"gnnsched.io/admit-bytes": str(est["admit_bytes"])},
                              "ownerReferences": [{"apiVersion": "gnnsched.io/v1alpha1", "kind": "GNNJob",
                                                   "name": name, "uid": juid, "controller": True}]},
                 "spec": {"nodeName": "gpu-node"}, "status": {"phase": "Running"}})
    meta.append((job, name + "-0", puid, est))
(T / "pods.json").write_text(json.dumps({"pods": pods, "gnnjobs": gnnjobs}))
agent_cmd = ["gnnsched", "node-agent", "--gpus", "nvml", "--node-name", "gpu-node", "--gate-socket",
             str(T / "gate.sock"),
             "--pods-file", str(T / "pods.json"), "--status-file", str(T / "status.json"), "--event-log",
             str(T / "events.jsonl"), "--mps", "on", "--mps-pipe-dir", str(T / "mps"), "--mps-log-dir",
             str(T / "mps-log"), "--compute-mode", "keep", "--peer-check", "off", "--no-node-check", "--jobs-uid",
             "-1", "--recovery-grace", "1", "--status-interval", "1", "--state-dir", str(T / "state"),
             "--metrics-port", "9400", "--metrics-addr", "127.0.0.1", "--log-level", "info"]
alog = open(T / "agent.log", "w")  # noqa: SIM115 - the agent's log for its whole life
agent = subprocess.Popen(agent_cmd, stderr=alog, stdout=alog)
deadline = time.time() + 60
while not (T / "gate.sock").exists():
    if agent.poll() is not None or time.time() > deadline:
        print("AGENT DID NOT START rc", agent.poll())
        print((T / "agent.log").read_text()[-3000:])
        sys.exit(1)
    time.sleep(0.2)
print("agent up", flush=True)
procs = []
FAULT = os.environ.get("FAULT_LAST") == "1"
PRESTART = ["--prestart"] if os.environ.get("PRESTART") == "1" else []
for n, (job, pod, puid, est) in enumerate(meta):
    e = dict(env, GNNSCHED_POD_UID=puid, GNNSCHED_POD_NAME=pod, GNNSCHED_POD_NAMESPACE="default")
    work = ["gnnsched", "worker", job, "--device", "cuda", "--epochs", os.environ.get("EPOCHS", "5"), "--no-progress"]
    if FAULT and n == len(meta) - 1:
        work = ["bash", "-c", "sleep 20; exec python3 bench/gpu/mps_client.py fault"]
    gate = ["gnnsched", "gate", *(PRESTART if work[0] == "gnnsched" else []), "--socket", str(T / "gate.sock"), "--"]
    procs.append((pod, est, subprocess.Popen(gate + work, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                             text=True)))
for pod, est, p in procs:
    try:
        so, se = p.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        p.kill()
        so, se = p.communicate()
    print(f"== {pod} rc={p.returncode} admit={est['admit_bytes']} reserved_est={est['cuda_reserved_bytes']}")
    print("stdout:", so[-800:])
    print("stderr:", se[-1500:], flush=True)
time.sleep(4)
try:
    import urllib.request
    m = urllib.request.urlopen("http://127.0.0.1:9400/metrics", timeout=5).read().decode()
    (OUT / f"{T.name}_metrics.txt").write_text(m)
except Exception as ex:  # noqa: BLE001
    print("metrics:", ex)
agent.send_signal(signal.SIGTERM)
try:
    agent.wait(20)
except subprocess.TimeoutExpired:
    agent.kill()
alog.close()
print("== pods file after")
pf = json.loads((T / "pods.json").read_text())
for p in pf["pods"]:
    print(p["metadata"]["name"], json.dumps(p["metadata"].get("annotations"))[:900])
print("== events")
print((T / "events.jsonl").read_text()[-4000:] if (T / "events.jsonl").exists() else "none")
print("== agent log tail")
print((T / "agent.log").read_text()[-5000:])
for f in ("pods.json", "events.jsonl", "agent.log", "status.json"):
    if (T / f).exists():
        (OUT / f"{T.name}_{f}").write_text((T / f).read_text())
