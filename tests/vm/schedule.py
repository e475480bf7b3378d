"""The VM tier first, longest boot first: the order the whole suite is collected in.

The boots are the suite's long pole (17 of them, 2 to 10 minutes each under TCG).
``scripts/check`` runs ``pytest -n auto --dist worksteal``: the collection is split into
one contiguous share per worker, and a worker that runs out takes the second half of
the longest queue left. Collected last (``tests/vm`` sorts late), the boots started
only once one worker had reached the end of its share, about 10 minutes in, and then
ran with little else left to overlap them. Put first, longest first, the worker whose
share starts with them boots VMs from the start while the other runs the rest of the
suite; whichever runs out later takes from the end of the other's queue: the short
tests first, then the shortest boots.

Host side; only reorders. Every worker sorts the same collection the same way, as
xdist requires.
"""

from __future__ import annotations

import pytest

from tests.vm import pace

MARKER = "vm"
SYSTEMD_MODULE = "test_systemd_vm"


def expected_seconds(item: pytest.Item) -> float:
    """A VM test's boot, as long as its kind's slowest quiet one (tests/vm/pace.py);
    0 for any other test."""
    if item.get_closest_marker(MARKER) is None:
        return 0.0
    kind = "systemd" if item.path.stem == SYSTEMD_MODULE else "busybox"
    return pace.QUIET_SECONDS[kind]


def vm_first(items: list[pytest.Item]) -> None:
    """Sort ``items`` in place: VM tests first, longest kind first, the rest after,
    each group in its collection order (the sort is stable)."""
    items.sort(key=lambda item: -expected_seconds(item))
