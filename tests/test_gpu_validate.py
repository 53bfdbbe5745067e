"""``bench/gpu/validate``, the one prepared command of a GPU session, and the scripts it runs: its plan, verdicts and
budget, that it stops at once on a source tree without an install, and that the scripts skip with a reason (never
hang, never an IndexError) where there is no GPU or no MPS daemon. The GPU path itself runs only on a lent GPU."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
GPU = ROOT / "bench" / "gpu"
VALIDATE = GPU / "validate"
HANG_GUARD_S = 60  # a bound on a loaded 2-core machine, only to catch a hang: a skip takes a second or two


def _load(path: Path, name: str):
    loader = importlib.machinery.SourceFileLoader(name, str(path))
    spec = importlib.util.spec_from_loader(name, loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    loader.exec_module(module)
    return module


def _validate():
    return _load(VALIDATE, "gpu_validate")


def _env(**extra: str) -> dict[str, str]:
    """This test's environment with the worktree first on the path (the scripts import gnnsched)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    for name in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"):
        env.pop(name, None)
    env.update(extra)
    return env


def test_the_plan_covers_every_gpu_check_within_the_budget(tmp_path):
    validate = _validate()
    plan = validate.steps(tmp_path)
    assert [s.name for s in plan] == ["pmc_accuracy", "allocator_history", "prestart", "real_gate",
                                      "context_by_share", "colocation"]
    assert sum(s.share for s in plan) == pytest.approx(1.0)
    for step in plan:
        for command in step.commands:
            script = ROOT / command.argv[1]
            assert script.is_file(), command  # every step runs a script that exists
    assert any("--models" in c.argv for c in plan[0].commands)  # the PyG classes and layer stacks too
    history = next(s for s in plan if s.name == "allocator_history").commands[0].argv
    assert history[2:] == [str(tmp_path / "allocator_history.json")]  # the H200 run's IndexError: no path given


def test_default_budget_matches_the_docstring():
    validate = _validate()
    assert validate.DEFAULT_BUDGET == 480
    assert "default 480" in validate.__doc__ and "--budget 480" in validate.__doc__
    assert "540" not in validate.__doc__


def test_colocation_runs_pairs_then_triples_under_both_sharing_modes(tmp_path):
    step = next(s for s in _validate().steps(tmp_path) if s.name == "colocation")
    modes = [(c.argv[c.argv.index("--mode") + 1], c.argv[c.argv.index("--sizes") + 1], c.mps) for c in step.commands]
    assert modes == [("time-slicing", "2", False), ("mps", "2", True), ("mps", "2", True), ("mps", "3", True),
                     ("time-slicing", "3", False)]
    assert [c.argv[c.argv.index("--active-thread-percentage") + 1] for c in step.commands
            if "--active-thread-percentage" in c.argv] == ["50"]  # the third: the pairs at half the threads
    for command in step.commands:  # each sizes its steps from its share of the budget, every row into one file
        assert "{budget}" in command.argv and str(tmp_path / "colocation.json") in command.argv
    context = next(s for s in _validate().steps(tmp_path) if s.name == "context_by_share").commands
    assert [c.mps for c in context] == [True] and "{budget}" in context[0].argv


@pytest.mark.parametrize("kind,codes,text,verdict", [
    ("prestart", [0], "", "PASS"), ("prestart", [2], "", "KEPT"), ("prestart", [1], "", "FAIL"),
    ("check", [0, 0], "", "PASS"), ("check", [0, 1], "", "FAIL"), ("check", [124], "", "FAIL (timeout)"),
    ("measure", [0], "", "MEASURED"), ("measure", [0, 0, 3], "", "FAIL"),
    ("measure", [5, 0, 5], "SKIP: no MPS daemon\n", "MEASURED"),  # time-slicing measured, MPS could not be
    ("measure", [5, 5], "x\nSKIP: first\nSKIP: no GPU (NVML)\n", "SKIP (no GPU (NVML))"),
    ("measure", [0, 124], "", "FAIL (timeout)"),
])
def test_verdicts(kind, codes, text, verdict):
    assert _validate()._verdict(kind, codes, text) == verdict


