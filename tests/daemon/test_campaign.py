"""The fault campaign (tests/campaign.py), bounded for CI: thousands of seeded random
steps of admit, release, hotplug, restarts, crashes and injected faults, with
numad's promises checked after every step and every cgroup write."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest

from numad.host import durable
from numad.host.scratch import scratch_mkdir
from tests.campaign import MACHINE, Crash, Simulation, run
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


def _scenario(sim: Simulation) -> None:
    """Shared and exclusive workloads come and go: every kind of ordered write."""
    for name, cpus in (("w0", "500m"), ("w1", 4), ("w2", 6), ("w3", "500m")):
        scratch_mkdir(sim.cgroups, f"numad.slice/{name}")
        spec = {"name": name, "cgroup": f"numad.slice/{name}", "cpus": cpus}
        assert sim.daemon.admit(sim.daemon.parse(json.dumps(spec), "json")).admitted
        sim.answered.add(name)
    for name in ("w1", "w0"):
        sim.answered.discard(name)
        sim.daemon.release(name)
    spec = {"name": "w4", "cgroup": "numad.slice/w1", "cpus": 8}  # w1's cgroup, exclusive again
    assert sim.daemon.admit(sim.daemon.parse(json.dumps(spec), "json")).admitted


def test_a_crash_at_any_cgroup_write_breaks_no_promise(machines: Machines, tmp_path: Path) -> None:
    """The scenario once without a crash to count its writes, then once per write
    with a crash at that write, a restart, and the promises checked."""
    clean = Simulation(machines.root(MACHINE), tmp_path / "clean", seed=0)
    _scenario(clean)
    writes = clean.writes
    assert writes > 10
    for at in range(writes):
        sim = Simulation(machines.root(MACHINE), tmp_path / f"crash{at}", seed=0)
        sim.writes = 0
        sim.faults.crash_in = at
        with contextlib.suppress(Crash):
            _scenario(sim)
            raise AssertionError(f"no crash at write {at}")  # pragma: no cover
        sim.restart()
        sim.check(f"after a crash at write {at}")
        sim.settle()


def test_a_crash_inside_any_checkpoint_write_breaks_no_promise(
    machines: Machines, tmp_path: Path
) -> None:
    """A crash half-way through each checkpoint write of the scenario in turn."""
    for at in range(8):
        sim = Simulation(machines.root(MACHINE), tmp_path / f"crash{at}", seed=0)
        left = [at]

        def dying(fd: int, data: memoryview, left: list[int] = left) -> int:
            left[0] -= 1
            if left[0] < 0:
                os.write(fd, data[: len(data) // 2])
                raise Crash
            return os.write(fd, data)

        sim.daemon.syscalls = durable.Syscalls(write=dying)
        with contextlib.suppress(Crash):
            _scenario(sim)
        sim.restart()
        sim.check(f"after a crash inside checkpoint write {at}")
        sim.settle()
