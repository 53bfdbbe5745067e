"""The GPU pod's gnnsched part, run from a copied ``gnnsched/portable`` in an image without gnnsched.

* Import graph: every module of ``gnnsched/portable`` imports only the standard library, torch and its siblings; the
  gate client imports no torch at all (it starts before every job and must start fast).
* The names and rules the portable modules spell out agree with the core's (environment variables, the fault
  patterns, the MPS limit grammar, the prestart hand-off line).
* The step runner and the gate run from an installed copy under ``python -I`` with an import hook that fails any
  import of gnnsched: a training and a parallel-inference job give the worker's result line, their progress reaches
  the gate's pipe, a fake GPU's limit gives ``memory-exceeded``, a wrong entrypoint is one line naming the field, a
  checkpointing job stopped by SIGTERM resumes and ends as one never stopped.
* One build path: the runner's observed peak equals the built-in worker's for the same job under a fake GPU.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from crd_schema import ROOT
from test_gate_client import ADMITTED, Successor

from gnnsched import contract
from gnnsched.closed_loop import _FAULT_PATTERNS, AttemptResult
from gnnsched.entrypoint_probe import install_probe, run_request, runs_portable
from gnnsched.gate_handoff import Handoff
from gnnsched.portable import fake_memory, gate, progress, runner
from gnnsched.portable.mps_limit import parse_mps_memory_limit
from gnnsched.spec import parse_job

pytestmark = pytest.mark.timeout(300)

PORTABLE = ROOT / "gnnsched" / "portable"
EXAMPLE = ROOT / "examples" / "custom-entrypoint"

BOOTSTRAP = """
import importlib.abc, runpy, sys
class NoGnnsched(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "gnnsched" or name.startswith("gnnsched."):
            raise ImportError("the GPU pod's code imported " + name)
        return None
sys.meta_path.insert(0, NoGnnsched())
import os
script = sys.argv[1]
sys.argv = [script, *sys.argv[3:]]
# as ``python script`` in the image: the script's directory first, then the image's own path
sys.path[:0] = [os.path.dirname(script), *os.environ["USER_PATH"].split(":")]
try:
    runpy.run_path(script, run_name="__main__")
finally:
    leaked = sorted(m for m in sys.modules if m == "gnnsched" or m.startswith("gnnsched."))
    print("LEAKED", leaked, file=sys.stderr)
"""


def _imports(path: Path) -> tuple[set[str], set[str]]:
    """(absolute top-level modules, sibling modules imported relatively) of one source file."""
    absolute: set[str] = set()
    relative: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            absolute.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                relative.add((node.module or "").split(".")[0])
            elif node.module != "gnnsched_portable.probe" and not (node.module or "").startswith("gnnsched_portable"):
                absolute.add((node.module or "").split(".")[0])
    return absolute, relative


def test_the_portable_code_imports_only_the_standard_library_and_torch() -> None:
    allowed = set(sys.stdlib_module_names) | {"torch", "__future__"}
    graph: dict[str, set[str]] = {}
    for path in sorted(PORTABLE.glob("*.py")):
        absolute, relative = _imports(path)
        assert absolute <= allowed, f"{path.name} imports {sorted(absolute - allowed)}"
        for sibling in relative:
            assert (PORTABLE / f"{sibling}.py").is_file(), f"{path.name}: no sibling {sibling}"
        graph[path.stem] = relative | {m for m in absolute if m == "torch"}
    # the gate and its launcher import no torch, directly or through a sibling
    seen, todo = set(), ["gate", "gate_launch"]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        assert "torch" not in graph[name], f"{name} imports torch: the gate must start without it"
        todo.extend(graph[name] - {"torch"})


def test_spelled_out_names_and_rules_agree_with_the_core() -> None:
    for module in (gate, runner, progress, fake_memory):
        for name in dir(module):
            if (name.startswith("ENV_") or name == "DEFAULT_GATE_SOCKET") and hasattr(contract, name):
                assert getattr(module, name) == getattr(contract, name), f"{module.__name__}.{name}"
    assert runner.FAULT_PATTERNS.pattern == _FAULT_PATTERNS.pattern
    for text in ("0=1024M", "2G", "1=512M,0=3G", "0=1536M,", "0 = 7 M"):
        assert runner.mps_limit_bytes(text) == parse_mps_memory_limit(text), text
    with pytest.raises(runner.RunError, match="CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"):
        runner.mps_limit_bytes("lots")
    line = gate.handoff_line("admitted", env={"CUDA_VISIBLE_DEVICES": "GPU-1"}, unset=["X"])
    assert Handoff.model_validate_json(line) == Handoff(status="admitted", env={"CUDA_VISIBLE_DEVICES": "GPU-1"},
                                                        unset=["X"])
    refused = Handoff.model_validate_json(gate.handoff_line("rejected", exit_code=3, message="no"))
    assert (refused.status, refused.exit_code, refused.message) == ("rejected", 3, "no")


def _spec(mode: str, **extra: object):
    manifest = yaml.safe_load((EXAMPLE / "gnnjob.yaml").read_text())
    manifest["spec"]["graph"] = {"nodes": 400, "edges": 3200, "features": 16, "classes": 4}
    manifest["spec"]["mode"] = mode
    if mode == "infer":
        manifest["spec"].pop("optimizer")
        manifest["spec"].pop("epochs")
        manifest["spec"]["requests"] = 6
    else:
        manifest["spec"]["epochs"] = 4
    manifest["spec"].update(extra)
    return parse_job(manifest).spec


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The user's image, simulated: the tools as the init container installs them, and the user's package."""
    root = tmp_path_factory.mktemp("image")
    install_probe(root / "tools")  # the GPU pod's init container runs exactly this
    (root / "user").mkdir()
    import shutil

    shutil.copytree(EXAMPLE / "my_gnn", root / "user" / "my_gnn")
    return root


def _run(image: Path, script: str, args: list[str], tmp_path: Path, env: dict[str, str] | None = None,
         pass_fds: tuple[int, ...] = (), execs: bool = False) -> subprocess.CompletedProcess[str]:
    """Run a launcher from the copy under ``python -I`` with gnnsched's imports failing. ``execs``: the program
    replaces itself (the gate), so no leak report prints; the import hook alone then stands guard."""
    launcher = image / "tools" / "gnnsched_portable" / script
    full_env = {"PATH": os.environ["PATH"], "USER_PATH": str(image / "user"), **(env or {})}
    run = subprocess.run([sys.executable, "-I", "-c", BOOTSTRAP, str(launcher), "--", *args], capture_output=True,
                         text=True, timeout=240, cwd=tmp_path, env=full_env, pass_fds=pass_fds)
    if not execs or run.returncode != 0:
        assert "LEAKED []" in run.stderr, run.stderr[-3000:]
    return run


def _result(run: subprocess.CompletedProcess[str]) -> dict:
    line = [ln for ln in run.stdout.splitlines() if ln.startswith("{")][-1]
    parsed = json.loads(line)
    # the operator's reader takes every key, with the worker's meaning
    assert set(parsed) <= set(AttemptResult.model_fields)
    assert AttemptResult.model_validate(parsed).model_dump(include=set(parsed)) == parsed
    return parsed


MINIBATCH = {"batching": {"mode": "minibatch", "batchSize": 128, "fanouts": [4, 3]}}


@pytest.mark.parametrize("mode,extra", [("train", {}), ("infer", {"parallelism": 3}), ("train", MINIBATCH),
                                        ("infer", {"parallelism": 2, **MINIBATCH})])
def test_the_runner_from_a_copy_runs_the_job_and_reports_as_the_worker(image: Path, tmp_path: Path, mode: str,
                                                                       extra: dict) -> None:
    spec = _spec(mode, **extra)
    assert runs_portable(spec)
    result_file = tmp_path / "termination-log"
    read_end, write_end = os.pipe()
    try:
        run = _run(image, "run_launch.py", ["--request", json.dumps(run_request(spec)), "--device", "cpu"], tmp_path,
                   env={"GNNSCHED_RESULT_FILE": str(result_file), "GNNSCHED_PROGRESS_FD": str(write_end),
                        "GNNSCHED_CPU_REQUEST": "1"}, pass_fds=(write_end,))
    finally:
        os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        reports = [json.loads(line) for line in pipe.read().splitlines()]
    assert run.returncode == 0, run.stderr[-3000:]
    result = _result(run)
    # a mini-batch training epoch is one step per batch of seed nodes (every node of the synthetic graph is one)
    steps = spec.steps * -(-400 // 128) if (mode == "train" and "batching" in extra) else spec.steps
    assert result["outcome"] == "succeeded" and result["steps"] == steps and result["observed_peak_bytes"] > 0
    assert result_file.read_text().strip() == run.stdout.strip().splitlines()[-1]
    # the last step's report always goes out; every line has the gate's three numbers
    assert reports and reports[-1]["steps"] == reports[-1]["total"] == steps, reports
    assert all(set(r) == {"steps", "total", "seconds"} for r in reports)


@pytest.mark.parametrize("extra", [{}, MINIBATCH])
def test_the_runners_peak_is_the_workers_for_the_same_job(image: Path, tmp_path: Path, extra: dict) -> None:
    """One build path: graph, sampler, model and step are the same modules, so the bytes they hold are the same. Both
    run as pods run them, each in a fresh process under a fake GPU: ``gnnsched worker JOB.yaml`` and the runner's
    copy."""
    spec = _spec("train", **extra)
    manifest = tmp_path / "job.yaml"
    manifest.write_text(yaml.safe_dump({"apiVersion": "gnnsched.io/v1alpha1", "kind": "GNNJob",
                                        "metadata": {"name": "same"},
                                        "spec": spec.model_dump(mode="json", by_alias=True, exclude_none=True)}))
    env = {**os.environ, "GNNSCHED_FAKE_GPU_MEMORY": "enforce",
           "PYTHONPATH": os.pathsep.join([str(EXAMPLE), *filter(None, [os.environ.get("PYTHONPATH")])])}
    worker = subprocess.run([sys.executable, "-m", "gnnsched.cli", "worker", str(manifest), "--device", "cpu",
                             "--no-progress"], capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert worker.returncode == 0, worker.stderr[-3000:]
    run = _run(image, "run_launch.py", ["--request", json.dumps(run_request(spec)), "--device", "cpu"], tmp_path,
               env={"GNNSCHED_FAKE_GPU_MEMORY": "enforce"})
    assert run.returncode == 0, run.stderr[-3000:]
    ours, theirs = _result(run), _result(worker)
    assert ours["steps"] == theirs["steps"]
    assert ours["observed_peak_bytes"] == theirs["observed_peak_bytes"] > 0


def test_a_fake_gpus_limit_ends_in_memory_exceeded(image: Path, tmp_path: Path) -> None:
    spec = _spec("train")
    run = _run(image, "run_launch.py", ["--request", json.dumps(run_request(spec)), "--device", "cpu"], tmp_path,
               env={"GNNSCHED_FAKE_GPU_MEMORY": "enforce", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=1M"})
    assert run.returncode == 1, run.stderr[-3000:]
    result = _result(run)
    assert result["outcome"] == "memory-exceeded" and result["limit_bytes"] == 1 << 20
    assert result["requested_bytes"] > 0 and result["held_bytes"] + result["requested_bytes"] > 1 << 20


@pytest.mark.parametrize("change,needle", [
    ({"entrypoint": "my_gnn.nowhere:build"}, "spec.model.entrypoint: cannot import 'my_gnn.nowhere'"),
    ({"steps": 0}, "--request: steps: must be a whole number >= 1"),
    ({"graph": {"nodes": 10}}, "--request: graph.edges"),
    ({"steps": "args"}, "unrecognized arguments: --fast (spec.args)"),
])
def test_bad_input_is_one_line_naming_the_field(image: Path, tmp_path: Path, change: dict, needle: str) -> None:
    request = {**run_request(_spec("train")), **change}
    extra = ["--fast"] if change.get("steps") == "args" else []
    run = _run(image, "run_launch.py", ["--request", json.dumps(request), "--device", "cpu", *extra], tmp_path)
    assert run.returncode == 2
    lines = [ln for ln in run.stderr.splitlines() if not ln.startswith("LEAKED")]
    assert len(lines) == 1 and needle in lines[0], run.stderr


DRAIN_MODULE = '''
"""The example's model, built by an entrypoint that asks its own process to stop (SIGTERM, as a drain does) in the
forward pass of step $DRAIN_AT_STEP: an interruption at a known step, through the runner's own signal handler."""
import os
import signal

from my_gnn.model import build as build_model


def build(dims):
    model = build_model(dims)
    at, calls = int(os.environ.get("DRAIN_AT_STEP", "0")), [0]

    def count(module, args, out):
        calls[0] += 1
        if calls[0] == at:
            os.kill(os.getpid(), signal.SIGTERM)

    model.register_forward_hook(count)
    return model
'''


def test_a_drained_runner_resumes_from_its_checkpoint_and_ends_as_an_uninterrupted_run(image: Path,
                                                                                        tmp_path: Path) -> None:
    """``spec.checkpoint`` in the user's image: SIGTERM during step 5 saves at its end and exits 143 with no result
    line; the next attempt resumes at step 5 and ends with the same weights, optimizer state and RNG, step for step,
    as a run that was never stopped (the example model draws dropout masks, so the RNG must be restored too)."""
    import torch

    user = tmp_path / "user"
    user.mkdir()
    (user / "drain_at.py").write_text(DRAIN_MODULE)
    request = {**run_request(_spec("train", epochs=12)), "entrypoint": "drain_at:build"}
    args = ["--request", json.dumps(request), "--device", "cpu"]
    base = {"USER_PATH": f"{image / 'user'}:{user}", "GNNSCHED_CPU_REQUEST": "1"}
    every_step = {"GNNSCHED_CHECKPOINT_EVERY_S": "0.000001"}  # below one step's time: a save after every step
    whole_dir, parts_dir = tmp_path / "whole", tmp_path / "parts"

    whole = _run(image, "run_launch.py", args, tmp_path,
                 env={**base, **every_step, "GNNSCHED_CHECKPOINT_DIR": str(whole_dir)})
    assert whole.returncode == 0, whole.stderr[-3000:]
    ref = _result(whole)
    assert (ref["outcome"], ref["steps"], ref["resumed_from_step"], ref["checkpoint_step"]) == ("succeeded", 12, 0, 11)
    assert ref["checkpoint_saves"] == 11 and ref["lost_seconds"] == 0.0

    stopped = _run(image, "run_launch.py", args, tmp_path,
                   env={**base, "DRAIN_AT_STEP": "5", "GNNSCHED_CHECKPOINT_EVERY_S": "3600",
                        "GNNSCHED_CHECKPOINT_DIR": str(parts_dir)})
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    assert "gnnsched runner: stopped by SIGTERM after step 5; checkpoint saved" in stopped.stderr
    assert not [ln for ln in stopped.stdout.splitlines() if ln.startswith("{")]  # no outcome: the attempt goes on
    assert os.listdir(parts_dir) == ["checkpoint.pt"]

    resumed = _run(image, "run_launch.py", args, tmp_path,
                   env={**base, **every_step, "GNNSCHED_CHECKPOINT_DIR": str(parts_dir)})
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    done = _result(resumed)
    assert (done["outcome"], done["steps"], done["resumed_from_step"], done["checkpoint_step"]) == (
        "succeeded", 12, 5, 11)
    assert done["checkpoint_saves"] == 6 and done["lost_seconds"] == 0.0

    a, b = (torch.load(d / "checkpoint.pt", weights_only=True) for d in (whole_dir, parts_dir))
    assert a["step"] == b["step"] == 11
    assert a["model"].keys() == b["model"].keys()
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key
    for slot, state in a["optimizer"]["state"].items():
        for name, value in state.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(b["optimizer"]["state"][slot][name])), name
    assert torch.equal(a["rng"]["torch"], b["rng"]["torch"])


def test_a_bad_checkpoint_interval_is_one_line_naming_the_variable(image: Path, tmp_path: Path) -> None:
    run = _run(image, "run_launch.py", ["--request", json.dumps(run_request(_spec("train"))), "--device", "cpu"],
               tmp_path, env={"GNNSCHED_CHECKPOINT_DIR": str(tmp_path / "c"), "GNNSCHED_CHECKPOINT_EVERY_S": "soon"})
    assert run.returncode == 2
    lines = [ln for ln in run.stderr.splitlines() if not ln.startswith("LEAKED")]
    assert lines == ["error: GNNSCHED_CHECKPOINT_EVERY_S: must be a number of seconds > 0, got 'soon'"], run.stderr


def test_the_gate_from_a_copy_waits_then_execs_the_workload_with_its_gpu(image: Path, tmp_path: Path) -> None:
    sock = tmp_path / "gate.sock"
    agent = Successor(sock, [{"status": "queued", "position": 1}, ADMITTED])
    out = tmp_path / "env.json"
    workload = [sys.executable, "-I", "-c",
                "import json, os, sys; json.dump(dict(os.environ), open(sys.argv[1], 'w'))", str(out)]
    try:
        run = _run(image, "gate_launch.py", ["--socket", str(sock), "--", *workload], tmp_path,
                   env={"GNNSCHED_POD_UID": "0b0e8a6e-5d1c-4a53-9f0a-1f7c2c5d9a10", "GNNSCHED_POD_NAME": "p-0",
                        "GNNSCHED_POD_NAMESPACE": "team-b"}, execs=True)
    finally:
        agent.close()
    assert run.returncode == 0, run.stderr
    assert agent.requests == [{"op": "admit", "version": 1, "podUid": "0b0e8a6e-5d1c-4a53-9f0a-1f7c2c5d9a10",
                               "podName": "p-0", "podNamespace": "team-b", "container": ""}]
    env = json.loads(out.read_text())
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-1" and env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=1024M"
    assert env["GNNSCHED_PROGRESS_FD"].isdigit()
    assert "queued at position 1" in run.stderr


def test_the_gate_from_a_copy_without_an_agent_exits_4_in_one_line(image: Path, tmp_path: Path) -> None:
    run = _run(image, "gate_launch.py", ["--socket", str(tmp_path / "none.sock"), "--wait-seconds", "0.3", "--",
                                         "true"], tmp_path,
               env={"GNNSCHED_POD_UID": "u-1", "GNNSCHED_POD_NAME": "p", "GNNSCHED_POD_NAMESPACE": "default"})
    assert run.returncode == 4
    assert "no node agent at" in run.stderr
    missing = _run(image, "gate_launch.py", ["--", "true"], tmp_path)
    assert missing.returncode == 2 and "GNNSCHED_POD_UID: not set" in missing.stderr


# What the GPU pod's portable modules use of torch, with the release that has it (docs/custom-models.md, "Oldest
# versions"). Names every torch release since 1.0 has are (1, 0).
GPU_POD_MODULES = ("runner", "step", "graph", "sampler", "fake_memory", "storage_booking", "progress", "gate",
                   "checkpoint")
TORCH_API = {
    "F.cross_entropy": (1, 0), "torch.Generator": (1, 0), "torch.Tensor": (1, 0), "torch.arange": (1, 0),
    "torch.cuda": (1, 0), "torch.cuda.is_available": (1, 0), "torch.cuda.synchronize": (1, 0),
    "torch.cuda.max_memory_reserved": (1, 4), "torch.cuda.memory_reserved": (1, 4),
    "torch.cuda.mem_get_info": (1, 11), "torch.cuda.OutOfMemoryError": (1, 13),
    "torch.empty": (1, 0), "torch.long": (1, 0), "torch.manual_seed": (1, 0), "torch.nn": (1, 0),
    "torch.nn.Module": (1, 0), "torch.nn.Parameter": (1, 0), "torch.no_grad": (1, 0), "torch.optim": (1, 0),
    "torch.optim.Adam": (1, 0), "torch.optim.AdamW": (1, 2), "torch.optim.SGD": (1, 0),
    "torch.optim.Optimizer": (1, 0), "torch.randint": (1, 0), "torch.randn": (1, 0), "torch.set_num_threads": (1, 0),
    "torch.utils._python_dispatch.TorchDispatchMode": (1, 13), "torch.utils._pytree.tree_flatten": (1, 0),
    "torch.argsort": (1, 13),  # its stable= keyword (the sampler's CSR)
    "torch.cat": (1, 0), "torch.device": (1, 0), "torch.full": (1, 0), "torch.ones_like": (1, 0),
    "torch.rand": (1, 0), "torch.randperm": (1, 0), "torch.repeat_interleave": (1, 1), "torch.stack": (1, 0),
    "torch.unique": (1, 0), "torch.where": (1, 0), "torch.zeros": (1, 0),
    # the checkpoint's save and resume; torch.load's weights_only= keyword is 1.13's
    "torch.save": (1, 0), "torch.load": (1, 13), "torch.get_rng_state": (1, 0), "torch.set_rng_state": (1, 0),
    "torch.cuda.get_rng_state_all": (1, 0), "torch.cuda.set_rng_state_all": (1, 0),
    "torch.cuda.is_initialized": (2, 0),  # an upper bound: no older release was checked
    # methods, found by name
    "Tensor.untyped_storage": (2, 0), "Optimizer(foreach=True)": (2, 0),
}
OLDEST_TORCH = (2, 0)


def _torch_names(path: Path) -> set[str]:
    names: set[str] = set()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            parts: list[str] = []
            base: ast.expr = node
            while isinstance(base, ast.Attribute):
                parts.append(base.attr)
                base = base.value
            if isinstance(base, ast.Name) and base.id in ("torch", "F"):
                names.add(".".join([base.id, *reversed(parts)]))
            if node.attr == "untyped_storage":
                names.add("Tensor.untyped_storage")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch."):
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.keyword) and node.arg == "foreach":
            names.add("Optimizer(foreach=True)")
    return names


def test_the_torch_api_used_is_the_stated_one() -> None:
    """A portable module that starts using a torch name not in the table fails here until the table (and the docs'
    oldest torch) says since when torch has it."""
    used = set().union(*(_torch_names(PORTABLE / f"{m}.py") for m in GPU_POD_MODULES))
    assert used - set(TORCH_API) == set(), "add these to TORCH_API with the torch release that has them"
    assert max(TORCH_API[name] for name in used) == OLDEST_TORCH


def test_the_runner_survives_a_torch_without_its_newer_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch before 2.5 has no top-level ``torch.OutOfMemoryError``: the runner catches ``torch.cuda``'s."""
    import torch

    monkeypatch.delattr(torch, "OutOfMemoryError")
    monkeypatch.syspath_prepend(str(EXAMPLE))
    request = runner.RunRequest.from_json(json.dumps(run_request(_spec("train"))))
    result = runner.attempt(request, "cpu", {"GNNSCHED_FAKE_GPU_MEMORY": "enforce",
                                             "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=1M"})
    assert result["outcome"] == "memory-exceeded" and result["limit_bytes"] == 1 << 20, result
    assert "CUDA out of memory. Tried to allocate" in result["message"]


FAULT_MODULE = '''
"""The example's model, with a fatal GPU error (as CUDA raises it) in the forward pass of step 4."""
from my_gnn.model import build as build_model


def build(dims):
    model = build_model(dims)
    calls = [0]

    def count(module, args, out):
        calls[0] += 1
        if calls[0] == 4:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    model.register_forward_hook(count)
    return model
'''


def test_a_runner_fault_reports_its_step_and_the_work_since_the_last_save(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's fault line: the step the fault came at, the last step saved, the seconds lost since then."""
    from gnnsched.portable.checkpoint import Checkpointer

    (tmp_path / "fault_at_step_4.py").write_text(FAULT_MODULE)
    monkeypatch.syspath_prepend(str(EXAMPLE))
    monkeypatch.syspath_prepend(str(tmp_path))
    request = runner.RunRequest.from_json(json.dumps({**run_request(_spec("train", epochs=12)),
                                                      "entrypoint": "fault_at_step_4:build"}))
    result = runner.attempt(request, "cpu", {}, checkpointer=Checkpointer(str(tmp_path / "c"), 1e-6))
    assert (result["outcome"], result["steps"], result["checkpoint_step"], result["resumed_from_step"]) == (
        "fault", 3, 3, 0)
    assert result["checkpoint_saves"] == 3 and result["lost_seconds"] >= 0.0
    assert AttemptResult.model_validate(result).steps == 3


def test_an_unreadable_checkpoint_is_one_line_naming_the_file(image: Path, tmp_path: Path) -> None:
    """A truncated or foreign ``checkpoint.pt`` is neither resumed from (another model) nor overwritten (maybe the
    user's): the runner stops with one line naming it."""
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "checkpoint.pt").write_bytes(b"half a checkpoint")
    run = _run(image, "run_launch.py", ["--request", json.dumps(run_request(_spec("train"))), "--device", "cpu"],
               tmp_path, env={"GNNSCHED_CHECKPOINT_DIR": str(tmp_path / "c"), "GNNSCHED_CHECKPOINT_EVERY_S": "5"})
    assert run.returncode == 2
    lines = [ln for ln in run.stderr.splitlines() if not ln.startswith("LEAKED")]
    assert len(lines) == 1 and lines[0].startswith(f"error: {tmp_path / 'c' / 'checkpoint.pt'}: not a readable"), lines
