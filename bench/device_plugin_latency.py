"""Device plugin latencies over real gRPC on unix sockets (no GPU needed): Allocate and GetPreferredAllocation
round trips as kubelet sees them, and how long a GPU health flip takes to reach kubelet's ListAndWatch stream.

    python bench/device_plugin_latency.py [--gpus 8] [--slots 48] [--n 2000]

Prints p50/p99 in milliseconds. Timings on a shared machine are pessimistic; report `uptime` beside them.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from dp_test_kubelet import TestKubelet  # noqa: E402

from gnnsched.device_plugin.server import DevicePlugin, PluginConfig  # noqa: E402
from gnnsched.device_plugin.v1beta1 import api_pb2 as pb  # noqa: E402
from gnnsched.gpu.backend import FakeGPUBackend  # noqa: E402


def _reports(kubelet: TestKubelet, device: str, health: str) -> bool:
    """Whether the kubelet's latest ListAndWatch update shows ``device`` with ``health``."""
    return kubelet.latest().get(device) == health


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--slots", type=int, default=48)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--flips", type=int, default=100)
    a = ap.parse_args()
    logging.getLogger("gnnsched.device_plugin").setLevel(logging.CRITICAL)  # the flips are intended
    with tempfile.TemporaryDirectory(prefix="dpb") as d:
        backend = FakeGPUBackend(a.gpus, 80 * 2**30)
        kubelet = TestKubelet(Path(d))
        kubelet.start()
        plugin = DevicePlugin(backend, PluginConfig(plugin_dir=Path(d), slots_per_gpu=a.slots, poll_interval_s=1.0,
                                                    watch_interval_s=0.2), None)
        t0 = time.perf_counter()
        plugin.start()
        assert kubelet.wait_for(lambda: kubelet.lists, timeout=10)
        t_reg = time.perf_counter() - t0
        ids = sorted(kubelet.latest())
        stub = kubelet.plugin
        alloc, pref = [], []
        for i in range(a.n):
            req = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=[ids[i % len(ids)]])])
            t = time.perf_counter()
            stub.Allocate(req, timeout=5)
            alloc.append(time.perf_counter() - t)
            preq = pb.PreferredAllocationRequest(container_requests=[pb.ContainerPreferredAllocationRequest(
                available_deviceIDs=ids, allocation_size=1 + i % 4)])
            t = time.perf_counter()
            stub.GetPreferredAllocation(preq, timeout=5)
            pref.append(time.perf_counter() - t)
        flips = []
        for i in range(a.flips):
            healthy = i % 2 == 1
            want = "Healthy" if healthy else "Unhealthy"
            first = f"{backend.devices()[0].uuid}-slot-00"
            t = time.perf_counter()
            backend.set_healthy(0, healthy)
            assert kubelet.wait_for(partial(_reports, kubelet, first, want), timeout=5)
            flips.append(time.perf_counter() - t)
        plugin.stop(0)
        kubelet.stop()
    print(f"devices advertised: {len(ids)} ({a.gpus} GPUs x {a.slots} slots)")
    print(f"start -> first ListAndWatch at kubelet: {t_reg * 1000:.1f} ms")
    print(f"Allocate round trip (n={a.n}): p50 {pct(alloc, .5):.2f} ms, p99 {pct(alloc, .99):.2f} ms")
    print(f"GetPreferredAllocation round trip (n={a.n}): p50 {pct(pref, .5):.2f} ms, p99 {pct(pref, .99):.2f} ms")
    print(f"health flip -> kubelet sees full list (n={a.flips}): p50 {pct(flips, .5):.2f} ms, "
          f"p99 {pct(flips, .99):.2f} ms, mean {statistics.mean(flips) * 1000:.2f} ms")


if __name__ == "__main__":
    main()
