#!/usr/bin/env python3
"""The whole gnnsched system on one machine: GNNJob YAML to ``Succeeded`` through every real component.

    python tests/e2e/local_cluster.py JOB.yaml... [--nodes N] [--gpus fake:GxSIZE] [--policy P] [--json OUT]
                                      [--timeout S] [--keep DIR] [--inject-xid NODE:GPU:XID@SECONDS ...]
    python tests/e2e/local_cluster.py --serve [JOB.yaml...] [--nodes N] [--gpus fake:GxSIZE] ...

Each of these runs as its own process: the emulated API server (``tests/e2e/apiserver.py``: the project's
``kube_emulator`` with Nodes, pod binding and graceful pod deletion) loaded with the CRDs from ``crds/`` and N Node
objects; ``gnnsched operator``; ``gnnsched extender`` reading the cluster through its kubeconfig; and per node one
``gnnsched node-agent`` and one ``gnnsched device-plugin`` on fake GPUs, each node with its own plugin, socket and
pipe directories. In this process run the two stand-ins for what is not ours: a kube-scheduler that drives the
extender from the ``KubeSchedulerConfiguration`` that ``gnnsched extender --print-scheduler-config`` prints
(``scheduler_standin.py``) and one kubelet per node that talks to its device plugin over real gRPC and runs the
pods' commands (the gate and the worker or step runner, copied in by gnnsched's init container) as local processes
(``kubelet_standin.py``); a user's image (``--image``, the examples') runs a Python with torch and PyG and no gnnsched
(``bare_image.py``).

Output: ``export KUBECONFIG=<path>`` as the first line on stdout once the cluster is up (kubectl works against it:
``docs/local-cluster.md``), a live timeline on stderr, then a table like ``kubectl get gj -o wide``; ``--json OUT``
writes per job ``name, phase, node, gpu, admit_bytes, observed_peak_bytes, attempts, seconds`` plus
``max_committed_fraction`` (over every GPU and instant, committed bytes / capacity, replayed from the agents' gate
event logs) and ``violations`` (instants where committed exceeded capacity). Exit 0 only when every job reached
``Succeeded``; 1 otherwise; 2 on bad input (one line). ``--serve`` keeps the cluster up after the jobs (none
needed) until Ctrl-C or SIGTERM, then exits 0. Every process, socket and temporary file is gone afterwards, on
success, failure or Ctrl-C.

``--inject-xid NODE:GPU:XID@SECONDS`` (repeatable) makes a fake GPU fail at the hardware boundary: the node's fake
GPUs get a fault directory, and SECONDS after the jobs are submitted the Xid is written there
(``gnnsched.gpu.fake_faults``). The agent sees it as the driver's Xid event; every worker on that GPU fails as a CUDA
client does after that Xid. A hardware Xid (79, 48, ...) leaves the GPU unhealthy and its jobs requeued uncharged; an
application Xid (13, 31, ...) is charged to a lone client's job (docs/faults.md).

Used as a library by ``tests/e2e/`` (``LocalCluster``).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import logging
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE.parent))  # tests/: child_process
sys.path.insert(0, str(HERE))

import yaml  # noqa: E402
from child_process import die_with_parent  # noqa: E402
from identities import cluster_identities, write_kubeconfig, write_token_file  # noqa: E402
from kubeapi import ALL_JOBS, ALL_PODS, GPUNODES, JOBS, NAMESPACES, NODES, Api, ApiError  # noqa: E402

from gnnsched.contract import (  # noqa: E402
    ANN_ADMIT_BYTES,
    ANN_GPU,
    ANN_GROUP,
    ENV_NODE_NAME,
    GPU_SHARE_RESOURCE,
)
from gnnsched.gpu.backend import BackendSpecError, parse_fake_spec  # noqa: E402
from gnnsched.quantity import parse_bytes  # noqa: E402

log = logging.getLogger("e2e")
MAX_UNIX_SOCKET = 107
TERMINAL = ("Succeeded", "Failed")


class InputError(Exception):
    """Bad input to the harness; the message names the field."""


PORT_RANGE = (20000, 32000)
"""Where the cluster's ports are drawn: below Linux's ephemeral range (32768-60999), which every other process that
binds port 0 or connects anywhere draws from. A port handed to a component is closed until the component binds it,
and a free ephemeral port was taken in that gap on the shared machine (the operator exited: Address already in use)."""


def _free_port() -> int:
    for _ in range(200):
        port = random.randrange(*PORT_RANGE)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # the range is crowded: any free port
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gnnsched_command() -> list[str]:
    """The ``gnnsched`` of this Python environment (the installed console script, else ``python -m``)."""
    script = Path(sys.executable).parent / "gnnsched"
    return [str(script)] if script.exists() else [sys.executable, "-m", "gnnsched.cli"]


class Proc:
    """One component process in its own process group, logging to a file; restartable."""

    def __init__(self, name: str, argv: list[str], log_path: Path, env: dict[str, str]) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self.env = env
        self.popen: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        with self.log_path.open("ab") as out:
            self.popen = subprocess.Popen(self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True,
                                          preexec_fn=die_with_parent)
        self.starts += 1

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else None

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self, sig: int = signal.SIGTERM, grace: float = 10.0) -> int | None:
        """Signal the whole group, wait ``grace``, then SIGKILL it; the exit status, or None if never started."""
        if self.popen is None:
            return None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=grace)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=10)
        return self.popen.returncode

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@dataclass
class NodeSetup:
    name: str
    dir: Path
    plugin_dir: Path
    gate_socket: Path
    mps_pipe_dir: Path
    mps_log_dir: Path
    mps_shm_dir: Path
    state_dir: Path
    event_log: Path
    metrics_port: int
    fault_dir: Path | None = None  # the fake GPUs' fault files (--fake-gpu-faults), when the cluster has them
    usage_dir: Path | None = None  # the fake GPUs' per-process usage (--fake-gpu-usage), when the cluster has it
    agent: Proc | None = None
    plugin: Proc | None = None
    kubelet: Any = None


@dataclass
class ClusterOptions:
    nodes: int = 2
    gpus: str = "fake:2x16Gi"
    policy: str = "base"
    timeout: float = 600.0
    keep: Path | None = None
    node_cpu: str = "32"
    node_memory: str = "128Gi"
    slots_per_gpu: int = 8
    reserve: str = "1Gi"
    poll: float = 0.2
    quiet: bool = False
    fake_gpu_memory: str | None = None  # the agents' --fake-gpu-memory (enforce[:FACTOR]): workers enforce MPS limits
    fake_gpu_faults: bool = False  # the agents' --fake-gpu-faults: inject_fault() makes a fake GPU fail
    fake_gpu_usage: bool = False  # the agents' --fake-gpu-usage (needs fake_gpu_memory): NVML's per-process view
    # the agents' --fake-gpu-constants (context=742Mi,cublas=32Mi,cublaslt=1Mi[,delay=S][,cc=9.0]): the fake GPUs'
    # stand-in measurement in GPUNode status (gpus[].measured); None: the catalogue's for a catalogued model
    fake_gpu_constants: str | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    # image -> directories of what it adds (its own packages); the kubelet stand-ins put them on PYTHONPATH
    images: dict[str, list[str]] = field(default_factory=lambda: example_images())
    # the chart's ValidatingAdmissionPolicies, installed and enforced by the API server; every component acts as its
    # own identity (identities.py, docs/security.md)
    admission_policies: bool = True
    # images whose Python has torch and PyG but no gnnsched (bare_image.py): users' images, the examples' included
    bare_images: frozenset[str] = field(default_factory=lambda: frozenset(example_images()))

    def validate(self) -> tuple[int, int, str]:
        if not 1 <= self.nodes <= 64:
            raise InputError(f"--nodes: must be 1..64, got {self.nodes}")
        if self.timeout <= 0:
            raise InputError(f"--timeout: must be positive seconds, got {self.timeout}")
        if self.policy not in ("base", "lmcf", "bmc", "sqtf", "bqt"):
            raise InputError(f"--policy: {self.policy!r} is not one of base|lmcf|bmc|sqtf|bqt")
        if not self.gpus.startswith("fake:"):
            raise InputError(f"--gpus: the local cluster runs on fake GPUs, expected fake:GxSIZE, got {self.gpus!r}")
        try:
            count, size, model = parse_fake_spec(self.gpus)
        except BackendSpecError as exc:
            raise InputError(str(exc)) from None
        if size <= parse_bytes(self.reserve):
            raise InputError(f"--gpus: {self.gpus} leaves no usable memory: each node reserves {self.reserve} of "
                             f"every GPU, so a GPU needs more than {self.reserve}")
        return count, size, model


@dataclass(frozen=True)
class XidInjection:
    """``--inject-xid NODE:GPU:XID@SECONDS``: Xid ``xid`` on GPU ``gpu`` (index) of ``node``, ``at`` seconds after the
    jobs were submitted (after the cluster is up, with ``--serve`` and no job)."""

    node: str
    gpu: int
    xid: int
    at: float


def parse_xid_injection(text: str, nodes: int, gpus: int) -> XidInjection:
    """One ``--inject-xid`` value; :class:`InputError` naming the flag and what is wrong with it."""
    flag = f"--inject-xid {text!r}"
    where, _, when = text.partition("@")
    parts = where.split(":")
    if not when or len(parts) != 3:
        raise InputError(f"{flag}: expected NODE:GPU:XID@SECONDS, e.g. node-1:0:79@30")
    node, gpu, xid = parts
    names = [f"node-{i}" for i in range(1, nodes + 1)]
    if node not in names:
        raise InputError(f"{flag}: no node {node!r} (the nodes are node-1..node-{nodes})")
    if not gpu.isdigit() or int(gpu) >= gpus:
        raise InputError(f"{flag}: GPU must be an index 0..{gpus - 1}, got {gpu!r}")
    if not xid.isdigit() or int(xid) == 0:
        raise InputError(f"{flag}: XID must be a positive integer (NVIDIA's Xid number), got {xid!r}")
    try:
        at = float(when)
    except ValueError:
        at = -1.0
    if not 0 <= at < float("inf"):
        raise InputError(f"{flag}: SECONDS must be a number >= 0, got {when!r}")
    return XidInjection(node, int(gpu), int(xid), at)


def example_images() -> dict[str, list[str]]:
    """The images of ``examples/``' own packages: a directory with a Dockerfile and a ``gnnjob.yaml`` stands for the
    image that GNNJob names (built from that Dockerfile, which adds the directory's packages to a PyTorch image)."""
    images: dict[str, list[str]] = {}
    for job in sorted((REPO / "examples").glob("*/gnnjob.yaml")):
        if (job.parent / "Dockerfile").is_file():
            image = (yaml.safe_load(job.read_text()).get("spec") or {}).get("image")
            if isinstance(image, str):
                images.setdefault(image, []).append(str(job.parent))
    return images


def parse_image(text: str) -> tuple[str, str]:
    """``--image NAME=DIR``: the image NAME holds the Python packages under DIR."""
    name, sep, directory = text.partition("=")
    if not sep or not name or not directory:
        raise InputError(f"--image: expected NAME=DIR, got {text!r}")
    if not Path(directory).is_dir():
        raise InputError(f"--image {name}: {directory} is not a directory")
    return name, str(Path(directory).resolve())


DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def check_metadata(path: Path, doc: dict[str, Any]) -> dict[str, Any]:
    """A GNNJob document's ``apiVersion`` and ``metadata`` as the API server would accept them (its name a DNS
    subdomain, its namespace a DNS label, as ``kubectl apply`` is told); ``InputError`` naming the file and the field
    otherwise, so a bad manifest is one line before any process starts, never the API server's refusal mid-run."""
    from gnnsched.contract import API_VERSION
    from gnnsched.spec import DNS_SUBDOMAIN

    if doc.get("apiVersion") != API_VERSION:
        raise InputError(f"{path}: apiVersion: expected {API_VERSION}, got {doc.get('apiVersion')!r}")
    meta = doc.get("metadata")
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        raise InputError(f"{path}: metadata: expected a mapping, got {type(meta).__name__}")
    name = meta.get("name")
    if not name:
        raise InputError(f"{path}: metadata.name: required")
    if not isinstance(name, str) or len(name) > 253 or not re.match(DNS_SUBDOMAIN, name):
        raise InputError(f"{path}: metadata.name: {name!r} is not a lower-case DNS subdomain (a-z, 0-9, '-', '.'; "
                         "at most 253 characters)")
    namespace = meta.get("namespace")
    if namespace is not None and (not isinstance(namespace, str) or len(namespace) > 63
                                  or not DNS_LABEL.match(namespace)):
        raise InputError(f"{path}: metadata.namespace: {namespace!r} is not a lower-case DNS label (a-z, 0-9, '-'; "
                         "at most 63 characters)")
    if not isinstance(doc.get("spec") or {}, dict):
        raise InputError(f"{path}: spec: expected a mapping, got {type(doc.get('spec')).__name__}")
    return meta


def load_manifests(paths: list[Path]) -> list[dict[str, Any]]:
    """Every GNNJob document in ``paths``; ``InputError`` naming the file and the problem."""
    from gnnsched.spec import GNNJobSpec

    docs: list[dict[str, Any]] = []
    names: set[tuple[str, str]] = set()
    for path in paths:
        try:
            loaded = list(yaml.safe_load_all(path.read_text()))
        except OSError as exc:
            raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None
        except yaml.YAMLError as exc:
            raise InputError(f"{path}: not YAML ({str(exc).splitlines()[0]})") from None
        for doc in loaded:
            if doc is None:
                continue
            if not isinstance(doc, dict) or doc.get("kind") != "GNNJob":
                raise InputError(f"{path}: kind: expected GNNJob documents")
            meta = check_metadata(path, doc)
            try:
                GNNJobSpec.model_validate(doc.get("spec") or {})
            except Exception as exc:  # pydantic ValidationError: name the first field
                errors: list[dict[str, Any]] = getattr(exc, "errors", list)()
                where = ".".join(str(p) for p in errors[0]["loc"]) if errors else "spec"
                what = errors[0]["msg"] if errors else str(exc)
                raise InputError(f"{path}: spec{'.' + where if where else ''}: {what}") from None
            key = (meta.get("namespace") or "default", meta["name"])
            if key in names:
                raise InputError(f"{path}: metadata.name: {key[1]!r} appears twice")
            names.add(key)
            docs.append(doc)
    if not docs:
        raise InputError("JOB.yaml: no GNNJob given")
    return docs


def committed_series(event_logs: dict[str, Path], capacity: dict[str, dict[int, int]]) -> dict[str, Any]:
    """Replay the agents' gate event logs: committed bytes per GPU after every event.

    ``admitted``/``resumed`` add an entry's bytes to its GPU, ``released`` removes it, ``start`` (a new agent
    process) forgets what the previous one held until its keepers ``resume``. Returns ``max_committed_fraction``
    (committed / capacity, max over GPUs and events), ``violations`` (events after which a GPU's committed bytes
    exceeded its capacity) and ``samples`` (events replayed).
    """
    max_fraction = 0.0
    violations: list[dict[str, Any]] = []
    samples = 0
    for node, path in event_logs.items():
        running: dict[str, tuple[int, int]] = {}
        try:
            lines = path.read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            kind = ev.get("event")
            if kind == "start":
                running.clear()
            elif kind == "admitted":
                for key, b in zip(ev.get("keys") or [], ev.get("bytes") or [], strict=False):
                    running[key] = (int(ev["gpu"]), int(b))
            elif kind == "resumed":
                running[ev["key"]] = (int(ev["gpu"]), int(ev["bytes"]))
            elif kind == "released":
                running.pop(ev.get("key"), None)
            else:
                continue
            samples += 1
            per_gpu: dict[int, int] = {}
            for gpu, b in running.values():
                per_gpu[gpu] = per_gpu.get(gpu, 0) + b
            for gpu, used in per_gpu.items():
                cap = capacity.get(node, {}).get(gpu)
                if not cap:
                    continue
                max_fraction = max(max_fraction, used / cap)
                if used > cap:
                    violations.append({"node": node, "gpu": gpu, "t": ev.get("t"), "committed": used,
                                       "capacity": cap})
    return {"max_committed_fraction": round(max_fraction, 4), "violations": violations, "samples": samples}


def _jsonpath(obj: Any, path: str) -> Any:
    for part in path.strip(".").split("."):
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)
    return obj


