"""The fault campaign (tests/campaign.py), bounded for CI: thousands of seeded random
steps of admit, release, hotplug, restarts, crashes and injected faults, with
numad's promises checked after every step and every cgroup write."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.campaign import MACHINE, run
from tests.conftest import Machines


@pytest.mark.parametrize("seed", range(4))
def test_no_promise_breaks_under_random_faults(
    machines: Machines, tmp_path: Path, seed: int
) -> None:
    sim = run(machines.root(MACHINE), tmp_path, seed, steps=1000)
    assert sim.steps == 1000
    assert sim.checks > 1000  # checked after each step and each cgroup write
    assert sum(sim.faults.injected.values()) > 50  # the faults really came
    assert sim.admitted > 50  # the workloads really came
