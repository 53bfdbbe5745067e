"""The Helm chart, rendered by the real Helm SDK (Helm v4 as a library) and checked against the Kubernetes schemas."""

from __future__ import annotations

import json
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
#: The oldest version the chart supports, one in between, and the newest kubernetes-validate knows: each rendered
#: with that version as the cluster's (.Capabilities.KubeVersion) and checked against that version's schemas.
K8S_VERSIONS = ["1.30", "1.33", ".".join(kubernetes_validate.latest_version().split(".")[:2])]
assert tuple(int(x) for x in K8S_VERSIONS[-1].split(".")) >= (1, 37)

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
                 "agent": {"policy": "lmcf", "bypassLimit": 0, "spread": False}}
    },
    "components-off": {"operator": {"enabled": False}, "scheduler": {"enabled": False}},
    "retrain-off": {"predictor": {"retrain": {"enabled": False}}},
}


@pytest.fixture(scope="module")
def chart():
    loaded = helm_python.Chart.load(str(CHART))
    yield loaded
    loaded.close()


def render_files(chart, values: dict | None, kube_version: str | None = None) -> dict[str, str]:
    """Helm's render with the cluster's version passed in: the SDK's ``helm_render`` takes ``kube_version`` (the
    Python wrapper of helm-python-sdk 0.2 does not expose it yet, so the native call is made directly)."""
    if kube_version is None:
        return chart.render(values or None, name="gs", namespace="gnnsched", is_install=True)
    from helm_python import _native

    opts = {"name": "gs", "namespace": "gnnsched", "is_install": True, "kube_version": kube_version}
    return json.loads(_native.call_string("helm_render", chart._raw(), json.dumps(values) if values else None,
                                          json.dumps(opts)))


def render(chart, values: dict, kube_version: str | None = None) -> list[dict]:
    out = render_files(chart, values, kube_version)
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


def node_daemonset(docs: list[dict], component: str = "node") -> dict:
    (daemonset,) = [d for d in by_kind(docs, "DaemonSet") if d["metadata"]["labels"]["app.kubernetes.io/component"]
                    == component]
    return daemonset


def arg_value(container: dict, flag: str) -> str | None:
    for arg in container.get("args", []) + container.get("command", []):
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("name", VALUE_SETS)
def test_every_rendered_manifest_validates_against_kubernetes_schemas(chart, name, version):
    docs = render(chart, VALUE_SETS[name], kube_version=f"v{version}.2")
    assert docs
    for doc in docs:
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            # Prometheus Operator CRD: not in the Kubernetes schemas; check the fields Prometheus relies on.
            assert doc["spec"]["selector"]["matchLabels"] and doc["spec"]["endpoints"][0]["port"] == "metrics"
            continue
        kubernetes_validate.validate(doc, version, strict=True)
    (scheduler,) = [d for d in by_kind(docs, "Deployment") if d["metadata"]["name"].endswith("-scheduler")] or [None]
    if scheduler is not None and not VALUE_SETS[name].get("scheduler", {}).get("image", {}).get("tag"):
        image = scheduler["spec"]["template"]["spec"]["containers"][0]["image"]
        assert image == f"registry.k8s.io/kube-scheduler:v{version}.2"  # kube-scheduler at the API server's version


@pytest.mark.parametrize(("cluster", "tag"), [("v1.31.4-gke.100", "v1.31.4"), ("v1.30.14-eks-931bdca", "v1.30.14"),
                                              ("v1.33.1+k3s1", "v1.33.1"), ("v1.37.0", "v1.37.0")])
def test_scheduler_tag_is_the_cluster_version_without_vendor_suffix(chart, cluster, tag):
    docs = render(chart, {}, kube_version=cluster)
    assert containers(docs)["kube-scheduler"]["image"] == f"registry.k8s.io/kube-scheduler:{tag}"
    pinned = render(chart, {"scheduler": {"image": {"tag": "v1.31.9"}}}, kube_version=cluster)
    assert containers(pinned)["kube-scheduler"]["image"] == "registry.k8s.io/kube-scheduler:v1.31.9"


