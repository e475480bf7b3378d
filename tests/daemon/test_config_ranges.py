"""Every numeric config key with a range: the ends accepted, a value just outside
each end refused, and every wrong type refused, each with an error naming the key.

The keys come from the config's own declaration (``_KEYS``): a key that takes a
number is found by trying numbers on every declared key, and must have a row in
RANGES, so a numeric key added later without its range checked fails here.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import pytest

from numad.daemon import config
from numad.daemon.config import Config, parse
from numad.errors import ConfigError

SOURCE = "/etc/numad/numad.toml"


class Range(NamedTuple):
    section: str
    key: str
    field: str  # the Config field it sets
    lo: float
    hi: float | None  # None: no upper end in the file (checked against the machine)
    whole: bool  # whole numbers only


RANGES = (
    Range("cpu", "reserved-count", "reserved_count", 0, None, whole=True),
    Range("metrics", "port", "metrics_port", 0, 65535, whole=True),
    Range("daemon", "reconcile-seconds", "reconcile_seconds", 0.1, 3600, whole=False),
    Range("daemon", "release-grace-seconds", "release_grace_seconds", 0, 86400, whole=False),
    Range("memory", "locality-threshold", "locality_threshold", 0, 1, whole=False),
)
PROBES = (0, 0.5, 1, 2, 10, 1000, 100_000)  # a numeric key takes one of these


def _raw(section: str, key: str, value: object) -> dict[str, Any]:
    return {section: {key: value}}


def _accepts(section: str, key: str, value: object) -> bool:
    try:
        parse(_raw(section, key, value))
    except ConfigError:
        return False
    return True


def test_every_numeric_key_has_its_range_checked_here() -> None:
    declared = {(s, k) for s, keys in config._KEYS.items() for k in keys}
    numeric = {(s, k) for s, k in declared if any(_accepts(s, k, v) for v in PROBES)}
    assert numeric == {(r.section, r.key) for r in RANGES}
    fields = {f.name for f in dataclasses.fields(Config) if f.type in ("int", "float", int, float)}
    assert fields == {r.field for r in RANGES}


def _middle(r: Range) -> float:
    return r.lo + 1 if r.hi is None else (r.lo + r.hi) / 2


def _outside(r: Range) -> list[tuple[object, str]]:
    """Values just outside each end, and of each wrong type, with a case id."""
    below = r.lo - 1 if r.whole else math.nextafter(r.lo, -math.inf)
    cases: list[tuple[object, str]] = [(below, "just-below")]
    if r.hi is not None:
        above = r.hi + 1 if r.whole else math.nextafter(r.hi, math.inf)
        cases.append((above, "just-above"))
    middle = int(_middle(r)) if r.whole else _middle(r)
    cases += [
        (str(middle), "a-string"),  # "0.5": a number in quotes
        (True, "true"),  # a bool is an int in Python, and 1 is in most ranges
        (False, "false"),
        ([middle], "an-array"),
        ({"value": middle}, "a-table"),
    ]
    if r.whole:
        cases.append((float(middle), "a-float"))
    return cases


OUTSIDE = [
    pytest.param(r, value, id=f"{r.key}-{case}") for r in RANGES for value, case in _outside(r)
]
EXPLICIT = [  # issue 24 item 13, as written there
    pytest.param(RANGES[-1], value, id=f"locality-threshold-{value!r}")
    for value in (1.5, -0.1, "0.5", True)
]


@pytest.mark.parametrize(("r", "value"), OUTSIDE + EXPLICIT)
def test_a_value_outside_the_range_or_of_the_wrong_type_is_refused_naming_the_key(
    r: Range, value: object
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(_raw(r.section, r.key, value), SOURCE)
    subject = f"{SOURCE} [{r.section}]"
    assert caught.value.subject == subject
    assert str(caught.value).startswith(f"{subject}: {r.key} = {value!r}: not a ")


INSIDE = [
    pytest.param(r, value, id=f"{r.key}-{value!r}")
    for r in RANGES
    for value in (r.lo, _middle(r), *(() if r.hi is None else (r.hi,)))
]


@pytest.mark.parametrize(("r", "value"), INSIDE)
def test_the_ends_and_the_middle_of_the_range_are_accepted(r: Range, value: float) -> None:
    given = int(value) if r.whole else value
    assert getattr(parse(_raw(r.section, r.key, given)), r.field) == given
