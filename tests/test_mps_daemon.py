"""``gnnsched mps-daemon`` against the fake ``nvidia-cuda-mps-control`` / ``nvidia-smi`` on PATH (the hardware
boundary): compute mode by UUID, an uncaptured ``-d``, per-GPU default limits, directory ownership, the health file
in the node state directory, ``--disable``; and the agent reading that health (``--mps external``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from fake_mps import kill_fake_mps

from gnnsched.contract import MPS_SHM_SOURCE, MPSDaemonHealth
from gnnsched.node_agent.mps import MPSConfig, MPSManager
from gnnsched.node_agent.mps_daemon import MPSDaemonService, dev_shm_binding, health_file_path, pinned_limit_mib
from gnnsched.node_agent.mps_external import ExternalMPS
from gnnsched.node_status_file import write_json_atomic

FAKES = Path(__file__).parent / "fakes"
GNNSCHED = [sys.executable, "-c", "from gnnsched.cli import main; main()"]
UUIDS = ["GPU-aaaaaaaa-0000-0000-0000-000000000000", "GPU-bbbbbbbb-0000-0000-0000-000000000001"]
pytestmark = [pytest.mark.timeout(60)]


@pytest.fixture
def service(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{FAKES}{os.pathsep}{os.environ['PATH']}")
    cfg = MPSConfig(pipe_directory=tmp_path / "pipe", log_directory=tmp_path / "log", devices=[0, 1], uuids=UUIDS,
                    compute_mode="exclusive", pinned_mem_limits={0: "80895M", 1: "80895M"}, owner_uid=os.getuid(),
                    start_timeout=5, command_timeout=5)
    svc = MPSDaemonService(MPSManager(cfg), tmp_path / "state", jobs_uid=os.getuid())
    yield svc
    kill_fake_mps(cfg.pipe_directory)


def _commands(svc: MPSDaemonService) -> list[str]:
    return (svc.manager.config.log_directory / "fake-commands.log").read_text().splitlines()


def test_start_sets_mode_by_uuid_limits_and_publishes_health(service: MPSDaemonService) -> None:
    t0 = time.monotonic()
    assert service.check() is True
    # The fake daemon keeps the caller's stdout/stderr open like the real one: a captured -d would block until the
    # command timeout (5 s) and fail; discarded output returns at once.
    assert time.monotonic() - t0 < 4
    cmds = _commands(service)
    assert cmds[:2] == [f"nvidia-smi -i {u} -c EXCLUSIVE_PROCESS" for u in UUIDS]
    assert "set_default_device_pinned_mem_limit 0 80895M" in cmds
    assert "set_default_device_pinned_mem_limit 1 80895M" in cmds
    health = MPSDaemonHealth.model_validate(json.loads(service.health_path.read_text()))
    assert health.healthy and health.compute_mode == "EXCLUSIVE_PROCESS" and health.gpus == UUIDS
    assert health.pinned_mem_limits == {"0": "80895M", "1": "80895M"} and health.jobs_uid == os.getuid()
    assert service.health_path.parent != service.manager.config.pipe_directory
    assert oct(service.health_path.stat().st_mode & 0o777) == "0o644"


def test_disable_quits_and_resets_compute_mode(service: MPSDaemonService) -> None:
    assert service.check()
    assert service.disable() == []
    cmds = _commands(service)
    assert "quit" in cmds
    assert cmds[-2:] == [f"nvidia-smi -i {UUIDS[0]} -c DEFAULT", f"nvidia-smi -i {UUIDS[1]} -c DEFAULT"]
    health = MPSDaemonHealth.model_validate(json.loads(service.health_path.read_text()))
    assert not health.healthy and health.message == "disabled" and health.compute_mode == "DEFAULT"
    assert service.manager.probe() is False


def test_directories_change_owner_to_the_jobs_uid(tmp_path, monkeypatch) -> None:
    if os.getuid() != 0:
        pytest.skip("chown to another UID needs root")
    monkeypatch.setenv("PATH", f"{FAKES}{os.pathsep}{os.environ['PATH']}")
    cfg = MPSConfig(pipe_directory=tmp_path / "pipe", log_directory=tmp_path / "log", devices=[0], uuids=UUIDS[:1],
                    owner_uid=65532, start_timeout=5)
    try:
        assert MPSManager(cfg).check()
        for d in (cfg.pipe_directory, cfg.log_directory):
            assert d.stat().st_uid == 65532 and oct(d.stat().st_mode & 0o777) == "0o755"
    finally:
        kill_fake_mps(cfg.pipe_directory)


def test_auto_limit_is_the_gpu_less_the_reserve() -> None:
    assert pinned_limit_mib(80 * 2**30, 2**30) == "80896M"
    assert pinned_limit_mib(2**20, 2**30) == "1M"


def test_external_reader_follows_the_health_file(tmp_path) -> None:
    path = health_file_path(tmp_path)
    ext = ExternalMPS(path, max_age_s=30)
    assert ext.check() is False and "is the gnnsched mps-daemon running" in ext.message
    write_json_atomic(path, MPSDaemonHealth(healthy=True, message="running", restarts=2,
                                            updated_at=datetime.now(timezone.utc)).wire())
    assert ext.check() is True and ext.restarts == 2
    old = datetime.now(timezone.utc) - timedelta(seconds=90)
    write_json_atomic(path, MPSDaemonHealth(healthy=True, message="running", updated_at=old).wire())
    assert ext.check() is False and "s old (limit 30 s)" in ext.message
    path.write_text("{not json")
    assert ext.check() is False and "is not JSON" in ext.message
    write_json_atomic(path, {"healthy": "maybe"})
    assert ext.check() is False and "healthy" in ext.message


def test_cli_runs_publishes_and_leaves_the_daemon_on_sigterm_then_disable(tmp_path) -> None:
    env = dict(os.environ, PATH=f"{FAKES}{os.pathsep}{os.environ['PATH']}")
    args = ["mps-daemon", "--gpus", "fake:2x16Gi", "--mps-pipe-dir", str(tmp_path / "pipe"), "--mps-log-dir",
            str(tmp_path / "log"), "--state-dir", str(tmp_path / "state"), "--jobs-uid", str(os.getuid()),
            "--probe-interval", "0.2", "--reserve-bytes", "1Gi"]
    proc = subprocess.Popen(GNNSCHED + args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    health = health_file_path(tmp_path / "state")
    try:
        deadline = time.monotonic() + 30
        while not (health.exists() and json.loads(health.read_text()).get("healthy")):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "mps-daemon never published a healthy state"
            time.sleep(0.05)
        h = MPSDaemonHealth.model_validate(json.loads(health.read_text()))
        assert h.pinned_mem_limits == {"0": "15360M", "1": "15360M"} and len(h.gpus) == 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
        # SIGTERM sends no quit (only --reset-on-exit does): outside a container the daemon is still there. In a pod
        # it ends with the container anyway (docs/node-agent.md); OnDelete keeps upgrades from stopping it.
        assert (tmp_path / "pipe" / "fake-mps.pid").exists()
        cp = subprocess.run(GNNSCHED + args + ["--disable"], env=env, capture_output=True, text=True, timeout=60)
        assert cp.returncode == 0, cp.stderr
        assert not (tmp_path / "pipe" / "fake-mps.pid").exists()
        log = (tmp_path / "log" / "fake-commands.log").read_text().splitlines()
        assert log[-1].endswith("-c DEFAULT") and "quit" in log
        assert json.loads(health.read_text())["message"] == "disabled"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kill_fake_mps(tmp_path / "pipe")


@pytest.mark.parametrize("flag, needle", [
    (["--compute-mode", "default"], "--compute-mode"),
    (["--default-pinned-mem-limit", "lots"], "--default-pinned-mem-limit"),
    (["--default-active-thread-percentage", "101"], "--default-active-thread-percentage"),
    (["--jobs-uid", "-3"], "--jobs-uid"),
])
def test_cli_bad_flags_are_one_line(flag: list[str], needle: str) -> None:
    cp = subprocess.run(GNNSCHED + ["mps-daemon", "--gpus", "fake:1x1Gi", *flag], capture_output=True, text=True,
                        timeout=60)
    assert cp.returncode == 2 and needle in cp.stderr and "Traceback" not in cp.stderr
    assert len(cp.stderr.strip().splitlines()) == 1, cp.stderr


PRIVATE = "30 25 0:27 / /dev/shm rw,nosuid,nodev,noexec,relatime - tmpfs shm rw,size=65536k\n"
SHARED = ("30 25 0:27 / /dev/shm rw,relatime - tmpfs shm rw,size=65536k\n"
          "41 25 0:24 /gnnsched/mps-shm /dev/shm rw,nosuid,nodev,noexec - tmpfs shm rw,size=32g\n")


def test_dev_shm_binding_tells_the_shared_tmpfs_from_a_private_one() -> None:
    # the chart's layout (NVIDIA's): a tmpfs of its own at the shm dir, bind-mounted whole, so its root is "/"
    own = f"42 25 0:25 / /dev/shm rw,nosuid,nodev,noexec - tmpfs {MPS_SHM_SOURCE} rw,size=65536k\n"
    assert dev_shm_binding("/var/run/gnnsched/mps-shm", own)[0] is True
    assert dev_shm_binding("/var/run/gnnsched/mps-shm", SHARED) == (True, "/dev/shm is /gnnsched/mps-shm (tmpfs)")
    shared, why = dev_shm_binding("/var/run/gnnsched/mps-shm", PRIVATE)
    assert not shared and "cannot attach" in why
    assert dev_shm_binding("/x/mps-shm", "25 1 0:1 / / rw - ext4 /dev/sda rw\n") == \
        (False, "/dev/shm is not a mount point")
    assert dev_shm_binding("/x/mps-shm", "41 25 0:24 /other-shm /dev/shm rw - tmpfs t rw\n")[0] is False


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _readyz(port: int) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, str(exc)


def _wait(cond, what: str, timeout: float = 30) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_agent_restart_leaves_the_mps_daemon_and_readiness_follows_it(tmp_path) -> None:
    """Blocker 5 of issue 20, with real processes: ``gnnsched mps-daemon`` owns the (fake) control daemon, a
    ``gnnsched node-agent --mps external`` reads its health; the agent is ready only while MPS is up, and stopping
    and restarting the agent leaves the control daemon (and so every MPS client) running."""
    env = dict(os.environ, PATH=f"{FAKES}{os.pathsep}{os.environ['PATH']}")
    state, pipe = tmp_path / "state", tmp_path / "pipe"
    pods = tmp_path / "pods.json"
    pods.write_text(json.dumps({"pods": [], "gnnjobs": []}))
    port = _free_port()
    agent_cmd = GNNSCHED + [
        "node-agent", "--gpus", "fake:2x16Gi", "--node-name", "node-a", "--gate-socket", str(tmp_path / "gate.sock"),
        "--pods-file", str(pods), "--status-file", str(tmp_path / "status.json"), "--mps", "external",
        "--state-dir", str(state), "--mps-pipe-dir", str(pipe), "--peer-check", "off", "--jobs-uid", str(os.getuid()),
        "--metrics-port", str(port), "--metrics-addr", "127.0.0.1", "--status-interval", "0.3",
        "--recovery-grace", "0", "--log-level", "warning",
    ]
    daemon_cmd = GNNSCHED + [
        "mps-daemon", "--gpus", "fake:2x16Gi", "--mps-pipe-dir", str(pipe), "--mps-log-dir", str(tmp_path / "log"),
        "--state-dir", str(state), "--jobs-uid", str(os.getuid()), "--probe-interval", "0.2",
    ]
    procs: list[subprocess.Popen] = []
    try:
        agent = subprocess.Popen(agent_cmd, env=env, stderr=subprocess.DEVNULL)
        procs.append(agent)
        _wait(lambda: _readyz(port)[0] == 503, "agent never answered /readyz")
        assert "MPS is down" in _readyz(port)[1]  # no mps-daemon yet
        daemon = subprocess.Popen(daemon_cmd, env=env, stderr=subprocess.DEVNULL)
        procs.append(daemon)
        _wait(lambda: _readyz(port)[0] == 200, "agent never became ready with the MPS daemon up", 60)
        mps_pid = int((pipe / "fake-mps.pid").read_text())
        _wait(lambda: json.loads((tmp_path / "status.json").read_text())["status"]["mps"].get("computeMode"),
              "status never showed the daemon's compute mode")
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=20) == 0
        os.kill(mps_pid, 0)  # the control daemon outlives the agent: running jobs keep their MPS server
        agent2 = subprocess.Popen(agent_cmd, env=env, stderr=subprocess.DEVNULL)
        procs.append(agent2)
        _wait(lambda: _readyz(port)[0] == 200, "restarted agent never became ready")
        assert int((pipe / "fake-mps.pid").read_text()) == mps_pid  # adopted, not restarted
        status = json.loads((tmp_path / "status.json").read_text())["status"]
        assert status["mps"]["healthy"] and status["mps"]["restarts"] == 0
        # The daemon stopped for good (--disable): the agent stops being ready.
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=20) == 0
        cp = subprocess.run(daemon_cmd + ["--disable"], env=env, capture_output=True, text=True, timeout=60)
        assert cp.returncode == 0, cp.stderr
        _wait(lambda: _readyz(port)[0] == 503, "agent stayed ready with MPS disabled", 30)
        assert "disabled" in _readyz(port)[1]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        kill_fake_mps(pipe)


MEMINFO = "MemTotal:       131072000 kB\nMemFree:        1000 kB\n"


def test_mount_shm_remounts_a_fresh_tmpfs(tmp_path, monkeypatch) -> None:
    from gnnsched.node_agent.mps import MPSError
    from gnnsched.node_agent.mps_daemon import mount_shm, shm_size_from_meminfo

    assert shm_size_from_meminfo(MEMINFO) == "65536000k" and shm_size_from_meminfo("") == "65536k"
    monkeypatch.setenv("PATH", f"{FAKES}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_MOUNT_LOG", str(tmp_path / "mount.log"))
    shm = tmp_path / "mps-shm"
    stale = f"41 25 0:24 / {shm} rw - tmpfs shm rw\n"
    assert mount_shm(shm, "1024k", mountinfo=stale)[0] == ["umount", str(shm)]
    assert shm.is_dir()
    assert (tmp_path / "mount.log").read_text().splitlines() == [
        f"umount {shm}", f"mount -t tmpfs -o rw,nosuid,nodev,noexec,relatime,size=1024k {MPS_SHM_SOURCE} {shm}"]
    assert len(mount_shm(shm, "1024k", mountinfo="")) == 1  # nothing stale: mount only
    monkeypatch.setenv("FAKE_MOUNT_FAIL", "1")
    with pytest.raises(MPSError, match=r"mount -t tmpfs .*: exit 32: mount: .*permission denied"):
        mount_shm(shm, "1024k", mountinfo="")


def test_cli_mount_shm(tmp_path) -> None:
    env = dict(os.environ, PATH=f"{FAKES}{os.pathsep}{os.environ['PATH']}", FAKE_MOUNT_LOG=str(tmp_path / "m.log"))
    shm = tmp_path / "shm"
    cp = subprocess.run(GNNSCHED + ["mps-daemon", "--mount-shm", "--mps-shm-dir", str(shm), "--shm-size", "1Gi"],
                        env=env, capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    assert (tmp_path / "m.log").read_text().strip().endswith(f"size=1048576k {MPS_SHM_SOURCE} {shm}")
    env["FAKE_MOUNT_FAIL"] = "1"
    cp = subprocess.run(GNNSCHED + ["mps-daemon", "--mount-shm", "--mps-shm-dir", str(shm)], env=env,
                        capture_output=True, text=True, timeout=60)
    assert cp.returncode == 1 and cp.stderr.startswith("error: --mount-shm: mount -t tmpfs")
    assert len(cp.stderr.strip().splitlines()) == 1
