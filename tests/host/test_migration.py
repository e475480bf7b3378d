"""Memory follows placement without stalling numad (numad/migration.py), on the recorded
2-socket machine with a scratch cgroup v2 tree. A scratch tree has no pages, so the
tests stand in for the kernel's memory.numa_stat (``Pages``) and, for the pull, for
migrate_pages(2); the VM tier moves real pages on real kernels."""

from __future__ import annotations

import functools
import json
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest

from numad.cpuset import CPUSet, NodeSet
from numad.daemon.root import Daemon
from numad.host.memory_move import narrow_job, pull_job
from numad.host.scratch import scratch_mkdir
from tests.conftest import Machines, recorded_daemon

MIB = 1 << 20


class Pages:
    """memory.numa_stat's anon line per cgroup, as the kernel would report it: the
    pages sit on ``home`` until the cgroup's mems exclude it or they are pulled."""

    def __init__(self, daemon: Daemon, size: int, home: int) -> None:
        self.tree = Path(str(daemon.fs.root)) / "sys/fs/cgroup"
        self.size = size
        self.where: dict[str, int] = {}
        self.home = home

    def __call__(self, cgroup_dir: Path) -> dict[int, int] | None:
        if not cgroup_dir.is_dir():
            return None  # gone: the kernel's reader finds no memory.numa_stat either
        path = str(cgroup_dir.relative_to(self.tree))
        node = self.where.setdefault(path, self.home)
        mems = NodeSet.parse_list((cgroup_dir / "cpuset.mems").read_text())
        if mems and node not in mems:  # v2 moved them inside the mems write
            node = self.where[path] = min(mems)
        return {node: self.size}


