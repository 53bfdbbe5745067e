"""Job pods on a real cluster: Pod Security ``restricted``, one UID, RuntimeClass, tolerations and nodeSelector.

Every pod the operator can write (each example manifest, a user's own image and command, every attempt, with and
without a PriorityClass, under each kind of operator setting) is checked against the ``restricted`` profile's
controls (``tests/pod_security.py``, written from the Pod Security Standards page) and against the Kubernetes
schema of the oldest and newest supported versions. The checker itself is shown to catch each control it implements.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from operator_harness import (
    a100,
    emulated_cluster,
    manifest,
    running_operator,
    wait_for,
)
from pod_security import restricted_violations
from typer.testing import CliRunner

from gnnsched.cli import app
from gnnsched.contract import DEFAULT_JOBS_UID, JOB_CONTAINER_NAME
from gnnsched.operator.planning import Plan
from gnnsched.operator.podspec import JobPodSettings, build_pod, job_pod_settings
from gnnsched.operator.status import view_pod
from gnnsched.spec import SpecError, Toleration, parse_spec

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
K8S_VERSIONS = ["1.30", kubernetes_validate.latest_version()]
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def _plan() -> Plan:
    return Plan(pmc_bytes=10, admit_bytes=20, predicted_runtime_seconds=1.5, runtime_source="analytic-prior",
                runtime_gpu_model="A100-40GB", intensity="memory", scaled_cpu="2", scaled_memory="3Gi")


def _job(spec: dict[str, Any], name: str = "j") -> dict[str, Any]:
    return {"apiVersion": "gnnsched.io/v1alpha1", "kind": "GNNJob",
            "metadata": {"name": name, "namespace": "ns", "uid": "u-1"}, "spec": spec}


SETTINGS = {
    "default": JobPodSettings(),
    "no-runtime-class": JobPodSettings(runtime_class_name=""),
    "uid-1000-no-tolerations": JobPodSettings(run_as_user=1000, tolerations=[]),
    "node-pool": JobPodSettings(node_selector={"cloud.google.com/gke-accelerator": "nvidia-tesla-t4"},
                                tolerations=[Toleration(key="nvidia.com/gpu", operator="Equal", value="present",
                                                        effect="NoSchedule"),
                                             Toleration(operator="Exists")]),
}


def _specs() -> list[tuple[str, dict[str, Any]]]:
    specs = [(path.name, yaml.safe_load(path.read_text())["spec"]) for path in EXAMPLES]
    base = specs[0][1]
    specs.append(("own-image-and-command", {**base, "image": "me/train:1", "command": ["python", "t.py"],
                                            "args": ["--x"]}))
    specs.append(("own-placement", {**base, "tolerations": [{"key": "dedicated", "operator": "Equal",
                                                              "value": "gnn", "effect": "NoExecute",
                                                              "tolerationSeconds": 60}],
                                     "nodeSelector": {"gpu.example.com/model": "a100"}}))
    return specs


@pytest.mark.parametrize(("setting", "case"), list(itertools.product(SETTINGS, [n for n, _ in _specs()])))
def test_every_pod_the_operator_writes_passes_restricted_and_the_schema(setting: str, case: str) -> None:
    settings = SETTINGS[setting]
    spec_doc = dict(_specs())[case]
    spec = parse_spec(spec_doc)
    for attempt, priority in ((0, None), (3, "gnnsched-runtime-004")):
        pod = build_pod(
            _job(spec_doc),
            spec,
            _plan(),
            attempt,
            "ghcr.io/gnnsched/gnnsched:1",
            priority_class_name=priority,
            settings=settings,
        )
        assert restricted_violations(pod) == [], (setting, case, attempt)
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(pod, version, strict=True)
        psc = pod["spec"]["securityContext"]
        [container] = pod["spec"]["containers"]
        assert psc["runAsUser"] == container["securityContext"]["runAsUser"] == settings.run_as_user
        assert psc["runAsNonRoot"] is True and container["securityContext"]["runAsNonRoot"] is True
        assert container["name"] == JOB_CONTAINER_NAME
        assert pod["spec"]["automountServiceAccountToken"] is False
        assert pod["spec"].get("runtimeClassName") == (settings.runtime_class_name or None)
        own = [Toleration.model_validate(t).wire() for t in spec_doc.get("tolerations", [])]
        assert pod["spec"]["tolerations"] == [t.wire() for t in settings.tolerations] + own
        selector = {**settings.node_selector, **spec_doc.get("nodeSelector", {})}
        assert pod["spec"].get("nodeSelector") == (selector or None)


def test_defaults_are_uid_65532_the_nvidia_runtime_class_and_the_gpu_taint() -> None:
    spec_doc = yaml.safe_load(EXAMPLES[0].read_text())["spec"]
    pod = build_pod(_job(spec_doc), parse_spec(spec_doc), _plan(), 0, "img:1")
    assert pod["spec"]["securityContext"] == {"runAsNonRoot": True, "runAsUser": DEFAULT_JOBS_UID,
                                              "runAsGroup": DEFAULT_JOBS_UID,
                                              "seccompProfile": {"type": "RuntimeDefault"}}
    sc = pod["spec"]["containers"][0]["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["spec"]["runtimeClassName"] == "nvidia"
    assert pod["spec"]["tolerations"] == [GPU_TOLERATION]
    assert "nodeSelector" not in pod["spec"]


def test_a_job_repeating_the_operators_toleration_gets_it_once_and_cannot_contradict_its_selector() -> None:
    base = yaml.safe_load(EXAMPLES[0].read_text())["spec"]
    spec = parse_spec({**base, "tolerations": [GPU_TOLERATION]})
    settings = JobPodSettings(node_selector={"pool": "gpu"})
    pod = build_pod(_job(base), spec, _plan(), 0, "img:1", settings=settings)
    assert pod["spec"]["tolerations"] == [GPU_TOLERATION]
    same = parse_spec({**base, "nodeSelector": {"pool": "gpu", "zone": "a"}})
    assert settings.node_selector_for(same) == {"pool": "gpu", "zone": "a"}
    with pytest.raises(SpecError, match=r"^spec\.nodeSelector\.pool: is 'cpu', but the operator requires pool='gpu'"):
        settings.node_selector_for(parse_spec({**base, "nodeSelector": {"pool": "cpu"}}))


GOOD = build_pod(_job(yaml.safe_load(EXAMPLES[0].read_text())["spec"]),
                 parse_spec(yaml.safe_load(EXAMPLES[0].read_text())["spec"]), _plan(), 0, "img:1")


def _mutate(path: str, value: Any) -> dict[str, Any]:
    pod = copy.deepcopy(GOOD)
    *parents, leaf = path.split(".")
    node: Any = pod
    for part in parents:
        node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
    if value is None:
        node.pop(leaf, None)
    else:
        node[leaf] = value
    return pod


@pytest.mark.parametrize(("path", "value", "control"), [
    ("spec.hostPID", True, "Host Namespaces"),
    ("spec.hostNetwork", True, "Host Namespaces"),
    ("spec.containers.0.securityContext.privileged", True, "Privileged Containers"),
    ("spec.containers.0.securityContext.capabilities", {"drop": ["ALL"], "add": ["SYS_ADMIN"]}, "Capabilities"),
    ("spec.containers.0.securityContext.capabilities", {"drop": ["NET_RAW"]}, "Capabilities"),
    ("spec.volumes", [{"name": "h", "hostPath": {"path": "/var/run"}}], "HostPath Volumes"),
    ("spec.volumes", [{"name": "n", "nfs": {"server": "s", "path": "/"}}], "Volume Types"),
    ("spec.containers.0.ports", [{"containerPort": 80, "hostPort": 80}], "Host Ports"),
    ("spec.containers.0.securityContext.allowPrivilegeEscalation", None, "Privilege Escalation"),
    ("spec.containers.0.securityContext.runAsNonRoot", False, "Running as Non-root"),
    ("spec.securityContext.runAsUser", 0, "Running as Non-root user"),
    ("spec.securityContext.seccompProfile", {"type": "Unconfined"}, "Seccomp"),
    ("spec.containers.0.securityContext.seccompProfile", {"type": "Unconfined"}, "Seccomp"),
    ("spec.containers.0.securityContext.procMount", "Unmasked", "/proc Mount Type"),
    ("spec.securityContext.seLinuxOptions", {"type": "spc_t"}, "SELinux"),
    ("spec.securityContext.sysctls", [{"name": "kernel.msgmax", "value": "1"}], "Sysctls"),
    ("spec.securityContext.windowsOptions", {"hostProcess": True}, "HostProcess"),
    ("spec.securityContext.appArmorProfile", {"type": "Unconfined"}, "AppArmor"),
])
def test_the_checker_catches_each_control_it_implements(path: str, value: Any, control: str) -> None:
    assert restricted_violations(GOOD) == []
    violations = restricted_violations(_mutate(path, value))
    assert any(v.startswith(f"{control}:") for v in violations), violations


def test_pod_level_non_root_and_seccomp_cover_containers_that_leave_them_unset() -> None:
    pod = copy.deepcopy(GOOD)
    for key in ("runAsNonRoot", "seccompProfile"):
        pod["spec"]["containers"][0]["securityContext"].pop(key)
    assert restricted_violations(pod) == []
    pod["spec"]["securityContext"].pop("runAsNonRoot")
    assert [v.split(":")[0] for v in restricted_violations(pod)] == ["Running as Non-root"]


def test_container_status_is_read_by_name_when_a_sidecar_comes_first() -> None:
    pod = {"metadata": {"name": "j-0"}, "spec": {"nodeName": "n1"}, "status": {"phase": "Failed", "containerStatuses": [
        {"name": "istio-proxy", "state": {"terminated": {"reason": "Completed", "exitCode": 0}}},
        {"name": JOB_CONTAINER_NAME, "state": {"terminated": {"reason": "OOMKilled", "exitCode": 137,
                                                              "message": '{"observed_peak_bytes": 7}'}}},
    ]}}
    view = view_pod(pod)
    assert (view.failure_reason, view.exit_code, view.observed_peak_bytes) == ("OOMKilled", 137, 7)
    only_sidecar = copy.deepcopy(pod)
    only_sidecar["status"]["containerStatuses"] = only_sidecar["status"]["containerStatuses"][:1]
    assert view_pod(only_sidecar).exit_code is None  # the sidecar's exit is never taken for the job's


@pytest.mark.parametrize(("args", "message"), [
    (["--run-as-user", "0"], "Invalid value for '--run-as-user'"),
    (["--runtime-class-name", "Not_A_Name"], "error: --runtime-class-name: 'Not_A_Name' is not a RuntimeClass"),
    (["--tolerations", "{"], "error: --tolerations: not JSON"),
    (["--tolerations", '{"key": "a"}'], "error: --tolerations: must be a JSON list"),
    (["--tolerations", '[{"key": "a", "operator": "Exists", "value": "b"}]'],
     "error: --tolerations[0]: value: must be empty when operator is Exists"),
    (["--node-selector", '{"a": "b c"}'], "error: --node-selector: a: 'b c' is not a valid label value"),
])
def test_bad_operator_pod_flags_are_one_line_errors(args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["operator", *args, "--kubeconfig", "/nonexistent"])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


def test_flags_and_their_environment_variables_build_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = job_pod_settings(1234, "", '[{"key": "x", "operator": "Exists"}]', '{"pool": "gpu"}')
    assert settings.run_as_user == 1234 and settings.runtime_class_name == ""
    assert [t.wire() for t in settings.tolerations] == [{"key": "x", "operator": "Exists"}]
    assert settings.node_selector == {"pool": "gpu"}
    assert job_pod_settings(tolerations_json="[]").tolerations == []
    assert job_pod_settings(tolerations_json=None).tolerations == JobPodSettings().tolerations


def test_spec_tolerations_and_node_selector_follow_the_api_servers_rules() -> None:
    base = yaml.safe_load(EXAMPLES[0].read_text())["spec"]
    for extra, message in (
        ({"tolerations": [{"operator": "Equal", "value": "x"}]}, "spec.tolerations[0].operator: must be Exists"),
        ({"tolerations": [{"key": "k", "effect": "NoSchedule", "tolerationSeconds": 3}]},
         "spec.tolerations[0].tolerationSeconds: applies only to effect NoExecute"),
        ({"tolerations": [{"key": "bad key"}]}, "spec.tolerations[0].key"),
        ({"nodeSelector": {"k": "two words"}}, "spec.nodeSelector"),
    ):
        with pytest.raises(SpecError) as err:
            parse_spec({**base, **extra})
        assert str(err.value).startswith(message), str(err.value)


def test_operator_creates_a_restricted_pod_with_merged_placement(tmp_path: Path) -> None:
    """The real operator against the emulated API server, with settings as the chart passes them."""
    settings = JobPodSettings(run_as_user=2000, runtime_class_name="nvidia", node_selector={"pool": "gpu"})

    async def scenario() -> dict[str, Any]:
        async with emulated_cluster(tmp_path) as cluster:
            await cluster.add_gpunode("n1", [a100(0)])
            async with running_operator(cluster, pods=settings):
                await cluster.create_job(manifest("placed", tolerations=[{"key": "dedicated", "operator": "Exists"}],
                                                  nodeSelector={"zone": "a"}))
                pods = await wait_for(cluster.pods, timeout=120, what="the job's pod")
                return pods[0]

    pod = asyncio.run(scenario())
    assert restricted_violations(pod) == []
    assert pod["spec"]["securityContext"]["runAsUser"] == 2000
    assert pod["spec"]["runtimeClassName"] == "nvidia"
    assert pod["spec"]["nodeSelector"] == {"pool": "gpu", "zone": "a"}
    assert pod["spec"]["tolerations"] == [GPU_TOLERATION, {"key": "dedicated", "operator": "Exists"}]
