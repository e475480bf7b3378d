"""numad under its own faults, one promise at a time (tests/campaign.py mixes them).

A daemon on the recorded 2-socket machine with a scratch cgroup tree; faults
come through a wrapped cgroup backend, the checkpoint's syscall seam, the
machine's sysfs files and the config.
"""

from __future__ import annotations

import json
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from numad.cpuset import CPUSet, NodeSet
from numad.daemon import state
from numad.daemon.instance import InstanceError, acquire
from numad.daemon.loops import (
    LONGEST_PASS,
    Supervisor,
    hotplug_loop,
    reconcile_loop,
    unit_loop,
    watchdog_loop,
)
from numad.daemon.metrics import Metrics
from numad.daemon.root import Daemon
from numad.daemon.watch import Event
from numad.errors import CgroupError, CheckpointError
from numad.host import durable
from numad.host.cgroup.hierarchy import BEAT_EVERY
from numad.host.cgroup.v2 import CgroupV2Backend
from numad.host.scratch import scratch_mkdir
from numad.host.systemd_bus import SystemdError
from numad.observe import Problems
from tests.conftest import Machines, recorded_daemon, restarted_daemon

NODE0 = CPUSet.parse_list("0-7,16-23")


class Faulty:
    """The real backend; ``fail`` names cgroups whose writes (or exists) fail."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.root = inner.root
        self.fail_write: set[str] = set()
        self.fail_exists: set[str] = set()
        self.raise_once: BaseException | None = None

    def exists(self, path: str) -> bool:
        if self.raise_once is not None:
            err, self.raise_once = self.raise_once, None
            raise err
        if path in self.fail_exists:
            raise CgroupError(path, "cannot tell: injected")
        return bool(self.inner.exists(path))

    def write(self, path: str, cpus: CPUSet | None, mems: NodeSet | None) -> None:
        if path in self.fail_write:
            raise CgroupError(path, "cannot write cpuset.cpus: injected EBUSY")
        self.inner.write(path, cpus, mems)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _faulty(daemon: Daemon) -> Faulty:
    faulty = Faulty(daemon.cgroups)
    daemon.cgroups = daemon.isolation.cgroups = faulty
    return faulty


def _admit(daemon: Daemon, name: str, cpus: int | str, **extra: Any) -> bool:
    spec = {"name": name, "cgroup": f"numad.slice/{name}", "cpus": cpus, **extra}
    return daemon.admit(daemon.parse(json.dumps(spec), "json")).admitted


def _cpus(daemon: Daemon, name: str) -> CPUSet:
    root = Path(str(daemon.fs.root)) / "sys/fs/cgroup/numad.slice" / name / "cpuset.cpus"
    return CPUSet.parse_list(root.read_text())


def _held(daemon: Daemon, name: str) -> CPUSet:
    return CPUSet.from_bits(daemon.books.cpu.assignments.get((name, "main"), 0))


def _loop_errors(daemon: Daemon, loop: str) -> float | None:
    return daemon.metrics.registry.get_sample_value("numad_loop_errors_total", {"loop": loop})


# -- supervision ---------------------------------------------------------------------------


def test_a_failing_reconcile_pass_is_counted_shown_and_the_next_one_clears_it(
    machines: Machines, tmp_path: Path
) -> None:
    daemon = recorded_daemon(machines, tmp_path)
    assert _admit(daemon, "db", 2)
    _faulty(daemon).raise_once = RuntimeError("a bug")
    assert not daemon.supervisor.run_once("reconcile", daemon.reconcile)
    assert _loop_errors(daemon, "reconcile") == 1
    assert daemon.problems == ["reconcile loop: RuntimeError: a bug; retried next pass"]
    assert daemon.supervisor.run_once("reconcile", daemon.reconcile)
    assert daemon.problems == []


def test_a_reconcile_that_keeps_failing_is_logged_once_and_numad_is_not_ready(
    machines: Machines, tmp_path: Path
) -> None:
    """Before: the same exception was logged with its traceback every pass (20 in
    20 s) and /v1/health stayed ready while no pass succeeded."""
    daemon = recorded_daemon(machines, tmp_path)
    log = _Log()
    supervisor = Supervisor(log, daemon.metrics, daemon.health)
    passes = [0]

    def failing() -> None:
        passes[0] += 1
        if passes[0] <= 5:
            raise RuntimeError("a bug")
        daemon.reconcile()

    for _ in range(5):
        assert not supervisor.run_once("reconcile", failing)
        assert not daemon.ready
    assert log.events.count("loop_failed") == 1
    assert _loop_errors(daemon, "reconcile") == 5  # every failure is counted
    assert supervisor.run_once("reconcile", failing)
    assert daemon.ready
    assert log.events.count("loop_recovered") == 1


def test_the_hotplug_loop_survives_a_failing_rediscovery() -> None:
    log, stop, calls = _Log(), threading.Event(), []

    def events() -> Iterator[Event]:
        calls.append("open")
        if calls.count("open") == 3:
            stop.set()  # the third time the source is opened: enough
            return
        yield ("cpu", "offline")

    def rediscover() -> None:
        calls.append("rediscover")
        if calls.count("rediscover") == 1:
            raise OSError("sysfs went away")

    metrics = Metrics()
    supervisor = Supervisor(log, metrics, _problems())
    thread = threading.Thread(target=hotplug_loop, args=(supervisor, events, rediscover, stop))
    thread.start()
    thread.join(15)
    assert not thread.is_alive()
    assert calls.count("rediscover") == 2  # after the failure, the next burst is handled
    assert metrics.registry.get_sample_value("numad_loop_errors_total", {"loop": "hotplug"}) == 1
    assert "loop_failed" in log.events


def test_the_watchdog_is_fed_only_while_reconcile_makes_progress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(2)
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        now = [100.0]
        supervisor = Supervisor(_Log(), Metrics(), _problems(), clock=lambda: now[0])
        supervisor.progress["reconcile"] = 100.0
        stop = threading.Event()
        thread = threading.Thread(target=watchdog_loop, args=(supervisor, stop, 0.05, 30.0))
        thread.start()
        try:
            assert sock.recv(64) == b"WATCHDOG=1"
            now[0] = 131.0  # no reconcile pass for 31 s: stuck or failing
            while True:  # drain what was sent before the clock moved
                sock.settimeout(0.5)
                try:
                    sock.recv(64)
                except TimeoutError:
                    break
            with pytest.raises(TimeoutError):
                sock.recv(64)
            supervisor.progress["reconcile"] = 131.0  # a pass succeeds again
            sock.settimeout(2)
            assert sock.recv(64) == b"WATCHDOG=1"
        finally:
            stop.set()
            thread.join(5)


def test_a_long_pass_feeds_the_watchdog_while_it_advances_and_a_hung_one_does_not() -> None:
    """Seen in the systemd VM: 10,000 cgroups made in numad.slice under emulation, each
    pass walked them for 25-32 s, past the 19 s window, and systemd killed a numad that
    was working. A pass under way counts while it advances (``Supervisor.beat``), and
    only so: one that stops advancing, or runs past LONGEST_PASS, does not."""
    now = [100.0]
    supervisor = Supervisor(_Log(), Metrics(), _problems(), clock=lambda: now[0])
    seen: list[bool] = []

    def long_pass() -> None:
        for _ in range(6):  # 60 s in all, a beat every 10 s
            now[0] += 10.0
            supervisor.beat("reconcile")
            seen.append(supervisor.progressing("reconcile", 19.0))
        now[0] += 25.0  # then it stops advancing (a read that hangs)
        seen.append(supervisor.progressing("reconcile", 19.0))

    assert supervisor.run_once("reconcile", long_pass)
    assert seen == [True] * 6 + [False]
    assert supervisor.progressing("reconcile", 19.0)  # it ended: a pass succeeded
    now[0] += 20.0
    assert not supervisor.progressing("reconcile", 19.0)
    supervisor.beat("reconcile")  # a beat with no pass under way is no progress
    assert not supervisor.progressing("reconcile", 19.0)

    def endless() -> None:
        while now[0] < 100.0 + LONGEST_PASS + 200.0:
            now[0] += 10.0
            supervisor.beat("reconcile")
            seen.append(supervisor.progressing("reconcile", 19.0))

    seen.clear()
    supervisor.run_once("reconcile", endless)
    assert seen[0], "fed at first"
    assert not seen[-1], "starved once past LONGEST_PASS"


def test_a_reconcile_pass_beats_as_it_walks_a_large_tree(
    machines: Machines, tmp_path: Path
) -> None:
    """The real pass: its walk of the managed roots beats every BEAT_EVERY directories,
    and each stray written one by one (shrunk before a grant, grown after) beats."""
    daemon = recorded_daemon(machines, tmp_path)
    tree = Path(str(daemon.fs.root)) / "sys/fs/cgroup"
    beats: list[str] = []
    daemon.supervisor.beat = beats.append  # type: ignore[method-assign,assignment]
    few = 10
    for i in range(few):
        (tree / f"numad.slice/stray{i}").mkdir()
    daemon.reconcile()
    scratch_mkdir(tree, "numad.slice/db")
    beats.clear()
    spec = {"name": "db", "cgroup": "numad.slice/db", "cpus": 4}
    daemon.admit(daemon.parse(json.dumps(spec), "json"))
    daemon.release("db")
    assert beats.count("reconcile") >= 2 * few  # each shrunk, then each grown back
    for i in range(few, 3 * BEAT_EVERY):
        (tree / f"numad.slice/stray{i}").mkdir()
    beats.clear()
    assert daemon.supervisor.run_once("reconcile", daemon.reconcile)
    assert beats.count("reconcile") >= 3


def test_numad_is_not_ready_while_its_cgroup_tree_is_gone(
    machines: Machines, tmp_path: Path
) -> None:
    daemon = recorded_daemon(machines, tmp_path)
    tree = Path(str(daemon.fs.root)) / "sys/fs/cgroup"
    tree.rename(tree.with_name("cgroup.away"))
    daemon.reconcile()
    assert not daemon.ready
    assert any("the cgroup hierarchy is gone" in p for p in daemon.problems)
    tree.with_name("cgroup.away").rename(tree)
    daemon.reconcile()
    assert daemon.ready


# -- commit or nothing ---------------------------------------------------------------------


def test_an_unwritable_checkpoint_changes_nothing_and_numad_is_not_ready_until_it_is(
    machines: Machines, tmp_path: Path
) -> None:
    daemon = recorded_daemon(machines, tmp_path)
    before = daemon.books
    daemon.syscalls = durable.Syscalls.injecting(durable.Fault.ENOSPC)
    with pytest.raises(CheckpointError, match="No space left on device"):
        _admit(daemon, "db", 4)
    assert daemon.specs == {}
    assert daemon.books == before
    assert not daemon.ready
    assert _cpus(daemon, "db") == CPUSet()  # no cgroup was written
    daemon.syscalls = durable.SYSCALLS
    daemon.reconcile()  # writes the checkpoint again: numad is ready once it can
    assert daemon.ready
    assert _admit(daemon, "db", 4)


def test_numad_starts_not_ready_on_an_unwritable_state_dir_and_recovers(
    machines: Machines, tmp_path: Path
) -> None:
    daemon = recorded_daemon(machines, tmp_path)
    assert _admit(daemon, "db", 4)
    again = Daemon(daemon.config, daemon.fs, daemon.cgroups, daemon.state_dir, daemon.log)
    again.syscalls = durable.Syscalls.injecting(durable.Fault.EIO)
    again.start()  # no crash loop under systemd: started, not ready, and says why
    assert again.started
    assert not again.ready
    assert "db" in again.specs
    assert any("numad cannot commit changes" in p for p in again.problems)
    again.syscalls = durable.SYSCALLS
    again.reconcile()
    assert again.ready


def test_a_cgroup_fault_after_the_commit_still_admits_and_is_shown_until_it_heals(
    machines: Machines, tmp_path: Path
) -> None:
    daemon = recorded_daemon(machines, tmp_path)
    faulty = _faulty(daemon)
    faulty.fail_exists.add("numad.slice/db")
    assert _admit(daemon, "db", 4)  # committed: the answer says so
    assert "db" in state.read(daemon.state_dir)[0].workloads  # type: ignore[union-attr]
    assert any(p.startswith("numad.slice/db: cannot tell") for p in daemon.problems)
    faulty.fail_exists.clear()
    daemon.reconcile()
    assert _cpus(daemon, "db") == _held(daemon, "db")
    assert daemon.problems == []


def _web_cannot_shrink(machines: Machines, tmp_path: Path) -> tuple[Daemon, Faulty]:
    """web, a shared workload whose cpuset cannot be written from now on; then db, 4
    exclusive CPUs that web still runs on."""
    daemon = recorded_daemon(machines, tmp_path)
    scratch_mkdir(Path(str(daemon.fs.root)) / "sys/fs/cgroup", "numad.slice/web")
    assert _admit(daemon, "web", "500m")
    faulty = _faulty(daemon)
    faulty.fail_write.add("numad.slice/web")
    assert _admit(daemon, "db", 4)
    return daemon, faulty


def test_a_shared_cgroup_that_cannot_shrink_holds_the_exclusive_grant_back(
    machines: Machines, tmp_path: Path
) -> None:
    daemon, faulty = _web_cannot_shrink(machines, tmp_path)
    db = _held(daemon, "db")
    assert db & _cpus(daemon, "web") == db  # web still runs there ...
    assert "numad.slice/db" not in daemon.enforcer.grants  # ... so db is not given them yet
    # Its file was empty (cgroup v2: every CPU of numad.slice, granted ones too): it
    # runs on the shared pool meanwhile, as a cgroup that holds no grant does.
    assert _cpus(daemon, "db") == CPUSet.from_bits(daemon.books.cpu.shared_pool)
    assert any("not granted yet: numad.slice/web" in p for p in daemon.problems)
    assert any(p.startswith("numad.slice/web: cannot write") for p in daemon.problems)
    faulty.fail_write.clear()
    daemon.reconcile()
    assert _cpus(daemon, "db") == db
    assert not db & _cpus(daemon, "web")
    assert daemon.problems == []


def test_a_grant_held_back_stays_held_back_when_its_cgroup_is_made_again(
    machines: Machines, tmp_path: Path
) -> None:
    """db's grant waits on web, which cannot shrink. db's cgroup goes and is made again
    (a restarted container): the event of its mkdir writes it the shared pool, not the
    grant web still runs on (found by the fault campaign, seed 0, once it delivered
    the mkdir events); the grant follows once web shrinks."""
    daemon, faulty = _web_cannot_shrink(machines, tmp_path)
    db = _held(daemon, "db")
    tree = Path(str(daemon.fs.root)) / "sys/fs/cgroup"
    shutil.rmtree(tree / "numad.slice/db")
    scratch_mkdir(tree, "numad.slice/db")
    daemon.isolate_new(["numad.slice/db"])  # the event its mkdir raises
    assert _cpus(daemon, "db") == CPUSet.from_bits(daemon.books.cpu.shared_pool)
    assert any("not granted yet: numad.slice/web" in p for p in daemon.problems)
    faulty.fail_write.clear()
    daemon.reconcile()
    assert _cpus(daemon, "db") == db


def test_a_grant_held_back_is_no_problem_once_its_workload_is_released(
    machines: Machines, tmp_path: Path
) -> None:
    """db's grant waits for web, which cannot shrink; db is released meanwhile. Its
    cgroup is written the shared pool as any released one is, and health no longer
    says it waits for a grant (before 2026-12-05 it did, until the cgroup went)."""
    daemon, faulty = _web_cannot_shrink(machines, tmp_path)
    assert any(p.startswith("numad.slice/db: exclusive cpus") for p in daemon.problems)
    daemon.release("db")
    assert not [p for p in daemon.problems if p.startswith("numad.slice/db:")], daemon.problems
    faulty.fail_write.clear()
    daemon.reconcile()
    assert daemon.problems == []


# -- nothing dropped ---------------------------------------------------------------------------


def test_a_cpu_offline_while_numad_was_stopped_is_replaced_on_its_node(
    machines: Machines, tmp_path: Path
) -> None:
    daemon = recorded_daemon(machines, tmp_path)
    assert _admit(daemon, "db", 4)
    before = _held(daemon, "db")
    victim = before.max()
    online = Path(str(daemon.fs.root)) / "sys/devices/system/cpu/online"
    online.write_text((CPUSet.parse_list("0-31") - CPUSet([victim])).format_list() + "\n")
    again = restarted_daemon(daemon)
    after = _held(again, "db")
    assert len(after) == 4
    assert victim not in after
    assert after.issubset(NODE0)
    assert _cpus(again, "db") == after
    assert _admit(again, "batch", 8)
    assert not _held(again, "batch") & after


def test_a_workload_that_no_longer_fits_stays_unplaced_on_the_pool_and_comes_back(
    machines: Machines, tmp_path: Path
) -> None:
    ve = {"devices": {"ve": {"class-prefix": "0x0b40"}}}
    daemon = recorded_daemon(machines, tmp_path, ve)
    assert _admit(daemon, "db", 4, devices={"ve": 1})
    held = _held(daemon, "db")
    stripped = restarted_daemon(daemon)  # the device class left the config
    listed = stripped.show("db")
    assert "unplaced" in listed
    assert any(p.startswith("db: unplaced:") for p in stripped.problems)
    assert _cpus(stripped, "db") == CPUSet.from_bits(stripped.books.cpu.shared_pool)
    scratch_mkdir(Path(str(stripped.fs.root)) / "sys/fs/cgroup", "numad.slice/other")
    assert _admit(stripped, "other", 14)  # db's old CPUs are free again ...
    assert _held(stripped, "other") & held  # ... and handed out, once db left them
    assert not _cpus(stripped, "db") & _cpus(stripped, "other")
    assert stripped.list_all()[0]["name"] == "db"  # never dropped
    shutil.rmtree(Path(str(stripped.fs.root)) / "sys/fs/cgroup/numad.slice/other")
    stripped.release("other")
    back = restarted_daemon(stripped, ve)  # the class is back: db is placed again
    assert "unplaced" not in back.show("db")
    assert len(_held(back, "db")) == 4
    assert _cpus(back, "db") == _held(back, "db")


def test_a_unit_restart_within_the_grace_period_keeps_its_placement(
    machines: Machines, tmp_path: Path
) -> None:
    daemon = recorded_daemon(machines, tmp_path)
    now = [0.0]
    daemon.clock = lambda: now[0]
    assert _admit(daemon, "db", 4)
    held = _held(daemon, "db")
    cgroups = Path(str(daemon.fs.root)) / "sys/fs/cgroup"
    shutil.rmtree(cgroups / "numad.slice/db")  # the unit stops ...
    daemon.reconcile()
    now[0] = 29.0
    daemon.reconcile()
    scratch_mkdir(cgroups, "numad.slice/db")  # ... and starts again: an empty cpuset
    daemon.reconcile()
    assert _held(daemon, "db") == held
    assert _cpus(daemon, "db") == held
    now[0] = 30.0
    shutil.rmtree(cgroups / "numad.slice/db")  # gone for good
    daemon.reconcile()
    now[0] = 59.0
    daemon.reconcile()
    assert "db" in daemon.specs
    now[0] = 60.0
    daemon.reconcile()
    assert "db" not in daemon.specs


def test_a_workload_whose_cgroup_went_while_numad_was_down_is_released_after_the_grace(
    machines: Machines, tmp_path: Path
) -> None:
    """Before: only a cgroup seen to go was released (what numad had seen lived in
    memory), so a container whose poststop never ran (a power loss) kept its CPUs
    forever. Now that a workload's cgroup existed is checkpointed. One whose cgroup
    never existed (admitted before its container starts) is kept."""
    daemon = recorded_daemon(machines, tmp_path)
    assert _admit(daemon, "db", 4)  # numad.slice/db exists
    assert _admit(daemon, "later", 2)  # its cgroup is made later, if ever
    daemon.stop()
    shutil.rmtree(Path(str(daemon.fs.root)) / "sys/fs/cgroup/numad.slice/db")
    again = restarted_daemon(daemon)  # its first pass starts db's grace period
    assert set(again.specs) == {"db", "later"}  # not before the grace
    grace = again.config.release_grace_seconds
    again.clock = lambda: time.monotonic() + grace
    again.reconcile()
    assert set(again.specs) == {"later"}
    assert not any(w == "db" for w, _ in again.books.cpu.assignments)
    assert "db" not in state.read(again.state_dir)[0].workloads  # type: ignore[union-attr]


def test_a_full_state_disk_still_enforces_what_is_committed(
    machines: Machines, tmp_path: Path
) -> None:
    """Before: with the checkpoint unwritable, a pass retried the commit first and
    stopped there: drift was not repaired and new cgroups were not isolated while
    the disk stayed full. Now the commit is retried beside enforcement."""
    daemon = recorded_daemon(machines, tmp_path)
    assert _admit(daemon, "db", 4)
    held = _held(daemon, "db")
    daemon.syscalls = durable.Syscalls.injecting(durable.Fault.ENOSPC)
    with pytest.raises(CheckpointError):
        _admit(daemon, "web", 2)
    cgroups = Path(str(daemon.fs.root)) / "sys/fs/cgroup"
    (cgroups / "numad.slice/db/cpuset.cpus").write_text("0-31\n")  # drift
    scratch_mkdir(cgroups, "numad.slice/stray")
    daemon.reconcile()
    assert _cpus(daemon, "db") == held
    assert CPUSet.parse_list((cgroups / "numad.slice/stray/cpuset.cpus").read_text())
    assert not CPUSet.parse_list((cgroups / "numad.slice/stray/cpuset.cpus").read_text()) & held
    assert not daemon.ready  # and says why
    assert any("numad cannot commit changes" in p for p in daemon.problems)
    daemon.syscalls = durable.SYSCALLS
    daemon.reconcile()
    assert daemon.ready


def test_a_released_cgroup_gets_every_memory_node_back(machines: Machines, tmp_path: Path) -> None:
    """Before: released cgroups were written with no memory nodes (``mems=None``: left
    alone), so one numad had pinned stayed on its node after the release."""
    daemon = recorded_daemon(machines, tmp_path, {"memory": {"policy": "static"}})
    assert _admit(daemon, "db", 4, memory="1Gi")
    mems = Path(str(daemon.fs.root)) / "sys/fs/cgroup/numad.slice/db/cpuset.mems"
    for _ in range(600):  # the mover writes a narrowing in the background; 60 s bound
        if len(NodeSet.parse_list(mems.read_text())) == 1:
            break
        threading.Event().wait(0.1)
    assert len(NodeSet.parse_list(mems.read_text())) == 1
    daemon.release("db")
    daemon.reconcile()
    assert NodeSet.parse_list(mems.read_text()) == NodeSet([0, 1])
    assert "numad.slice/db" in daemon.orphans  # still there: it follows the pool


def test_an_unreadable_cpuset_blocks_only_what_it_may_run_on(
    machines: Machines, tmp_path: Path
) -> None:
    """Before: a workload cgroup whose cpuset could not be read (no cpuset controller
    there) counted as running on every CPU, so no exclusive set anywhere on the host
    was granted. Now it counts as what its nearest readable ancestor applies."""
    daemon = recorded_daemon(machines, tmp_path)
    tree = Path(str(daemon.fs.root)) / "sys/fs/cgroup"
    node1 = CPUSet.parse_list(
        (Path(str(daemon.fs.root)) / "sys/devices/system/node/node1/cpulist").read_text()
    )
    scratch_mkdir(tree, "numad.slice/pod/a")
    CgroupV2Backend(tree, ["numad.slice"], emulate_kernel=True).write(
        "numad.slice/pod", node1, None
    )  # the pod's own cpuset: its containers run on node 1 at most
    spec = {"name": "a", "cgroup": "numad.slice/pod/a", "cpus": "500m"}
    assert daemon.admit(daemon.parse(json.dumps(spec), "json")).admitted
    for name in ("cpuset.cpus", "cpuset.mems", "cpuset.cpus.effective", "cpuset.mems.effective"):
        (tree / "numad.slice/pod/a" / name).unlink()  # a has no cpuset controller now
    daemon.enforcer.written.clear()  # a is written (and fails) again
    assert _admit(daemon, "db", 4)
    held = _held(daemon, "db")
    assert not held & node1  # single-numa-node: node 0 first
    assert _cpus(daemon, "db") == held  # granted: a cannot run on node 0
    assert not any(p.startswith("grant:") for p in daemon.health.snapshot())


# -- stable host settings ---------------------------------------------------------------------


def test_reserved_cpus_are_kept_across_restarts_and_hotplug(
    machines: Machines, tmp_path: Path
) -> None:
    daemon = recorded_daemon(machines, tmp_path)
    reserved = CPUSet.from_bits(daemon.reserved)
    assert len(reserved) == 2
    online = Path(str(daemon.fs.root)) / "sys/devices/system/cpu/online"
    first = reserved.min()
    online.write_text((CPUSet.parse_list("0-31") - CPUSet([first])).format_list() + "\n")
    again = restarted_daemon(daemon)  # the allocator alone would now reserve another CPU
    assert CPUSet.from_bits(again.reserved) == reserved
    again.rediscover()
    online.write_text("0-31\n")
    again.rediscover()  # back online: still reserved
    assert CPUSet.from_bits(again.books.cpu.reserved) == reserved
    assert _admit(again, "all", 14)
    assert _admit(again, "rest", 14)
    assert not (_held(again, "all") | _held(again, "rest")) & reserved
    changed = restarted_daemon(again, {"cpu": {"reserved-count": 3}})  # the config changes them
    assert len(CPUSet.from_bits(changed.reserved)) == 3
    for name in ("all", "rest"):  # a workload on a newly reserved CPU is re-placed
        assert not _held(changed, name) & CPUSet.from_bits(changed.reserved)


# -- small defects ---------------------------------------------------------------------------


def test_reloading_does_not_repeat_a_problem(machines: Machines, tmp_path: Path) -> None:
    daemon = recorded_daemon(machines, tmp_path)
    declared = Path(daemon.config.paths.workloads_dir)
    declared.mkdir(parents=True)
    (declared / "broken.toml").write_text('name = "broken"\ncpus = -1\n')
    daemon.reload_workloads()
    daemon.reload_workloads()
    assert len([p for p in daemon.problems if "broken.toml" in p]) == 1


def test_what_numad_remembers_of_a_cgroup_goes_with_it(machines: Machines, tmp_path: Path) -> None:
    daemon = recorded_daemon(machines, tmp_path)
    assert _admit(daemon, "db", 4)
    daemon.release("db")
    shutil.rmtree(Path(str(daemon.fs.root)) / "sys/fs/cgroup/numad.slice/db")
    daemon.reconcile()
    e = daemon.enforcer
    for known in (e.written, e.ensured, e.drift, e.grants, daemon.outcomes, daemon.orphans):
        assert not any("db" in str(key) for key in known)


def test_a_second_instance_is_refused_naming_the_first(tmp_path: Path) -> None:
    lock = acquire(tmp_path)
    with pytest.raises(InstanceError, match=r"another numad \(pid \d+\) is running"):
        acquire(tmp_path)
    lock.release()
    acquire(tmp_path).release()  # the holder is gone: the lock is free


def test_a_signed_but_malformed_checkpoint_is_kept_aside_and_numad_starts(
    machines: Machines, tmp_path: Path
) -> None:
    daemon = recorded_daemon(machines, tmp_path)
    assert _admit(daemon, "db", 4)
    body = {"reserved": "0,16", "orphans": ["/etc"], "workloads": {"db": {"spec": 3}}}
    digest = state._checksum(body)
    (daemon.state_dir / state.FILE).write_text(
        json.dumps({"version": 1, "checksum": digest, "body": body})
    )
    again = restarted_daemon(daemon)
    assert again.ready
    assert any("kept aside" in p for p in again.problems)
    assert list(daemon.state_dir.glob(f"{state.FILE}.corrupt.*"))


def test_an_orphan_outside_the_managed_roots_does_not_stop_start_up(
    machines: Machines, tmp_path: Path
) -> None:
    daemon = recorded_daemon(machines, tmp_path)
    assert _admit(daemon, "db", 4)
    daemon.release("db")  # numad.slice/db is an orphan now
    again = restarted_daemon(daemon, {"paths": {"managed-roots": ["other.slice"]}})
    assert again.ready
    assert again.orphans == set()


# -- helpers -----------------------------------------------------------------------------------


class _Log:
    def __init__(self) -> None:
        self.events: list[str] = []

    def _add(self, event: str, **_kw: Any) -> None:
        self.events.append(event)

    info = warning = error = exception = _add


def _problems() -> Problems:
    return Problems()


class _StuckSystemd:
    """systemd that never answers in time: each call waits ``delay`` seconds, then
    fails as the bus does after its timeout. Stands in for a loaded systemd (the VM
    tier runs the real one, which cannot be made slow on demand)."""

    def __init__(self, control_groups: dict[str, str], delay: float) -> None:
        self.control_groups = control_groups
        self.delay = delay
        self.calls = 0
        self.hurried = threading.Event()

    def _slow(self, name: str) -> None:
        self.calls += 1
        if self.hurried.wait(self.delay):  # as the bus ends a call once numad hurries it
            raise SystemdError(name, "numad is stopping: gave up waiting (injected)")
        raise SystemdError(name, f"no reply within {self.delay:g} s (injected)")

    def hurry(self, seconds: float) -> None:
        self.hurried.set()

    def unit(self, name: str) -> str | None:
        return f"/org/freedesktop/systemd1/unit/{name}" if name in self.control_groups else None

    def control_group(self, name: str) -> str | None:
        return self.control_groups.get(name)

    def transient(self, name: str) -> bool:
        self._slow(name)
        raise AssertionError("unreachable")

    def allowed(self, name: str) -> tuple[CPUSet, NodeSet]:
        self._slow(name)
        raise AssertionError("unreachable")

    def set_allowed(
        self, name: str, cpus: CPUSet | None, mems: NodeSet | None, *, runtime: bool = True
    ) -> None:
        self._slow(name)

    def load(self, name: str) -> str:
        self._slow(name)
        raise AssertionError("unreachable")

    def slice(self, name: str) -> str:
        return "-.slice"


def test_a_stuck_systemd_starves_neither_the_watchdog_nor_admissions(
    machines: Machines, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: reconcile passes and admissions waited on D-Bus under the daemon's
    lock, the watchdog was not fed, and systemd killed numad. Now numad writes the
    cgroups itself and tells systemd from the unit loop: systemd being stuck is a
    health problem, retried, while passes, admissions and the watchdog go on."""
    daemon = recorded_daemon(machines, tmp_path)
    tree = Path(str(daemon.fs.root)) / "sys/fs/cgroup"
    for top in ("system.slice", "user.slice"):
        scratch_mkdir(tree, top)
    scratch_mkdir(tree, "numad.slice/svc.service")
    control_groups = {"system.slice": "/system.slice", "user.slice": "/user.slice"}
    stuck = _StuckWhenSetting({**control_groups, "svc.service": "/numad.slice/svc.service"}, 0.5)
    daemon.isolation.systemd = stuck
    notify_path = tmp_path / "notify.sock"
    supervisor = Supervisor(_Log(), daemon.metrics, daemon.health)
    stop, wake = threading.Event(), threading.Event()
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(notify_path))
        monkeypatch.setenv("NOTIFY_SOCKET", str(notify_path))
        loops: list[tuple[Callable[..., None], tuple[Any, ...]]] = [
            (reconcile_loop, (supervisor, daemon.reconcile, stop, 0.05, wake)),
            (unit_loop, (supervisor, daemon.isolation, wake, stop)),
            (watchdog_loop, (supervisor, stop, 0.05, 2.0)),
        ]
        threads = [threading.Thread(target=t, args=a, daemon=True) for t, a in loops]
        for thread in threads:
            thread.start()
        try:
            for name in ("db", "web"):
                scratch_mkdir(tree, f"numad.slice/{name}")
                spec = {"name": name, "cgroup": f"numad.slice/{name}", "cpus": 4}
                assert daemon.admit(daemon.parse(json.dumps(spec), "json")).admitted
            unit = {"name": "svc", "unit": "svc.service", "cpus": 2}  # placed through systemd
            assert daemon.admit(daemon.parse(json.dumps(unit), "json")).admitted
            sock.settimeout(30)  # bounds for a hung daemon, not speed goals
            deadline = threading.Event()
            timer = threading.Timer(60, deadline.set)
            timer.start()
            pings = 0  # the watchdog is fed all along (a STATUS line comes between)
            while (stuck.calls < 4 or pings < 3) and not deadline.is_set():
                pings += sock.recv(64) == b"WATCHDOG=1"
            timer.cancel()
            assert pings >= 3
            assert stuck.calls >= 4, "the unit loop stopped retrying"
            assert supervisor.progressing("reconcile", 2.0)
            for name in ("db", "web"):
                held = CPUSet.from_bits(daemon.books.cpu.assignments[(name, "main")])
                granted = (tree / f"numad.slice/{name}/cpuset.cpus").read_text()
                assert CPUSet.parse_list(granted) == held
                assert not CPUSet.parse_list((tree / "system.slice/cpuset.cpus").read_text()) & held
            assert any("systemd lacks its cpuset yet" in p for p in daemon.problems)
            assert any("systemd lacks svc.service's placement yet" in p for p in daemon.problems)
        finally:
            stop.set()
            wake.set()
            for thread in threads:
                thread.join(10)


