"""The byte limit ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` sets, read the same way by the built-in worker
(``gnnsched.closed_loop``) and the portable step runner (``runner.py``, in a user's image without gnnsched): here,
standard library only, so both read one rule."""

from __future__ import annotations

import re

ENV_MPS_MEMORY_LIMIT = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"

_ITEM = re.compile(r"^\s*(?:(\d+)\s*=\s*)?(\d+)\s*([KMGT]?)B?\s*$", re.IGNORECASE)
_UNIT = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def parse_mps_memory_limit(text: str, device: int = 0) -> int | None:
    """The byte limit ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` sets for visible device ``device`` (``"0=1024M"``,
    ``"0=2G,1=512M"``, or one value for every device; K/M/G/T are binary multiples, as the gate writes them), or
    ``None`` when it sets none for that device. Raises ``ValueError`` naming the item it cannot read."""
    default: int | None = None
    for item in text.split(","):
        if not item.strip():
            continue
        match = _ITEM.match(item)
        if match is None:
            raise ValueError(f"{ENV_MPS_MEMORY_LIMIT}: cannot read {item.strip()!r} (expected e.g. 0=1024M)")
        value = int(match.group(2)) * _UNIT[match.group(3).upper()]
        if match.group(1) is None:
            default = value
        elif int(match.group(1)) == device:
            return value
    return default