def _age(stamp: str | None) -> str:
    if not stamp:
        return "<unknown>"
    import datetime

    t = datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.timezone.utc)
    secs = int((datetime.datetime.now(tz=datetime.timezone.utc) - t).total_seconds())
    return f"{secs}s" if secs < 120 else f"{secs // 60}m{secs % 60}s"


def _shown(meta: dict[str, Any]) -> str:
    """An object's name in the timeline: ``NAMESPACE/NAME`` outside ``default``."""
    ns = meta.get("namespace") or "default"
    return meta["name"] if ns == "default" else f"{ns}/{meta['name']}"


def _job_keys(job: dict[str, Any]) -> set[str]:
    """What names a job in ``LocalCluster.wait_jobs``: its name, and its namespace-qualified name."""
    meta = job["metadata"]
    return {meta["name"], f"{meta.get('namespace') or 'default'}/{meta['name']}"}


def gnnjob_table(jobs: list[dict[str, Any]]) -> str:
    """The table ``kubectl get gj -o wide`` prints: NAME plus the CRD's printer columns (Age as an age); NAMESPACE
    first, as ``kubectl get -A`` does, when the jobs are in more than one namespace."""
    crd = yaml.safe_load((REPO / "crds" / "gnnjob.yaml").read_text())
    version = next(v for v in crd["spec"]["versions"] if v.get("served"))
    columns = version.get("additionalPrinterColumns") or []
    spaces = {j["metadata"].get("namespace") or "default" for j in jobs}
    rows = [(["NAMESPACE"] if len(spaces) > 1 else []) + ["NAME", *[c["name"].upper() for c in columns]]]
    for job in sorted(jobs, key=lambda j: (j["metadata"].get("namespace") or "default", j["metadata"]["name"])):
        row = ([job["metadata"].get("namespace") or "default"] if len(spaces) > 1 else []) + [job["metadata"]["name"]]
        for c in columns:
            value = _jsonpath(job, c["jsonPath"])
            row.append(_age(value) if c.get("type") == "date" else ("<none>" if value is None else str(value)))
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("   ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows)


class LocalCluster:
    """Start, drive and stop the local cluster. Use as a context manager; ``stop()`` is idempotent."""

    def __init__(self, opts: ClusterOptions) -> None:
        self.opts = opts
        self.gpu_count, self.gpu_bytes, self.gpu_model = opts.validate()
        if opts.keep is not None:
            opts.keep.mkdir(parents=True, exist_ok=True)
            self.dir = Path(tempfile.mkdtemp(prefix="run-", dir=opts.keep))
        else:
            self.dir = Path(tempfile.mkdtemp(prefix="gnnsched-e2e-"))
        longest = self.dir / f"node-{opts.nodes}" / "device-plugins" / "gnnsched-gpu-share.sock"
        if len(str(longest)) > MAX_UNIX_SOCKET - 8:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise InputError(f"--keep: {opts.keep} is too long a path for the nodes' unix sockets")
        self.procs: list[Proc] = []
        self.nodes: list[NodeSetup] = []
        self.api: Api | None = None
        self.url = ""
        self.kubeconfig = self.dir / "kubeconfig"  # the admin's (kubectl, the harness)
        self.identities = cluster_identities([f"node-{i}" for i in range(1, opts.nodes + 1)])
        self.apiserver: Proc | None = None
        self.operator: Proc | None = None
        self.extender: Proc | None = None
        self.extender_port = 0
        self.extender_metrics_port = 0
        self.operator_metrics_port = 0
        self.operator_health_port = 0
        self.scheduler: Any = None
        self.scheduler_config: dict[str, Any] = {}
        self.t0 = time.monotonic()
        self.timeline: list[dict[str, Any]] = []
        self._seen: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._stopped = False
        self._bare_bin: Path | None = None
        atexit.register(self.stop)

    # -- environment -------------------------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        """What every process of ours gets (the control plane and, through the kubelet stand-ins, the containers):
        this Python's bin dir first on PATH, the kubeconfig. No thread setting: a job's worker sizes its own thread
        pool from its pod's CPU request (``GNNSCHED_CPU_REQUEST``), as it must on a real node."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
        env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}"
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["PYTHONUNBUFFERED"] = "1"
        env.update(self.opts.extra_env)
        return env

    def kubeconfig_of(self, identity: str) -> Path:
        """The kubeconfig of one identity (``identities.py``: admin, tenant, operator, scheduler, agent-<node>,
        kubelet-<node>)."""
        return self.dir / ("kubeconfig" if identity == "admin" else f"kubeconfig-{identity}")

    def api_as(self, identity: str) -> Api:
        """A REST client acting as ``identity``."""
        return Api(self.url, token=self.identities[identity].token)

    def bare_bin(self) -> Path | None:
        """The Python of the users' images (torch and PyG, no gnnsched), made once per cluster; None without such
        images."""
        if not self.opts.bare_images:
            return None
        if self._bare_bin is None:
            from bare_image import make_bare_python

            self.say("making the users' images' Python (torch and PyG, no gnnsched)")
            self._bare_bin = make_bare_python(self.dir / "image-python")
        return self._bare_bin

    def _proc(self, name: str, argv: list[str], log_name: str | None = None, node: str | None = None,
              identity: str | None = None) -> Proc:
        """Start a process; ``node``: it is one of that node's processes (``NODE_NAME``, as the chart sets it);
        ``identity``: whose kubeconfig it gets (default the admin's)."""
        env = self.env()
        if identity is not None:
            env["KUBECONFIG"] = str(self.kubeconfig_of(identity))
        # The daemons get one thread each, as their pods' small CPU requests would give them; the jobs need the cores.
        env.setdefault("OMP_NUM_THREADS", "1")
        if node is not None:
            env[ENV_NODE_NAME] = node
        proc = Proc(name, argv, self.dir / (log_name or f"{name}.log"), env)
        self.procs.append(proc)
        proc.start()
        return proc

    # -- start -------------------------------------------------------------------------------------------------
    def start(self) -> LocalCluster:
        self.say("starting the emulated API server")
        url_file = self.dir / "apiserver.url"
        tokens = write_token_file(self.dir / "tokens.json", self.identities)
        self.apiserver = self._proc("apiserver", [sys.executable, str(HERE / "apiserver.py"), "--url-file",
                                                  str(url_file), "--node-root", str(self.dir),
                                                  "--token-auth-file", str(tokens)])
        self._wait(lambda: url_file.exists(), 30, "the API server's URL", self.apiserver)
        self.url = url_file.read_text().strip()
        for identity in self.identities.values():
            write_kubeconfig(self.kubeconfig_of(identity.name), self.url, identity)
        self.api = self.api_as("admin")
        if self.opts.admission_policies:
            self._install_admission_policies()
        for i in range(1, self.opts.nodes + 1):
            self._add_node(f"node-{i}")
        self._start_extender()
        self._start_operator()
        for node in self.nodes:
            self._start_node(node)
        self._start_scheduler()
        self._wait(self._nodes_ready, 90, "GPUNode status and gpu-share capacity from every node")
        self._wait(self._extender_ready, 60, "the extender's /readyz", self.extender)
        self.say(f"cluster up: {self.opts.nodes} node(s) x {self.gpu_count} fake GPU(s) of "
                 f"{self.gpu_bytes / 2**30:.0f} GiB, policy {self.opts.policy}, in {self.dir}")
        return self

    def _install_admission_policies(self) -> None:
        """What ``helm install`` creates of the chart's ValidatingAdmissionPolicies and bindings (rendered by the
        Helm SDK, ``tests/chart_policies.py``); the API server enforces them from then on."""
        from chart_policies import admission_objects

        assert self.api is not None
        for obj in admission_objects():
            plural = {"ValidatingAdmissionPolicy": "validatingadmissionpolicies",
                      "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings"}[obj["kind"]]
            self.api.post(f"/apis/admissionregistration.k8s.io/v1/{plural}", obj)
        self.say("installed the chart's admission policies")

    def _add_node(self, name: str) -> None:
        assert self.api is not None
        d = self.dir / name
        node = NodeSetup(name=name, dir=d, plugin_dir=d / "device-plugins", gate_socket=d / "run" / "gate.sock",
                         mps_pipe_dir=d / "mps", mps_log_dir=d / "mps-log", mps_shm_dir=d / "mps-shm",
                         state_dir=d / "state", event_log=d / "gate-events.jsonl", metrics_port=_free_port(),
                         fault_dir=d / "gpu-faults" if self.opts.fake_gpu_faults else None,
                         usage_dir=d / "gpu-usage" if self.opts.fake_gpu_usage else None)
        for p in (node.plugin_dir, node.gate_socket.parent, node.mps_pipe_dir, node.mps_log_dir, node.mps_shm_dir,
                  node.state_dir, node.fault_dir, node.usage_dir):
            if p is not None:
                p.mkdir(parents=True, exist_ok=True)
        mib = self.gpu_bytes // 2**20
        labels = {
            "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
            # what NVIDIA GPU feature discovery labels a GPU node with
            "nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": str(self.gpu_count),
            "nvidia.com/gpu.product": self.gpu_model, "nvidia.com/gpu.memory": str(mib),
            "nvidia.com/mps.capable": "true",
        }
        capacity = {"cpu": self.opts.node_cpu, "memory": self.opts.node_memory, "pods": "110"}
        self.api.post(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
                              # the taint GPU node pools carry; job pods tolerate it (operator --tolerations)
                              "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present",
                                                   "effect": "NoSchedule"}]},
                              "status": {"capacity": dict(capacity), "allocatable": dict(capacity),
                                         "conditions": [{"type": "Ready", "status": "True"}],
                                         "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                                                       {"type": "Hostname", "address": name}]}})
        self.nodes.append(node)

    def _start_extender(self) -> None:
        self.extender_port = _free_port()
        self.extender_metrics_port = _free_port()
        cfg = subprocess.run([*gnnsched_command(), "extender", "--print-scheduler-config", "--url-prefix",
                              f"http://127.0.0.1:{self.extender_port}"], capture_output=True, text=True,
                             env=self.env(), check=True)
        self.scheduler_config = yaml.safe_load(cfg.stdout)
        (self.dir / "scheduler-config.yaml").write_text(cfg.stdout)
        self.extender = self._proc("extender", [*gnnsched_command(), "extender", "--host", "127.0.0.1", "--port",
                                                str(self.extender_port), "--metrics-host", "127.0.0.1",
                                                "--metrics-port", str(self.extender_metrics_port), "--kubeconfig",
                                                str(self.kubeconfig_of("scheduler"))], identity="scheduler")

    def _start_operator(self) -> None:
        self.operator_health_port = _free_port()
        self.operator_metrics_port = _free_port()
        self.operator = self._proc("operator", [*gnnsched_command(), "operator", "--all-namespaces", "--kubeconfig",
                                                str(self.kubeconfig_of("operator")), "--worker-device", "cpu",
                                                "--health-port", str(self.operator_health_port),
                                                "--metrics-port", str(self.operator_metrics_port),
                                                "--watch-timeout", "5", "--resync-seconds", "2",
                                                "--workers", "2"], identity="operator")

    def agent_argv(self, node: NodeSetup) -> list[str]:
        return [*gnnsched_command(), "node-agent", "--gpus", self.opts.gpus, "--node-name", node.name,
                "--gate-socket", str(node.gate_socket), "--metrics-port", str(node.metrics_port),
                "--metrics-addr", "127.0.0.1", "--policy", self.opts.policy, "--reserve-bytes", self.opts.reserve,
                # no MPS daemon without a GPU; no cgroups without a container runtime (see kubelet_standin.py)
                "--mps", "off", "--peer-check", "off",
                "--mps-pipe-dir", str(node.mps_pipe_dir), "--mps-log-dir", str(node.mps_log_dir),
                "--state-dir", str(node.state_dir),
                # the kubelet stand-in runs containers as this user, not the pod's runAsUser (kubelet_standin.py)
                "--jobs-uid", str(os.getuid()),
                "--event-log", str(node.event_log), "--recovery-grace", "1", "--status-interval", "1",
                *(["--fake-gpu-memory", self.opts.fake_gpu_memory] if self.opts.fake_gpu_memory else []),
                *(["--fake-gpu-faults", str(node.fault_dir)] if node.fault_dir is not None else []),
                *(["--fake-gpu-usage", str(node.usage_dir)] if node.usage_dir is not None else []),
                *(["--fake-gpu-constants", self.opts.fake_gpu_constants] if self.opts.fake_gpu_constants else [])]

    def inject_fault(self, node_name: str, gpu_uuid: str, xid: int = 31) -> None:
        """A fatal fault on a fake GPU, at the hardware boundary (``gnnsched.gpu.fake_faults``): the node's agent sees
        the Xid, every gated worker running on that GPU fails as an MPS client of a terminated server. The file is
        written whole, then renamed, so neither side reads it half-written."""
        node = next(n for n in self.nodes if n.name == node_name)
        if node.fault_dir is None:
            raise RuntimeError("inject_fault: start the cluster with fake_gpu_faults=True")
        tmp = node.fault_dir / f".{gpu_uuid}.tmp"
        tmp.write_text(f"{xid}\n")
        tmp.replace(node.fault_dir / gpu_uuid)
        self.say(f"fault    Xid {xid} on {node_name} GPU {gpu_uuid}")

    def gpu_uuid(self, node_name: str, index: int) -> str:
        """The UUID of GPU ``index`` of ``node_name``, as its agent published it in the node's GPUNode status."""
        assert self.api is not None
        for g in self.api.items(GPUNODES):
            if g["metadata"]["name"] == node_name:
                for gpu in (g.get("status") or {}).get("gpus") or []:
                    if int(gpu["index"]) == index:
                        return str(gpu["uuid"])
        raise RuntimeError(f"{node_name} has published no GPU {index}")

    def injector(self, injections: list[XidInjection]) -> Callable[[LocalCluster], None]:
        """A ``wait_jobs`` tick that makes each Xid of ``injections`` happen once its time (from now) has come."""
        start = time.monotonic()
        due = sorted(injections, key=lambda i: i.at)

        def tick(c: LocalCluster) -> None:
            while due and time.monotonic() - start >= due[0].at:
                i = due.pop(0)
                c.inject_fault(i.node, c.gpu_uuid(i.node, i.gpu), i.xid)
        return tick

    def _start_node(self, node: NodeSetup) -> None:
        from kubelet_standin import KubeletStandIn

        assert self.api is not None
        node.kubelet = KubeletStandIn(self.api_as(f"kubelet-{node.name}"), node.name, node.dir, node.plugin_dir,
                                      self.env(), self._on_event, poll=self.opts.poll, images=self.opts.images,
                                      bare_images=self.opts.bare_images, bare_bin=self.bare_bin())
        node.kubelet.start()
        node.agent = self._proc(f"agent-{node.name}", self.agent_argv(node), node=node.name,
                                identity=f"agent-{node.name}")
        node.plugin = self._proc(f"device-plugin-{node.name}", [
            *gnnsched_command(), "device-plugin", "--plugin-dir", str(node.plugin_dir), "--gpus", self.opts.gpus,
            "--slots-per-gpu", str(self.opts.slots_per_gpu), "--mps-pipe-dir", str(node.mps_pipe_dir),
            "--gate-socket", str(node.gate_socket), "--mps-shm-dir", str(node.mps_shm_dir),
            "--state-dir", str(node.state_dir), "--poll-interval", "0.5"], node=node.name,
            identity=f"agent-{node.name}")

    def _start_scheduler(self) -> None:
        from scheduler_standin import SchedulerStandIn

        assert self.api is not None
        self.scheduler = SchedulerStandIn(self.api_as("scheduler"), self.scheduler_config, self._on_event,
                                          poll=self.opts.poll)
        self.scheduler.start()

    def _nodes_ready(self) -> bool:
        assert self.api is not None
        names = {n.name for n in self.nodes}
        reported = {g["metadata"]["name"] for g in self.api.items(GPUNODES) if (g.get("status") or {}).get("gpus")}
        share = {n["metadata"]["name"] for n in self.api.items(NODES)
                 if int(((n.get("status") or {}).get("allocatable") or {}).get(GPU_SHARE_RESOURCE, 0)) > 0}
        return names <= reported and names <= share

    def _extender_ready(self) -> bool:
        import requests

        try:
            return requests.get(f"http://127.0.0.1:{self.extender_metrics_port}/readyz", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def _wait(self, predicate: Callable[[], bool], timeout: float, what: str, proc: Proc | None = None) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(ApiError):
                if predicate():
                    return
            for p in [proc] if proc is not None else self.procs:
                if p.popen is not None and not p.alive():
                    raise RuntimeError(f"{p.name} exited ({p.popen.returncode}) while waiting for {what}:\n"
                                       f"{p.log_tail()}")
            time.sleep(0.2)
        raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")

    # -- restarts (tests) ------------------------------------------------------------------------------------------
    def restart(self, proc: Proc, sig: int = signal.SIGKILL, pause: float = 0.5) -> None:
        """Kill a component (SIGKILL by default: no clean shutdown) and start it again."""
        self.say(f"killing {proc.name} (signal {sig}) and restarting it")
        proc.stop(sig=sig, grace=10)
        time.sleep(pause)
        proc.start()

    # -- jobs ------------------------------------------------------------------------------------------------------
    def submit(self, manifests: list[dict[str, Any]]) -> None:
        """Create the GNNJobs, first each namespace that does not exist yet (as an admin would with ``kubectl create
        namespace``: the API server refuses objects in a missing namespace). An object the API server refuses is a
        ``RuntimeError`` saying which and why (one line)."""
        assert self.api is not None
        for doc in manifests:
            ns = (doc.get("metadata") or {}).get("namespace") or "default"
            try:
                self.ensure_namespace(ns)
                self.api.post(JOBS.format(ns=ns), doc)
            except ApiError as exc:
                raise RuntimeError(f"gnnjob {ns}/{doc['metadata']['name']}: the API server refused it: {exc}"
                                   ) from None
            self.say(f"created  gnnjob {ns}/{doc['metadata']['name']}")

    def ensure_namespace(self, namespace: str) -> bool:
        """Create ``namespace`` when it does not exist, saying so in one line; True when it was created."""
        assert self.api is not None
        if self.api.get_or_none(f"{NAMESPACES}/{namespace}") is not None:
            return False
        try:
            self.api.post(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        except ApiError as exc:
            if exc.status != 409:  # created meanwhile: as good
                raise
            return False
        self.say(f"created  namespace {namespace} (it did not exist: as kubectl create namespace {namespace})")
        return True

    def jobs(self) -> list[dict[str, Any]]:
        assert self.api is not None
        return self.api.items(ALL_JOBS)

    def pods(self) -> list[dict[str, Any]]:
        assert self.api is not None
        return self.api.items(ALL_PODS)

    def wait_jobs(self, names: set[str] | None = None, timeout: float | None = None,
                  tick: Callable[[LocalCluster], None] | None = None) -> list[dict[str, Any]]:
        """Follow the jobs (timeline on stderr) until every one named is Succeeded or Failed, or ``timeout``. A name
        is ``NAMESPACE/NAME``, or a bare ``NAME`` for that name in any namespace."""
        deadline = time.monotonic() + (timeout if timeout is not None else self.opts.timeout)
        jobs: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            try:
                jobs = self.jobs()
                self.observe(jobs, self.pods())
            except ApiError as exc:
                log.debug("API unavailable: %s", exc)
                time.sleep(self.opts.poll)
                continue
            if tick is not None:
                tick(self)
            mine = [j for j in jobs if names is None or _job_keys(j) & names]
            if mine and all((j.get("status") or {}).get("phase") in TERMINAL for j in mine) and \
                    (names is None or names <= set().union(*map(_job_keys, mine))):
                return mine
            for proc in self.procs:
                if not proc.alive() and proc.name != "apiserver" and proc.starts and proc.popen is not None \
                        and proc.popen.returncode not in (None, -9, -15):
                    raise RuntimeError(f"{proc.name} exited with {proc.popen.returncode}:\n{proc.log_tail()}")
            time.sleep(self.opts.poll)
        self.say("timed out waiting for the jobs")
        return [j for j in jobs if names is None or _job_keys(j) & names]

    # -- timeline ----------------------------------------------------------------------------------------------
    def say(self, text: str) -> None:
        line = f"[{time.monotonic() - self.t0:7.2f}s] {text}"
        with self._lock:
            self.timeline.append({"t": round(time.monotonic() - self.t0, 3), "text": text})
        if not self.opts.quiet:
            print(line, file=sys.stderr, flush=True)

    def _on_event(self, kind: str, pod: dict[str, Any], detail: str) -> None:
        name = _shown(pod["metadata"])
        if kind == "unschedulable":
            key = f"unsched:{pod['metadata']['uid']}:{detail}"
            with self._lock:
                if key in self._seen:
                    return
                self._seen[key] = {}
            self.say(f"unschedulable pod {name}: {detail}")
        elif kind in ("failed", "killing"):
            self.say(f"{kind:8s} pod {name} on {pod['spec'].get('nodeName')}: {detail}")

    def observe(self, jobs: list[dict[str, Any]], pods: list[dict[str, Any]]) -> None:
        """Print each job's and pod's transitions once: bound, admitted (GPU, group, bytes), running, finished."""
        for pod in pods:
            meta = pod["metadata"]
            ann = meta.get("annotations") or {}
            state = self._seen.setdefault(meta["uid"], {})
            node = (pod.get("spec") or {}).get("nodeName")
            name = _shown(meta)
            if node and "bound" not in state:
                state["bound"] = node
                self.say(f"bound    pod {name} -> {node}")
            if ann.get(ANN_GPU) and state.get("admitted") != (ann.get(ANN_GPU), ann.get(ANN_GROUP)):
                state["admitted"] = (ann.get(ANN_GPU), ann.get(ANN_GROUP))
                admit = int(ann.get(ANN_ADMIT_BYTES) or 0)
                self.say(f"admitted pod {name} on {node} GPU {ann.get(ANN_GPU)} group {ann.get(ANN_GROUP)} "
                         f"({admit / 2**20:.0f} MiB)")
            cs = ((pod.get("status") or {}).get("containerStatuses") or [{}])[0].get("state") or {}
            if "running" in cs and "running" not in state:
                state["running"] = True
                self.say(f"running  pod {name}")
            phase = (pod.get("status") or {}).get("phase")
            if phase in TERMINAL and "finished" not in state:
                state["finished"] = phase
                term = cs.get("terminated") or {}
                self.say(f"finished pod {name}: {phase} (exit {term.get('exitCode')})")
        for job in jobs:
            key = f"job:{job['metadata']['uid']}"
            phase = (job.get("status") or {}).get("phase")
            state = self._seen.setdefault(key, {})
            if phase and state.get("phase") != phase:
                state["phase"] = phase
                st = job.get("status") or {}
                extra = ""
                if phase in TERMINAL:
                    extra = (f" node {st.get('node')} gpu {st.get('gpu')} observed peak "
                             f"{(st.get('observedPeakBytes') or 0) / 2**20:.1f} MiB")
                    if phase == "Failed":
                        extra += f": {st.get('message', '')}"
                self.say(f"gnnjob   {_shown(job['metadata'])}: {phase}{extra}")

    # -- results -------------------------------------------------------------------------------------------------
    def capacity(self) -> dict[str, dict[int, int]]:
        """Per node and GPU index: total - reserve, as the agents publish it."""
        assert self.api is not None
        out: dict[str, dict[int, int]] = {}
        for g in self.api.items(GPUNODES):
            out[g["metadata"]["name"]] = {int(gpu["index"]): int(gpu["totalBytes"]) - int(gpu.get("reserveBytes", 0))
                                          for gpu in (g.get("status") or {}).get("gpus") or []}
        return out

    def report(self, jobs: list[dict[str, Any]]) -> dict[str, Any]:
        rows = []
        for job in sorted(jobs, key=lambda j: j["metadata"]["name"]):
            st = job.get("status") or {}
            rows.append({"name": job["metadata"]["name"], "namespace": job["metadata"].get("namespace") or "default",
                         "phase": st.get("phase"), "node": st.get("node"),
                         "gpu": st.get("gpu"), "admit_bytes": st.get("admitBytes"),
                         "observed_peak_bytes": st.get("observedPeakBytes"), "attempts": st.get("attempts"),
                         "seconds": st.get("observedRuntimeSeconds"),
                         # spec.checkpoint: the step the last attempt resumed from (None: the job does not checkpoint)
                         "resumed_from_step": st.get("resumedFromStep")})
        loads = committed_series({n.name: n.event_log for n in self.nodes}, self.capacity())
        return {"jobs": rows, "max_committed_fraction": loads["max_committed_fraction"],
                "violations": loads["violations"], "gate_events": loads["samples"]}

    # -- stop --------------------------------------------------------------------------------------------------
    def pids(self) -> list[int]:
        """Every process this cluster started that is still alive (components and pods' process groups)."""
        groups = [p.pid for p in self.procs if p.pid is not None]
        for n in self.nodes:
            if n.kubelet is not None:
                groups.extend(n.kubelet.all_pids())
        alive = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                pgid = os.getpgid(int(pid))
            except OSError:
                continue
            if pgid in groups:
                alive.append(int(pid))
        return alive

    def sockets(self) -> list[Path]:
        return sorted(p for p in self.dir.rglob("*") if p.is_socket()) if self.dir.exists() else []

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self.scheduler is not None:
            self.scheduler.stop()
        for node in self.nodes:
            if node.kubelet is not None:
                node.kubelet.stop()
        for proc in reversed(self.procs):
            proc.stop(grace=10)
        for sock in self.sockets():
            sock.unlink(missing_ok=True)
        if self.opts.keep is None:
            shutil.rmtree(self.dir, ignore_errors=True)
        atexit.unregister(self.stop)

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _Terminated(KeyboardInterrupt):
    """SIGTERM/SIGHUP: ends the run like Ctrl-C, exit status 128 + the signal's number, as a shell reports it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """SIGTERM/SIGHUP end the run like Ctrl-C does: through ``KeyboardInterrupt`` and the cleanup below."""
    def handler(signum: int, frame: object) -> None:
        raise _Terminated(signum)

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    # Ctrl-C raises KeyboardInterrupt even where the shell started us with SIGINT ignored (a background job).
    old[signal.SIGINT] = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


class _ServeEnded(Exception):
    """``--serve`` was ended by Ctrl-C or SIGTERM: its normal end (exit 0 after the cleanup)."""


def serve_forever(cluster: LocalCluster, tick: Callable[[LocalCluster], None]) -> None:
    """Keep the cluster up for kubectl until Ctrl-C/SIGTERM/SIGHUP, still injecting the Xids that are due (``tick``);
    then raise :class:`_ServeEnded`."""
    print("serving: use kubectl with the KUBECONFIG above; Ctrl-C stops every process", file=sys.stderr)
    try:
        while True:
            tick(cluster)
            time.sleep(0.5)
    except KeyboardInterrupt:
        raise _ServeEnded() from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="local_cluster.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("jobs", nargs="*", type=Path, metavar="JOB.yaml", help="GNNJob manifests")
    parser.add_argument("--serve", action="store_true",
                        help="stay up after the jobs (if any) until Ctrl-C, for kubectl (docs/local-cluster.md)")
    parser.add_argument("--nodes", type=int, default=2, help="GPU nodes (default 2)")
    parser.add_argument("--gpus", default="fake:2x16Gi",
                        help="GPUs per node: fake:GxSIZE[xMODEL] (default fake:2x16Gi)")
    parser.add_argument("--policy", default="base", help="the agents' grouping policy: base|lmcf|bmc|sqtf|bqt")
    parser.add_argument("--json", type=Path, dest="json_out", metavar="OUT", help="write the results as JSON")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for every job (default 900)")
    parser.add_argument("--keep", type=Path, metavar="DIR", help="keep logs, event logs and pod files under DIR")
    parser.add_argument("--slots-per-gpu", type=int, default=8, help="gnnsched.io/gpu-share slots per GPU")
    parser.add_argument("--inject-xid", action="append", default=[], metavar="NODE:GPU:XID@SECONDS",
                        help="make GPU index GPU of NODE report Xid XID, SECONDS after the jobs are submitted, through "
                             "the fake GPUs' fault files (docs/faults.md); repeatable")
    parser.add_argument("--verbose", action="store_true", help="log the stand-ins' debug messages")
    parser.add_argument("--no-admission-policies", action="store_true",
                        help="do not install the chart's ValidatingAdmissionPolicies (docs/security.md)")
    parser.add_argument("--image", action="append", default=[], metavar="NAME=DIR",
                        help="containers of image NAME find the Python packages under DIR, with torch and PyG and "
                        "no gnnsched (no container runtime here: a Python made for users' images runs them); "
                        "examples/custom-entrypoint's image is preset")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        manifests = load_manifests(args.jobs) if args.jobs or not args.serve else []
        if args.json_out is not None and not args.json_out.parent.is_dir():
            raise InputError(f"--json: directory {args.json_out.parent} does not exist")
        if not 1 <= args.slots_per_gpu <= 48:
            raise InputError(f"--slots-per-gpu: must be 1..48, got {args.slots_per_gpu}")
        images = example_images()
        for name, directory in map(parse_image, args.image):
            images.setdefault(name, []).append(directory)
        opts = ClusterOptions(nodes=args.nodes, gpus=args.gpus, policy=args.policy, timeout=args.timeout,
                              keep=args.keep, slots_per_gpu=args.slots_per_gpu, images=images,
                              bare_images=frozenset(images), fake_gpu_faults=bool(args.inject_xid),
                              admission_policies=not args.no_admission_policies)
        gpus, _, _ = opts.validate()
        injections = [parse_xid_injection(text, args.nodes, gpus) for text in args.inject_xid]
        cluster = LocalCluster(opts)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    code = 1
    with _signals_raise():
        try:
            cluster.start()
            print(f"export KUBECONFIG={cluster.kubeconfig}", flush=True)
            inject = cluster.injector(injections)
            if args.serve and not manifests:
                serve_forever(cluster, inject)
            cluster.submit(manifests)
            names = {f"{m['metadata'].get('namespace') or 'default'}/{m['metadata']['name']}" for m in manifests}
            jobs = cluster.wait_jobs(names, tick=inject)
            result = cluster.report(jobs)
            print(gnnjob_table(jobs), flush=True)
            print(f"max committed fraction {result['max_committed_fraction']:.3f}, "
                  f"violations {len(result['violations'])}", file=sys.stderr)
            if args.json_out is not None:
                args.json_out.write_text(json.dumps(result, indent=2) + "\n")
            ok = len(jobs) == len(names) and all(j["phase"] == "Succeeded" for j in result["jobs"])
            code = 0 if ok and not result["violations"] else 1
            if args.serve:
                serve_forever(cluster, inject)
        except KeyboardInterrupt as exc:
            print("interrupted: stopping the cluster", file=sys.stderr)
            code = 128 + exc.signum if isinstance(exc, _Terminated) else 130
        except _ServeEnded:
            print("stopping the cluster", file=sys.stderr)
            code = 0
        except (RuntimeError, TimeoutError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            code = 1
        finally:
            cluster.stop()
    return code


if __name__ == "__main__":
    sys.exit(main())