def test_a_step_past_its_share_is_a_timeout_within_the_budget_and_keeps_its_output(tmp_path):
    validate = _validate()
    sleeper = [sys.executable, "-c", "import time; print('partial line', flush=True); time.sleep(120)"]
    quick = [sys.executable, "-c", "print('fine')"]
    chosen = [validate.Step("slow", 0.5, [validate.Command(sleeper)]),
              validate.Step("after", 0.5, [validate.Command(quick)], kind="measure")]
    began = time.monotonic()
    code = validate.run_all(chosen, 12.0, began, tmp_path, {})
    took = time.monotonic() - began
    assert code == 1
    assert took < 12.0 + 3.0  # the kill's grace is inside the step's share; the rest is Python's own overhead
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"]["slow"]["verdict"] == "FAIL (timeout)"
    assert summary["steps"]["slow"]["seconds"] < 12.0
    assert summary["steps"]["after"]["verdict"] == "MEASURED"  # the next step still had its share
    slow = (tmp_path / "slow.txt").read_text()
    assert "partial line" in slow and "TIMEOUT" in slow


def test_a_timed_out_step_leaves_no_process_behind(tmp_path):
    validate = _validate()
    pid_file = tmp_path / "child.pid"
    # the script starts a child of its own (as colocation starts workers) and both outlive the share
    script = (f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; "
              f"time.sleep(120)']); open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(120)")
    verdict, _ = validate.run_step(validate.Step("kids", 1.0, [validate.Command([sys.executable, "-c", script])]),
                                   8.0, tmp_path)
    assert verdict == "FAIL (timeout)"
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
        status = Path(f"/proc/{child}/status").read_text() if Path(f"/proc/{child}/status").exists() else ""
        if "zombie" in status:
            break
        time.sleep(0.2)
    status = Path(f"/proc/{child}/status").read_text() if Path(f"/proc/{child}/status").exists() else ""
    assert not status or "zombie" in status, status[:200]


def test_a_step_needing_the_mps_daemon_is_skipped_without_it(tmp_path, monkeypatch):
    validate = _validate()
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-cuda-mps-control
    step = next(s for s in validate.steps(tmp_path) if s.name == "context_by_share")
    assert validate.run_step(step, 30.0, tmp_path) == ("SKIP (nvidia-cuda-mps-control not installed)", 0.0)


def test_a_source_tree_without_an_install_stops_validate_with_one_message():
    validate = _validate()
    # -S: no site-packages, so no install (nor the editable finder) of gnnsched; the source tree only
    message = validate.check_install([sys.executable, "-S"], _env(PYTHONPATH=str(ROOT)))
    assert message is not None
    assert "No module named 'gnnsched.node_agent'" in message
    assert "pip install ." in message and "prepare-device-run" in message
    assert validate.check_install() is None  # this environment has gnnsched installed


def test_a_source_tree_that_shadows_the_install_is_named(tmp_path):
    validate = _validate()
    site = tmp_path / "site" / "gnnsched"  # an install's layout: the components inside the package
    for package in (site, site / "node_agent", site / "operator"):
        package.mkdir(parents=True)
        (package / "__init__.py").write_text("")
    message = validate.check_install([sys.executable, "-S"], _env(PYTHONPATH=str(tmp_path / "site")))
    assert message is not None and "hides it" in message and "rm -rf gnnsched" in message


