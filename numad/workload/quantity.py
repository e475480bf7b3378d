"""Kubernetes resource quantities ("32Gi", "1.5G", "500m", "1e9") as exact numbers.

The input edge of admission, under ``numad.workload.spec`` and ``numad.workload.pod``: a pure
parser of decoded values. Touches nothing but its arguments. Numbers stay
``Decimal`` and exact (no float rounding at any size a quantity string can
spell); whether a value is in range or whole is the caller's check.
"""

from __future__ import annotations

import math
import re
from decimal import Context, Decimal

# A decimal number, then a binary or decimal suffix or a decimal exponent.
_QUANTITY = re.compile(
    r"(?P<sign>[+-]?)(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:[eE](?P<exponent>[0-9]{1,2})|(?P<suffix>[KMGTPE]i|[mkMGTPE]))?"
)
_SCALE = {
    "m": Decimal("0.001"),
    **{s: Decimal(1000**i) for i, s in enumerate("kMGTPE", 1)},
    **{f"{s}i": Decimal(1024**i) for i, s in enumerate("KMGTPE", 1)},
}
EXACT = Context(prec=200)  # no rounding at any size a quantity string can spell
# An integer longer than this is beyond every range numad accepts; TOML and YAML
# read hexadecimal of any length in linear time, but its Decimal would take minutes.
MAX_BITS = 256


def quantity(text: str) -> Decimal | None:
    """The value of a quantity string, or None if ``text`` is not one."""
    match = _QUANTITY.fullmatch(text) if len(text) <= 64 else None
    if match is None:
        return None
    exponent, suffix = match["exponent"], match["suffix"]
    scale = Decimal(10) ** int(exponent) if exponent else _SCALE.get(suffix, Decimal(1))
    value = EXACT.multiply(Decimal(match["number"]), scale)
    return -value if match["sign"] == "-" else value


def exact_number(value: object) -> Decimal | None:
    """An exact number from an integer, a finite float or a quantity string; an
    integer beyond ``MAX_BITS`` is infinite (out of range, never converted)."""
    if isinstance(value, Decimal):
        return value
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        if value.bit_length() > MAX_BITS:  # out of every range: not converted (quadratic)
            return Decimal("-Infinity") if value < 0 else Decimal("Infinity")
        return Decimal(value)
    if isinstance(value, float):
        return Decimal(repr(value)) if math.isfinite(value) else None
    return quantity(value) if isinstance(value, str) else None


def is_whole(value: Decimal) -> bool:
    return value == value.to_integral_value()


def page_size(size: str) -> int | None:
    """Bytes per page for the size in a ``hugepages-<size>`` name (a power of two)."""
    amount = quantity(size)
    if amount is None or not 1024 <= amount <= 1 << 40 or not is_whole(amount):
        return None
    page = int(amount)
    return page if page % 1024 == 0 and page & (page - 1) == 0 else None
