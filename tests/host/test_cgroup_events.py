"""New cgroups seen when they appear (issue 23): inotify on the managed roots, and
the daemon isolating a new cgroup with no reconcile pass at all. On a scratch v2 tree
of the recorded 2-socket machine: plain directories, the same IN_CREATE as cgroupfs."""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

from numad.cpuset import CPUSet
from numad.daemon.loops import Supervisor, cgroup_loop, reconcile_loop
from numad.host.cgroup.events import CgroupEvents
from numad.host.cgroup.hierarchy import SCRATCH_MARKER, KernelMutex
from numad.host.cgroup.path import MAX_DEPTH
from numad.host.drift import drifted
from numad.host.scratch import scratch_mkdir
from tests.conftest import Machines, recorded_daemon


def _read_until(events: CgroupEvents, want: set[str], seconds: float = 10.0) -> set[str]:
    seen: set[str] = set()
    deadline = time.monotonic() + seconds  # a bound for a hung test, not a speed goal
    while not want <= seen and time.monotonic() < deadline:
        seen.update(events.read(0.2))
    return seen


def test_new_directories_are_reported_nested_ones_too(tmp_path: Path) -> None:
    (tmp_path / "numad.slice/old").mkdir(parents=True)
    (tmp_path / "system.slice").mkdir()
    events = CgroupEvents(tmp_path, ["numad.slice"])
    try:
        assert events.read(0.05) == []
        (tmp_path / "numad.slice/a").mkdir()
        (tmp_path / "numad.slice/old/b").mkdir()  # in a directory watched from the start
        assert _read_until(events, {"numad.slice/a", "numad.slice/old/b"}) == {
            "numad.slice/a",
            "numad.slice/old/b",
        }
        # A subtree made at once (mkdir -p): its lower levels may exist before the
        # new directory's watch does; they are found by listing it.
        (tmp_path / "numad.slice/p/q/r").mkdir(parents=True)
        got = _read_until(events, {"numad.slice/p", "numad.slice/p/q", "numad.slice/p/q/r"})
        assert got == {"numad.slice/p", "numad.slice/p/q", "numad.slice/p/q/r"}
        (tmp_path / "system.slice/x").mkdir()  # not in a managed root
        (tmp_path / "numad.slice/file").write_text("")  # not a directory
        assert events.read(0.2) == []
    finally:
        events.close()


def test_a_managed_root_made_later_is_followed(tmp_path: Path) -> None:
    """numad.slice appears with its first unit, after numad started."""
    events = CgroupEvents(tmp_path, ["machine.slice/numad"])
    try:
        (tmp_path / "machine.slice/numad/vm1/vcpu0").mkdir(parents=True)
        (tmp_path / "machine.slice/other").mkdir()  # beside the root: not numad's
        got = _read_until(events, {"machine.slice/numad/vm1", "machine.slice/numad/vm1/vcpu0"})
        assert got == {"machine.slice/numad/vm1", "machine.slice/numad/vm1/vcpu0"}
        (tmp_path / "machine.slice/numad/vm2").mkdir()
        assert _read_until(events, {"machine.slice/numad/vm2"}) == {"machine.slice/numad/vm2"}
    finally:
        events.close()


def test_events_lost_to_an_overflow_are_found_by_looking_again(tmp_path: Path) -> None:
    """More new directories at once than the kernel queues (fs.inotify.max_queued_events):
    the kernel drops the rest and says so (IN_Q_OVERFLOW). The directories whose events
    were lost are still reported, and watched, so what is made in them later is too."""
    queued = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    (tmp_path / "numad.slice").mkdir()
    events = CgroupEvents(tmp_path, ["numad.slice"])
    try:
        made = [f"numad.slice/c{i}" for i in range(queued + 20)]
        for path in made:
            (tmp_path / path).mkdir()  # nothing read meanwhile: the queue overflows
        seen = _read_until(events, set(made), seconds=60)
        assert events.overflows >= 1
        assert set(made) <= seen
        last = made[-1] + "/child"  # in a directory whose own event was lost
        (tmp_path / last).mkdir()
        assert last in _read_until(events, {last})
    finally:
        events.close()


