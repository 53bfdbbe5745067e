"""Operator memory on a shared cluster: N unrelated pods in the emulated API server, before and after the pod watch
was filtered on the server.

Starts the emulated API server (``tests/kube_emulator.py``) holding ``--pods`` pods that are not gnnsched's (labels
``app=web``, a realistic ~1 kB spec each) and one GPUNode, then runs the real operator in its own process twice:

* ``kopf-labels`` (before): pods watched through a kopf handler with ``labels={managed-by: gnnsched}``, the way the
  operator did it until the server-side watch: kopf receives every pod and filters in the operator;
* ``server-selector`` (after): ``operator/podwatch.py``, whose LIST and WATCH carry ``labelSelector``.

Each run waits until the operator is ready, lets it settle ``--settle`` seconds (the initial listing is processed),
measures, then creates one GNNJob and waits for its pod (the operator still works; ``--no-probe`` skips this, which
loads torch for the job's estimate: about 5 s of CPU per mode). It reports the process's resident set size
(``VmRSS``), its peak (``VmHWM``), the Python heap that ``tracemalloc`` traced from the start of the operator's loop
to the measurement (current and peak: what the run added on top of the modules and clients, the same in both modes),
and how many pod events reached the operator's handler. The watch timeout is set longer than the run, so each mode
makes one LIST and one WATCH, as against a real API server.

Tracing starts after the imports and the API clients are built, and stops at the measurement: under ``tracemalloc``
the ``kubernetes`` client's import (its generated API classes, pydantic-validated) took minutes on a loaded 2-core
machine, and the probe job's torch import as long again. Every wait here is bounded by ``--deadline``; the operator
processes are killed if this one dies (``tests/child_process.py``).

Usage::

    .venv/bin/python bench/operator_pod_memory.py [--pods 10000] [--settle 15] [--deadline 300] [--no-probe]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from child_process import die_with_parent  # noqa: E402

MODES = ("kopf-labels", "server-selector")


def _proc_status() -> dict[str, int]:
    """VmRSS and VmHWM of this process, in bytes."""
    out: dict[str, int] = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


def child(mode: str, kubeconfig: str, settle: float, out: str) -> None:
    """One operator process in ``mode``; writes its measurements as JSON to ``out``."""
    import tracemalloc

    import kopf

    import gnnsched.operator.main as main
    from gnnsched.cliutil import setup_logging
    from gnnsched.contract import LABEL_MANAGED_BY, MANAGED_BY_VALUE
    from gnnsched.operator.handlers import OperatorConfig

    setup_logging("info")
    op = main.make_operator(OperatorConfig(workers=4, watch_client_timeout=600.0, resync_seconds=600.0),
                            kubeconfig=kubeconfig)
    delivered = {"n": 0}
    handler = op.on_pod_event

    def counting(body: Any, event: Any = None, **kwargs: Any) -> None:
        delivered["n"] += 1
        handler(body, event=event, **kwargs)

    op.on_pod_event = counting  # type: ignore[method-assign]
    if mode == "kopf-labels":
        build = main.build_registry

        def kopf_registry(o: Any) -> Any:
            registry = build(o)
            kopf.on.event("", "v1", "pods", registry=registry, labels={LABEL_MANAGED_BY: MANAGED_BY_VALUE},
                          id="pod-sync")(o.on_pod_event)
            return registry

        class NoWatch:
            lists = 0

            def start(self) -> None:
                return None

            def stop(self) -> None:
                return None

        main.build_registry = kopf_registry  # type: ignore[assignment]
        main.pod_watcher = lambda o, context=None: NoWatch()  # type: ignore[assignment,misc,return-value]

    async def run() -> None:
        stop, ready = asyncio.Event(), asyncio.Event()
        tracemalloc.start()  # after the imports and make_operator's clients (the module docstring says why)
        task = asyncio.create_task(main.run_async(op, stop_flag=stop, ready_flag=ready))
        await asyncio.wait_for(ready.wait(), 300)
        await asyncio.sleep(settle)
        settled = _proc_status()
        current, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        Path(out).write_text(json.dumps({"mode": mode, "settled": settled, "traced_current": current,
                                         "traced_peak": peak, "pod_events": delivered["n"]}))
        done = Path(out + ".done")  # the parent saw the probe job's pod: this operator still works
        for _ in range(6000):
            if done.exists():
                break
            await asyncio.sleep(0.1)
        stop.set()
        await asyncio.wait({task}, timeout=5)

    asyncio.run(run())


def _pod(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"web-{i:05d}", "namespace": "default", "uid": f"uid-web-{i:05d}",
                     "resourceVersion": str(10 + i), "creationTimestamp": "2026-01-01T00:00:00Z",
                     "labels": {"app": "web", "pod-template-hash": "5d8f9c7b6"},
                     "annotations": {"kubectl.kubernetes.io/restartedAt": "2026-01-01T00:00:00Z"}},
        "spec": {"nodeName": f"node-{i % 50}", "schedulerName": "default-scheduler",
                 "containers": [{"name": "web", "image": "registry.example.com/team/web:1.2.3",
                                 "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                                 "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                                 "env": [{"name": "MODE", "value": "production"}]}]},
        "status": {"phase": "Running", "podIP": f"10.1.{i // 250}.{i % 250}",
                   "conditions": [{"type": "Ready", "status": "True"}],
                   "containerStatuses": [{"name": "web", "ready": True, "restartCount": 0,
                                          "state": {"running": {"startedAt": "2026-01-01T00:00:01Z"}}}]},
    }


async def parent(args: argparse.Namespace) -> int:
    from operator_harness import a100, emulated_cluster

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        async with emulated_cluster(Path(tmp)) as cluster:
            for i in range(args.pods):
                cluster.k8s.objects["v1/pods", "default", f"web-{i:05d}"] = _pod(i)
            await cluster.add_gpunode("node-a", [a100(0)])
            for n, mode in enumerate(MODES):
                result = await _measure(cluster, mode, f"probe-{n}", Path(tmp), args)
                if isinstance(result, str):
                    log = (Path(tmp) / f"{mode}.log").read_text(errors="replace")
                    print(f"{mode}: {result}; the operator's log ends:\n{log[-3000:]}", file=sys.stderr)
                    return 1
                results.append(result)
    mib = 2**20
    print(f"{args.pods} unrelated pods in the API server; load average {os.getloadavg()[0]:.1f}")
    print(f"{'mode':<17} {'RSS MiB':>8} {'peak RSS':>9} {'py heap':>8} {'py peak':>8} {'pod events':>10} "
          f"{'seconds':>8}")
    for r in results:
        print(f"{r['mode']:<17} {r['settled']['VmRSS'] / mib:8.1f} {r['settled']['VmHWM'] / mib:9.1f} "
              f"{r['traced_current'] / mib:8.1f} {r['traced_peak'] / mib:8.1f} {r['pod_events']:10d} "
              f"{r['seconds']:8.1f}")
    print(json.dumps(results))
    return 0


async def _measure(cluster: Any, mode: str, job: str, tmp: Path, args: argparse.Namespace) -> dict[str, Any] | str:
    """One operator process in ``mode``: its figures, or why there are none (it never measured, never made the
    probe job's pod, or never stopped: each bounded by ``--deadline``)."""
    from operator_harness import manifest, wait_for

    out = tmp / f"{mode}.json"
    started = time.monotonic()
    with (tmp / f"{mode}.log").open("wb") as log:
        proc = subprocess.Popen(  # noqa: ASYNC220 - waited on from a thread or polled
            [sys.executable, "-P", __file__, "--child", mode, "--kubeconfig", str(cluster.kubeconfig),
             "--settle", str(args.settle), "--out", str(out)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log, preexec_fn=die_with_parent)
    try:
        while not out.exists():  # measured before any job (no torch loaded yet)
            if proc.poll() is not None:
                return f"the operator exited {proc.returncode} before it measured"
            if time.monotonic() - started > args.deadline:
                return f"the operator did not measure within {args.deadline:.0f} s"
            await asyncio.sleep(0.2)
        pod = None
        if args.probe:
            await cluster.create_job(manifest(job))
            try:
                pod = await wait_for(lambda: _pod_of(cluster, job), args.deadline, what=f"{mode}: the job's pod")
            except AssertionError as exc:
                return str(exc)
        Path(str(out) + ".done").touch()
        try:
            code = await asyncio.to_thread(proc.wait, args.deadline)
        except subprocess.TimeoutExpired:
            return f"the operator did not stop within {args.deadline:.0f} s of being told to"
        if code != 0:
            return f"the operator exited {code}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    result: dict[str, Any] = json.loads(out.read_text())
    result["seconds"] = round(time.monotonic() - started, 1)
    result["job_pod_created"] = pod is not None
    return result


async def _pod_of(cluster: Any, job: str) -> dict[str, Any] | None:
    status, data = await cluster.request(
        "GET", "/api/v1/namespaces/default/pods?labelSelector=gnnsched.io/job-name=" + job)
    items = (data or {}).get("items") or [] if status == 200 else []
    return items[0] if items else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=10_000, help="unrelated pods in the API server")
    parser.add_argument("--settle", type=float, default=20.0, help="seconds after ready before measuring")
    parser.add_argument("--deadline", type=float, default=300.0,
                        help="seconds each operator may take to measure, to make the probe job's pod, and to stop")
    parser.add_argument("--no-probe", dest="probe", action="store_false",
                        help="measure only: no probe job after the measurement (it loads torch)")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--kubeconfig", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.kubeconfig, args.settle, args.out)
        return 0
    return asyncio.run(parent(args))


if __name__ == "__main__":
    sys.exit(main())