class _StuckWhenSetting(_StuckSystemd):
    """Loads units at once; only setting their properties is stuck."""

    def load(self, name: str) -> str:
        return f"/org/freedesktop/systemd1/unit/{name}"


def test_sigterm_ends_a_wait_on_a_stuck_systemd_at_once(machines: Machines, tmp_path: Path) -> None:
    """Before: SIGTERM waited for the D-Bus call under way (a workload unit's placement
    is set under the daemon's lock), then for each unit's give-back, each as long as
    the bus's timeout: far past the 2 s numad has to exit. Now numad hurries the bus
    (``Isolation.hurry``): the call under way ends at once, and every later one gets
    what is left of STOP_SYSTEMD_SECONDS."""
    daemon = recorded_daemon(machines, tmp_path)
    tree = Path(str(daemon.fs.root)) / "sys/fs/cgroup"
    scratch_mkdir(tree, "numad.slice/svc.service")
    stuck = _StuckWhenSetting({"svc.service": "/numad.slice/svc.service"}, 120.0)
    daemon.isolation.systemd = stuck
    spec = {"name": "svc", "unit": "svc.service", "cpus": 4}
    answers: list[object] = []
    admission = threading.Thread(
        target=lambda: answers.append(daemon.admit(daemon.parse(json.dumps(spec), "json")))
    )
    admission.start()
    for _ in range(600):  # up to 60 s: a bound for a hung test, not a speed goal
        if stuck.calls:
            break
        admission.join(0.1)
    assert stuck.calls == 1, "the admission never asked systemd"
    assert admission.is_alive(), "the admission did not wait on systemd"
    start = time.monotonic()
    daemon.interrupt()  # what SIGTERM's handler does; the API server then stops
    admission.join(60)
    daemon.stop()
    took = time.monotonic() - start
    assert not admission.is_alive()
    assert answers, "the admission raised instead of answering"
    # The stuck call would have lasted 120 s; the stop waited for none of it.
    assert took < stuck.delay / 4, f"stop took {took:.1f} s"
    assert stuck.hurried.is_set()
