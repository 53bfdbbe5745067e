#!/usr/bin/env python3
"""What an MPS client is charged for its CUDA context, by active thread percentage (``context_by_share``).

Why: the admission assumes a full-GPU context per job, but under MPS the context scales with
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (docs/gpu-measurements.md section 2); the figures per share are what a
share-aware admission would charge. For each share this starts one client (this script with ``--client``) with that
percentage and an MPS memory limit, and the client reports NVML's used memory of its own PID, and the context
(NVML used minus PyTorch's reserved bytes; also the limit minus free minus reserved, which needs no NVML), after CUDA
initialisation and after a matmul forward and backward (the backward's thread takes its own cuBLAS handle, as
training does).

It never hangs: a client that cannot connect (no daemon in the pipe directory, a daemon whose server does not start
for this user, a server still held by another user's clients) blocks inside CUDA's initialisation forever, so each
client has a timeout, a share of ``--budget``, after which its process group is killed and the share is SKIP with
the stage it reached and the MPS control log's tail. Before any client runs, the pipe directory, the control binary,
the daemon's answer and the GPU (NVML) are checked, each with its own short timeout: a missing one is SKIP with the
reason, at once. NVML is polled for the client's PID for a few seconds at most (another PID namespace never lists it:
the NVML figures are then null, with the reason). Each share's result is printed (and the JSON rewritten) as soon as
it is measured, as one parseable line::

    context share=25 status=measured nvml_init_mib=171.0 nvml_matmul_mib=240.0 ctx_init_mib=169.0 ...

Usage (an MPS daemon running, its pipe directory in ``$CUDA_MPS_PIPE_DIRECTORY``; ``bench/gpu/validate`` does this)::

    python bench/gpu/mps_context.py [--shares 25,50,100] [--budget 45] [--limit-mib 4096] [--json out.json]

Exit status: 0 when at least one share was measured, 5 with a ``SKIP:`` line when none was.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

SKIP_EXIT = 5  # bench/gpu/validate reads this status as SKIP, with the reason from the last "SKIP:" line
CHECK_TIMEOUT_S = 10.0  # for each check before the clients: the control daemon's answer, NVML
NVML_WAIT_S = 5.0  # how long a client looks for its own PID in NVML's process list
MIN_CLIENT_S = 8.0  # a client given less cannot import torch and initialise CUDA: the share is SKIP instead
MIB = 2**20


# ---------------------------------------------------------------- the client (one share, one process)

def _say(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def _nvml_used(handle: Any, pid: int) -> tuple[int | None, str | None]:
    """NVML's used memory of ``pid`` (compute, then MPS compute processes), polled briefly: a new client may show up
    a moment after its context. (bytes, None) or (None, why)."""
    import pynvml

    deadline = time.monotonic() + NVML_WAIT_S
    while True:
        for query in (pynvml.nvmlDeviceGetComputeRunningProcesses,
                      getattr(pynvml, "nvmlDeviceGetMPSComputeRunningProcesses", None)):
            if query is None:
                continue
            try:
                procs = query(handle)
            except pynvml.NVMLError as exc:
                return None, f"NVML: {exc}"
            for proc in procs:
                if proc.pid == pid and proc.usedGpuMemory is not None:
                    return int(proc.usedGpuMemory), None
        if time.monotonic() > deadline:
            return None, f"pid {pid} not in NVML's process list after {NVML_WAIT_S:.0f} s (another PID namespace?)"
        time.sleep(0.2)


def client(limit_mib: int) -> int:
    """One MPS client: stages as JSON lines (so a parent that kills it knows where it stopped), then the result."""
    _say(stage="start", pid=os.getpid())
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    _say(stage="import-torch")
    import torch

    _say(stage="cuda-init")  # a client the MPS server does not serve blocks here
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    result: dict[str, Any] = {"stage": "result", "share": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
                              "limit_mib": limit_mib}

    def measure(tag: str) -> None:
        torch.cuda.synchronize()
        reserved = int(torch.cuda.memory_reserved())
        free, _ = torch.cuda.mem_get_info()
        used, why = _nvml_used(handle, os.getpid())
        result[f"nvml_{tag}_mib"] = None if used is None else used / MIB
        result[f"ctx_{tag}_mib"] = None if used is None else (used - reserved) / MIB
        result[f"limit_ctx_{tag}_mib"] = (limit_mib * MIB - free - reserved) / MIB
        result[f"reserved_{tag}_mib"] = reserved / MIB
        if why:
            result["nvml_missing"] = why
        _say(stage=f"after-{tag}", **{k: v for k, v in result.items() if k.endswith(f"{tag}_mib")})

    measure("init")
    a = torch.randn(2048, 2048, device="cuda", requires_grad=True)
    b = torch.randn(2048, 2048, device="cuda", requires_grad=True)
    (a @ b).relu().sum().backward()
    measure("matmul")
    _say(**result)
    return 0


# ---------------------------------------------------------------- the parent (checks, one client per share)

def _mps_processes() -> list[str]:
    """MPS control daemons and servers running on this machine (``/proc``): another daemon's server on the GPU (a
    node agent's left behind, say) is one way a client waits forever."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            comm = (entry / "comm").read_text().strip()
        except OSError:
            continue
        if comm.startswith("nvidia-cuda-mps"):
            found.append(f"{comm}[{entry.name}]")
    return found


