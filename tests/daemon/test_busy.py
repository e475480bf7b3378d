"""A busy host (issue 23): the cost of a pass grows with what changed, and the
daemon's lock says how long it is held. On the recorded 2-socket machine with a
scratch v2 tree."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from numad.cpuset import CPUSet
from numad.daemon.holdings import TimedLock
from numad.host import durable, isolation_file
from numad.host.cgroup.path import MAX_DEPTH
from numad.host.scratch import scratch_mkdir
from tests.conftest import Machines, recorded_daemon


def test_new_strays_cost_one_isolation_record_write_per_pass(
    machines: Machines, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: isolation.json was rewritten and fsynced once per new cgroup, so a
    pass over N new cgroups wrote N files of O(N) bytes each."""
    daemon = recorded_daemon(machines, tmp_path)
    spec = {"name": "db", "cgroup": "numad.slice/db", "cpus": 4}
    assert daemon.admit(daemon.parse(json.dumps(spec), "json")).admitted
    tree = Path(str(daemon.fs.root)) / "sys/fs/cgroup"
    for i in range(300):
        scratch_mkdir(tree, f"numad.slice/stray{i}")
    writes: list[str] = []
    real = durable.write_file

    def counted(*args: Any, **kwargs: Any) -> None:
        writes.append(str(args[1]))
        real(*args, **kwargs)

    monkeypatch.setattr(isolation_file, "write_file", counted)
    daemon.reconcile()
    assert writes == [isolation_file.FILE]
    record = json.loads((daemon.state_dir / isolation_file.FILE).read_text())
    assert {f"numad.slice/stray{i}" for i in range(300)} <= set(record["cgroups"])
    writes.clear()
    daemon.reconcile()  # nothing new: nothing written
    assert writes == []


def test_the_lock_reports_each_outermost_hold_once() -> None:
    held: list[float] = []
    lock = TimedLock(held.append)
    with lock:
        with lock:  # re-entered: one hold
            pass
        assert held == []
    assert len(held) == 1
    assert held[0] >= 0
    assert lock.acquire(blocking=False)
    lock.release()
    assert len(held) == 2


def test_requests_and_passes_are_measured_in_the_lock_histogram(
    machines: Machines, tmp_path: Path
) -> None:
    daemon = recorded_daemon(machines, tmp_path)

    def count() -> float:
        value = daemon.metrics.registry.get_sample_value("numad_lock_held_seconds_count")
        return value or 0.0

    before = count()
    daemon.reconcile()
    spec = {"name": "db", "cgroup": "numad.slice/db", "cpus": 4}
    assert daemon.admit(daemon.parse(json.dumps(spec), "json")).admitted
    assert count() >= before + 2


@pytest.mark.parametrize("partitions", [False, True])
def test_each_cpuset_write_is_timed_by_kind(
    machines: Machines, tmp_path: Path, partitions: bool
) -> None:
    """``numad_cgroup_write_seconds{kind}``: a grant (with its partition) and each
    shared write, one observation per write that went through, none for a write that
    had nothing to change."""
    daemon = recorded_daemon(machines, tmp_path, {"host": {"partitions": partitions}})
    tree = Path(str(daemon.fs.root)) / "sys/fs/cgroup"
    for i in range(3):
        scratch_mkdir(tree, f"numad.slice/stray{i}")

    def count(kind: str) -> float:
        value = daemon.metrics.registry.get_sample_value(
            "numad_cgroup_write_seconds_count", {"kind": kind}
        )
        return value or 0.0

    daemon.reconcile()
    shared, grants = count("shared"), count("grant")
    assert shared >= (0 if partitions else 3)  # the strays, isolated one by one
    assert grants == 0
    scratch_mkdir(tree, "numad.slice/db")
    spec = {"name": "db", "cgroup": "numad.slice/db", "cpus": 4}
    assert daemon.admit(daemon.parse(json.dumps(spec), "json")).admitted
    assert count("grant") == 1
    assert count("shared") == shared + (0 if partitions else 3)  # each stray shrinks first
    total = daemon.metrics.registry.get_sample_value(
        "numad_cgroup_write_seconds_sum", {"kind": "grant"}
    )
    assert total is not None
    assert total > 0
    daemon.reconcile()  # nothing changed: nothing written, nothing observed
    assert count("grant") == 1


def test_a_deep_chain_is_bounded_and_named_in_health(machines: Machines, tmp_path: Path) -> None:
    """A 200-deep chain in a managed root: its outermost level is isolated, which bounds
    every level below it (cgroup v2), and the levels past the bound are named in health.
    Before: every level was isolated, each write resolving every level above it (a
    400-deep chain took 9 minutes a pass)."""
    daemon = recorded_daemon(machines, tmp_path)
    tree = Path(str(daemon.fs.root)) / "sys/fs/cgroup"
    chain = "numad.slice/" + "/".join(f"d{i}" for i in range(200))
    scratch_mkdir(tree, chain)
    daemon.reconcile()
    assert {p for p in daemon.others if p.startswith("numad.slice/d0")} == {"numad.slice/d0"}
    spec = {"name": "db", "cgroup": "numad.slice/db", "cpus": 4}
    assert daemon.admit(daemon.parse(json.dumps(spec), "json")).admitted
    exclusive = CPUSet.from_bits(daemon.books.cpu.exclusive)
    inside = "/".join(chain.split("/")[:MAX_DEPTH])  # the deepest level within the bound
    assert inside.count("/") == MAX_DEPTH - 1
    cpus = CPUSet.parse_list((tree / inside / "cpuset.cpus.effective").read_text())
    assert cpus == CPUSet.from_bits(daemon.books.cpu.shared_pool)
    assert not cpus & exclusive
    problems = [p for p in daemon.problems if "levels or more deep" in p]
    assert len(problems) == 1
    assert problems[0].startswith(f"numad.slice/{'/'.join(f'd{i}' for i in range(MAX_DEPTH))}:")
    assert f"{200 - MAX_DEPTH + 1} cgroups in numad.slice" in problems[0]


def test_stopping_ends_a_pass_between_two_writes(
    machines: Machines, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM during a long pass (thousands of strays): no cgroup write after it,
    then every isolated cgroup gets its own setting back."""
    daemon = recorded_daemon(machines, tmp_path)
    tree = Path(str(daemon.fs.root)) / "sys/fs/cgroup"
    for i in range(60):
        scratch_mkdir(tree, f"numad.slice/stray{i}")
    writes: list[str] = []
    real = daemon.isolation.write

    def write(path: str, cpus: Any, mems: Any) -> None:
        writes.append(path)
        if len(writes) == 5:
            daemon.interrupt()  # as the SIGTERM handler does
        real(path, cpus, mems)

    monkeypatch.setattr(daemon.isolation, "write", write)
    daemon.reconcile()
    assert len(writes) == 5
    daemon.reconcile()  # a pass after the signal does nothing
    assert len(writes) == 5
    monkeypatch.undo()
    daemon.stop()
    assert not daemon.isolation.originals  # all given back
