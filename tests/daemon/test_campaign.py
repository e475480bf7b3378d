"""The fault campaign (tests/campaign/), bounded for CI: thousands of seeded random
steps of admit, release, hotplug, restarts, crashes, injected faults, cgroups gone
while numad is down, killed ``numad run`` clients, a full state disk, unreadable
cpusets and hostile numbers, with numad's promises checked after every step and
every cgroup write; and each of the newer steps shown to catch its promise broken."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Callable
from decimal import Context
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from numad.daemon import admissions, commits, moving, others, reconcile, resizes, state
from numad.errors import CheckpointError
from numad.host import durable, enforce
from numad.host.scratch import scratch_mkdir
from numad.host.targets import Scan
from numad.placement.resize import resize
from numad.workload import quantity, reader
from tests.campaign import MACHINE, Crash, Simulation, Violation, hostile, outages, run, steps
from tests.conftest import Machines

OUTAGES = {
    "cgroup gone while numad was down",
    "numad run client killed",
    "state disk full during reconcile",
    "cpuset drift",
    "unreadable cpuset",
    "hostile number",
    "admitted below a stray",
}


@pytest.mark.parametrize("seed", range(4))
def test_no_promise_breaks_under_random_faults(
    machines: Machines, tmp_path: Path, seed: int
) -> None:
    sim = run(machines.root(MACHINE), tmp_path, seed, steps=1000)
    assert sim.steps == 1000
    assert sim.checks > 1000  # checked after each step and each cgroup write
    assert sum(sim.faults.injected.values()) > 50  # the faults really came
    assert set(sim.faults.injected) >= OUTAGES  # each kind of them
    assert sim.admitted > 50  # the workloads really came
    assert sim.moves["admissions"] > 0  # some came only by moving others


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
    _crash_at_each_write(machines, tmp_path, _scenario, range(writes))


def _crash_at_each_write(
    machines: Machines, tmp_path: Path, scenario: Callable[[Simulation], object], at: range
) -> None:
    """``scenario`` on a fresh simulation once per write of ``at``, crashed at that
    write; then a restart, the promises checked, and the daemon settled."""
    for write in at:
        sim = Simulation(machines.root(MACHINE), tmp_path / f"crash{write}", seed=0)
        sim.writes = 0
        sim.faults.crash_in = write
        with contextlib.suppress(Crash):
            scenario(sim)
            raise AssertionError(f"no crash at write {write}")  # pragma: no cover
        sim.restart()
        sim.check(f"after a crash at write {write}")
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


def _resize_scenario(sim: Simulation) -> list[int]:
    """The scenario's workloads (w2: 6 CPUs, w3: 500m, w4: 8; on node 0), then resizes:
    a shrink, a grow, two grows past the node (refused), a shrink, each moving CPUs
    between a workload and the pool; the statuses answered."""
    _scenario(sim)
    answered = []
    for name, cpus in (("w4", 2), ("w2", 10), ("w2", 20), ("w4", 5), ("w2", 3)):
        status, answer = sim.daemon.resize(name, json.dumps({"cpus": cpus}).encode())
        assert status in (200, 409), answer
        answered.append(status)
    return answered


def test_a_crash_at_any_cgroup_write_of_a_resize_breaks_no_promise(
    machines: Machines, tmp_path: Path
) -> None:
    """The resize scenario once to count its writes, then a crash at each write after
    the admissions', a restart, and the promises checked."""
    clean = Simulation(machines.root(MACHINE), tmp_path / "clean", seed=0)
    _scenario(clean)
    first = clean.writes
    counted = Simulation(machines.root(MACHINE), tmp_path / "counted", seed=0)
    assert _resize_scenario(counted) == [200, 200, 409, 409, 200]
    assert counted.writes > first + 4
    _crash_at_each_write(machines, tmp_path, _resize_scenario, range(first, counted.writes))


