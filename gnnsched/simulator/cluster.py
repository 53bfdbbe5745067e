"""Cluster shapes the simulator runs on: built-in names, the extender's ``N[xG][xMODEL]`` syntax, or a YAML file.

A cluster is only capacity: nodes with a number of GPUs of one catalogue model, CPU millicores and host memory. The
simulator's state (what runs where) lives in :mod:`gnnsched.simulator.engine`; this module never mutates anything.

Default host capacity for ``N[xG][xMODEL]`` nodes is 12 cores and 64 GiB per GPU: the ratio of the resource-demand
paper's cluster (seed ``004_*``: 32 GPUs, 384 cores, 2 TB), so CPU is as scarce as it was there.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from gnnsched.errors import FieldError
from gnnsched.gpu.catalogue import GiB, get_gpu_model

CORES_PER_GPU = 12
MEMORY_PER_GPU = 64 * GiB
#: The CoGNN and GNNSched papers' testbed host (seed 002 Table III, seed 000 Table 3): two Xeon E5-2680 v4, 28 cores,
#: 378 GB DDR4, beside one V100 (or the A100 of CoGNN's section V-E). Pods request CPU and memory here, so the host's
#: size bounds how many are bound (and so queued at the gate or co-located) at once.
TESTBED_CPU_MILLI = 28_000
TESTBED_MEMORY_BYTES = 378 * 10**9
DEFAULT_MODEL = "V100-32GB"


class ClusterError(FieldError):
    """A cluster description is wrong; ``field`` names what is wrong (for the CLI's one-line error)."""


@dataclass(frozen=True)
class NodeSpec:
    """One node's capacity."""

    name: str
    gpus: int
    gpu_model: str
    cpu_milli: int
    memory_bytes: int


@dataclass(frozen=True)
class ClusterSpec:
    """A named list of nodes."""

    name: str
    nodes: tuple[NodeSpec, ...]

    @property
    def gpu_count(self) -> int:
        return sum(n.gpus for n in self.nodes)

    def describe(self) -> str:
        models = sorted({n.gpu_model for n in self.nodes if n.gpus})
        return (
            f"{self.name}: {len(self.nodes)} nodes, {self.gpu_count} GPUs ({', '.join(models) or 'none'}), "
            f"{sum(n.cpu_milli for n in self.nodes) // 1000} cores, "
            f"{sum(n.memory_bytes for n in self.nodes) / 2**40:.2f} TiB"
        )


_SHAPE = re.compile(r"^(\d+)(?:x(\d+))?(?:x(.+))?$", re.IGNORECASE)


def uniform_cluster(nodes: int, gpus: int, model: str, name: str | None = None,
                    cpu_milli: int | None = None, memory_bytes: int | None = None) -> ClusterSpec:
    """``nodes`` identical nodes of ``gpus`` GPUs of ``model`` (canonical catalogue name)."""
    canonical = get_gpu_model(model).name
    cpu = cpu_milli if cpu_milli is not None else CORES_PER_GPU * 1000 * max(gpus, 1)
    mem = memory_bytes if memory_bytes is not None else MEMORY_PER_GPU * max(gpus, 1)
    width = len(str(nodes - 1))
    specs = tuple(NodeSpec(f"node-{i:0{width}d}", gpus, canonical, cpu, mem) for i in range(nodes))
    return ClusterSpec(name or f"{nodes}x{gpus}x{canonical}", specs)


def openb_cluster(data_dir: Path) -> ClusterSpec:
    """The openb trace's 1,213 GPU nodes (``openb_node_list_gpu_node.csv``), models mapped through the catalogue."""
    path = data_dir / "traces" / "openb_node_list_gpu_node.csv"
    if not path.exists():
        raise ClusterError("cluster", f"openb node list not found at {path}")
    nodes = []
    with path.open() as fh:
        for row in csv.DictReader(fh):
            model = get_gpu_model(row["model"]).name
            nodes.append(NodeSpec(row["sn"], int(row["gpu"]), model, int(row["cpu_milli"]),
                                  int(row["memory_mib"]) * 2**20))
    return ClusterSpec("openb", tuple(nodes))


BUILTIN_CLUSTERS = {
    "v100": "one V100-32GB, 28 cores, 378 GB: the CoGNN and GNNSched papers' testbed (seeds 002, 000)",
    "a100": "one A100-40GB on the same host: CoGNN's generality experiment (seed 002, section V-E)",
    "pai32": "4 nodes x 8 V100-32GB, 96 cores, 512 GiB each = 32 GPUs / 384 cores / 2 TiB (seed 004)",
    "small": "4 nodes x 2 V100-32GB (default demo cluster)",
    "openb": "the openb trace's 1,213 GPU nodes (needs ../shared/data)",
}


def parse_cluster(text: str, data_dir: Path | None = None) -> ClusterSpec:
    """Resolve ``--cluster``: a built-in name, ``N[xG][xMODEL]`` (``4x1xV100-32GB``), or a YAML file.

    YAML: ``{name: str, nodes: [{count: int, gpus: int, model: str, cpu: cores, memoryGi: number}]}``.
    """
    key = text.strip()
    low = key.lower()
    if low == "v100":
        return uniform_cluster(1, 1, "V100-32GB", name="v100", cpu_milli=TESTBED_CPU_MILLI,
                               memory_bytes=TESTBED_MEMORY_BYTES)
    if low == "a100":
        return uniform_cluster(1, 1, "A100-40GB", name="a100", cpu_milli=TESTBED_CPU_MILLI,
                               memory_bytes=TESTBED_MEMORY_BYTES)
    if low == "pai32":
        return uniform_cluster(4, 8, "V100-32GB", name="pai32", cpu_milli=96_000, memory_bytes=512 * GiB)
    if low == "small":
        return uniform_cluster(4, 2, "V100-32GB", name="small")
    if low == "openb":
        if data_dir is None:
            raise ClusterError("cluster", "the openb cluster needs the shared data directory")
        return openb_cluster(data_dir)
    path = Path(key)
    if path.suffix in {".yaml", ".yml"} or path.exists():
        return _load_cluster_file(path)
    match = _SHAPE.match(key)
    if not match:
        raise ClusterError("cluster", f"{text!r} is neither a built-in name ({', '.join(BUILTIN_CLUSTERS)}), "
                                      "N[xG][xMODEL] nor a YAML file")
    nodes = int(match.group(1))
    gpus = int(match.group(2)) if match.group(2) else 1
    model = match.group(3) or DEFAULT_MODEL
    if nodes < 1:
        raise ClusterError("cluster", "the node count must be at least 1")
    if gpus < 1:
        raise ClusterError("cluster", "the GPU count per node must be at least 1")
    try:
        return uniform_cluster(nodes, gpus, model)
    except KeyError as exc:
        raise ClusterError("cluster", str(exc.args[0])) from None


def _load_cluster_file(path: Path) -> ClusterSpec:
    if not path.exists():
        raise ClusterError("cluster", f"file {path} does not exist")
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ClusterError("cluster", f"{path} is not valid YAML: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list) or not doc["nodes"]:
        raise ClusterError("cluster.nodes", f"{path} must be a mapping with a non-empty 'nodes' list")
    nodes: list[NodeSpec] = []
    for i, group in enumerate(doc["nodes"]):
        where = f"cluster.nodes[{i}]"
        if not isinstance(group, dict):
            raise ClusterError(where, "must be a mapping")
        try:
            count = int(group.get("count", 1))
            gpus = int(group.get("gpus", 1))
            model = get_gpu_model(str(group.get("model", DEFAULT_MODEL))).name
            cpu = int(float(group.get("cpu", CORES_PER_GPU * max(gpus, 1))) * 1000)
            mem = int(float(group.get("memoryGi", MEMORY_PER_GPU / GiB * max(gpus, 1))) * GiB)
        except KeyError as exc:
            raise ClusterError(f"{where}.model", str(exc.args[0])) from None
        except (TypeError, ValueError) as exc:
            raise ClusterError(where, f"bad number: {exc}") from None
        if count < 1 or gpus < 0 or cpu <= 0 or mem <= 0:
            raise ClusterError(where, "count must be >= 1, gpus >= 0, cpu and memoryGi > 0")
        for _ in range(count):
            nodes.append(NodeSpec(f"node-{len(nodes):04d}", gpus, model, cpu, mem))
    return ClusterSpec(str(doc.get("name", path.stem)), tuple(nodes))
