"""Quantities, the GPU catalogue and the dataset catalogue: the small pieces every component leans on."""

from __future__ import annotations

from decimal import Decimal

import pytest

from gnnsched.datasets import dataset_names, get_dataset
from gnnsched.gpu.catalogue import GiB, get_gpu_model, gpu_models, match_device_name
from gnnsched.quantity import (
    QuantityError,
    format_bytes,
    format_cpu,
    format_quantity_bytes,
    parse_bytes,
    parse_cpu,
    parse_quantity,
)


@pytest.mark.parametrize(
    "text,value",
    [
        ("500m", Decimal("0.5")),
        ("2", Decimal(2)),
        ("1.5Gi", Decimal(3 * 2**29)),
        ("512Mi", Decimal(2**29)),
        ("2e9", Decimal("2e9")),
        ("1k", Decimal(1000)),
        ("+.5", Decimal("0.5")),
        (3, Decimal(3)),
    ],
)
def test_parse_quantity(text, value):
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "two", "1Gb", "1.2.3", "Gi", "1 Gi", True])
def test_parse_quantity_rejects(text):
    with pytest.raises(QuantityError):
        parse_quantity(text)


def test_conversions_and_formatting():
    assert parse_bytes("1.5Ki") == 1536
    assert parse_bytes("0.5") == 1  # fractional bytes round up
    assert parse_cpu("250m") == 0.25
    assert format_cpu(0.25) == "250m" and format_cpu(3.0) == "3"
    assert format_bytes(3 * GiB + GiB // 4) == "3.25 GiB"
    assert format_bytes(512) == "512 B"
    assert format_quantity_bytes(80 * GiB) == "80Gi"


def test_gpu_catalogue_lookup():
    assert get_gpu_model("v100m32").name == "V100-32GB"
    assert get_gpu_model("NVIDIA A100-SXM4-80GB").memory_bytes == 81920 * 2**20
    with pytest.raises(KeyError, match="known models"):
        get_gpu_model("Voodoo2")
    assert match_device_name("NVIDIA A100-PCIE-40GB", 40536 * 2**20).name == "A100-40GB"
    assert match_device_name("Matrox") is None
    names = [m.name for m in gpu_models()]
    assert len(names) == len(set(names))
    # only the H100 has been measured (docs/gpu-measurements.md)
    assert {m.name for m in gpu_models() if m.overheads_verified} == {"H100-80GB"}
    assert {m.name for m in gpu_models() if m.assumed} == {"G2", "G3"}


def test_dataset_catalogue():
    assert get_dataset("pubmed").nodes == 19717
    assert get_dataset("OGBN-Products").classes == 47
    with pytest.raises(KeyError, match="known datasets"):
        get_dataset("imagenet")
    assert len(dataset_names()) == 14


def test_api_version_is_group_and_version() -> None:
    """contract.API_VERSION is spelled out (type checkers need the literal); it must still be GROUP/VERSION."""
    from gnnsched import contract

    assert f"{contract.GROUP}/{contract.VERSION}" == contract.API_VERSION