def _settled_before_move(sim: Simulation) -> None:
    """w1 (4 CPUs, movable) and w3 (6) on node 0, w2 (12) on node 1: 4 CPUs free on
    each node (of 14 and 16 outside the reserved ones)."""
    for name, cpus, movable in (("w1", 4, True), ("w2", 12, False), ("w3", 6, False)):
        scratch_mkdir(sim.cgroups, f"numad.slice/{name}")
        assert sim.admit(
            {"name": name, "cgroup": f"numad.slice/{name}", "cpus": cpus, "movable": movable}
        )
    scratch_mkdir(sim.cgroups, "numad.slice/w4")


def _move_scenario(sim: Simulation) -> None:
    """Then w4 asks 8 CPUs: it fits only once w1 moves to node 1 (a change of two
    workloads: w1 rewritten to node 1's CPUs, then w4 granted w1's old ones)."""
    _settled_before_move(sim)
    assert sim.admit({"name": "w4", "cgroup": "numad.slice/w4", "cpus": 8})


def test_a_crash_at_any_cgroup_write_of_a_move_breaks_no_promise(
    machines: Machines, tmp_path: Path
) -> None:
    """The move scenario once to count its writes (and see the move made), then a crash
    at each write of the admission that moves w1, a restart, the promises checked."""
    clean = Simulation(machines.root(MACHINE), tmp_path / "clean", seed=0)
    _settled_before_move(clean)
    first = clean.writes
    held = clean.daemon.books.cpu.assignments
    w1_before = held[("w1", "main")]
    node = clean.daemon.engine.cpu_policy.topo.numa
    assert w1_before & node[0] == w1_before
    assert clean.admit({"name": "w4", "cgroup": "numad.slice/w4", "cpus": 8})
    held = clean.daemon.books.cpu.assignments
    assert held[("w1", "main")] & node[1] == held[("w1", "main")]  # w1 moved to node 1
    assert held[("w4", "main")] & w1_before == w1_before  # w4 got the CPUs w1 left
    assert clean.writes >= first + 2  # w1 rewritten, then w4 granted
    _crash_at_each_write(machines, tmp_path, _move_scenario, range(first, clean.writes))


def _moves_cpus_on_resize(mp: pytest.MonkeyPatch) -> None:
    """A resize that swaps a CPU it held for a free one (no grow keeps all then)."""

    def swapping(engine: Any, books: Any, key: Any, **kw: Any) -> Any:
        done = resize(engine, books, key, **kw)
        now, free = done.books.cpu.assignments.get(key, 0), done.books.cpu.available
        if done.refused or not now or not free:
            return done
        held = dict(done.books.cpu.assignments)
        held[key] = (now & (now - 1)) | (free & -free)  # its lowest CPU for a free one
        cpu = dataclasses.replace(done.books.cpu, assignments=MappingProxyType(held))
        return dataclasses.replace(done, books=dataclasses.replace(done.books, cpu=cpu))

    mp.setattr(resizes, "resize", swapping)


def _stops_at_a_failed_commit(mp: pytest.MonkeyPatch) -> None:
    """Before: a pass on a full state disk retried the commit and stopped there."""
    whole = reconcile.Reconciler._pass

    def stopping(self: reconcile.Reconciler, scan: Scan) -> int | None:
        if self.health.has("checkpoint"):
            try:
                self.commits.commit(self.held.books, self.held.specs)
            except CheckpointError:
                return 0
        return whole(self, scan)

    mp.setattr(reconcile.Reconciler, "_pass", stopping)


def _forgets_what_it_saw(mp: pytest.MonkeyPatch) -> None:
    """Before: that a workload's cgroup existed lived in memory only."""
    encode = state.encode
    mp.setattr(state, "encode", lambda cp: encode(dataclasses.replace(cp, seen=())))


def _converts_huge_integers(mp: pytest.MonkeyPatch) -> None:
    """Before: a huge integer was converted to Decimal (~20 s for a million hex
    digits, then decimal.Overflow); here a thousand digits overflow, to be quick."""
    mp.setattr(quantity, "MAX_BITS", 1 << 40)
    mp.setattr(reader, "EXACT", Context(prec=200, Emax=1_000))
    mp.setattr(hostile, "SIZES", (1_000,))