def test_a_chain_deeper_than_the_bound_is_not_followed(tmp_path: Path) -> None:
    (tmp_path / "numad.slice").mkdir()
    events = CgroupEvents(tmp_path, ["numad.slice"])
    try:
        chain = "numad.slice/" + "/".join(f"d{i}" for i in range(MAX_DEPTH + 8))
        (tmp_path / chain).mkdir(parents=True)
        seen = _read_until(events, set(), 0.5)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and (more := events.read(0.2)):
            seen.update(more)
        assert seen  # the chain is seen down to the bound, and no further
        assert max(p.count("/") for p in seen) == MAX_DEPTH - 1
    finally:
        events.close()


def test_a_removed_cgroup_is_reported_and_wakes_the_reconcile_loop(
    machines: Machines, tmp_path: Path
) -> None:
    """A unit stopped, a container gone: the daemon releases and resets on the pass
    the removal wakes, not at the end of the period."""
    (tmp_path / "numad.slice/a/inner").mkdir(parents=True)
    (tmp_path / "system.slice/x").mkdir(parents=True)
    events = CgroupEvents(tmp_path, ["numad.slice"])
    try:
        (tmp_path / "numad.slice/a/inner").rmdir()
        (tmp_path / "system.slice/x").rmdir()  # not in a managed root: not watched
        deadline = time.monotonic() + 10  # a bound for a hung test, not a speed goal
        while time.monotonic() < deadline and not events.removed:
            events.read(0.2)
        assert events.removed == ["numad.slice/a/inner"]
    finally:
        events.close()
    wake, stop = threading.Event(), threading.Event()
    found: list[list[str]] = []
    opened: list[CgroupEvents] = []

    def open_events() -> CgroupEvents:
        opened.append(CgroupEvents(tmp_path, ["numad.slice"]))
        return opened[0]

    daemon = recorded_daemon(machines, tmp_path / "daemon")
    supervisor = Supervisor(daemon.log, daemon.metrics, daemon.health)
    loop = threading.Thread(
        target=cgroup_loop, args=(supervisor, open_events, found.append, stop, wake)
    )
    loop.start()
    try:
        deadline = time.monotonic() + 10
        while not opened and time.monotonic() < deadline:
            time.sleep(0.02)
        (tmp_path / "numad.slice/a").rmdir()
        assert wake.wait(10), "the removal did not wake the reconcile loop"
        assert found == []  # nothing made: nothing to isolate
    finally:
        stop.set()
        loop.join(5)
    assert not loop.is_alive()


def test_a_new_cgroup_is_isolated_before_any_reconcile_pass(
    machines: Machines, tmp_path: Path
) -> None:
    daemon = recorded_daemon(machines, tmp_path)
    spec = {"name": "db", "cgroup": "numad.slice/db", "cpus": 6}
    assert daemon.admit(daemon.parse(json.dumps(spec), "json")).admitted
    exclusive = CPUSet.from_bits(daemon.books.cpu.exclusive)
    tree = Path(str(daemon.fs.root)) / "sys/fs/cgroup"
    supervisor = Supervisor(daemon.log, daemon.metrics, daemon.health)
    stop = threading.Event()
    passes = daemon.held.passes
    loop = threading.Thread(
        target=cgroup_loop,
        args=(supervisor, lambda: CgroupEvents(tree, ["numad.slice"]), daemon.isolate_new, stop),
    )
    loop.start()
    try:
        time.sleep(0.3)  # the watches are in place
        (tree / "numad.slice/newcomer").mkdir()
        cpus = tree / "numad.slice/newcomer/cpuset.cpus"
        deadline = time.monotonic() + 10  # a bound for a hung test; no pass runs meanwhile
        while time.monotonic() < deadline:
            text = cpus.read_text().strip() if cpus.exists() else ""
            if text and not CPUSet.parse_list(text) & exclusive:
                break
            time.sleep(0.02)
        held = CPUSet.parse_list(cpus.read_text())
        assert held, "the new cgroup was not written"
        assert not held & exclusive
        assert held == CPUSet.from_bits(daemon.books.cpu.shared_pool)
        assert "numad.slice/newcomer" in daemon.others
        assert daemon.held.passes == passes  # the event did it, not a pass
        # The workload's own cgroup and anything inside it are not the event path's.
        (tree / "numad.slice/db/inner").mkdir()
        time.sleep(0.5)
        assert "numad.slice/db/inner" not in daemon.others
        # A new top-level cgroup (machine.slice at the first VM): isolated as a whole.
        scratch_mkdir(tree, "machine.slice")
        top = tree / "machine.slice/cpuset.cpus"
        deadline = time.monotonic() + 10  # a bound for a hung test; no pass runs meanwhile
        while time.monotonic() < deadline and not top.read_text().strip():
            time.sleep(0.02)
        assert CPUSet.parse_list(top.read_text()) == CPUSet.from_bits(daemon.books.cpu.shared_pool)
        assert daemon.isolation.originals["machine.slice"]["cpus"] == ""  # given back on stop
        assert daemon.held.passes == passes
    finally:
        stop.set()
        loop.join(5)
    assert not loop.is_alive()