class SlowMems:
    """The backend, except that a mems-only write (the mover's) waits for ``go``."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.go = threading.Event()
        self.waiting = threading.Event()

    def write(self, path: str, cpus: CPUSet | None, mems: NodeSet | None) -> None:
        if cpus is None and mems is not None:
            self.waiting.set()
            assert self.go.wait(10), "the test never let the mems write go"
        self.inner.write(path, cpus, mems)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _daemon(machines: Machines, tmp_path: Path, policy: str, home: int) -> tuple[Daemon, Pages]:
    daemon = recorded_daemon(machines, tmp_path, {"memory": {"policy": policy}})
    pages = Pages(daemon, 64 * MIB, home)
    daemon.migrations.read_anon = pages
    daemon.migrations.emulated = False  # behave as on a real hierarchy
    return daemon, pages


def _admit(daemon: Daemon, name: str, **extra: Any) -> None:
    spec = {"name": name, "cgroup": f"numad.slice/{name}", "cpus": 4, **extra}
    assert daemon.admit(daemon.parse(json.dumps(spec), "json")).admitted


def _moved(daemon: Daemon) -> float:
    value = daemon.metrics.registry.get_sample_value("numad_memory_moved_bytes_total")
    return value or 0.0


def test_a_mems_write_that_moves_pages_runs_in_the_background_not_under_the_lock(
    machines: Machines, tmp_path: Path
) -> None:
    daemon, pages = _daemon(machines, tmp_path, "static", home=1)
    slow = SlowMems(daemon.isolation.cgroups)
    daemon.isolation.cgroups = slow
    daemon.migrations.cgroups = daemon.isolation
    _admit(daemon, "db", memory="1Gi")  # answers at once
    shown = daemon.show("db")
    mems = NodeSet.parse_list(shown["containers"]["main"]["mems"])
    assert slow.waiting.wait(10)  # the mover is inside the (slow) write
    assert shown["state"] == "migrating"
    assert daemon.show("db")["state"] == "migrating"
    # The lock is free and admissions go on while the pages move.
    assert daemon.lock.acquire(timeout=1)
    daemon.lock.release()
    scratch_mkdir(pages.tree, "numad.slice/web")
    _admit(daemon, "web")
    daemon.reconcile()  # the read-back does not take the unwritten mems for drift
    assert daemon.repairs == 0
    slow.go.set()
    assert daemon.migrations.mover.drain(10)
    tree = pages.tree
    assert NodeSet.parse_list((tree / "numad.slice/db/cpuset.mems").read_text()) == mems
    memory = daemon.show("db")["memory"]
    assert memory["state"] == "placed"
    assert memory["locality"] == 1.0
    assert memory["moves"][0]["bytes_moved"] == 64 * MIB
    assert _moved(daemon) >= 64 * MIB
    daemon.stop()


def test_pages_off_the_cpus_nodes_are_pulled_there_with_policy_none(
    machines: Machines, tmp_path: Path
) -> None:
    daemon, pages = _daemon(machines, tmp_path, "none", home=1)
    calls: list[tuple[int, NodeSet, NodeSet]] = []

    def migrate(pid: int, old: NodeSet, new: NodeSet) -> int:
        calls.append((pid, old, new))
        pages.where["numad.slice/db"] = min(new)
        return 0

    daemon.migrations.make_pull = functools.partial(
        pull_job, migrate=migrate, free=lambda node: 1 << 40
    )
    (pages.tree / "numad.slice/db/cgroup.procs").write_text("4242\n")
    _admit(daemon, "db")
    assert daemon.migrations.mover.drain(10)
    cpus = CPUSet.parse_list(daemon.show("db")["containers"]["main"]["cpus"])
    assert daemon.topology.nodes_of_cpus(cpus) == NodeSet([0])  # its pages sit on node 1
    assert calls == [(4242, NodeSet([1]), NodeSet([0]))]
    memory = daemon.show("db")["memory"]
    assert memory["locality"] == 1.0
    assert memory["state"] == "placed"
    daemon.stop()


def test_pull_can_be_turned_off(machines: Machines, tmp_path: Path) -> None:
    daemon = recorded_daemon(machines, tmp_path, {"memory": {"policy": "none", "pull": False}})
    daemon.migrations.read_anon = Pages(daemon, 64 * MIB, home=1)
    daemon.migrations.emulated = False
    _admit(daemon, "db")
    assert daemon.migrations._mover is None  # nothing was ever queued
    daemon.stop()


def test_a_workload_whose_locality_stays_low_is_listed_in_health(
    machines: Machines, tmp_path: Path
) -> None:
    daemon, _ = _daemon(machines, tmp_path, "none", home=1)
    daemon.migrations.make_pull = functools.partial(
        pull_job,
        migrate=lambda pid, old, new: 0,
        free=lambda node: 0,  # never fits
    )
    _admit(daemon, "db")
    assert daemon.migrations.mover.drain(10)
    cpus = CPUSet.parse_list(daemon.show("db")["containers"]["main"]["cpus"])
    assert daemon.topology.nodes_of_cpus(cpus) == NodeSet([0])  # its pages sit on node 1
    assert daemon.show("db")["memory"]["locality"] == 0.0
    assert daemon.show("db")["memory"]["moves"][0]["outcome"] == "skipped"
    for _ in range(2):
        daemon.reconcile()
    assert not any(p.startswith("db:") for p in daemon.problems)
    daemon.reconcile()  # the third pass in a row
    assert any("0% of its memory is on its own NUMA nodes" in p for p in daemon.problems)
    gauge = daemon.metrics.registry.get_sample_value(
        "numad_workload_memory_locality_ratio", {"workload": "db"}
    )
    assert gauge == 0.0
    daemon.release("db")
    assert not any("own NUMA nodes" in p for p in daemon.problems)
    daemon.stop()


def test_a_failed_move_is_shown_and_the_mems_written_again(
    machines: Machines, tmp_path: Path
) -> None:
    daemon, _ = _daemon(machines, tmp_path, "static", home=1)

    class Failing(SlowMems):
        def write(self, path: str, cpus: CPUSet | None, mems: NodeSet | None) -> None:
            if cpus is None and mems is not None and not self.go.is_set():
                raise OSError("injected: the write failed")
            self.inner.write(path, cpus, mems)

    failing = Failing(daemon.isolation.cgroups)
    daemon.isolation.cgroups = failing
    _admit(daemon, "db", memory="1Gi")
    assert daemon.migrations.mover.drain(10)
    assert any("moving its memory failed" in p for p in daemon.problems)
    failing.go.set()
    daemon.reconcile()  # written again, through the mover
    assert daemon.migrations.mover.drain(10)
    daemon.reconcile()
    assert not any("moving its memory failed" in p for p in daemon.problems)
    daemon.stop()


@pytest.mark.parametrize("then", ["written at once", "cgroup gone"])
def test_a_failed_moves_problem_ends_when_the_mems_need_no_move_or_the_cgroup_goes(
    machines: Machines, tmp_path: Path, then: str
) -> None:
    """Seen in the systemd guest: a unit's move timed out on a slow systemd, its mems
    were written later without a move (or the unit stopped), and health kept saying
    the move failed. The enforcer's own write, or the cgroup's end, settles it."""
    daemon, pages = _daemon(machines, tmp_path, "static", home=1)

    class Failing(SlowMems):
        def write(self, path: str, cpus: CPUSet | None, mems: NodeSet | None) -> None:
            if cpus is None and mems is not None:
                raise OSError("injected: no reply from systemd within 5 s")
            self.inner.write(path, cpus, mems)

    daemon.isolation.cgroups = Failing(daemon.isolation.cgroups)
    _admit(daemon, "db", memory="1Gi")
    assert daemon.migrations.mover.drain(10)
    assert any("moving its memory failed" in p for p in daemon.problems)
    if then == "written at once":
        pages.where["numad.slice/db"] = 0  # its pages sit on its node now: nothing to move
    else:
        shutil.rmtree(pages.tree / "numad.slice/db")
    daemon.reconcile()
    assert not any("moving its memory failed" in p for p in daemon.problems)
    daemon.stop()


def test_pages_move_with_migrate_pages_before_the_mems_narrow(
    machines: Machines, tmp_path: Path
) -> None:
    """The mems write alone would move the pages in the kernel's cpuset workqueue,
    which every other cpuset write waits for (benchmarks/migration.py measured an
    admission held 4.1 s): the cgroup holds the old and new nodes while the mover
    moves the pages process by process, and only then narrows."""
    daemon, pages = _daemon(machines, tmp_path, "static", home=1)
    moved: list[tuple[int, NodeSet, NodeSet]] = []

    def migrate(pid: int, old: NodeSet, new: NodeSet) -> int:
        moved.append((pid, old, new))
        pages.where["numad.slice/db"] = min(new)
        return 0

    daemon.migrations.make_narrow = functools.partial(narrow_job, migrate=migrate)
    slow = SlowMems(daemon.isolation.cgroups)
    daemon.isolation.cgroups = slow
    (pages.tree / "numad.slice/db/cgroup.procs").write_text("4242\n")
    _admit(daemon, "db", memory="1Gi")
    assert slow.waiting.wait(10)  # the mover is at the narrowing write
    mems_file = pages.tree / "numad.slice/db/cpuset.mems"
    assert NodeSet.parse_list(mems_file.read_text()) == NodeSet([0, 1])  # old and new
    assert moved == [(4242, NodeSet([1]), NodeSet([0]))]  # already moved, by the mover
    slow.go.set()
    assert daemon.migrations.mover.drain(10)
    assert NodeSet.parse_list(mems_file.read_text()) == NodeSet([0])
    assert daemon.show("db")["memory"]["moves"][0]["bytes_moved"] == 64 * MIB
    daemon.stop()
