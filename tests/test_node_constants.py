"""The node measures its own GPUs (issue 36 item 3): the probe's pure parts over recorded figures, the fake stand-in
flag, and the agent in-process with fake GPUs publishing ``GPUStatus.measured`` / ``catalogued`` (after a delay, on
a driver change, kept across a restart with the same driver, absent while a failing probe is retried, never holding
up an admission)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
from crd_schema import load_crd, validate
from gate_helpers import GiB, job_pod, write_pods

from gnnsched.contract import GPUMeasurement, GPUNodeStatus, GPUStatus
from gnnsched.cuda_allocator import CachingAllocatorModel
from gnnsched.gpu.backend import BackendSpecError, FakeGPUBackend, GPUInfo, parse_fake_spec
from gnnsched.gpu.catalogue import get_gpu_model
from gnnsched.gpu.constants_probe import (
    ALLOCATED,
    RESERVED,
    AllocationSample,
    ProbeOutputError,
    check_allocator,
    context_bytes,
    output_line,
    parse_mps_limit,
    parse_output,
    workspace_bytes,
)
from gnnsched.node_agent.agent import AgentOptions, NodeAgent
from gnnsched.node_agent.constants import (
    STATE_FILE_NAME,
    FakeConstants,
    FakeProber,
    SubprocessProber,
    parse_fake_constants,
)
from gnnsched.node_agent.identity import FilePodLookup, PeerVerifier
from gnnsched.node_agent.status import FileStatusSink

pytestmark = [pytest.mark.timeout(60)]
MiB = 2**20
Z100 = "NVIDIA Z100"  # a board the catalogue does not know
A100 = "NVIDIA A100-SXM4-80GB"


# --- the probe's pure parts ---------------------------------------------------------------------------------------

# torch.cuda.memory_stats() around an H100's first 1024x1024 fp32 matmul and first addmm with a bias (the shape of
# what the probe reads; the workspace sizes are torch 2.11's on Hopper: 32 MiB + 4 MiB per cuBLAS handle, 1 MiB Lt).
BEFORE_MATMUL = {ALLOCATED: 8 * MiB + 512, RESERVED: 22 * MiB, "num_alloc_retries": 0}
AFTER_MATMUL = {ALLOCATED: 8 * MiB + 512 + 4 * MiB + 36 * MiB, RESERVED: 62 * MiB, "num_alloc_retries": 0}
AFTER_ADDMM = {ALLOCATED: 8 * MiB + 512 + 36 * MiB + 4 * MiB + 1 * MiB, RESERVED: 62 * MiB}


def test_workspaces_are_the_allocated_growth_less_the_result() -> None:
    result = 1024 * 1024 * 4  # the product's own block
    assert workspace_bytes(BEFORE_MATMUL, AFTER_MATMUL, result) == 36 * MiB
    before_addmm = {ALLOCATED: AFTER_MATMUL[ALLOCATED] - 4 * MiB}  # the product freed
    assert workspace_bytes(before_addmm, AFTER_ADDMM, result) == 1 * MiB
    assert workspace_bytes(AFTER_MATMUL, BEFORE_MATMUL, result) == 0  # never negative
    assert workspace_bytes({}, {ALLOCATED: 700}, 10) == 700 - 512  # the result rounded as the allocator rounds it


def test_context_from_nvml_or_from_the_mps_limit() -> None:
    assert context_bytes(800 * MiB, 58 * MiB) == 742 * MiB
    assert context_bytes(None, 58 * MiB, mps_limit=4096 * MiB, free=3296 * MiB) == 742 * MiB
    assert context_bytes(None, 58 * MiB) is None
    assert parse_mps_limit("0=4096M") == 4096 * MiB
    assert parse_mps_limit("1=2G,0=2G") == 2 << 30
    assert parse_mps_limit("0=1073741824") == 1 << 30
    assert parse_mps_limit("") is None and parse_mps_limit("0=lots") is None


def test_the_allocator_check_against_recorded_samples() -> None:
    native = [AllocationSample(1, 512, 2 * MiB), AllocationSample(MiB + 1, MiB + 512, 20 * MiB),
              AllocationSample(11 * MiB, 12 * MiB, 12 * MiB)]  # 1 MiB left over: not split off, handed out whole
    ok, detail = check_allocator(native)
    assert ok and "3 test allocations" in detail
    for sample in native:  # the rule the check applies is the allocator model's, request by request on empty pools
        model = CachingAllocatorModel()
        model.malloc(sample.requested)
        assert (model.allocated, model.reserved) == (sample.allocated_delta, sample.reserved_delta)
    # expandable segments: one segment grows page by page instead of a 20 MiB / rounded segment per request
    expandable = [AllocationSample(1, 512, 2 * MiB), AllocationSample(MiB + 1, MiB + 512, 2 * MiB),
                  AllocationSample(11 * MiB, 11 * MiB, 10 * MiB)]
    ok, detail = check_allocator(expandable, "expandable_segments:True")
    assert not ok
    assert "expandable_segments" in detail and "1048577 B: allocated +1049088 reserved +2097152" in detail
    ok, detail = check_allocator(native, backend="cudaMallocAsync")
    assert not ok and "cudaMallocAsync" in detail
    assert check_allocator([]) == (False, "no test allocation was made")


def _measurement(**kw: object) -> GPUMeasurement:
    values: dict[str, object] = dict(source="nvml", measured_at=datetime(2026, 11, 28, tzinfo=timezone.utc),
                                     context_bytes=742 * MiB, cublas_workspace_bytes=36 * MiB,
                                     cublaslt_workspace_bytes=MiB, active_thread_percentage=100,
                                     driver_version="580.159.04", cuda_version="13.0", torch_version="2.11.0+cu130",
                                     compute_capability="9.0")
    values.update(kw)
    return GPUMeasurement.model_validate(values)


def test_the_output_line_round_trips_among_noise() -> None:
    m = _measurement()
    text = f"some warning from torch\n{output_line(m)}\n"
    assert parse_output(text) == m
    assert parse_output(json.dumps(m.wire())) == m  # a bare JSON object line counts too
    with pytest.raises(ProbeOutputError, match="no measurement line"):
        parse_output("Traceback ...\nRuntimeError: boom\n")
    with pytest.raises(ProbeOutputError, match="not JSON"):
        parse_output("gnnsched-gpu-constants: {oops\n")
    with pytest.raises(ProbeOutputError, match="contextBytes"):
        parse_output('gnnsched-gpu-constants: {"source": "nvml", "measuredAt": "2026-11-28T00:00:00Z"}')


def test_the_probe_loads_every_built_in_gnns_kernels_before_it_reads_the_context() -> None:
    """The context grows with the kernels a process has run (676 MiB after a matmul, 742 MiB after GNN training on
    the H100): the probe runs a training and an inference step of each built-in architecture first. The same code
    runs here on the CPU."""
    from gnnsched.gpu.constants_probe import GNN_ARCHS, gnn_steps

    assert set(GNN_ARCHS) == {"gcn", "sage", "gin", "gat"}
    assert gnn_steps("cpu") == 2 * len(GNN_ARCHS)


def test_the_probe_switches_to_the_jobs_uid_only_with_cap_setuid() -> None:
    """MPS serves one user at a time, so the probe runs as the jobs' UID, but only where the agent may switch: root
    whose capabilities were dropped (the chart's agent) would fail to start the probe at all."""
    from gnnsched.node_agent.constants import SubprocessProber, may_set_uid

    assert may_set_uid("Name:\tagent\nCapEff:\t00000000000000c0\n")  # CAP_SETGID and CAP_SETUID
    assert not may_set_uid("Name:\tagent\nCapEff:\t0000000000000000\n")  # root with every capability dropped
    assert not may_set_uid("Name:\tagent\n")
    prober = SubprocessProber("/tmp/mps", jobs_uid=os.geteuid() + 1)
    assert prober._user() == (os.geteuid() + 1 if may_set_uid() else None)
    assert SubprocessProber("/tmp/mps", jobs_uid=os.geteuid())._user() is None  # already that user
    assert SubprocessProber("/tmp/mps")._user() is None


def test_the_probe_module_imports_no_torch() -> None:
    code = "import sys, gnnsched.gpu.constants_probe; print('torch' in sys.modules)"
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --- flags ---------------------------------------------------------------------------------------------------------


def test_fake_gpu_constants_flag() -> None:
    c = parse_fake_constants("context=742Mi,cublas=32Mi,cublaslt=1Mi,delay=1.5,cc=9.0")
    assert c == FakeConstants(742 * MiB, 32 * MiB, MiB, 1.5, "9.0")
    assert parse_fake_constants("cublaslt=0, context=1Gi ,cublas=4Mi").delay_s == 0.0
    for bad, says in (("context=742Mi,cublas=32Mi", "missing cublaslt"),
                      ("context=lots,cublas=1,cublaslt=1", "context"),
                      ("context=1,cublas=1,cublaslt=1,delay=soon", "delay"),
                      ("context=1,cublas=1,cublaslt=1,cc=9", "cc"),
                      ("context=1,cublas=1,cublaslt=1,speed=2", "speed"), ("context=1,context=2", "twice")):
        with pytest.raises(ValueError, match=says):
            parse_fake_constants(bad)


def test_fake_gpus_may_carry_a_raw_nvml_name() -> None:
    assert parse_fake_spec(f"fake:2x96Gixnvml:{Z100}") == (2, 96 * GiB, Z100)
    assert parse_fake_spec("fake:1x80GixH100")[2] == "H100-80GB"
    with pytest.raises(BackendSpecError, match="nvml:NAME"):
        parse_fake_spec("fake:1x80GixZ100")


def test_the_cli_names_the_flag_on_bad_input(tmp_path: Path) -> None:
    import subprocess

    from gate_helpers import gnnsched_command

    run = subprocess.run(gnnsched_command() + ["node-agent", "--gpus", "fake:1x80Gi", "--fake-gpu-constants",
                                               "context=742Mi", "--gate-socket", str(tmp_path / "s")],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "--fake-gpu-constants: missing cublas, cublaslt" in run.stderr
    run = subprocess.run(gnnsched_command() + ["node-agent", "--gpus", "nvml", "--fake-gpu-constants",
                                               "context=1,cublas=1,cublaslt=1", "--gate-socket", str(tmp_path / "s")],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "--fake-gpu-constants: only with --gpus fake" in run.stderr


def test_the_crd_takes_the_measurement() -> None:
    status = GPUNodeStatus(node_name="n1", gpus=[
        GPUStatus(index=0, uuid="GPU-0", model=Z100, total_bytes=96 * GiB, catalogued=False, measured=_measurement()),
        GPUStatus(index=1, uuid="GPU-1", model="A100-80GB", total_bytes=80 * GiB),
    ])
    obj = {"apiVersion": "gnnsched.io/v1alpha1", "kind": "GPUNode", "metadata": {"name": "n1"},
           "status": status.wire()}
    assert validate(load_crd("gpunode.yaml"), obj) == []
    assert obj["status"]["gpus"][0]["measured"]["contextBytes"] == 742 * MiB
    assert obj["status"]["gpus"][0]["catalogued"] is False and "measured" not in obj["status"]["gpus"][1]


# --- the agent ------------------------------------------------------------------------------------------------------


class Node:
    """One agent on fake GPUs, no MPS, a pods file and a status file (what the extender and operator read)."""

    def __init__(self, tmp: Path, name: str = A100, count: int = 2) -> None:
        self.tmp = tmp
        self.pods = tmp / "pods.json"
        self.name, self.count = name, count
        self.backend = FakeGPUBackend(count, 80 * GiB, name=name)
        self.agent: NodeAgent | None = None
        self.status_task: asyncio.Task | None = None
        write_pods(self.pods, [], [])

    async def start(self, prober: object = None, driver: str | None = None, **opts: object) -> NodeAgent:
        self.backend = FakeGPUBackend(self.count, 80 * GiB, name=self.name)
        if driver is not None:
            self.backend.set_driver_version(driver)
        options = AgentOptions(node_name="node-a", gate_socket=self.tmp / "gate.sock", recovery_grace=0,
                               status_interval=0.1, sample_interval=3600, metrics_port=None, reconcile_interval=0,
                               state_dir=str(self.tmp / "state"), **opts)  # type: ignore[arg-type]
        sink = FileStatusSink(self.tmp / "status.json")
        self.agent = NodeAgent(options, self.backend, FilePodLookup(self.pods), sink, PeerVerifier(enabled=False),
                               prober=prober)  # type: ignore[arg-type]
        await self.agent.start()
        self.status_task = asyncio.create_task(self.agent._status_loop())
        return self.agent

    async def stop(self) -> None:
        if self.status_task is not None:
            self.status_task.cancel()
            self.status_task = None
        if self.agent is not None:
            await self.agent.close()
            self.agent = None

    def gpus(self) -> list[dict]:
        return json.loads((self.tmp / "status.json").read_text())["status"]["gpus"]

    def count_of(self, result: str) -> float:
        assert self.agent is not None
        return self.agent.metrics.registry.get_sample_value("gnnsched_gpu_constants_measurements_total",
                                                            {"result": result}) or 0.0


async def _until(cond, timeout: float = 8.0) -> None:
    for _ in range(int(timeout / 0.02)):
        if cond():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached")


class CountingProber:
    """A stand-in that counts its calls (one per model, not per GPU)."""

    def __init__(self, constants: FakeConstants | None = None) -> None:
        self.inner = FakeProber(constants)
        self.calls: list[tuple[str, str | None]] = []

    async def measure(self, gpu: GPUInfo, driver: str | None) -> GPUMeasurement | None:
        self.calls.append((gpu.uuid, driver))
        return await self.inner.measure(gpu, driver)


@pytest.mark.asyncio
async def test_fake_gpu_constants_are_published_after_the_delay_not_before(tmp_path: Path) -> None:
    node = Node(tmp_path)
    agent = await node.start(fake_gpu_constants=parse_fake_constants(
        "context=742Mi,cublas=32Mi,cublaslt=1Mi,delay=0.6,cc=9.0"))
    try:
        gpus = node.gpus()  # published at start, before the stand-in answered
        assert [g.get("measured") for g in gpus] == [None, None] and all(g["catalogued"] for g in gpus)
        await _until(lambda: all(g.get("measured") for g in node.gpus()))
        for g in node.gpus():  # one measurement of the model, applied to both of its GPUs
            m = GPUMeasurement.model_validate(g["measured"])
            assert (m.source, m.context_bytes, m.cublas_workspace_bytes, m.cublaslt_workspace_bytes) == (
                "fake", 742 * MiB, 32 * MiB, MiB)
            assert m.compute_capability == "9.0" and m.driver_version == node.backend.driver_version()
            assert m.active_thread_percentage == 100
        assert node.count_of("ok") == 1
        assert agent.metrics.registry.get_sample_value("gnnsched_gpu_constants_measured",
                                                       {"gpu": "0", "uuid": gpus[0]["uuid"]}) == 1
    finally:
        await node.stop()


@pytest.mark.asyncio
async def test_an_uncatalogued_fake_gpu_is_published_raw_and_unmeasured_without_the_flag(tmp_path: Path) -> None:
    node = Node(tmp_path, name=Z100, count=1)
    agent = await node.start()
    try:
        await asyncio.sleep(0.3)
        [g] = node.gpus()
        assert g["model"] == Z100 and g["catalogued"] is False and g.get("measured") is None
        assert agent.constants is not None and not agent.constants.busy()
        assert node.count_of("ok") == node.count_of("failed") == 0  # nothing to measure: not a failure
    finally:
        await node.stop()
    (tmp_path / "a100").mkdir()
    node = Node(tmp_path / "a100", name=A100, count=1)  # a catalogued one gets the catalogue's constants
    await node.start()
    try:
        await _until(lambda: node.gpus()[0].get("measured") is not None)
        m = GPUMeasurement.model_validate(node.gpus()[0]["measured"])
        cat = get_gpu_model(A100)
        assert (m.context_bytes, m.cublas_workspace_bytes, m.source, m.compute_capability) == (
            cat.context_bytes, cat.cublas_workspace_bytes, "fake", "8.0")
    finally:
        await node.stop()


@pytest.mark.asyncio
async def test_the_unnamed_fake_test_board_stands_in_with_the_default_entrys_constants(tmp_path: Path) -> None:
    """``fake:NxSIZE`` (model ``Fake-GPU``, no datasheet) is measured with the default entry's constants, so a local
    cluster shares as it did before nodes measured; it stays uncatalogued."""
    from gnnsched.gpu.backend import DEFAULT_FAKE_MODEL
    from gnnsched.gpu.catalogue import DEFAULT_GPU_MODEL

    node = Node(tmp_path, name=DEFAULT_FAKE_MODEL, count=1)
    await node.start()
    try:
        await _until(lambda: node.gpus()[0].get("measured") is not None)
        [g] = node.gpus()
        m = GPUMeasurement.model_validate(g["measured"])
        default = get_gpu_model(DEFAULT_GPU_MODEL)
        assert g["catalogued"] is False and g["model"] == DEFAULT_FAKE_MODEL
        assert (m.source, m.context_bytes, m.cublas_workspace_bytes, m.cublaslt_workspace_bytes) == (
            "fake", default.context_bytes, default.cublas_workspace_bytes, default.cublaslt_workspace_bytes)
        assert DEFAULT_GPU_MODEL in m.allocator_detail
    finally:
        await node.stop()


@pytest.mark.asyncio
async def test_a_driver_change_measures_again(tmp_path: Path) -> None:
    prober = CountingProber(FakeConstants(700 * MiB, 32 * MiB, MiB))
    node = Node(tmp_path)
    agent = await node.start(prober=prober, driver_check_interval=0)  # reads the driver at every sample
    try:
        await _until(lambda: all(g.get("measured") for g in node.gpus()))
        assert len(prober.calls) == 1
        await agent._sample()  # the same driver: nothing to do
        assert len(prober.calls) == 1
        node.backend.set_driver_version("580.159.04")
        await agent._sample()
        await _until(lambda: all(g.get("measured", {}).get("driverVersion") == "580.159.04" for g in node.gpus()))
        assert [d for _, d in prober.calls] == ["555.42.06-fake", "580.159.04"]
        assert node.count_of("ok") == 2
        kept = json.loads((tmp_path / "state" / STATE_FILE_NAME).read_text())["entries"]
        assert [k.split("|")[1] for k in kept] == ["580.159.04"]  # the old driver's measurement is dropped
    finally:
        await node.stop()


@pytest.mark.asyncio
async def test_the_driver_version_is_read_again_only_after_its_interval(tmp_path: Path) -> None:
    """The sample loop also watches for Xids: it reads the driver version once per ``driver_check_interval``, and a
    driver change is noticed at the first read after it."""
    prober = CountingProber(FakeConstants(700 * MiB, 32 * MiB, MiB))
    node = Node(tmp_path)
    agent = await node.start(prober=prober, driver_check_interval=3600)
    try:
        await _until(lambda: all(g.get("measured") for g in node.gpus()))
        node.backend.set_driver_version("580.159.04")
        await agent._sample()
        assert [d for _, d in prober.calls] == ["555.42.06-fake"]  # not read again yet
        agent.opts.driver_check_interval = 0
        await agent._sample()
        await _until(lambda: [d for _, d in prober.calls] == ["555.42.06-fake", "580.159.04"])
    finally:
        await node.stop()


@pytest.mark.asyncio
async def test_a_restart_reuses_the_kept_measurement_with_the_same_driver_only(tmp_path: Path) -> None:
    node = Node(tmp_path)
    first = CountingProber(FakeConstants(700 * MiB, 32 * MiB, MiB))
    await node.start(prober=first)
    try:
        await _until(lambda: all(g.get("measured") for g in node.gpus()))
        measured_at = node.gpus()[0]["measured"]["measuredAt"]
    finally:
        await node.stop()
    again = CountingProber(FakeConstants(1, 1, 1))
    await node.start(prober=again)
    try:
        await _until(lambda: all(g.get("measured") for g in node.gpus()))
        assert again.calls == [] and node.count_of("reused") == 1 and node.count_of("ok") == 0
        assert node.gpus()[0]["measured"]["measuredAt"] == measured_at
    finally:
        await node.stop()
    upgraded = CountingProber(FakeConstants(650 * MiB, 32 * MiB, MiB))
    await node.start(prober=upgraded, driver="580.159.04")
    try:
        await _until(lambda: all(g.get("measured") for g in node.gpus()))
        assert len(upgraded.calls) == 1 and node.count_of("reused") == 0
        assert node.gpus()[0]["measured"]["contextBytes"] == 650 * MiB
    finally:
        await node.stop()


@pytest.mark.asyncio
@pytest.mark.parametrize("command, result", [
    ((sys.executable, "-c", "import sys; print('no GPU here', file=sys.stderr); sys.exit(1)"), "failed"),
    ((sys.executable, "-c", "import time; time.sleep(30)"), "timeout"),
    ((sys.executable, "-c", "print('{\"source\": \"nvml\"}')"), "failed"),
], ids=["exits-1", "hangs", "bad-output"])
async def test_a_failing_probe_leaves_the_gpu_unmeasured_is_counted_retried_and_blocks_no_admission(
        tmp_path: Path, command: tuple[str, ...], result: str) -> None:
    node = Node(tmp_path, count=1)
    pod, job = job_pod("p", 10 * GiB)
    write_pods(node.pods, [pod], [job])
    agent = await node.start(constants_probe_command=command, constants_timeout=1.0, constants_retry=0.2)
    try:
        # admission goes ahead while the probe runs (or hangs)
        r, w = await asyncio.open_unix_connection(str(agent.opts.gate_socket))
        m = pod["metadata"]
        w.write(json.dumps({"op": "admit", "podUid": m["uid"], "podName": m["name"],
                            "podNamespace": m["namespace"]}).encode() + b"\n")
        await w.drain()
        reply = json.loads(await asyncio.wait_for(r.readline(), 5))
        assert reply["status"] == "admitted"
        await _until(lambda: node.count_of(result) == 1)
        assert node.gpus()[0].get("measured") is None
        await asyncio.sleep(0.25)  # past the first backoff
        await agent._sample()
        await _until(lambda: node.count_of(result) == 2)  # tried again
        assert node.gpus()[0].get("measured") is None and node.count_of("ok") == 0
        w.close()
    finally:
        await node.stop()


@pytest.mark.asyncio
async def test_the_probe_process_gets_the_jobs_environment(tmp_path: Path) -> None:
    """A probe command standing in for the real one: it reports what it was given, as the real probe's line."""
    script = tmp_path / "probe.py"
    script.write_text(
        "import os\n"
        "from datetime import datetime, timezone\n"
        "from gnnsched.contract import GPUMeasurement\n"
        "from gnnsched.gpu.constants_probe import output_line\n"
        "e = os.environ\n"
        "seen = '|'.join(e.get(k, '-') for k in ('CUDA_VISIBLE_DEVICES', 'CUDA_MPS_PIPE_DIRECTORY',\n"
        "                                        'CUDA_MPS_PINNED_DEVICE_MEM_LIMIT', 'GNNSCHED_FAKE_GPU_MEMORY'))\n"
        "print('torch says hello')\n"
        "print(output_line(GPUMeasurement(source='nvml', measured_at=datetime.now(tz=timezone.utc),\n"
        "      context_bytes=216 * 2**20, cublas_workspace_bytes=1, cublaslt_workspace_bytes=1,\n"
        "      active_thread_percentage=int(e['CUDA_MPS_ACTIVE_THREAD_PERCENTAGE']), allocator_detail=seen)))\n")
    prober = SubprocessProber(str(tmp_path / "mps"), active_thread_percentage=10, command=(sys.executable, str(script)),
                              base_env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path),
                                        "GNNSCHED_FAKE_GPU_MEMORY": "enforce"})
    gpu = GPUInfo(0, "GPU-abc", Z100, 96 * GiB, 0)
    m = await prober.measure(gpu, "580.159.04")
    assert m is not None and m.active_thread_percentage == 10 and m.context_bytes == 216 * MiB
    assert m.allocator_detail == f"GPU-abc|{tmp_path / 'mps'}|0=4096M|-"
