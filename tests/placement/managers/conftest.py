"""Fixtures shared by the managers' tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from numad.hostfs import HostFS
from numad.topology.discover import discover
from numad.topology.model import Topology
from tests.conftest import Machines


@pytest.fixture(scope="module")
def recorded(machines: Machines) -> Callable[[str], Topology]:
    """Recorded machines discovered once per module, by name."""
    cache: dict[str, Topology] = {}

    def topology(name: str) -> Topology:
        if name not in cache:
            cache[name] = discover(HostFS(machines.root(name)))
        return cache[name]

    return topology