def _moves_the_fixed(mp: pytest.MonkeyPatch) -> None:
    """The search told every workload is movable (under the lock and after it)."""
    decide = moving.decide

    def all_movable(held: Any, request: Any, resident: Any) -> Any:
        specs = held.specs
        held.specs = {n: dataclasses.replace(s, movable=True) for n, s in specs.items()}
        try:
            return decide(held, request, resident)
        finally:
            held.specs = specs

    mp.setattr(admissions, "decide", all_movable)
    search = moving.search

    def searched_all_movable(view: Any, *args: Any) -> Any:  # the search after the lock
        specs = {n: dataclasses.replace(s, movable=True) for n, s in view.specs.items()}
        return search(dataclasses.replace(view, specs=specs), *args)

    mp.setattr(admissions, "search", searched_all_movable)


@dataclasses.dataclass(frozen=True)
class Broken:
    step: Callable[[Simulation], None]
    mutant: Callable[[pytest.MonkeyPatch], None]  # undoes the fix in this process
    found: str  # in the Violation
    churn: bool = False  # workloads released between rounds (names run out otherwise)


BROKEN = [
    pytest.param(
        Broken(outages.gone_while_down, _forgets_what_it_saw, "still held after the grace"),
        id="gone-while-down",
    ),
    pytest.param(
        Broken(
            outages.killed_client,
            lambda mp: mp.setattr(reconcile.Reconciler, "_idle", lambda *_: False),
            "after it emptied",
        ),
        id="killed-client",
    ),
    pytest.param(
        Broken(outages.full_disk, _stops_at_a_failed_commit, "on a full disk"), id="full-disk"
    ),
    pytest.param(
        Broken(
            outages.unreadable_cpuset,
            lambda mp: mp.setattr(enforce.Enforcer, "_applied_above", lambda *_: -1),
            "not granted; no other cgroup runs there",
            churn=True,
        ),
        id="unreadable-blocks-every-cpu",
    ),
    pytest.param(
        Broken(hostile.hostile_numbers, _converts_huge_integers, "raised Overflow"),
        id="huge-integer-converted",
    ),
    pytest.param(
        Broken(steps.resize, _moves_cpus_on_resize, "both added and removed CPUs"),
        id="resize-moves-cpus",
    ),
    pytest.param(
        Broken(steps.move, _moves_the_fixed, "not movable, but moved"),
        id="moves-a-fixed-workload",
    ),
    pytest.param(
        Broken(
            steps.admit_below,
            lambda mp: mp.setattr(others, "around", lambda *_: []),
            "bounded by an isolated cgroup before, runs on",
            churn=True,
        ),
        id="gives-back-before-the-strays-below-are-written",
    ),
    pytest.param(
        Broken(
            steps.cgroup_churn,
            lambda mp: mp.setattr(commits.Commits, "_write_made", lambda *_: None),
            "a workload's cgroup with an empty cpuset, runs on",
            churn=True,
        ),
        id="leaves-a-made-workload-cgroup-to-the-next-pass",
    ),
    pytest.param(
        Broken(
            outages.unreadable_cpuset,
            lambda mp: mp.setattr(enforce.Enforcer, "_hold_back", lambda *_: None),
            "a workload's cgroup with an empty cpuset, runs on",
            churn=True,
        ),
        id="leaves-a-waiting-grant-on-every-cpu",
    ),
]


def _rounds(sim: Simulation, step: Callable[[Simulation], None], *, churn: bool) -> None:
    try:
        for _ in range(20):
            sim.steps += 1
            steps.admit(sim)
            steps.admit(sim)
            step(sim)
            sim.check(f"step {sim.steps}")
            if churn:
                steps.release(sim)
                steps.release(sim)
    finally:
        sim.close()


@pytest.mark.parametrize("broken", BROKEN)
def test_each_newer_step_catches_its_promise_broken(
    machines: Machines, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, broken: Broken
) -> None:
    """numad with the step's promise broken again as it once was: a few rounds of
    admissions and the step raise Violation."""
    broken.mutant(monkeypatch)
    sim = Simulation(machines.root(MACHINE), tmp_path, seed=7)
    with pytest.raises(Violation, match=broken.found):
        _rounds(sim, broken.step, churn=broken.churn)
