"""Does a prestarted worker still get its GPU after admission? One command, PASS or FAIL (docs/gpu-measurements.md 7).

Usage (a GPU node, repository root, gnnsched installed): python bench/gpu/prestart_check.py [JOB.yaml] ; exit 0 on
PASS, 1 on FAIL, 2 on KEPT (the worker succeeded only through the prestart fallback: it re-executed itself after
admission, so the guard missed a path into the driver; the job is kept, the start-up paid twice). ``--device cpu``
runs only the worker part on the CPU (a check of this script, not of the fix).

Three children, each started as ``gnnsched gate --prestart`` leaves its workload (``CUDA_VISIBLE_DEVICES`` empty,
``PYTORCH_NVML_BASED_CUDA_CHECK=1``) and then given GPU 0's UUID, as the keeper's admission does:
1. control: ``import torch_geometric`` with no guard, then the GPU: on torch 2.11 + PyG 2.8 this reported no device
   (the bug). Reported, not judged: it says whether this torch/PyG pair still needs the guard.
2. the same import under ``gnnsched.gpu.cuda_guard.PreAdmissionGuard``, removed before the GPU is given: must see the
   GPU and make a CUDA tensor. Both print whether ``libcuda.so`` was mapped before admission (a hint, not the verdict:
   loading the library is not ``cuInit``).
3. the real thing: ``gnnsched worker JOB --device cuda --epochs 1`` with a hand-off pipe, admitted (the keeper's JSON
   line: the GPU's UUID, the pre-admission variables unset) once it says it is waiting: must exit 0 with outcome
   ``succeeded``. Before the fix it exited 2 with "cuda requested but no CUDA device is available". It also says
   whether the worker took the prestart fallback (``prestart_fallback`` in its result line: its start-up tried to
   initialise CUDA before admission, or the runtime saw no device once admitted, and it re-executed itself as a
   plain admitted worker): "fallback taken: no" is what verifies the guard on this GPU.
No node agent and no MPS daemon are involved; ``PRESTART=1 python bench/gpu/real_gate.py JOB.yaml...`` runs the same
worker behind the real gate, agent and MPS.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from gnnsched.closed_loop import AttemptResult
from gnnsched.contract import ENV_GATE_HANDOFF_FD
from gnnsched.gate_handoff import NVML_CHECK_ENV, Handoff

PROBE = """
import os, sys
guarded = sys.argv[1] == "guarded"
if guarded:
    from gnnsched.gpu.cuda_guard import PreAdmissionGuard
    guard = PreAdmissionGuard().install()
import torch_geometric  # noqa: F401
maps = open("/proc/self/maps").read()
# the CUDA runtime loads the driver library at its first call: mapped before admission means something entered CUDA
print("libcuda loaded before admission:", "yes" if "libcuda.so" in maps else "no")
if guarded:
    guard.remove()
    print("blocked before admission:", guard.attempts or "nothing")
os.environ.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)
os.environ["CUDA_VISIBLE_DEVICES"] = sys.argv[2]
import torch
ok = torch.cuda.is_available()
print("is_available after admission:", ok)
if ok:
    print("tensor:", torch.ones(2, device="cuda").sum().item())
sys.exit(0 if ok else 1)
"""


def gpu_uuid() -> str | None:
    """GPU 0's UUID from NVML (what the node agent hands over), else from nvidia-smi."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            raw = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(0))
        finally:
            pynvml.nvmlShutdown()
        return raw.decode() if isinstance(raw, bytes) else str(raw)
    except Exception:  # noqa: BLE001 - no NVML here: try the CLI
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30, check=True).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return out[0] if out else None


def pre_admission_env() -> dict[str, str]:
    return dict(os.environ, CUDA_VISIBLE_DEVICES="", **{NVML_CHECK_ENV: "1"})


def probe(kind: str, uuid: str) -> tuple[bool, str]:
    run = subprocess.run([sys.executable, "-c", PROBE, kind, uuid], env=pre_admission_env(), capture_output=True,
                         text=True, timeout=300, check=False)
    return run.returncode == 0, (run.stdout + run.stderr[-1500:]).strip()


def prestarted_worker(job: str, device: str, uuid: str) -> tuple[bool, str | None, str]:
    """``gnnsched worker`` as the gate's prestart leaves it; admitted to ``uuid`` once it waits. Returns (succeeded,
    the fallback's reason if the worker re-executed itself, its output)."""
    read_fd, write_fd = os.pipe()
    env = dict(pre_admission_env(), **{ENV_GATE_HANDOFF_FD: str(read_fd)})
    cmd = [sys.executable, "-m", "gnnsched.cli", "worker", job, "--device", device, "--epochs", "1", "--no-progress"]
    proc = subprocess.Popen(cmd, env=env, pass_fds=(read_fd,), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    os.close(read_fd)
    err: list[str] = []
    waiting = threading.Event()

    def read_err() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            err.append(line)
            if "waiting for the gate" in line:
                waiting.set()

    reader = threading.Thread(target=read_err, daemon=True)
    reader.start()
    deadline = time.monotonic() + 300
    try:
        while not waiting.wait(0.2) and proc.poll() is None and time.monotonic() < deadline:
            pass
        if waiting.is_set():
            admitted = {"CUDA_VISIBLE_DEVICES": uuid} if uuid else {}
            os.write(write_fd, Handoff(status="admitted", env=admitted,
                                       unset=["CUDA_VISIBLE_DEVICES", NVML_CHECK_ENV]).line())
    finally:
        os.close(write_fd)
    try:
        out, _ = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    reader.join(10)
    last = out.strip().splitlines()[-1] if out.strip() else ""
    try:
        result: AttemptResult | None = AttemptResult.model_validate_json(last)
    except ValueError:
        result = None
    ok = proc.returncode == 0 and result is not None and result.outcome == "succeeded"
    fallback = result.prestart_fallback if result is not None else None
    if fallback is None:  # a worker that failed after re-executing has no result line: its log says so
        marks = [line.split("prestart fallback: ", 1)[1] for line in err if "prestart fallback: " in line]
        fallback = marks[0].strip() if marks else None
    return ok, fallback, f"rc={proc.returncode} result={last}\n" + "".join(err)[-2000:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job", nargs="?", default=str(Path(__file__).parents[2] / "examples" / "gin-train-custom.yaml"))
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    args = parser.parse_args()
    uuid = ""
    verdicts: list[bool] = []
    if args.device == "cuda":
        found = gpu_uuid()
        if not found:
            print("FAIL: no NVIDIA GPU found (NVML, nvidia-smi)")
            return 1
        uuid = found
        print(f"GPU 0: {uuid}")
        usable, text = probe("unguarded", uuid)
        print(f"1. control, PyG imported with no guard: {'GPU usable' if usable else 'NO DEVICE (the bug)'}\n"
              f"   {text}")
        ok, text = probe("guarded", uuid)
        verdicts.append(ok)
        print(f"2. PyG imported under the guard: {'pass' if ok else 'FAIL'}\n   {text}")
    ok, fallback, text = prestarted_worker(args.job, args.device, uuid)
    verdicts.append(ok)
    print(f"3. gnnsched worker --device {args.device}, prestarted then admitted: {'pass' if ok else 'FAIL'}\n"
          f"   fallback taken: {'yes: ' + fallback if fallback else 'no'}\n{text}")
    if not all(verdicts):
        print("FAIL")
        return 1
    if fallback:
        print("KEPT: the job succeeded through the prestart fallback (start-up paid twice); the guard missed a path")
        return 2
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
