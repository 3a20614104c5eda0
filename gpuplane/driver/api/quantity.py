"""Parse Kubernetes resource quantities ("6Gi", "512M", "1.5G", "1024") into integers."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_SUFFIXES: dict[str, int] = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
_QUANTITY = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kMGTPE]i?|)\s*$")


def parse_quantity(value: str | int) -> int:
    """Return the quantity as an integer number of units (bytes for memory).

    Raises ValueError with the accepted forms when the text is not a quantity.
    """
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a quantity")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{value} is negative")
        return value
    match = _QUANTITY.match(value)
    if match is None:
        raise ValueError(
            f"{value!r} is not a quantity: use an integer with an optional suffix "
            f"(Ki, Mi, Gi, Ti or k, M, G, T), e.g. 6Gi or 512Mi"
        )
    try:
        number = Decimal(match.group(1))
    except InvalidOperation as exc:  # pragma: no cover - regex guarantees digits
        raise ValueError(f"{value!r} is not a quantity") from exc
    result = number * _SUFFIXES[match.group(2)]
    if result != result.to_integral_value():
        raise ValueError(f"{value!r} is not a whole number of bytes")
    return int(result)


def format_mebibytes(value: int) -> str:
    """Format bytes as whole mebibytes with an "M" suffix, the unit MPS limits take."""
    return f"{max(1, value // 2**20)}M"
