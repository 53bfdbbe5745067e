"""What gnnsched puts into every GPU pod from its own image: the gate client, and the step runner of an entrypoint job.

Why: the GPU pod runs in ``spec.image`` when a job names one, and a user's image holds torch and PyG, not gnnsched.
So gnnsched's part comes from gnnsched's image (the operator's ``--image``), as the probe pod's does
(``operator/probe.py``): an init container copies ``gnnsched/portable`` (standard library and torch only) into an
``emptyDir`` shared with the job's container, which runs it read-only with the image's own ``python``:

* **the gate client** (``gnnsched_portable/gate_launch.py``) for every job: the gate is never looked up on the user's
  ``PATH``, where an image could put a ``gnnsched`` that never asks the node agent;
* **the step runner** (``gnnsched_portable/run_launch.py``) behind the gate for an entrypoint job
  (``gnnsched.entrypoint_probe.runs_portable``), with its request (``run_request``) on the command line;
* a job's own ``spec.command`` behind the gate;
* the built-in worker (``gnnsched worker``) behind the gate otherwise: built-in models run in gnnsched's own image
  (no ``spec.image``), where the worker is gnnsched's; a built-in model in a user's image still needs gnnsched
  installed there (``docs/custom-models.md``).

The copy is gnnsched's, not the user's: the volume is written by gnnsched's image and mounted read-only in the job's
container, so a ``gnnsched`` on the image's ``PATH`` (a stub that never asks) is never run. What it cannot stop: the
copy runs under the image's own ``python``, and an image whose ``python`` ignores its script skips the gate as any
process of a pod could; against that the gate is not the enforcement (the node agent's per-client memory check and
the admission policies are, docs/security.md).
"""

from __future__ import annotations

import json
from typing import Any

from gnnsched.entrypoint_probe import PORTABLE_NAME, run_request, runs_portable
from gnnsched.spec import GNNJobSpec

INSTALL_CONTAINER = "install-gnnsched"
TOOLS_DIR = "/gnnsched-tools"
TOOLS_VOLUME = "gnnsched-tools"
TOOLS_SCRATCH = "64Mi"  # the emptyDir's sizeLimit: the copy is well under 1 MiB
GATE_LAUNCHER = f"{TOOLS_DIR}/{PORTABLE_NAME}/gate_launch.py"
RUN_LAUNCHER = f"{TOOLS_DIR}/{PORTABLE_NAME}/run_launch.py"
INSTALL_RESOURCES = {"cpu": "100m", "memory": "128Mi"}


def uses_prestart(spec: GNNJobSpec, prestart: bool) -> bool:
    """The start-up-first gate (``--prestart``) is for the built-in worker only: a user's command may not know the
    hand-off, and the portable runner does not read it."""
    return prestart and not spec.command and not runs_portable(spec)


def gpu_pod_command(spec: GNNJobSpec, job_file: str, worker_device: str = "cuda", prestart: bool = False) -> list[str]:
    """The job container's command: the copied gate, then the workload (see the module's docstring)."""
    gate = ["python", GATE_LAUNCHER]
    if spec.command:
        return [*gate, "--", *spec.command, *(spec.args or [])]
    if runs_portable(spec):
        request = json.dumps(run_request(spec), sort_keys=True, separators=(",", ":"))
        return [*gate, "--", "python", RUN_LAUNCHER, "--request", request, "--device", worker_device,
                *(spec.args or [])]
    workload = ["gnnsched", "worker", job_file, "--device", worker_device, "--no-progress", *(spec.args or [])]
    return [*gate, *(["--prestart"] if uses_prestart(spec, prestart) else []), "--", *workload]


def add_gpu_pod_tools(pod_spec: dict[str, Any], container: dict[str, Any], gnnsched_image: str,
                      security: dict[str, Any]) -> None:
    """Add the init container that installs the tools, their volume, and its read-only mount in ``container``."""
    mount = {"name": TOOLS_VOLUME, "mountPath": TOOLS_DIR}
    pod_spec.setdefault("initContainers", []).append({
        "name": INSTALL_CONTAINER,
        "image": gnnsched_image,
        "command": ["python", "-m", "gnnsched.entrypoint_probe", "--install", TOOLS_DIR],
        "resources": {"requests": dict(INSTALL_RESOURCES), "limits": dict(INSTALL_RESOURCES)},
        "securityContext": dict(security),
        "volumeMounts": [dict(mount)],
    })
    pod_spec.setdefault("volumes", []).append({"name": TOOLS_VOLUME, "emptyDir": {"sizeLimit": TOOLS_SCRATCH}})
    container.setdefault("volumeMounts", []).append({**mount, "readOnly": True})
