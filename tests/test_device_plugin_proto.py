"""The project's v1beta1 proto: wire numbers as upstream kubelet defines them, and committed stubs not stale."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import grpc
import pytest

from gnnsched.device_plugin.v1beta1 import api_pb2 as pb

# message -> {field name: (number, type, repeated)} from k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/api.proto
# (types: FieldDescriptor type names; only numbers and types are on the wire, names document intent).
UPSTREAM = {
    "DevicePluginOptions": {
        "pre_start_required": (1, "bool", False),
        "get_preferred_allocation_available": (2, "bool", False),
    },
    "RegisterRequest": {
        "version": (1, "string", False),
        "endpoint": (2, "string", False),
        "resource_name": (3, "string", False),
        "options": (4, "message", False),
    },
    "Empty": {},
    "ListAndWatchResponse": {"devices": (1, "message", True)},
    "TopologyInfo": {"nodes": (1, "message", True)},
    "NUMANode": {"ID": (1, "int64", False)},
    "Device": {"ID": (1, "string", False), "health": (2, "string", False), "topology": (3, "message", False)},
    "PreStartContainerRequest": {"devices_ids": (1, "string", True)},
    "PreStartContainerResponse": {},
    "PreferredAllocationRequest": {"container_requests": (1, "message", True)},
    "ContainerPreferredAllocationRequest": {
        "available_deviceIDs": (1, "string", True),
        "must_include_deviceIDs": (2, "string", True),
        "allocation_size": (3, "int32", False),
    },
    "PreferredAllocationResponse": {"container_responses": (1, "message", True)},
    "ContainerPreferredAllocationResponse": {"deviceIDs": (1, "string", True)},
    "AllocateRequest": {"container_requests": (1, "message", True)},
    "ContainerAllocateRequest": {"devices_ids": (1, "string", True)},
    "AllocateResponse": {"container_responses": (1, "message", True)},
    "ContainerAllocateResponse": {
        "envs": (1, "message", True),
        "mounts": (2, "message", True),
        "devices": (3, "message", True),
        "annotations": (4, "message", True),
        "cdi_devices": (5, "message", True),
    },
    "Mount": {
        "container_path": (1, "string", False),
        "host_path": (2, "string", False),
        "read_only": (3, "bool", False),
    },
    "DeviceSpec": {
        "container_path": (1, "string", False),
        "host_path": (2, "string", False),
        "permissions": (3, "string", False),
    },
    "CDIDevice": {"name": (1, "string", False)},
}

_TYPE_NAMES = {8: "bool", 9: "string", 11: "message", 3: "int64", 5: "int32"}


def test_messages_match_upstream_numbers_and_types():
    assert pb.DESCRIPTOR.package == "v1beta1"
    assert set(pb.DESCRIPTOR.message_types_by_name) == set(UPSTREAM)
    for msg, fields in UPSTREAM.items():
        desc = pb.DESCRIPTOR.message_types_by_name[msg]
        got = {
            f.name: (f.number, _TYPE_NAMES.get(f.type, str(f.type)), f.is_repeated)
            for f in desc.fields
        }
        assert got == fields, msg
    envs = pb.DESCRIPTOR.message_types_by_name["ContainerAllocateResponse"].fields_by_name["envs"]
    assert envs.message_type.GetOptions().map_entry  # map<string,string>, not a repeated message


def test_services_match_upstream():
    svc = pb.DESCRIPTOR.services_by_name
    assert {m.name: (m.input_type.name, m.output_type.name) for m in svc["Registration"].methods} == {
        "Register": ("RegisterRequest", "Empty")
    }
    dp = {m.name: (m.input_type.name, m.output_type.name, m.server_streaming) for m in svc["DevicePlugin"].methods}
    assert dp == {
        "GetDevicePluginOptions": ("Empty", "DevicePluginOptions", False),
        "ListAndWatch": ("Empty", "ListAndWatchResponse", True),
        "GetPreferredAllocation": ("PreferredAllocationRequest", "PreferredAllocationResponse", False),
        "Allocate": ("AllocateRequest", "AllocateResponse", False),
        "PreStartContainer": ("PreStartContainerRequest", "PreStartContainerResponse", False),
    }


def test_grpc_matches_the_stub_generator():
    """api_pb2_grpc.py refuses grpcio older than the grpcio-tools that wrote it: pyproject pins them together."""
    from gnnsched.device_plugin.v1beta1 import api_pb2_grpc

    assert grpc.__version__ == api_pb2_grpc.GRPC_GENERATED_VERSION


@pytest.mark.skipif(importlib.util.find_spec("grpc_tools") is None, reason="grpcio-tools (dev extra) not installed")
def test_committed_stubs_are_what_api_proto_generates():
    import grpc_tools

    from gnnsched.device_plugin.v1beta1 import generate

    assert grpc_tools.__file__  # the pinned generator is importable
    here = Path(generate.__file__).parent
    for name, text in generate.generate().items():
        assert (here / name).read_text() == text, f"{name} is stale: python -m gnnsched.device_plugin.v1beta1.generate"