@pytest.mark.parametrize("cluster", ["v1.29.9", "v1.27.3-gke.100", "v1.21.0"])
def test_render_below_the_minimum_version_fails_naming_it(chart, cluster):
    with pytest.raises(helm_python.HelmRenderError, match=r"needs Kubernetes v1\.30\.0 or newer"):
        render_files(chart, {}, kube_version=cluster)
    assert yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"] == ">=1.30.0-0"  # helm install's check


def test_crds_are_templated_identical_to_the_repository_and_kept_on_uninstall(chart):
    """Helm never upgrades crds/: the CRDs are templates, so `helm upgrade` applies a changed schema."""
    assert not (CHART / "crds").exists() and not chart.crds
    docs = by_kind(render(chart, {}), "CustomResourceDefinition")
    sources = {yaml.safe_load(p.read_text())["metadata"]["name"]: p for p in (ROOT / "crds").glob("*.yaml")}
    assert {d["metadata"]["name"] for d in docs} == set(sources)
    for doc in docs:
        assert doc["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
        source = yaml.safe_load(sources[doc["metadata"]["name"]].read_text())
        del doc["metadata"]["annotations"]
        assert doc == source
        assert (CHART / "files" / "crds" / sources[doc["metadata"]["name"]].name).read_text() == \
            sources[doc["metadata"]["name"]].read_text()
    unkept = by_kind(render(chart, {"crds": {"keep": False}}), "CustomResourceDefinition")
    assert len(unkept) == len(docs) and all("annotations" not in d["metadata"] for d in unkept)
    assert not by_kind(render(chart, {"crds": {"enabled": False}}), "CustomResourceDefinition")


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
        {"predictor": {"retrain": {"holdoutFraction": 1}}},
        {"predictor": {"retrain": {"minNewJobs": 2}}},
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
    assert ("gnnsched.io", "gnnjobs", "watch") in scheduler  # a pod's facts are in its GNNJob's status
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
    # kube-scheduler counts the slots against the kubelet's allocatable too (the extender's GPUNode cache may lag it)
    assert {"name": contract.GPU_SHARE_RESOURCE, "ignoredByScheduler": False} in extender["managedResources"]
    assert [p["percentageOfNodesToScore"] for p in config["profiles"]] == [100]  # every GPU node reaches the extender
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
    daemonset = node_daemonset(docs)
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
    assert "--spread" in agent["args"]  # node.agent.spread: true (bench/robustness.py's +spread)
    assert arg_value(agent, "--mps-pipe-dir") == contract.DEFAULT_MPS_PIPE_DIR
    assert arg_value(plugin, "--plugin-dir") == contract.DEFAULT_DEVICE_PLUGIN_DIR
    assert arg_value(agent, "--metrics-port") == str(contract.DEFAULT_AGENT_METRICS_PORT)
    # paths a container opens itself are mounted at the same place as on the host (the device plugin's
    # --gate-socket and --mps-pipe-dir are host paths it hands to kubelet in Allocate, so only its plugin dir counts)
    assert host_paths["state"] == contract.DEFAULT_NODE_STATE_DIR
    assert arg_value(agent, "--state-dir") == arg_value(plugin, "--state-dir") == contract.DEFAULT_NODE_STATE_DIR
    assert arg_value(agent, "--mps") == "external"  # MPS lives in its own DaemonSet
    assert arg_value(plugin, "--mps-shm-dir") == contract.DEFAULT_MPS_SHM_DIR
    assert agent["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert agent["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert {"name": contract.ENV_JOBS_UID, "value": str(contract.DEFAULT_JOBS_UID)} in agent["env"]
    for container, flags in ((agent, ("--gate-socket", "--mps-pipe-dir", "--mps-log-dir", "--state-dir")),
                             (plugin, ("--plugin-dir", "--state-dir"))):
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        for flag in flags:
            value = arg_value(container, flag)
            assert value in mounts or str(Path(value).parent) in mounts, (container["name"], flag)
    assert pod["hostPID"] is True  # SO_PEERCRED pids are resolved in the host PID namespace
    # every process that opens the GPU backend knows its node: fake GPUs' UUIDs derive from it and must agree
    node_name = {"name": contract.ENV_NODE_NAME, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    mps_daemon = node_daemonset(docs, "mps")["spec"]["template"]["spec"]["containers"][0]
    for container in (agent, plugin, mps_daemon):
        assert node_name in container["env"], container["name"]


def test_extra_node_selectors_are_merged(chart):
    docs = render(chart, VALUE_SETS["extra-node-selectors"])
    daemonset = node_daemonset(docs)
    selector = daemonset["spec"]["template"]["spec"]["nodeSelector"]
    assert selector == {"nvidia.com/gpu.present": "true", "pool": "a100", "topology.kubernetes.io/zone": "zone-a"}
    assert arg_value(containers(docs)["agent"], "--policy") == "lmcf"
    assert arg_value(containers(docs)["agent"], "--bypass-limit") == "0"
    assert "--no-spread" in containers(docs)["agent"]["args"]


def test_security_contexts(chart):
    docs = render(chart, {})
    for name, container in containers(docs).items():
        security = container["securityContext"]
        if name == "mps-daemon":  # privileged by design: see test_mps_daemon_runs_apart_privileged_with_shared_shm
            continue
        assert security["allowPrivilegeEscalation"] is False and security["readOnlyRootFilesystem"] is True, name
        # the agent may signal a job it stops (over its admitted GPU memory: node_agent/overrun.py), nothing else
        added = ["KILL"] if name == "agent" else None
        assert security["capabilities"]["drop"] == ["ALL"] and security["capabilities"].get("add") == added, name
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
        d for d in by_kind(docs, "ConfigMap") if "gnnsched.json" in d.get("data", {})
    ]
    docs = render(chart, VALUE_SETS["servicemonitor-on"])
    monitors = by_kind(docs, "ServiceMonitor")
    assert len(monitors) == 3 and all(m["metadata"]["labels"]["release"] == "prom" for m in monitors)
    services = {d["metadata"]["labels"]["app.kubernetes.io/component"] for d in by_kind(docs, "Service")}
    assert {m["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] for m in monitors} <= services


def test_custom_names_apply_everywhere(chart):
    docs = render(chart, VALUE_SETS["custom-names"])
    names = [d["metadata"]["name"] for d in docs if d["kind"] != "CustomResourceDefinition"]  # API names are fixed
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
    (dashboard,) = [d for d in by_kind(docs, "ConfigMap") if "gnnsched.json" in d.get("data", {})]
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


def test_scheduler_rbac_binds_the_upstream_roles_and_the_extender_binds_in_one_call(chart):
    docs = render(chart, {})
    bound = {d["roleRef"]["name"]: d["subjects"] for d in by_kind(docs, "ClusterRoleBinding")}
    (sa,) = [d["metadata"]["name"] for d in by_kind(docs, "ServiceAccount")
             if d["metadata"]["name"].endswith("-scheduler")]
    for role in ("system:kube-scheduler", "system:volume-scheduler"):  # the upstream multiple-schedulers guide
        assert bound[role] == [{"kind": "ServiceAccount", "name": sa, "namespace": "gnnsched"}]
    (auth,) = [d for d in by_kind(docs, "RoleBinding")
               if d["roleRef"]["name"] == "extension-apiserver-authentication-reader"]
    assert auth["metadata"]["namespace"] == "kube-system"
    scheduler = _permissions(docs, "scheduler")
    # the reservation rides on the Binding: no pod patch, no pod update
    assert ("", "pods/binding", "create") in scheduler and not {p for p in scheduler if p[1] == "pods" and
                                                                 p[2] in ("patch", "update")}
    assert ("gnnsched.io", "gnnjobs/finalizers", "update") in _permissions(docs, "operator")


def test_scheduler_pod_settings(chart):
    docs = render(chart, {})
    (deploy,) = [d for d in by_kind(docs, "Deployment") if d["metadata"]["name"].endswith("-scheduler")]
    pod = deploy["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "system-cluster-critical"
    kube_scheduler = containers(docs)["kube-scheduler"]
    assert arg_value(kube_scheduler, "--profiling") == "false"
    config_map = next(d for d in by_kind(docs, "ConfigMap") if "scheduler-config.yaml" in d.get("data", {}))
    assert yaml.safe_load(config_map["data"]["scheduler-config.yaml"])["enableProfiling"] is False  # what applies
    assert arg_value(kube_scheduler, "--bind-address") == "$(POD_IP)"  # not every address
    assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in kube_scheduler["env"]
    assert kube_scheduler["livenessProbe"]["httpGet"]["port"] == int(arg_value(kube_scheduler, "--secure-port"))
    other = render(chart, {"scheduler": {"priorityClassName": "gpu-control-plane"}})
    (deploy,) = [d for d in by_kind(other, "Deployment") if d["metadata"]["name"].endswith("-scheduler")]
    assert deploy["spec"]["template"]["spec"]["priorityClassName"] == "gpu-control-plane"
    none = render(chart, {"scheduler": {"priorityClassName": ""}})
    (deploy,) = [d for d in by_kind(none, "Deployment") if d["metadata"]["name"].endswith("-scheduler")]
    assert "priorityClassName" not in deploy["spec"]["template"]["spec"]


@pytest.mark.parametrize(("http_timeout", "bind_timeout"), [("5s", 4.0), ("1s", 0.8), ("2500ms", 2.0), ("1m", 48.0)])
def test_bind_timeout_is_below_the_schedulers_http_timeout(chart, http_timeout, bind_timeout):
    docs = render(chart, {"scheduler": {"extender": {"httpTimeout": http_timeout}}})
    assert float(arg_value(containers(docs)["extender"], "--bind-timeout")) == pytest.approx(bind_timeout)
    config_map = next(d for d in by_kind(docs, "ConfigMap") if "scheduler-config.yaml" in d.get("data", {}))
    assert yaml.safe_load(config_map["data"]["scheduler-config.yaml"])["extenders"][0]["httpTimeout"] == http_timeout


def test_scheduler_name_reaches_every_consumer(chart):
    docs = render(chart, {"scheduler": {"name": "acme-gnn"}})
    config_map = next(d for d in by_kind(docs, "ConfigMap") if "scheduler-config.yaml" in d.get("data", {}))
    config = yaml.safe_load(config_map["data"]["scheduler-config.yaml"])
    assert [p["schedulerName"] for p in config["profiles"]] == ["acme-gnn"]
    assert config["leaderElection"]["resourceName"] == "acme-gnn"
    env = {e["name"]: e.get("value") for e in containers(docs)["operator"]["env"]}
    assert env["GNNSCHED_SCHEDULER_NAME"] == "acme-gnn"  # the operator's pods ask for this scheduler
    leases = [r for d in by_kind(docs, "Role") for r in d["rules"] if "leases" in r["resources"]
              and r.get("resourceNames")]
    assert leases and all(r["resourceNames"] == ["acme-gnn"] for r in leases)


def test_jobs_values_reach_the_operator(chart):
    # the operator reads these as the envvars of --run-as-user, --runtime-class-name, --tolerations, --node-selector
    uid, runtime = contract.ENV_JOBS_UID, contract.ENV_JOB_RUNTIME_CLASS
    tolerations, selector = contract.ENV_JOB_TOLERATIONS, contract.ENV_JOB_NODE_SELECTOR

    def env(docs: list[dict]) -> dict[str, str]:
        return {e["name"]: e.get("value") for e in containers(docs)["operator"]["env"]}

    default = env(render(chart, {}))
    assert default[uid] == str(contract.DEFAULT_JOBS_UID)
    assert default[runtime] == contract.DEFAULT_JOB_RUNTIME_CLASS  # the node DaemonSet's
    assert json.loads(default[tolerations]) == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert json.loads(default[selector]) == {}
    custom = env(render(chart, {"jobs": {"runAsUser": 1000, "runtimeClassName": "nvidia-cdi", "tolerations": [],
                                         "nodeSelector": {"pool": "a100"}}, "node": {"runtimeClassName": "x"}}))
    assert custom[uid] == "1000" and custom[runtime] == "nvidia-cdi"
    assert json.loads(custom[tolerations]) == []
    assert json.loads(custom[selector]) == {"pool": "a100"}
    # the operator's own parser takes what the chart renders
    from gnnsched.operator.podspec import job_pod_settings

    settings = job_pod_settings(int(custom[uid]), custom[runtime], custom[tolerations], custom[selector])
    assert (settings.run_as_user, settings.runtime_class_name, settings.node_selector) == (1000, "nvidia-cdi",
                                                                                          {"pool": "a100"})
    assert job_pod_settings(int(default[uid]), default[runtime], default[tolerations], default[selector]).tolerations
    follows = env(render(chart, {"node": {"runtimeClassName": "nvidia-legacy"}}))
    assert follows[runtime] == "nvidia-legacy"
    for bad in ({"jobs": {"runAsUser": 0}}, {"jobs": {"tolerations": [{"operator": "Maybe"}]}},
                {"jobs": {"nodeSelector": {"a": 1}}}, {"jobs": {"runtimeClassName": "Not A Name"}}):
        with pytest.raises(helm_python.HelmValuesError):
            chart.validate_schema(bad)


def test_worker_prestart_is_on_by_default_and_reaches_the_operator(chart):
    """``operator.workerPrestart`` (on in the chart, off on the operator's command line, as ``--retry-priority``) is
    always passed explicitly, so the chart's value wins whatever the CLI's default."""
    assert "--worker-prestart" in containers(render(chart, {}))["operator"]["args"]
    args = containers(render(chart, {"operator": {"workerPrestart": False}}))["operator"]["args"]
    assert "--no-worker-prestart" in args and "--worker-prestart" not in args
    with pytest.raises(helm_python.HelmValuesError):
        chart.validate_schema({"operator": {"workerPrestart": "yes"}})


def test_network_policies_admit_only_metrics_and_health_ports(chart):
    assert not by_kind(render(chart, {}), "NetworkPolicy")
    peers = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    docs = render(chart, {"networkPolicy": {"enabled": True, "metricsFrom": peers}})
    policies = {d["metadata"]["labels"]["app.kubernetes.io/component"]: d for d in by_kind(docs, "NetworkPolicy")}
    assert set(policies) == {"operator", "scheduler", "node", "mps"}  # every pod of the release (checkov CKV2_K8S_6)
    mps = policies.pop("mps")
    assert mps["spec"]["policyTypes"] == ["Ingress"] and mps["spec"]["ingress"] == []  # listens on nothing
    assert mps["spec"]["podSelector"]["matchLabels"] == node_daemonset(docs, "mps")["spec"]["selector"]["matchLabels"]
    for component, policy in policies.items():
        workload = next(d for d in docs if d["kind"] in ("Deployment", "DaemonSet")
                        and d["metadata"]["labels"]["app.kubernetes.io/component"] == component)
        assert policy["spec"]["podSelector"]["matchLabels"] == workload["spec"]["selector"]["matchLabels"]
        (rule,) = policy["spec"]["ingress"]
        assert rule["from"] == peers
        declared = {p["containerPort"] for c in workload["spec"]["template"]["spec"]["containers"]
                    for p in c.get("ports", [])}
        assert {p["port"] for p in rule["ports"]} <= declared, component
    assert {p["port"] for p in policies["scheduler"]["spec"]["ingress"][0]["ports"]} == {8889}  # never the verbs'


def test_mps_daemon_runs_apart_privileged_with_shared_shm(chart):
    """NVIDIA's MPS layout: its own privileged DaemonSet (OnDelete), a tmpfs at the shm directory mounted at /dev/shm,
    the same directories and the jobs' UID as the agent and the device plugin."""
    docs = render(chart, {"jobs": {"runAsUser": 1234}})
    mps = node_daemonset(docs, "mps")
    assert mps["spec"]["updateStrategy"] == {"type": "OnDelete"}  # an upgrade never restarts it under running jobs
    assert node_daemonset(docs)["spec"]["updateStrategy"]["type"] == "RollingUpdate"  # the agent rolls freely
    pod = mps["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False and pod["runtimeClassName"] == "nvidia"
    assert pod["hostPID"] is True  # NVIDIA's mps.enableHostPID default: the MPS server finds its PID via /proc/self
    assert pod["nodeSelector"] == node_daemonset(docs)["spec"]["template"]["spec"]["nodeSelector"]
    (daemon,) = pod["containers"]
    assert daemon["securityContext"]["privileged"] is True and daemon["args"][0] == "mps-daemon"
    assert {"name": contract.ENV_JOBS_UID, "value": "1234"} in daemon["env"]  # owner of the pipe and log dirs
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in daemon["volumeMounts"]}
    shm = arg_value(daemon, "--mps-shm-dir")
    assert shm == contract.DEFAULT_MPS_SHM_DIR and volumes[mounts["/dev/shm"]]["hostPath"]["path"] == shm
    node = containers(docs)
    assert arg_value(node["device-plugin"], "--mps-shm-dir") == shm  # Allocate mounts the same tmpfs in every job
    for flag in ("--mps-pipe-dir", "--mps-log-dir", "--state-dir"):
        assert arg_value(daemon, flag) == arg_value(node["agent"], flag), flag
        assert volumes[mounts[arg_value(daemon, flag)]]["hostPath"]["path"] == arg_value(daemon, flag)
    # the init container (mps-daemon --mount-shm, NVIDIA's mount-shm) mounts the tmpfs where the host sees it
    (init,) = pod["initContainers"]
    assert init["securityContext"]["privileged"] is True
    assert init["args"][:2] == ["mps-daemon", "--mount-shm"] and arg_value(init, "--mps-shm-dir") == shm
    (parent,) = init["volumeMounts"]
    assert parent["mountPropagation"] == "Bidirectional" and parent["mountPath"] == str(Path(shm).parent)
    assert volumes[parent["name"]]["hostPath"]["path"] == str(Path(shm).parent)
    # what mps-daemon then sees in its mountinfo counts as the shared tmpfs, a private /dev/shm does not
    from gnnsched.node_agent.mps_daemon import dev_shm_binding

    seen = f"812 790 0:97 / /dev/shm rw,nosuid,nodev,noexec,relatime - tmpfs {contract.MPS_SHM_SOURCE} rw,size=65536k\n"
    private = "813 790 0:98 / /dev/shm rw,nosuid,nodev,noexec,relatime - tmpfs shm rw,size=65536k\n"
    assert dev_shm_binding(shm, seen)[0] is True and dev_shm_binding(shm, private)[0] is False
    # off: no daemon, the agent does not wait for one, jobs get no shm mount
    off = render(chart, {"node": {"mps": {"enabled": False}}})
    assert not [d for d in by_kind(off, "DaemonSet") if d["metadata"]["labels"]["app.kubernetes.io/component"] == "mps"]
    assert arg_value(containers(off)["agent"], "--mps") == "off"
    assert arg_value(containers(off)["device-plugin"], "--mps-shm-dir") == "none"


def test_device_plugin_strategy_values(chart):
    plugin = containers(render(chart, {}))["device-plugin"]
    assert (arg_value(plugin, "--device-list-strategy"), arg_value(plugin, "--device-id-strategy")) == (
        "envvar",
        "uuid",
    )
    cdi = containers(render(chart, {"node": {"devicePlugin": {"deviceListStrategy": "cdi-cri"}}}))["device-plugin"]
    assert arg_value(cdi, "--device-list-strategy") == "cdi-cri"
    with pytest.raises(helm_python.HelmValuesError):
        chart.validate_schema({"node": {"devicePlugin": {"deviceListStrategy": "volume-mounts"}}})


@pytest.mark.parametrize("name", [*VALUE_SETS, "mps-reset"])
def test_every_gnnsched_container_command_line_parses_with_the_cli(chart, name):
    """Each flag the chart passes exists in the component's CLI with a value of its type (click parses it as
    at start-up, without running the command), so the chart cannot drift from the code."""
    import typer

    from gnnsched.cli import app

    values = VALUE_SETS.get(name) or {"node": {"mps": {"resetOnExit": True}}}
    cli = typer.main.get_command(app)
    checked = 0
    for doc in render(chart, values):
        if doc["kind"] not in ("Deployment", "DaemonSet", "CronJob"):
            continue
        template = doc["spec"]["jobTemplate"]["spec"]["template"] if doc["kind"] == "CronJob" else \
            doc["spec"]["template"]
        pod = template["spec"]
        for container in pod.get("initContainers", []) + pod["containers"]:
            if not container["image"].startswith("ghcr.io/gnnsched/"):
                continue
            args = list(container["args"])
            command = cli
            with cli.make_context("gnnsched", list(args), resilient_parsing=False) as ctx:
                while hasattr(command, "commands") and args and args[0] in command.commands:
                    command = command.commands[args.pop(0)]
                    if not hasattr(command, "commands") or not args or args[0] not in command.commands:
                        command.make_context(command.name, list(args), parent=ctx)
                        break
            checked += 1
    assert checked >= (0 if name == "components-off" else 4 if name == "retrain-off" else 6)


def test_the_retrain_cronjob_writes_the_configmap_the_operator_reads_with_only_the_rbac_it_needs(chart):
    """issue 28, item 5: one ConfigMap name reaches both sides; the CronJob's service account may list GNNJobs and
    GPUNodes (the history export) and get and patch that one ConfigMap, nothing else."""
    docs = render(chart, {})
    (configmap,) = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"] == "gs-gnnsched-predictor-model"]
    assert "data" not in configmap  # the chart never sets the model: Helm's upgrades leave the CronJob's alone
    operator = containers(docs)["operator"]
    assert arg_value(operator, "--predictor-model-configmap") == "gnnsched/gs-gnnsched-predictor-model"
    assert arg_value(operator, "--predictor-reload-seconds") == "60"
    (cronjob,) = by_kind(docs, "CronJob")
    job = cronjob["spec"]["jobTemplate"]["spec"]
    pod = job["template"]["spec"]
    assert cronjob["spec"]["schedule"] == "23 * * * *" and cronjob["spec"]["concurrencyPolicy"] == "Forbid"
    assert job["backoffLimit"] == 0 and pod["restartPolicy"] == "Never"  # a rejected candidate is not retried
    (export,) = pod["initContainers"]
    (train,) = pod["containers"]
    assert export["args"][:2] == ["operator", "export-history"]
    assert arg_value(export, "--out") == arg_value(train, "--from-history") == "/history/history.jsonl"
    assert arg_value(train, "--model-configmap") == "gnnsched/gs-gnnsched-predictor-model"
    assert (arg_value(train, "--min-new-jobs"), arg_value(train, "--holdout-fraction")) == ("20", "0.2")
    for container in (export, train):
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert _permissions(docs, "retrain") == {("", "configmaps", "get"), ("", "configmaps", "patch"),
                                             ("gnnsched.io", "gnnjobs", "list"), ("gnnsched.io", "gpunodes", "list")}
    [rule] = [r for d in by_kind(docs, "Role") if d["metadata"]["labels"]["app.kubernetes.io/component"] == "retrain"
              for r in d["rules"]]
    assert rule["resourceNames"] == ["gs-gnnsched-predictor-model"]
    bindings = [d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")
                and d["metadata"]["labels"]["app.kubernetes.io/component"] == "retrain"]
    assert len(bindings) == 2 and all(b["subjects"][0]["name"] == pod["serviceAccountName"] for b in bindings)

    tuned = render(chart, {"predictor": {"reloadSeconds": 15, "retrain": {
        "schedule": "*/30 * * * *", "minNewJobs": 50, "holdoutFraction": 0.25}}})
    (cronjob,) = by_kind(tuned, "CronJob")
    (train,) = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert cronjob["spec"]["schedule"] == "*/30 * * * *"
    assert (arg_value(train, "--min-new-jobs"), arg_value(train, "--holdout-fraction")) == ("50", "0.25")
    assert arg_value(containers(tuned)["operator"], "--predictor-reload-seconds") == "15"
    # off: no CronJob and no RBAC for it; the operator still reads the ConfigMap (a model can be put there by hand)
    off = render(chart, VALUE_SETS["retrain-off"])
    assert not by_kind(off, "CronJob") and not _permissions(off, "retrain")
    assert arg_value(containers(off)["operator"], "--predictor-model-configmap")
    # a long release name: the CronJob's name stays within the 52 characters a CronJob may have
    long = render(chart, {"fullnameOverride": "a" * 63})
    assert len(by_kind(long, "CronJob")[0]["metadata"]["name"]) <= 52
