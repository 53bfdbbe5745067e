"""The Helm chart, rendered by the real Helm SDK (Helm v4 as a library) and checked against the Kubernetes schemas."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml

from gnnsched import contract
from gnnsched.policies import DEFAULT_BYPASS_LIMIT
from gnnsched.scheduler_config import DEFAULT_SCORING_STRATEGY, DEFAULT_WEIGHT, scheduler_config

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "gnnsched"
K8S_VERSIONS = ["1.30", kubernetes_validate.latest_version()]

VALUE_SETS: dict[str, dict[str, Any]] = {
    "default": {},
    "metrics-off": {"metrics": {"enabled": False}, "dashboard": {"enabled": False}},
    "servicemonitor-on": {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}}},
    "custom-names": {
        "fullnameOverride": "acme-gpu-share",
        "scheduler": {"name": "acme-gnn-scheduler", "extender": {"port": 9000, "weight": 3},
                      "nodeResourcesScoring": "MostAllocated"},
        "operator": {"watchNamespaces": ["ml-team-a", "ml-team-b"]},
    },
    "extra-node-selectors": {
        "node": {"extraNodeSelector": {"pool": "a100", "topology.kubernetes.io/zone": "zone-a"},
                 "agent": {"policy": "lmcf", "bypassLimit": 0}}
    },
    "components-off": {"operator": {"enabled": False}, "scheduler": {"enabled": False}},
}


@pytest.fixture(scope="module")
def chart():
    loaded = helm_python.Chart.load(str(CHART))
    yield loaded
    loaded.close()


def render(chart, values: dict) -> list[dict]:
    out = chart.render(values or None, name="gs", namespace="gnnsched", is_install=True)
    docs: list[dict] = []
    for filename, text in out.items():
        if filename.endswith(".yaml"):
            docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def containers(docs: list[dict]) -> dict[str, dict]:
    out = {}
    for d in docs:
        if d["kind"] in ("Deployment", "DaemonSet"):
            for c in d["spec"]["template"]["spec"]["containers"]:
                out[c["name"]] = c
    return out


def arg_value(container: dict, flag: str) -> str | None:
    for arg in container.get("args", []) + container.get("command", []):
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


@pytest.mark.parametrize("name", VALUE_SETS)
def test_every_rendered_manifest_validates_against_kubernetes_schemas(chart, name):
    docs = render(chart, VALUE_SETS[name])
    assert docs
    for doc in docs:
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            # Prometheus Operator CRD: not in the Kubernetes schemas; check the fields Prometheus relies on.
            assert doc["spec"]["selector"]["matchLabels"] and doc["spec"]["endpoints"][0]["port"] == "metrics"
            continue
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)


def test_crds_validate_and_match_the_repository_copies(chart):
    for item in chart.crds:
        source = ROOT / "crds" / Path(item["name"]).name
        assert item["data"] == source.read_text(), f"{item['name']} differs from {source}"
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(yaml.safe_load(item["data"]), version, strict=True)
    assert {Path(i["name"]).name for i in chart.crds} == {p.name for p in (ROOT / "crds").glob("*.yaml")}


@pytest.mark.parametrize("name", ["default", "servicemonitor-on", "custom-names"])
def test_helm_lint_is_clean(name):
    result = helm_python.lint(str(CHART), VALUE_SETS[name] or None, strict=True)
    assert result["errors"] == []
    serious = [m for m in result["messages"] if m["severity"] > 1]  # 1 is INFO ("icon is recommended")
    assert serious == []


def test_values_schema_rejects_bad_values(chart):
    chart.validate_schema(None)
    for bad in (
        {"node": {"agent": {"policy": "random"}}},
        {"node": {"agent": {"bypassLimit": -1}}},
        {"scheduler": {"extender": {"weight": 0}}},
        {"node": {"paths": {"gateSocket": "relative/path.sock"}}},
        {"operatr": {"enabled": True}},
    ):
        with pytest.raises(helm_python.HelmValuesError):
            chart.validate_schema(bad)


@pytest.mark.parametrize("name", VALUE_SETS)
def test_rbac_has_no_wildcards(chart, name):
    for doc in render(chart, VALUE_SETS[name]):
        if doc["kind"] in ("Role", "ClusterRole"):
            for rule in doc["rules"]:
                for key in ("verbs", "resources", "apiGroups", "resourceNames"):
                    assert "*" not in rule.get(key, []), (doc["metadata"]["name"], rule)


def _permissions(docs: list[dict], component: str) -> set[tuple[str, str, str]]:
    perms = set()
    for doc in docs:
        if (
            doc["kind"] in ("Role", "ClusterRole")
            and doc["metadata"]["labels"]["app.kubernetes.io/component"] == component
        ):
            for rule in doc["rules"]:
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        for verb in rule["verbs"]:
                            perms.add((group, resource, verb))
    return perms


def test_each_component_gets_only_what_it_uses(chart):
    docs = render(chart, {})
    operator, scheduler, node = (_permissions(docs, c) for c in ("operator", "scheduler", "node"))
    # the operator creates pods and writes GNNJob status, and never binds or touches GPUNodes
    assert ("", "pods", "create") in operator and ("gnnsched.io", "gnnjobs/status", "patch") in operator
    assert not {
        p
        for p in operator
        if p[1] in ("pods/binding", "bindings")
        or (p[1] == "gpunodes" and p[2] != "get" and p[2] not in ("list", "watch"))
    }
    # the scheduler + extender bind and read GPUNodes, never write them or create pods
    assert ("", "pods/binding", "create") in scheduler and ("gnnsched.io", "gpunodes", "watch") in scheduler
    assert not {p for p in scheduler if p[0] == "gnnsched.io" and p[2] not in ("get", "list", "watch")}
    assert ("", "pods", "create") not in scheduler
    # the node agent writes GPUNodes and reads GNNJobs; it never creates or deletes pods, nor binds
    assert ("gnnsched.io", "gpunodes/status", "patch") in node and ("gnnsched.io", "gnnjobs", "get") in node
    assert not {p for p in node if p[1] in ("pods", "pods/binding") and p[2] in ("create", "delete")}
    assert not {p for p in node if p[1] == "gnnjobs" and p[2] != "get"}
    # only the scheduler's leader-election Role touches leases, and only its own by name for updates
    lease_rules = [
        r
        for d in docs
        if d["kind"] == "Role"
        for r in d["rules"]
        if "leases" in r["resources"] and "update" in r["verbs"]
    ]
    assert lease_rules and all(r.get("resourceNames") == ["gnnsched-scheduler"] for r in lease_rules)


@pytest.mark.parametrize("name", ["default", "custom-names"])
def test_scheduler_config_points_to_the_sidecar_and_manages_gpu_share(chart, name):
    docs = render(chart, VALUE_SETS[name])
    config_maps = [d for d in by_kind(docs, "ConfigMap") if "scheduler-config.yaml" in d.get("data", {})]
    assert len(config_maps) == 1
    config = yaml.safe_load(config_maps[0]["data"]["scheduler-config.yaml"])
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1" and config["kind"] == "KubeSchedulerConfiguration"
    scheduler_name = VALUE_SETS[name].get("scheduler", {}).get("name", contract.SCHEDULER_NAME)
    assert [p["schedulerName"] for p in config["profiles"]] == [scheduler_name]
    assert config["leaderElection"]["leaderElect"] is True
    assert config["leaderElection"]["resourceName"] == scheduler_name
    (extender,) = config["extenders"]
    sidecar = containers(docs)["extender"]
    port = arg_value(sidecar, "--port")
    assert extender["urlPrefix"] == f"http://127.0.0.1:{port}" and arg_value(sidecar, "--host") == "127.0.0.1"
    assert (extender["filterVerb"], extender["prioritizeVerb"], extender["bindVerb"]) == (
        "filter",
        "prioritize",
        "bind",
    )
    assert extender["nodeCacheCapable"] is True
    assert {"name": contract.GPU_SHARE_RESOURCE, "ignoredByScheduler": True} in extender["managedResources"]
    # the chart's configuration is the Python package's (its source of truth) with the same settings
    values = VALUE_SETS[name].get("scheduler", {})
    assert config == scheduler_config(
        extender["urlPrefix"], weight=values.get("extender", {}).get("weight", DEFAULT_WEIGHT),
        namespace="gnnsched", scheduler_name=scheduler_name,
        scoring_strategy=values.get("nodeResourcesScoring", DEFAULT_SCORING_STRATEGY))
    # the scheduler container reads the file the ConfigMap provides
    kube_scheduler = containers(docs)["kube-scheduler"]
    mount = next(m for m in kube_scheduler["volumeMounts"] if m["name"] == "config")
    assert arg_value(kube_scheduler, "--config") == f"{mount['mountPath']}/scheduler-config.yaml"


def test_daemonset_mounts_match_the_components_defaults(chart):
    docs = render(chart, {})
    (daemonset,) = by_kind(docs, "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    host_paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert host_paths["device-plugins"] == contract.DEFAULT_DEVICE_PLUGIN_DIR
    assert host_paths["mps-pipe"] == contract.DEFAULT_MPS_PIPE_DIR
    assert host_paths["mps-log"] == contract.DEFAULT_MPS_LOG_DIR
    assert host_paths["gate"] == str(Path(contract.DEFAULT_GATE_SOCKET).parent)
    by_name = {c["name"]: c for c in pod["containers"]}
    agent, plugin = by_name["agent"], by_name["device-plugin"]
    assert arg_value(agent, "--gate-socket") == contract.DEFAULT_GATE_SOCKET
    assert arg_value(agent, "--bypass-limit") == str(DEFAULT_BYPASS_LIMIT)  # the chart runs what the simulator measures
    assert arg_value(agent, "--mps-pipe-dir") == contract.DEFAULT_MPS_PIPE_DIR
    assert arg_value(plugin, "--plugin-dir") == contract.DEFAULT_DEVICE_PLUGIN_DIR
    assert arg_value(agent, "--metrics-port") == str(contract.DEFAULT_AGENT_METRICS_PORT)
    # paths a container opens itself are mounted at the same place as on the host (the device plugin's
    # --gate-socket and --mps-pipe-dir are host paths it hands to kubelet in Allocate, so only its plugin dir counts)
    for container, flags in (
        (agent, ("--gate-socket", "--mps-pipe-dir", "--mps-log-dir")),
        (plugin, ("--plugin-dir",)),
    ):
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        for flag in flags:
            value = arg_value(container, flag)
            assert value in mounts or str(Path(value).parent) in mounts, (container["name"], flag)
    assert pod["hostPID"] is True  # SO_PEERCRED pids are resolved in the host PID namespace


def test_extra_node_selectors_are_merged(chart):
    docs = render(chart, VALUE_SETS["extra-node-selectors"])
    (daemonset,) = by_kind(docs, "DaemonSet")
    selector = daemonset["spec"]["template"]["spec"]["nodeSelector"]
    assert selector == {"nvidia.com/gpu.present": "true", "pool": "a100", "topology.kubernetes.io/zone": "zone-a"}
    assert arg_value(containers(docs)["agent"], "--policy") == "lmcf"
    assert arg_value(containers(docs)["agent"], "--bypass-limit") == "0"


def test_security_contexts(chart):
    docs = render(chart, {})
    for name, container in containers(docs).items():
        security = container["securityContext"]
        assert security["allowPrivilegeEscalation"] is False and security["readOnlyRootFilesystem"] is True, name
        assert security["capabilities"]["drop"] == ["ALL"] and "add" not in security["capabilities"], name
        assert security.get("privileged", False) is False, name
        if name not in ("agent", "device-plugin"):  # the node DaemonSet needs root for host paths (see chart comment)
            assert security["runAsNonRoot"] is True, name


def test_metrics_off_renders_no_metrics_services(chart):
    docs = render(chart, VALUE_SETS["metrics-off"])
    assert not [d for d in by_kind(docs, "Service") if d["metadata"]["name"].endswith("-metrics")]
    assert arg_value(containers(docs)["operator"], "--metrics-port") == "0"
    operator = containers(render(chart, {}))["operator"]
    assert (
        arg_value(operator, "--metrics-port") == "9402"
        and {"name": "metrics", "containerPort": 9402} in operator["ports"]
    )
    assert not by_kind(docs, "ServiceMonitor") and not [
        d for d in by_kind(docs, "ConfigMap") if "gnnsched.json" in d["data"]
    ]
    docs = render(chart, VALUE_SETS["servicemonitor-on"])
    monitors = by_kind(docs, "ServiceMonitor")
    assert len(monitors) == 3 and all(m["metadata"]["labels"]["release"] == "prom" for m in monitors)
    services = {d["metadata"]["labels"]["app.kubernetes.io/component"] for d in by_kind(docs, "Service")}
    assert {m["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] for m in monitors} <= services


def test_custom_names_apply_everywhere(chart):
    docs = render(chart, VALUE_SETS["custom-names"])
    names = [d["metadata"]["name"] for d in docs]
    assert all(n.startswith("acme-gpu-share") for n in names), names
    operator = containers(docs)["operator"]
    assert [a for a in operator["args"] if a.startswith("--namespace=")] == [
        "--namespace=ml-team-a",
        "--namespace=ml-team-b",
    ]
    env = {e["name"]: e.get("value") for e in operator["env"]}
    assert env["GNNSCHED_SCHEDULER_NAME"] == "acme-gnn-scheduler"


def test_dashboard_is_labelled_for_the_grafana_sidecar_and_uses_real_metrics(chart):
    import json

    docs = render(chart, {})
    (dashboard,) = [d for d in by_kind(docs, "ConfigMap") if "gnnsched.json" in d["data"]]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    panels = json.loads(dashboard["data"]["gnnsched.json"])["panels"]
    exprs = " ".join(t["expr"] for p in panels for t in p["targets"])
    used = {re.sub(r"_(bucket|total|sum|count)$", "", m) for m in re.findall(r"gnnsched_[a-z_]+", exprs)}
    defined = set()
    for source in [p for c in ("node_agent", "extender", "operator") for p in (ROOT / c).rglob("*.py")]:
        defined |= set(re.findall(r'"(gnnsched_[a-z_]+)"', source.read_text()))
    assert used and used <= defined, f"dashboard queries metrics no component exports: {used - defined}"
    for needed in (
        "gnnsched_gpu_memory_committed_bytes",
        "gnnsched_gpu_memory_used_bytes",
        "gnnsched_gate_queue_length",
        "gnnsched_gate_admission_wait_seconds",
        "gnnsched_job_prediction_error_ratio",
        "gnnsched_mps_daemon_up",
        "gnnsched_operator_jobs",
        "gnnsched_operator_runtime_prediction_ratio",
    ):
        assert needed in used


def test_notes_tell_the_admin_how_to_verify_and_submit_a_job(chart):
    out = chart.render(None, name="gs", namespace="gnnsched", is_install=True)
    notes = next(text for filename, text in out.items() if filename.endswith("NOTES.txt"))
    assert "kubectl get gpunodes" in notes and "kind: GNNJob" in notes and "kubectl get gj" in notes
    job = yaml.safe_load(re.search(r"<<'YAML' \| kubectl apply -f -\n(.*?)\n\s+YAML", notes, re.S).group(1))
    from gnnsched.spec import parse_job

    assert parse_job(job).spec.model.arch == "gcn"