def _log_tail(name: str, lines: int = 8) -> str:
    folder = os.environ.get("CUDA_MPS_LOG_DIRECTORY")
    if not folder:
        return ""
    try:
        text = Path(folder, name).read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])


def precheck(env: dict[str, str]) -> tuple[str | None, str]:
    """(why no client can run here, or None; the pipe directory). Each check is quick and bounded."""
    pipe = env.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps"
    if not Path(pipe, "control").exists():
        where = "CUDA_MPS_PIPE_DIRECTORY" if env.get("CUDA_MPS_PIPE_DIRECTORY") else "the default pipe directory"
        return f"no MPS control daemon: no 'control' socket in {pipe} ({where})", pipe
    control = shutil.which("nvidia-cuda-mps-control", path=env.get("PATH"))
    if control is None:
        return "nvidia-cuda-mps-control is not on PATH", pipe
    try:
        answer = subprocess.run([control], input="get_server_list\n", env=env, capture_output=True, text=True,
                                timeout=CHECK_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return f"the MPS control daemon in {pipe} did not answer within {CHECK_TIMEOUT_S:.0f} s", pipe
    if answer.returncode != 0:
        return f"the MPS control daemon in {pipe} refused get_server_list: {answer.stderr.strip()[-300:]}", pipe
    gpu = subprocess.run([sys.executable, "-c", "import pynvml; pynvml.nvmlInit(); "
                          "print(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0)))"],
                         env=env, capture_output=True, text=True, timeout=CHECK_TIMEOUT_S, check=False)
    if gpu.returncode != 0:
        return f"no GPU: NVML: {(gpu.stderr.strip().splitlines() or ['failed'])[-1]}", pipe
    return None, pipe


def run_client(command: list[str], env: dict[str, str], timeout: float) -> tuple[list[dict[str, Any]], str | None]:
    """Run one client for at most ``timeout`` seconds (its process group killed then). Its JSON lines, each echoed
    as it comes, and why it gave no result (timeout, exit status), or None."""
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines: list[dict[str, Any]] = []
    other: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                parsed = json.loads(line)
            except ValueError:
                other.append(line.rstrip())
                continue
            if isinstance(parsed, dict):
                lines.append(parsed)
                print(f"  client: {line.rstrip()}", flush=True)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    why = None
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        stage = lines[-1].get("stage") if lines else "before its first line"
        why = f"client timed out after {timeout:.0f} s at stage {stage!r}"
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        reader.join(5)
    if why is None and not any(line.get("stage") == "result" for line in lines):
        why = f"client exited {proc.returncode} without a result: {' | '.join(other[-5:])[-500:]}"
    return lines, why


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shares", default="25,50,100", help="active thread percentages, comma-separated")
    parser.add_argument("--budget", type=float, default=60.0, help="seconds for every share together")
    parser.add_argument("--limit-mib", type=int, default=4096, help="each client's MPS memory limit (MiB)")
    parser.add_argument("--json", dest="json_path", type=Path, help="also write the results here")
    parser.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.client:
        return client(args.limit_mib)
    try:
        shares = [int(s) for s in args.shares.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--shares: comma-separated percentages, not {args.shares!r}")
    if not shares or any(not 1 <= s <= 100 for s in shares):
        parser.error("--shares: percentages from 1 to 100")
    deadline = time.monotonic() + args.budget
    env = dict(os.environ)
    problem, pipe = precheck(env)
    report: dict[str, Any] = {"pipe_dir": pipe, "limit_mib": args.limit_mib, "mps_processes": _mps_processes(),
                              "shares": []}

    def save() -> None:
        if args.json_path is not None:
            args.json_path.write_text(json.dumps(report, indent=2))

    if problem:
        report["skip"] = problem
        save()
        print(f"SKIP: {problem}", flush=True)
        return SKIP_EXIT
    print(f"MPS daemon in {pipe}; MPS processes: {', '.join(report['mps_processes']) or 'none'}", flush=True)
    for index, share in enumerate(shares):
        left = deadline - time.monotonic()
        timeout = left / (len(shares) - index)
        entry: dict[str, Any] = {"share": share}
        if timeout < MIN_CLIENT_S:
            entry.update(status="skip", reason=f"{left:.0f} s left of the budget")
        else:
            client_env = dict(env, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=str(share),
                              CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=f"0={args.limit_mib}M")
            lines, why = run_client([sys.executable, str(Path(__file__).resolve()), "--client", "--limit-mib",
                                     str(args.limit_mib)], client_env, timeout)
            result = next((line for line in lines if line.get("stage") == "result"), None)
            if result is None:
                log = _log_tail("control.log")
                entry.update(status="skip", reason=why + (f"; control.log: {log}" if log else ""))
            else:
                entry.update(status="measured", **{k: v for k, v in result.items() if k not in ("stage", "share")})
        report["shares"].append(entry)
        save()
        fields = " ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in entry.items()
                          if k not in ("share", "status", "reason", "nvml_missing"))
        reason = f" reason={json.dumps(entry.get('reason') or entry.get('nvml_missing'))}" if (
            entry.get("reason") or entry.get("nvml_missing")) else ""
        print(f"context share={share} status={entry['status']} {fields}{reason}".replace("  ", " "), flush=True)
    print(json.dumps(report), flush=True)
    if not any(e["status"] == "measured" for e in report["shares"]):
        print(f"SKIP: no share measured ({report['shares'][-1].get('reason')})", flush=True)
        return SKIP_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main())
