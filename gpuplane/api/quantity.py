"""Parse Kubernetes resource quantities ("6Gi", "512M", "1.5G", "1024") into integers, within bounds.

Every input is hostile: a quantity is at most :data:`MAX_CHARS` characters and at
most :data:`MAX_VALUE` (2^63 - 1, the largest quantity Kubernetes stores as an
int64), so no caller ever holds, compares or formats a number thousands of digits
long (a 9,800-digit limit once crashed prepare while its error was formatted:
Python refuses to turn ints over 4,300 digits into text). Error messages show at
most :data:`SHOWN_CHARS` characters of the input (:func:`shown`).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

MAX_CHARS = 32
MAX_VALUE = 2**63 - 1
SHOWN_CHARS = 40
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
_QUANTITY = re.compile(r"^([0-9]{1,19}(?:\.[0-9]{1,9})?)([kMGTPE]i?|)$")  # as Kubernetes writes them: no spaces


def shown(value: Any) -> str:
    """``repr(value)`` cut to a readable length; never converts a huge int to text."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 100:
        return f"<an integer of about {int(value.bit_length() * 0.30103) + 1} digits>"
    if isinstance(value, str | bytes) and len(value) > SHOWN_CHARS:
        return f"{value[:SHOWN_CHARS]!r}… ({len(value)} characters)"
    text = (
        repr(value) if isinstance(value, int | float | bool | str | bytes | type(None)) else f"a {type(value).__name__}"
    )
    return text if len(text) <= SHOWN_CHARS + 20 else text[: SHOWN_CHARS + 20] + "…"


def parse_quantity(value: str | int) -> int:
    """Return the quantity as an integer number of units (bytes for memory).

    Raises ValueError with the accepted forms when the text is not a quantity or is out of bounds.
    """
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a quantity")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{shown(value)} is negative")
        if value > MAX_VALUE:
            raise ValueError(f"{shown(value)} exceeds the largest quantity, 2^63-1")
        return value
    if not isinstance(value, str):
        raise ValueError(f"{shown(value)} is not a quantity (a string such as 6Gi)")
    if len(value) > MAX_CHARS:
        raise ValueError(f"{shown(value)} is too long for a quantity (at most {MAX_CHARS} characters, e.g. 6Gi)")
    match = _QUANTITY.match(value)
    if match is None:
        raise ValueError(
            f"{shown(value)} is not a quantity: use an integer with an optional suffix "
            f"(Ki, Mi, Gi, Ti or k, M, G, T), e.g. 6Gi or 512Mi"
        )
    try:
        number = Decimal(match.group(1))
    except InvalidOperation as exc:  # pragma: no cover - regex guarantees digits
        raise ValueError(f"{shown(value)} is not a quantity") from exc
    result = number * _SUFFIXES[match.group(2)]
    if result != result.to_integral_value():
        raise ValueError(f"{shown(value)} is not a whole number of bytes")
    if result > MAX_VALUE:
        raise ValueError(f"{shown(value)} exceeds the largest quantity, 2^63-1 (8Ei)")
    return int(result)


def share_percent(value: Any) -> int:
    """A ``sharePercent`` capacity (requested or consumed): a whole 1..100; ValueError says what is wrong.

    0 is refused: a claim holding a GPU at 0 % lets the scheduler count the GPU free.
    """
    try:
        pct = parse_quantity(value if isinstance(value, str | int) else str(value)[: MAX_CHARS + 1])
    except ValueError as exc:
        raise ValueError(f"sharePercent is not a whole percentage: {exc}") from exc
    if not 1 <= pct <= 100:
        raise ValueError(
            f"sharePercent {pct} is outside 1..100 (a 0 % share would hold the GPU while the scheduler counts it "
            'free); ask for a share between "1" and "100"'
        )
    return pct


def format_mebibytes(value: int) -> str:
    """Format bytes as whole mebibytes with an "M" suffix, the unit MPS limits take."""
    return f"{max(1, value // 2**20)}M"
