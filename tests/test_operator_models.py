"""The operator with any PyG model: a model class job is estimated by its real class and reaches a pod; a bad class,
layer or option is a Validated=False condition naming the field, with no pod (kopf against the emulated API server)."""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path

import pytest
from operator_harness import a100, emulated_cluster, manifest, running_operator
from test_operator import condition, job_in_phase, own_pods, wait_for

from gnnsched.contract import ANN_ADMIT_BYTES
from gnnsched.spec import parse_spec

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]

PNA = {"pyg": "PNA", "layers": 2, "hidden": 32,
       "options": {"aggregators": ["mean", "max", "std"], "scalers": ["identity", "amplification"]}}


async def test_a_model_class_job_is_planned_from_its_own_class(tmp_path: Path) -> None:
    from gnnsched.estimator import estimate

    async with emulated_cluster(tmp_path) as cluster:
        await cluster.add_gpunode("node-a", [a100(0)])
        async with running_operator(cluster):
            created = await cluster.create_job(manifest("pna", model=PNA))
            pods = await wait_for(lambda: own_pods(cluster, "pna"), 30, what="the job's pod")
            job = await job_in_phase(cluster, "pna", "Estimated")
    expected = estimate(parse_spec(created["spec"]), device="cuda", gpu_model="A100-40GB")
    assert job["status"]["pmcBytes"] == expected.pmc_bytes
    assert int(pods[0]["metadata"]["annotations"][ANN_ADMIT_BYTES]) == expected.admit_bytes
    # the nearest built-in arch would be a different (smaller) prediction: the class itself was traced
    as_gin = estimate(parse_spec({**created["spec"], "model": {"arch": "gin", "layers": 2, "hidden": 32}}),
                      device="cuda", gpu_model="A100-40GB")
    assert expected.pmc_bytes > as_gin.pmc_bytes


async def test_bad_model_names_and_options_fail_validation_with_no_pod(tmp_path: Path) -> None:
    async with emulated_cluster(tmp_path) as cluster, running_operator(cluster):
        await cluster.create_job(manifest("typo-class", model={"pyg": "GraphSage", "layers": 2}))
        await cluster.create_job(manifest("typo-option", model={"conv": "GATv2Conv", "options": {"head": 4}}))
        await cluster.create_job(manifest("wrong-type", model={"pyg": "GAT", "options": {"v2": "yes"}}))
        await cluster.create_job(manifest("no-image", model={"entrypoint": "mypkg.models:build"}))
        jobs = {name: await job_in_phase(cluster, name, "Failed")
                for name in ("typo-class", "typo-option", "wrong-type", "no-image")}
        await asyncio.sleep(0.5)
        assert await cluster.pods() == []
    messages = {name: condition(job, "Validated")["message"] for name, job in jobs.items()}
    assert all(condition(job, "Validated")["reason"] == "InvalidSpec" for job in jobs.values())
    assert messages["typo-class"].startswith("spec.model.pyg: 'GraphSage' is not a model class")
    assert "did you mean 'GraphSAGE'" in messages["typo-class"]
    assert messages["typo-option"].startswith("spec.model.options.head: unknown option")
    assert messages["wrong-type"].startswith("spec.model.options.v2: must be bool")
    assert messages["no-image"].startswith("spec.image: required with spec.model.entrypoint")


async def test_an_entrypoint_job_never_runs_user_code_in_the_operator(tmp_path: Path) -> None:
    """The operator cannot import the user's package (it is only in the user's image): an entrypoint job, with or
    without a declared gpuMemory, gets a probe pod from its own image and no GPU pod until the probe has ended
    (tests/test_operator_probe.py follows it to the end)."""
    import sys

    async with emulated_cluster(tmp_path) as cluster:
        await cluster.add_gpunode("node-a", [a100(0)])
        async with running_operator(cluster):
            mine = {"entrypoint": "users_own_package_nowhere_here.models:build"}
            await cluster.create_job(manifest("declared", model=mine, image="registry.example/team/gnn:1",
                                              resources={"gpuMemory": "6Gi"}))
            await cluster.create_job(manifest("undeclared", model=mine, image="registry.example/team/gnn:1"))
            for name in ("declared", "undeclared"):
                pods = await wait_for(functools.partial(own_pods, cluster, name), 30, what=f"{name}'s probe pod")
                assert [p["metadata"]["name"] for p in pods] == [f"{name}-probe"]
                assert pods[0]["spec"]["containers"][0]["image"] == "registry.example/team/gnn:1"
            await asyncio.sleep(1.0)
            assert sorted(p["metadata"]["name"] for p in await cluster.pods()) == ["declared-probe",
                                                                                   "undeclared-probe"]
            job = await cluster.get_job("undeclared")
    assert job["status"]["phase"] == "Pending" and condition(job, "Probed")["reason"] == "ProbeRunning"
    assert not any(m.startswith("users_own_package_nowhere_here") for m in sys.modules)