def _modified_until(events: CgroupEvents, want: set[str], seconds: float = 10.0) -> set[str]:
    seen: set[str] = set()
    deadline = time.monotonic() + seconds  # a bound for a hung test, not a speed goal
    while not want <= seen and time.monotonic() < deadline:
        events.read(0.2)
        seen |= events.modified
        events.modified.clear()
    return seen


def test_writes_to_the_workloads_cpuset_files_are_reported(tmp_path: Path) -> None:
    """A workload's cgroup written by another (a daemon-reload) is told when it
    happens; the other cgroups' writes (numad's own, thousands) and other files not."""
    for d in ("numad.slice/db", "numad.slice/other", "system.slice/svc"):
        (tmp_path / d).mkdir(parents=True)
    events = CgroupEvents(tmp_path, ["numad.slice"])
    try:
        events.watch_writes({"numad.slice/db", "system.slice/svc", "numad.slice/later"})
        for d in ("numad.slice/db", "numad.slice/other", "system.slice/svc"):
            (tmp_path / d / "cpuset.cpus").write_text("0-3\n")
        (tmp_path / "numad.slice/db/cpu.weight").write_text("100\n")
        (tmp_path / "system.slice/svc/cpuset.mems").write_text("0\n")
        got = _modified_until(events, {"numad.slice/db", "system.slice/svc"})
        assert got == {"numad.slice/db", "system.slice/svc"}
        (tmp_path / "numad.slice/db/cpu.weight").write_text("200\n")  # not a cpuset file
        assert _modified_until(events, {"x"}, seconds=0.3) == set()

        # A workload's cgroup made after it was named: watched as it is made.
        (tmp_path / "numad.slice/later").mkdir()
        assert _read_until(events, {"numad.slice/later"}) == {"numad.slice/later"}
        (tmp_path / "numad.slice/later/cpuset.cpus.partition").write_text("root\n")
        assert _modified_until(events, {"numad.slice/later"}) == {"numad.slice/later"}

        # No longer a workload's: its writes are not told, what is made in it still is.
        events.watch_writes({"system.slice/svc"})
        (tmp_path / "numad.slice/db/cpuset.cpus").write_text("4\n")
        (tmp_path / "numad.slice/db/inner").mkdir()
        assert _read_until(events, {"numad.slice/db/inner"}) == {"numad.slice/db/inner"}
        assert events.modified == set()
        events.watch_writes(set())  # outside the managed roots: the watch ends
        (tmp_path / "system.slice/svc/cpuset.cpus").write_text("5\n")
        assert _modified_until(events, {"x"}, seconds=0.3) == set()

        # Made again (its unit restarted): watched again.
        events.watch_writes({"system.slice/svc"})
        shutil.rmtree(tmp_path / "system.slice/svc")
        (tmp_path / "system.slice/svc").mkdir()
        events.read(0.2)  # the old directory's watch ends
        events.watch_writes({"system.slice/svc"})
        (tmp_path / "system.slice/svc/cpuset.mems").write_text("1\n")
        assert _modified_until(events, {"system.slice/svc"}) == {"system.slice/svc"}
    finally:
        events.close()


def other_writer(file: Path, cpus: str) -> None:
    """Write ``cpus`` into a scratch tree's cpuset file as one step, as a write to cgroupfs
    is: a plain file is truncated, then written, and numad (woken by the truncation)
    could repair it between the two, leaving a torn file. The emulated kernel's lock
    (numad reads and writes under it) makes the two one."""
    with KernelMutex(file.parents[2] / SCRATCH_MARKER):  # sys/fs/cgroup/numad.slice/db
        file.write_text(cpus + "\n")


