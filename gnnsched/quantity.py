"""Kubernetes resource quantities (``500m``, ``1.5Gi``, ``2e9``) parsed exactly, and bytes printed for people.

Parsing follows apimachinery's ``resource.Quantity`` grammar: an optional sign, a decimal number, and either a binary
suffix (Ki … Ei), a decimal suffix (n u m "" k M G T P E) or a decimal exponent (e/E). Values are returned as
``Decimal`` so ``100m`` CPU and ``1Gi`` bytes round-trip without float error; callers convert at the edge.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$")
QUANTITY_PATTERN = r"^[+]?(\d+\.?\d*|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$"
"""The non-negative subset accepted in GNNJob specs (also used as the CRD's ``pattern``)."""


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity."""


def parse_quantity(value: str | int | float | Decimal) -> Decimal:
    """Parse a quantity; numbers pass through. Raises ``QuantityError`` naming the bad text."""
    if isinstance(value, bool):
        raise QuantityError(f"{value!r} is not a quantity")
    if isinstance(value, (int, Decimal)):
        return Decimal(value)
    if isinstance(value, float):
        return Decimal(repr(value))
    text = str(value).strip()
    match = _QUANTITY.match(text)
    if not match:
        raise QuantityError(f"{value!r} is not a Kubernetes quantity (examples: 500m, 2, 1.5Gi, 512Mi, 2e9)")
    number, suffix = match.group(1), match.group(2) or ""
    try:
        base = Decimal(number)
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only valid decimals
        raise QuantityError(f"{value!r} is not a Kubernetes quantity") from exc
    if suffix in _BINARY:
        return base * _BINARY[suffix]
    if suffix in _DECIMAL:
        return base * _DECIMAL[suffix]
    return base * (Decimal(10) ** int(suffix[1:]))


def parse_bytes(value: str | int | float | Decimal) -> int:
    """A memory quantity in whole bytes (rounded up, as the kubelet does for fractional bytes)."""
    amount = parse_quantity(value)
    whole = int(amount.to_integral_value(rounding="ROUND_CEILING"))
    return whole


def parse_cpu(value: str | int | float | Decimal) -> float:
    """A CPU quantity in cores."""
    return float(parse_quantity(value))


def format_bytes(n: int | float) -> str:
    """Bytes for people, in binary units with three significant digits (``3.21 GiB``)."""
    n = float(n)
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            if unit == "B":
                return f"{sign}{int(n)} B"
            return f"{sign}{n:.3g} {unit}" if n < 100 else f"{sign}{n:.0f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def format_quantity_bytes(n: int) -> str:
    """Bytes as a compact Kubernetes quantity (``3.21Gi``), for status fields and printer columns."""
    value = float(n)
    for suffix in ("", "Ki", "Mi", "Gi", "Ti", "Pi"):
        if value < 1024 or suffix == "Pi":
            return f"{int(value)}" if suffix == "" else f"{value:.3g}{suffix}"
        value /= 1024
    raise AssertionError("unreachable")


def format_cpu(cores: float) -> str:
    """Cores as a Kubernetes quantity: whole cores plainly, fractions in millicores."""
    millis = round(cores * 1000)
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"