def test_validate_run_from_a_source_tree_exits_before_any_step(tmp_path, monkeypatch, capsys):
    validate = _validate()
    wrapper = tmp_path / "python"  # the steps' interpreter, as one without the install: the source tree only
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
    wrapper.chmod(0o755)
    monkeypatch.setattr(validate, "PY", str(wrapper))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    assert validate.main(["--budget", "480"]) == 3
    captured = capsys.readouterr()
    assert captured.out == ""  # no step line: it stopped before the first
    assert "gnnsched is not installed" in captured.err and "prepare-device-run" in captured.err
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_without_a_gpu_every_step_is_skipped_and_nothing_is_written(tmp_path):
    done = subprocess.run([sys.executable, str(VALIDATE)], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 6 and all(line.split()[1:] == ["SKIP", "(no", "CUDA", "device)"] for line in lines)
    assert list(tmp_path.iterdir()) == []


def test_allocator_history_without_an_output_path_is_a_usage_error(tmp_path):
    script = GPU / "allocator_history.py"
    done = subprocess.run([sys.executable, str(script)], env=_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "the following arguments are required: OUT.json" in done.stderr and "IndexError" not in done.stderr
    missing = tmp_path / "no-such-folder" / "h.json"
    done = subprocess.run([sys.executable, str(script), str(missing)], env=_env(), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "does not exist" in done.stderr
    history = _load(script, "gpu_allocator_history")
    assert history.parse_args([str(tmp_path / "h.json")]).out == tmp_path / "h.json"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_allocator_history_without_a_gpu_skips(tmp_path):
    done = subprocess.run([sys.executable, str(GPU / "allocator_history.py"), str(tmp_path / "h.json")], env=_env(),
                          capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 5 and done.stdout.startswith("SKIP: no CUDA device")
    assert not (tmp_path / "h.json").exists()


def _fake_daemon(tmp_path: Path) -> tuple[Path, Path]:
    """A pipe directory with a control socket in it and an ``nvidia-cuda-mps-control`` that answers every query:
    what validate's daemon looks like from outside, with no GPU behind it."""
    pipe = tmp_path / "pipe"
    pipe.mkdir()
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(pipe / "control"))
    sock.close()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    control = bin_dir / "nvidia-cuda-mps-control"
    control.write_text("#!/bin/sh\ncat > /dev/null\nexit 0\n")
    control.chmod(0o755)
    return pipe, bin_dir


@pytest.mark.parametrize("setup,reason", [
    ("none", "no MPS control daemon: no 'control' socket in"),
    ("pipe-only", "nvidia-cuda-mps-control is not on PATH"),
    ("daemon", "no GPU: NVML"),
])
def test_mps_context_skips_with_its_reason_quickly(tmp_path, setup, reason):
    if setup == "daemon" and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    env = _env(CUDA_MPS_PIPE_DIRECTORY=str(tmp_path / "absent"))
    if setup != "none":
        pipe, bin_dir = _fake_daemon(tmp_path)
        env["CUDA_MPS_PIPE_DIRECTORY"] = str(pipe)
        env["PATH"] = (str(bin_dir) + os.pathsep if setup == "daemon" else "") + "/usr/bin:/bin"
    out = tmp_path / "ctx.json"
    began = time.monotonic()
    done = subprocess.run([sys.executable, str(GPU / "mps_context.py"), "--json", str(out)], env=env,
                          capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert time.monotonic() - began < HANG_GUARD_S
    assert done.returncode == 5, done.stdout + done.stderr
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("SKIP: ") and reason in last
    assert reason in json.loads(out.read_text())["skip"]


def test_mps_context_kills_a_client_that_blocks(tmp_path):
    """A client the MPS server never serves blocks in CUDA's initialisation: the parent gives up at its timeout,
    kills its process group and says at which stage it stopped."""
    context = _load(GPU / "mps_context.py", "gpu_mps_context")
    blocked = [sys.executable, "-c", "import json, time; print(json.dumps({'stage': 'cuda-init'}), flush=True); "
               "time.sleep(120)"]
    began = time.monotonic()
    lines, why = context.run_client(blocked, dict(os.environ), 3.0)
    assert time.monotonic() - began < 20
    assert lines == [{"stage": "cuda-init"}]
    assert why is not None and "timed out after 3 s at stage 'cuda-init'" in why
    lines, why = context.run_client([sys.executable, "-c", "print('{\"stage\": \"result\", \"x\": 1}')"],
                                    dict(os.environ), 20.0)
    assert why is None and lines[-1] == {"stage": "result", "x": 1}
    lines, why = context.run_client([sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"],
                                    dict(os.environ), 20.0)
    assert why is not None and "exited 3 without a result" in why and "boom" in why


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
@pytest.mark.parametrize("mode", ["mps", "time-slicing"])
def test_colocation_without_a_gpu_skips(tmp_path, mode):
    done = subprocess.run([sys.executable, str(GPU / "colocation.py"), "--mode", mode, "--budget", "30"],
                          env=_env(), capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 5 and done.stdout.startswith("SKIP: no GPU")


def test_colocation_sizing_and_modes(tmp_path):
    coloc = _load(GPU / "colocation.py", "gpu_colocation")
    assert coloc.groups([3, 2])[:3] == [("gcn-train", "gin-train"), ("gcn-train", "sage-infer"),
                                        ("gin-train", "sage-infer")]
    assert len(coloc.groups([2, 3])) == 4 and len(coloc.groups([3])[0]) == 3
    # time-slicing: pointed away from any daemon, the MPS limits of validate's environment dropped
    base = {"CUDA_MPS_PIPE_DIRECTORY": "/tmp/d", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25", "X": "1"}
    sliced = coloc.worker_env("time-slicing", base, tmp_path)
    assert sliced == {"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path), "X": "1"}
    assert coloc.worker_env("mps", base, tmp_path) == {"CUDA_MPS_PIPE_DIRECTORY": "/tmp/d", "X": "1"}
    assert coloc.worker_env("mps", base, tmp_path, 50)["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert coloc.parse_args(["--mode", "mps", "--active-thread-percentage", "50"]).key == "mps@50"
    assert coloc.parse_args(["--mode", "mps"]).key == "mps"
    for bad in (["--mode", "time-slicing", "--active-thread-percentage", "50"],
                ["--mode", "mps", "--active-thread-percentage", "101"]):
        with pytest.raises(SystemExit):
            coloc.parse_args(bad)
    # what a share costs each job: its time alone at P % over alone under plain mps
    runs = {"mps": {"a": {"s_per_step": 0.02}, "b": {"s_per_step": 0.05}},
            "mps@50": {"a": {"s_per_step": 0.03}, "b": {"s_per_step": 0.05}, "c": {"s_per_step": 1.0}},
            "time-slicing": {"a": {"s_per_step": 0.04}}}
    assert coloc.share_costs(runs) == {"mps@50": {"a": pytest.approx(1.5), "b": pytest.approx(1.0)}}
    assert "not set" in coloc.mps_problem({})
    assert "no 'control' socket" in coloc.mps_problem({"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)})
    # steps from the budget: a bigger budget never gives fewer steps, never fewer than the H200 run's 20
    assert coloc.size_steps(60, 6, None) == 20 and coloc.size_steps(6000, 6, None) > 20
    assert coloc.size_steps(60, 6, 7) == 7
    solo = {"gcn-train": {"s_per_step": 0.01, "startup_s": 10.0, "steps": 20},
            "gin-train": {"s_per_step": 0.04, "startup_s": 8.0, "steps": 20}}
    assert coloc.expected_seconds(("gcn-train", "gin-train"), solo) == pytest.approx(10.0 + 2 * 0.8)
    a = coloc.Run("a", 10, 0.1, 1.0, step_start=0.0, step_end=10.0)
    b = coloc.Run("b", 10, 0.1, 1.0, step_start=5.0, step_end=20.0)
    assert coloc.overlap(a, [b]) == pytest.approx(0.5) and coloc.overlap(b, [a]) == pytest.approx(5 / 15)


FAKE_WORKER = """
import json, sys, time, yaml
spec = yaml.safe_load(open(sys.argv[1]))["spec"]
steps = spec.get("epochs") or spec.get("requests")
time.sleep(0.2)
print("log line")
print(json.dumps({"outcome": "succeeded", "seconds": steps * 0.01, "steps": steps}), flush=True)
"""


def test_colocation_writes_every_row_with_its_mode(tmp_path, monkeypatch, capsys):
    """The control flow on fake workers (the GPU is faked; the workers print the real result line's fields): solo
    runs, pairs, then the triple reusing the solo runs, in both modes, every row labelled and in one JSON file."""
    coloc = _load(GPU / "colocation.py", "gpu_colocation_flow")
    monkeypatch.setattr(coloc, "_gpu", lambda: ("NVIDIA H100 80GB HBM3", 80 * 2**30))
    monkeypatch.setattr(coloc, "worker_command", lambda manifest: [sys.executable, "-c", FAKE_WORKER, str(manifest)])
    pipe = tmp_path / "pipe"
    pipe.mkdir()
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(pipe / "control"))
    sock.close()
    out = tmp_path / "coloc.json"
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    assert coloc.main(["--mode", "mps", "--sizes", "2", "--budget", "60", "--json", str(out)]) == 5
    assert "SKIP: no MPS daemon" in capsys.readouterr().out
    assert coloc.main(["--mode", "time-slicing", "--sizes", "2", "--budget", "60", "--json", str(out)]) == 0
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(pipe))
    assert coloc.main(["--mode", "mps", "--sizes", "2,3", "--budget", "60", "--json", str(out)]) == 0
    assert coloc.main(["--mode", "time-slicing", "--sizes", "3", "--budget", "60", "--json", str(out)]) == 0
    seen: list[str] = []  # the workers' share, as each fake saw it
    monkeypatch.setattr(coloc, "run_together", _recording(coloc.run_together, seen))
    assert coloc.main(["--mode", "mps", "--active-thread-percentage", "50", "--sizes", "2", "--budget", "60",
                       "--json", str(out)]) == 0
    assert seen and set(seen) == {"50"}
    printed = capsys.readouterr().out
    assert "[time-slicing] gcn-train+gin-train" in printed and "[mps] gcn-train+gin-train+sage-infer" in printed
    data = json.loads(out.read_text())
    assert data["steps"] == 20 and set(data["solo"]) == {"mps", "time-slicing", "mps@50"}
    assert [(r["mode"], len(r["jobs"])) for r in data["rows"]] == [
        ("time-slicing", 2), ("time-slicing", 2), ("time-slicing", 2), ("mps", 2), ("mps", 2), ("mps", 2),
        ("mps", 3), ("time-slicing", 3), ("mps@50", 2), ("mps@50", 2), ("mps@50", 2)]
    assert set(data["share_cost"]["mps@50"]) == set(coloc.JOBS)  # the fakes' steps never slow: about 1.0 each
    assert "[mps@50] solo gcn-train" in printed and "x its time under mps" in printed
    for row in data["rows"]:
        assert set(row["measured"]) == set(row["jobs"]) == set(row["predicted"]) == set(row["solo_s_per_step"])
        assert all(row["predicted"][j] >= 1.0 for j in row["jobs"])
        assert all(row["measured"][j] == pytest.approx(1.0) for j in row["jobs"])  # the fakes' steps never slow
    assert set(data["summary"]) == {"mps", "time-slicing", "mps@50"}


def _recording(run_together: Any, seen: list[str]) -> Any:
    """``run_together`` that records each run's ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``."""
    def wrapped(jobs: Any, env: dict[str, str], timeout: float) -> Any:
        seen.append(env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "unset"))
        return run_together(jobs, env, timeout)
    return wrapped


def test_colocation_skips_a_group_that_no_longer_fits(tmp_path, monkeypatch, capsys):
    coloc = _load(GPU / "colocation.py", "gpu_colocation_budget")
    monkeypatch.setattr(coloc, "_gpu", lambda: ("NVIDIA H100 80GB HBM3", 80 * 2**30))
    monkeypatch.setattr(coloc, "worker_command", lambda manifest: [sys.executable, "-c", FAKE_WORKER, str(manifest)])
    out = tmp_path / "coloc.json"
    out.write_text(json.dumps({"steps": 20, "solo": {"time-slicing": {  # solo runs that took long: nothing fits
        job: {"s_per_step": 0.01, "startup_s": 500.0, "steps": 20} for job in coloc.JOBS}}}))
    began = time.monotonic()
    assert coloc.main(["--mode", "time-slicing", "--sizes", "2,3", "--budget", "30", "--json", str(out)]) == 5
    assert time.monotonic() - began < HANG_GUARD_S
    printed = capsys.readouterr().out
    assert "SKIP gcn-train+gin-train: needs about 500 s, 30 s left" in printed
    assert printed.strip().splitlines()[-1].startswith("SKIP: nothing measured under time-slicing")
    data = json.loads(out.read_text())
    assert data["rows"] == [] and len(data["skipped"]) == 4


FAKE_MPS_CONTROL = """#!{python}
import os, socket, sys, time
pipe = os.environ["CUDA_MPS_PIPE_DIRECTORY"]
with open(os.environ["FAKE_MPS_CALLS"], "a") as fh:
    fh.write(" ".join(sys.argv[1:]) or sys.stdin.read().strip())
    fh.write("\\n")
if sys.argv[1:] == ["-d"]:
    time.sleep(0.5)  # a daemon answers a moment after it forks
    s = socket.socket(socket.AF_UNIX)
    s.bind(os.path.join(pipe, "control"))
elif "quit" in open(os.environ["FAKE_MPS_CALLS"]).read().splitlines():
    os.unlink(os.path.join(pipe, "control"))
"""


def test_an_mps_step_runs_its_commands_under_its_own_daemon_within_the_budget(tmp_path, monkeypatch):
    """The daemon is started before the first MPS command, the commands see its pipe directory, a plain command
    after them runs without it (the daemon quit first), and all of it within the step's seconds."""
    validate = _validate()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    control = bin_dir / "nvidia-cuda-mps-control"
    control.write_text(FAKE_MPS_CONTROL.format(python=sys.executable))
    control.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    calls = tmp_path / "calls"
    monkeypatch.setenv("FAKE_MPS_CALLS", str(calls))
    show = [sys.executable, "-c", "import os; print('pipe=' + os.environ.get('CUDA_MPS_PIPE_DIRECTORY', 'none'))"]
    step = validate.Step("mpsfake", 1.0, [validate.Command(show, mps=True), validate.Command(show, mps=True),
                                          validate.Command(show)], kind="measure", needs="nvidia-cuda-mps-control")
    began = time.monotonic()
    verdict, took = validate.run_step(step, 40.0, tmp_path)
    assert verdict == "MEASURED" and took < 40.0 and time.monotonic() - began < 40.0
    text = (tmp_path / "mpsfake.txt").read_text()
    pipes = [line.split("=", 1)[1] for line in text.splitlines() if line.startswith("pipe=")]
    assert len(pipes) == 3 and pipes[0] == pipes[1] != "none" and pipes[2] == "none"
    assert pipes[0].startswith("/tmp/gv-mps-") and not Path(pipes[0]).exists()  # quit and removed
    assert calls.read_text().splitlines() == ["-d", "get_server_list", "quit"]  # one daemon for both MPS commands