def test_a_workloads_cpuset_written_by_another_is_repaired_before_the_next_pass(
    machines: Machines, tmp_path: Path
) -> None:
    """Issue 23's daemon-reload gap: a workload declared by its cgroup, rewritten by
    another writer, is repaired by a pass woken by the write, with the period at an
    hour; numad's own writes to it wake nothing."""
    daemon = recorded_daemon(machines, tmp_path)
    tree = Path(str(daemon.fs.root)) / "sys/fs/cgroup"
    scratch_mkdir(tree, "numad.slice/web")
    for name, cpus in (("db", 6), ("web", 2)):
        spec = {"name": name, "cgroup": f"numad.slice/{name}", "cpus": cpus}
        assert daemon.admit(daemon.parse(json.dumps(spec), "json")).admitted
    db = tree / "numad.slice/db/cpuset.cpus"
    want = db.read_text().strip()
    online = (tree / "cpuset.cpus.effective").read_text().strip()
    assert len(CPUSet.parse_list(want)) == 6, "the test needs numad's own placement there"
    supervisor = Supervisor(daemon.log, daemon.metrics, daemon.health)
    stop, wake, woken = threading.Event(), threading.Event(), threading.Event()
    passes: list[float] = []

    def reconcile() -> None:
        passes.append(time.monotonic())
        daemon.reconcile()

    def open_events() -> CgroupEvents:
        events = CgroupEvents(tree, ["numad.slice"])
        woken.set()
        return events

    loops = [
        threading.Thread(
            target=cgroup_loop,
            args=(supervisor, open_events, daemon.isolate_new, stop, wake, daemon.commits),
        ),
        threading.Thread(target=reconcile_loop, args=(supervisor, reconcile, stop, 3600.0, wake)),
    ]
    for loop in loops:
        loop.start()
    try:
        assert woken.wait(10)
        time.sleep(0.6)  # the loop's first rounds: the workloads' watches in place
        repairs = daemon.repairs
        # numad's own write (web released: its cgroup given the pool) wakes no pass.
        daemon.release("web")
        time.sleep(1.0)
        assert passes == []
        for round_ in (1, 2):
            other_writer(db, online)
            deadline = time.monotonic() + 10  # a bound for a hung test; the period is an hour
            while time.monotonic() < deadline and (db.read_text().strip() != want):
                time.sleep(0.02)
            assert db.read_text().strip() == want, f"write {round_} not repaired"
            # One pass per write, or two: a write seen while the woken pass scans
            # before taking the lock wakes another (it repairs nothing more).
            assert round_ <= len(passes) <= 2 * round_
            assert daemon.repairs == repairs + round_
    finally:
        stop.set()
        wake.set()
        for loop in loops:
            loop.join(10)
    assert not any(loop.is_alive() for loop in loops)


def test_a_writer_fighting_numad_is_left_to_the_passes_backoff(
    machines: Machines, tmp_path: Path
) -> None:
    """What a reported write wakes a pass for (``drifted``): a cgroup that differs from
    what numad wrote, unless it was repaired twice in a row with no clean pass between
    (then only the passes repair it, less and less often); never numad's own value,
    nor a cgroup numad did not write."""
    daemon = recorded_daemon(machines, tmp_path)
    spec = {"name": "db", "cgroup": "numad.slice/db", "cpus": 6}
    assert daemon.admit(daemon.parse(json.dumps(spec), "json")).admitted
    tree = Path(str(daemon.fs.root)) / "sys/fs/cgroup"
    db, enforcer = "numad.slice/db", daemon.enforcer
    assert drifted(enforcer, {db}) == []  # numad's own value
    online = (tree / "cpuset.cpus.effective").read_text().strip()
    other_writer(tree / db / "cpuset.cpus", online)
    assert drifted(enforcer, {db, "numad.slice/never-written"}) == [db]
    enforcer.drift[db] = (1, 0)  # repaired once: a second wake
    assert drifted(enforcer, {db}) == [db]
    enforcer.drift[db] = (2, 0)  # twice in a row: the passes' backoff
    assert drifted(enforcer, {db}) == []
    daemon.reconcile()  # due: the pass repairs it a third time in a row, then backs off
    assert enforcer.drift[db][0] == 3
    assert (tree / db / "cpuset.cpus").read_text().strip() != online
    other_writer(tree / db / "cpuset.cpus", online)
    assert drifted(enforcer, {db}) == []
