"""Users' jobs as users run them, through the local cluster: their own image, with torch and PyG and no gnnsched.

One small cluster (1 node, 1 fake GPU) whose users' images run a Python that cannot import gnnsched and has no
``gnnsched`` command (``bare_image.py``):

* an entrypoint job (``examples/custom-entrypoint``, tiny) in namespace ``team-b``, which does not exist yet: the
  harness creates it in one line, the probe pod and the GPU pod run in the user's image, the GPU pod's gate and step
  runner copied in by gnnsched's init container; the job reaches ``Succeeded`` with an observed peak;
* a custom-command job (``tests/e2e/images/torch-script``: a script that exits non-zero if gnnsched is importable or on
  ``PATH``, or if no GPU was admitted) reaches ``Succeeded`` behind the copied gate;
* a malformed manifest is one line naming the file and the field, exit 2, before anything starts.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from jobs import tiny_entrypoint_example  # noqa: E402
from local_cluster import ClusterOptions, LocalCluster, example_images, gnnjob_table  # noqa: E402

from gnnsched.operator.gpu_pod_tools import GATE_LAUNCHER, INSTALL_CONTAINER, RUN_LAUNCHER  # noqa: E402

pytestmark = pytest.mark.slow
SCRIPT_IMAGE = "registry.example.com/team/torch-script:1"


def custom_command_job(name: str) -> dict:
    return {"apiVersion": "gnnsched.io/v1alpha1", "kind": "GNNJob", "metadata": {"name": name},
            "spec": {"mode": "train", "model": {"arch": "gcn", "layers": 2, "hidden": 16},
                     "graph": {"nodes": 300, "edges": 1200, "features": 8, "classes": 3}, "epochs": 3,
                     "image": SCRIPT_IMAGE, "command": ["python", "-m", "user_train"], "args": ["3"],
                     "resources": {"cpu": "1", "memory": "1Gi", "gpuMemory": "256Mi"}}}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    images = {**example_images(), SCRIPT_IMAGE: [str(HERE / "images" / "torch-script")]}
    opts = ClusterOptions(nodes=1, gpus="fake:1x2Gi", reserve="256Mi", timeout=420, images=images,
                          bare_images=frozenset(images), keep=tmp_path_factory.mktemp("ui"))
    with LocalCluster(opts) as c:
        c.start()
        yield c
    assert c.pids() == []


def test_entrypoint_and_custom_command_jobs_succeed_from_an_image_without_gnnsched(cluster: LocalCluster) -> None:
    mine = tiny_entrypoint_example()
    mine["metadata"]["namespace"] = "team-b"
    script = custom_command_job("script-job")
    cluster.submit([mine, script])
    jobs = cluster.wait_jobs({mine["metadata"]["name"], "script-job"})
    table = gnnjob_table(jobs)
    assert {j["metadata"]["name"]: j["status"]["phase"] for j in jobs} == {
        mine["metadata"]["name"]: "Succeeded", "script-job": "Succeeded"}, table
    assert any("created  namespace team-b" in e["text"] for e in cluster.timeline), cluster.timeline[:20]
    entry = next(j for j in jobs if j["metadata"]["name"] == mine["metadata"]["name"])
    assert entry["metadata"]["namespace"] == "team-b" and entry["status"]["observedPeakBytes"] > 0, entry["status"]
    gpu_pods = {p["metadata"]["name"]: p for p in cluster.pods()
                if (p["metadata"].get("labels") or {}).get("gnnsched.io/role") != "probe"}
    for pod in gpu_pods.values():
        spec = pod["spec"]
        assert [c["name"] for c in spec["initContainers"]] == [INSTALL_CONTAINER]
        assert spec["containers"][0]["command"][:2] == ["python", GATE_LAUNCHER]
        assert pod["status"]["phase"] == "Succeeded"
    entry_pod = next(p for n, p in gpu_pods.items() if n.startswith(mine["metadata"]["name"]))
    assert RUN_LAUNCHER in entry_pod["spec"]["containers"][0]["command"]
    # the runner's result line is the pod's termination message, as the worker's
    term = entry_pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert '"outcome":"succeeded"' in term["message"], term


def test_the_namespace_is_created_once(cluster: LocalCluster) -> None:
    assert cluster.ensure_namespace("team-b") is False  # exists since the first test
    assert cluster.ensure_namespace("team-c") is True
    assert sum("created  namespace team-c" in e["text"] for e in cluster.timeline) == 1


@pytest.mark.parametrize("doc,needle", [
    ({"apiVersion": "gnnsched.io/v1alpha1", "kind": "GNNJob", "metadata": "x"}, "metadata: expected a mapping"),
    ({"apiVersion": "gnnsched.io/v1alpha1", "kind": "GNNJob", "metadata": {"name": "Big_Job"}}, "metadata.name: "),
    ({"apiVersion": "gnnsched.io/v1alpha1", "kind": "GNNJob", "metadata": {"name": "a", "namespace": "Team B"}},
     "metadata.namespace: 'Team B' is not a lower-case DNS label"),
    ({"apiVersion": "v1", "kind": "GNNJob", "metadata": {"name": "a"}}, "apiVersion: expected gnnsched.io/v1alpha1"),
    ({"apiVersion": "gnnsched.io/v1alpha1", "kind": "GNNJob", "metadata": {"name": "a"}, "spec": [1]},
     "spec: expected a mapping"),
])
def test_a_malformed_manifest_is_one_line_naming_the_file_and_the_field(tmp_path: Path, doc: dict,
                                                                       needle: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    proc = subprocess.run([sys.executable, str(HERE / "local_cluster.py"), str(path)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: ") and needle in lines[0], proc.stderr
