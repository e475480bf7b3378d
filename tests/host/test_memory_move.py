"""numad.host.pages (numa_stat parsing, locality, migrate_pages) and numad.host.memory_move (the
Mover and its jobs).

The numa_stat samples follow the formats of the kernel's documentation
(cgroup-v2.rst "memory.numa_stat", cgroup-v1/memory.rst "numa_stat"). Only two
tests reach the kernel: migrate_pages(2) on this very process, moving node 0 to
node 0, and on a pid that cannot exist; nothing reads this machine's /sys.
"""

from __future__ import annotations

import errno
import itertools
import os
import platform
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from numad.cpuset import NodeSet
from numad.errors import CgroupError, HostFileError, NumadError, SysfsFormatError
from numad.host.memory_move import Mover, MoveResult, Outcome, narrow_job, pull_job
from numad.host.pages import (
    SYSCALL_NUMBERS,
    anon_by_node,
    free_bytes,
    locality,
    migrate_pages,
    read_anon_by_node,
)

WAIT = 5.0  # seconds a test waits for the worker before it fails (never slept)

V2_SAMPLE = """\
anon N0=1048576 N1=3145728
file N0=8192 N1=0
kernel_stack N0=16384 N1=0
shmem N0=0 N1=0
file_mapped N0=4096 N1=0
anon_thp N0=0 N1=2097152
inactive_anon N0=1040384 N1=3141632
"""

# cgroup-v1/memory.rst: total, file, anon, unevictable, then hierarchical_<counter>.
V1_SAMPLE = """\
total=73 N0=0 N1=41 N2=32 N3=0
file=14 N0=0 N1=0 N2=14 N3=0
anon=59 N0=0 N1=41 N2=18 N3=0
unevictable=0 N0=0 N1=0 N2=0 N3=0
hierarchical_total=80 N0=0 N1=48 N2=32 N3=0
hierarchical_file=14 N0=0 N1=0 N2=14 N3=0
hierarchical_anon=66 N0=0 N1=48 N2=18 N3=0
hierarchical_unevictable=0 N0=0 N1=0 N2=0 N3=0
"""


def nodes(text: str) -> NodeSet:
    return NodeSet.parse_list(text)


# -- parsing -------------------------------------------------------------------


def test_v2_anon_bytes_by_node() -> None:
    assert anon_by_node(V2_SAMPLE) == {0: 1048576, 1: 3145728}


def test_v2_anon_found_by_key_wherever_it_is() -> None:
    moved = "file N0=1 N1=2\nnew_entry N0=5\nanon N0=10 N1=20\n"
    assert anon_by_node(moved) == {0: 10, 1: 20}


def test_v1_prefers_hierarchical_anon_and_counts_pages() -> None:
    assert anon_by_node(V1_SAMPLE, v1_page_size=4096) == {0: 0, 1: 48 * 4096, 2: 18 * 4096, 3: 0}


def test_v1_without_hierarchical_lines_uses_anon() -> None:
    old_kernel = "total=5 N0=5\nfile=2 N0=2\nanon=3 N0=3\nunevictable=0 N0=0\n"
    assert anon_by_node(old_kernel, v1_page_size=65536) == {0: 3 * 65536}


def test_v1_skips_vendor_lines_without_a_key() -> None:
    vendor = V1_SAMPLE + "numa_locality 0 0 0 0\nnuma_exectime 0\n"
    assert anon_by_node(vendor, v1_page_size=4096)[1] == 48 * 4096


@pytest.mark.parametrize(
    ("text", "page_size", "match"),
    [
        pytest.param("file N0=1\nanon N0=12 N1=x\n", None, "line 2", id="v2-bad-value"),
        pytest.param("anon N0=1 N0=2\n", None, "line 1.*N0=2", id="v2-node-twice"),
        pytest.param("anon 0=5\n", None, "line 1.*0=5", id="v2-node-without-N"),
        pytest.param("anon N=5\n", None, "line 1", id="v2-node-without-id"),
        pytest.param("anon N0=5 junk\n", None, "line 1.*junk", id="v2-stray-word"),
        pytest.param("file N0=1\n", None, "no anon line", id="v2-no-anon"),
        pytest.param("", None, "no anon line", id="empty"),
        pytest.param("total=1 N0=1\nanon=x N0=1\n", 4096, "line 2", id="v1-bad-total"),
        pytest.param("total=1 N0=1\n=3 N0=1\n", 4096, "line 2", id="v1-empty-key"),
        pytest.param(V1_SAMPLE, None, "v1_page_size", id="v1-without-page-size"),
    ],
)
def test_malformed_numa_stat_raises(text: str, page_size: int | None, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        anon_by_node(text, v1_page_size=page_size)


def test_read_anon_by_node(tmp_path: Path) -> None:
    (tmp_path / "memory.numa_stat").write_text(V2_SAMPLE)
    assert read_anon_by_node(tmp_path) == {0: 1048576, 1: 3145728}


def test_read_anon_by_node_without_the_memory_controller(tmp_path: Path) -> None:
    assert read_anon_by_node(tmp_path) is None


def test_read_anon_by_node_malformed_or_unreadable(tmp_path: Path) -> None:
    (tmp_path / "memory.numa_stat").write_text("anon N0=?\n")
    with pytest.raises(CgroupError, match=r"memory\.numa_stat: unexpected content.*line 1"):
        read_anon_by_node(tmp_path)
    (tmp_path / "memory.numa_stat").unlink()
    (tmp_path / "memory.numa_stat").mkdir()
    with pytest.raises(CgroupError, match="cannot be read"):
        read_anon_by_node(tmp_path)


@pytest.mark.parametrize(
    ("by_node", "on", "expected"),
    [
        pytest.param({}, "0", None, id="no-nodes"),
        pytest.param({0: 0, 1: 0}, "0", None, id="no-bytes"),
        pytest.param({0: 100, 1: 0}, "0", 1.0, id="all-local"),
        pytest.param({0: 100, 1: 300}, "0", 0.25, id="quarter-local"),
        pytest.param({0: 100, 1: 300}, "0-1", 1.0, id="two-nodes"),
        pytest.param({0: 100, 1: 300}, "", 0.0, id="empty-set"),
        pytest.param({0: 100}, "3", 0.0, id="node-without-bytes"),
    ],
)
def test_locality(by_node: dict[int, int], on: str, expected: float | None) -> None:
    assert locality(by_node, nodes(on)) == expected


# -- free memory -------------------------------------------------------------------


def write_meminfo(sys_root: Path, node: int, text: str) -> None:
    path = sys_root / "devices" / "system" / "node" / f"node{node}" / "meminfo"
    path.parent.mkdir(parents=True)
    path.write_text(text)


def test_free_bytes(tmp_path: Path) -> None:
    write_meminfo(
        tmp_path,
        1,
        "Node 1 MemTotal:       14641356 kB\n"
        "Node 1 MemFree:         8618408 kB\n"
        "Node 1 MemUsed:         6022948 kB\n",
    )
    assert free_bytes(1, tmp_path) == 8618408 * 1024


def test_free_bytes_missing_or_malformed(tmp_path: Path) -> None:
    with pytest.raises(HostFileError, match="node0/meminfo: cannot be read"):
        free_bytes(0, tmp_path)
    write_meminfo(tmp_path, 0, "Node 0 MemTotal: 4 kB\nNode 0 MemFree: lots kB\n")
    with pytest.raises(SysfsFormatError, match="no 'MemFree"):
        free_bytes(0, tmp_path)


# -- migrate_pages ------------------------------------------------------------------

ON_KNOWN_MACHINE = pytest.mark.skipif(
    platform.machine() not in SYSCALL_NUMBERS, reason="no migrate_pages number for this machine"
)
PID_MAX_LIMIT = 4 * 1024 * 1024  # include/linux/threads.h (64-bit): pids stay below it


@ON_KNOWN_MACHINE
def test_migrate_pages_on_this_process_node0_to_node0() -> None:
    assert migrate_pages(os.getpid(), NodeSet([0]), NodeSet([0])) == 0


@ON_KNOWN_MACHINE
def test_migrate_pages_of_a_process_that_does_not_exist() -> None:
    with pytest.raises(ProcessLookupError) as caught:
        migrate_pages(PID_MAX_LIMIT, NodeSet([0]), NodeSet([0]))
    assert caught.value.errno == errno.ESRCH


@dataclass
class FakeSyscall:
    result: tuple[int, int] = (0, 0)
    calls: list[tuple[int, int, int, tuple[int, ...], tuple[int, ...]]] = field(
        default_factory=list
    )

    def __call__(
        self, number: int, pid: int, maxnode: int, old: tuple[int, ...], new: tuple[int, ...]
    ) -> tuple[int, int]:
        self.calls.append((number, pid, maxnode, old, new))
        return self.result


@pytest.mark.parametrize(
    ("old", "new", "maxnode", "words"),
    [
        pytest.param("0", "1", 65, 1, id="one-word"),
        pytest.param("63", "0", 65, 1, id="node-63-still-one-word"),
        pytest.param("0", "64", 129, 2, id="node-64-needs-two"),
        pytest.param("0", "1023", 1025, 16, id="node-1023"),
        pytest.param("", "", 65, 1, id="empty-sets"),
    ],
)
def test_mask_sizing(old: str, new: str, maxnode: int, words: int) -> None:
    syscall = FakeSyscall(result=(7, 0))
    assert migrate_pages(42, nodes(old), nodes(new), syscall=syscall, machine="x86_64") == 7
    [(number, pid, got_maxnode, old_words, new_words)] = syscall.calls
    assert (number, pid, got_maxnode) == (256, 42, maxnode)
    assert len(old_words) == len(new_words) == words
    # The kernel reads maxnode - 1 bits (get_nodes' "--maxnode"): every word, no more.
    assert got_maxnode - 1 == 64 * words
    assert sum(w << (64 * i) for i, w in enumerate(old_words)) == nodes(old).bits
    assert sum(w << (64 * i) for i, w in enumerate(new_words)) == nodes(new).bits


def test_node_1023_is_the_top_bit_of_the_sixteenth_word() -> None:
    syscall = FakeSyscall()
    migrate_pages(1, NodeSet([0]), NodeSet([1023]), syscall=syscall, machine="aarch64")
    [(number, _, maxnode, old, new)] = syscall.calls
    assert (number, maxnode) == (238, 1025)
    assert old == (1,) + (0,) * 15
    assert new == (0,) * 15 + (1 << 63,)


def test_node_beyond_max_numnodes_is_refused() -> None:
    with pytest.raises(ValueError, match="node 1024"):
        migrate_pages(1, NodeSet([0]), NodeSet([1024]), syscall=FakeSyscall(), machine="x86_64")


def test_unknown_machine_is_a_numad_error() -> None:
    with pytest.raises(NumadError, match=r"riscv64.*x86_64 \(256\), aarch64 \(238\)"):
        migrate_pages(1, NodeSet([0]), NodeSet([1]), syscall=FakeSyscall(), machine="riscv64")


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        pytest.param(errno.ESRCH, ProcessLookupError, id="esrch"),
        pytest.param(errno.EPERM, PermissionError, id="eperm"),
        pytest.param(errno.EINVAL, OSError, id="einval"),
    ],
)
def test_syscall_failure_raises_oserror_with_errno(code: int, kind: type[OSError]) -> None:
    syscall = FakeSyscall(result=(-1, code))
    with pytest.raises(kind, match="pid 9: migrate_pages failed") as caught:
        migrate_pages(9, NodeSet([1]), NodeSet([0]), syscall=syscall, machine="x86_64")
    assert caught.value.errno == code


# -- the Mover ---------------------------------------------------------------------


@dataclass
class RecordingLog:
    events: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)

    def info(self, event: str, **kw: Any) -> None:
        self.events.append(("info", event, kw))

    def error(self, event: str, **kw: Any) -> None:
        self.events.append(("error", event, kw))

    def named(self, event: str) -> list[dict[str, Any]]:
        return [kw for _, name, kw in self.events if name == event]


@dataclass
class Done:
    calls: list[tuple[str, MoveResult, str]] = field(default_factory=list)

    def __call__(self, name: str, result: MoveResult) -> None:
        self.calls.append((name, result, threading.current_thread().name))


@pytest.fixture
def log() -> RecordingLog:
    return RecordingLog()


@pytest.fixture
def done() -> Done:
    return Done()


@pytest.fixture
def mover(log: RecordingLog, done: Done) -> Iterator[Mover]:
    worker = Mover(log, done)
    yield worker
    assert worker.stop(timeout=WAIT)


def result(moved: int = 0) -> MoveResult:
    return MoveResult(Outcome.MOVED, bytes_moved=moved)


def blocking_job(started: threading.Event, gate: threading.Event) -> Callable[[], MoveResult]:
    def job() -> MoveResult:
        started.set()
        assert gate.wait(WAIT)
        return result(1)

    return job


def recording(ran: list[str], label: str, moved: int) -> Callable[[], MoveResult]:
    def job() -> MoveResult:
        ran.append(label)
        return result(moved)

    return job


def wait_until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.001)


def test_jobs_run_one_at_a_time_in_submission_order(mover: Mover) -> None:
    started, gate = threading.Event(), threading.Event()
    lock = threading.Lock()
    active, peak, order = [0], [0], []

    def counted(name: str) -> Callable[[], MoveResult]:
        def job() -> MoveResult:
            with lock:
                active[0] += 1
                peak[0] = max(peak[0], active[0])
            time.sleep(0.002)  # long enough for an overlap to show, were there one
            with lock:
                active[0] -= 1
                order.append(name)
            return result()

        return job

    mover.submit("first", blocking_job(started, gate))
    assert started.wait(WAIT)
    for name in ("a", "b", "c", "d"):
        mover.submit(name, counted(name))
    gate.set()
    assert mover.drain(WAIT)
    assert order == ["a", "b", "c", "d"]
    assert peak[0] == 1


def test_a_newer_job_replaces_a_queued_one(mover: Mover, done: Done) -> None:
    started, gate = threading.Event(), threading.Event()
    ran: list[str] = []
    mover.submit("blocker", blocking_job(started, gate))
    assert started.wait(WAIT)
    mover.submit("w", recording(ran, "old", 1))
    mover.submit("other", recording(ran, "other", 2))
    mover.submit("w", recording(ran, "new", 3))
    gate.set()
    assert mover.drain(WAIT)
    assert ran == ["new", "other"]  # the replacement kept its place in the queue
    assert mover.last("w") == result(3)
    assert [name for name, _, _ in done.calls] == ["blocker", "w", "other"]


def test_status_is_migrating_while_queued_or_running(mover: Mover) -> None:
    started, gate = threading.Event(), threading.Event()
    assert mover.status("w") is None
    mover.submit("w", blocking_job(started, gate))
    assert started.wait(WAIT)
    mover.submit("queued", result)
    assert mover.status("w") == "migrating"
    assert mover.status("queued") == "migrating"
    assert mover.status("other") is None
    assert not mover.drain(0.01)
    gate.set()
    assert mover.drain(WAIT)
    assert mover.status("w") is None
    assert mover.status("queued") is None
    assert mover.last("w") == result(1)


def test_on_done_runs_on_the_worker_after_the_result_is_recorded(log: RecordingLog) -> None:
    seen: list[tuple[str | None, MoveResult | None]] = []
    worker = Mover(log, lambda name, _: seen.append((worker.status(name), worker.last(name))))
    try:
        worker.submit("w", lambda: result(5))
        assert worker.drain(WAIT)
        assert seen == [(None, result(5))]
    finally:
        assert worker.stop(WAIT)


def test_on_done_gets_name_and_result_on_the_worker_thread(mover: Mover, done: Done) -> None:
    mover.submit("w", lambda: result(9))
    assert mover.drain(WAIT)
    assert done.calls == [("w", result(9), "numad-mover")]


def test_a_raising_job_is_recorded_and_the_worker_lives_on(log: RecordingLog, done: Done) -> None:
    ticks = itertools.count(10.0, 2.5)
    worker = Mover(log, done, clock=lambda: next(ticks))

    def boom() -> MoveResult:
        raise RuntimeError("boom")

    try:
        worker.submit("w", boom)
        assert worker.drain(WAIT)
        failed = MoveResult(Outcome.FAILED, seconds=2.5, error="RuntimeError: boom")
        assert worker.last("w") == failed
        assert done.calls[0][:2] == ("w", failed)
        assert log.named("memory_move_failed") == [
            {"workload": "w", "problem": "RuntimeError('boom')"}
        ]
        assert worker.alive
        worker.submit("w", lambda: result(4))
        assert worker.drain(WAIT)
        assert worker.last("w") == result(4)
    finally:
        assert worker.stop(WAIT)


def test_a_raising_on_done_is_logged_and_the_worker_lives_on(log: RecordingLog) -> None:
    def on_done(name: str, _: MoveResult) -> None:
        raise KeyError(name)

    worker = Mover(log, on_done)
    try:
        worker.submit("w", result)
        worker.submit("v", result)
        assert worker.drain(WAIT)
        assert [kw["workload"] for kw in log.named("memory_move_callback_failed")] == ["w", "v"]
        assert worker.alive
    finally:
        assert worker.stop(WAIT)


def test_finished_moves_are_logged(mover: Mover, log: RecordingLog) -> None:
    mover.submit("w", lambda: MoveResult(Outcome.FAILED, error="pid 3: EPERM"))
    mover.submit("v", lambda: result(8))
    assert mover.drain(WAIT)
    finished = [(level, kw) for level, name, kw in log.events if name == "memory_move_finished"]
    levels = [(level, kw["workload"]) for level, kw in finished]
    assert levels == [("error", "w"), ("info", "v")]
    assert log.named("memory_move_finished")[1]["bytes_moved"] == 8


def test_forget_drops_the_queued_job_and_the_last_result(mover: Mover) -> None:
    started, gate = threading.Event(), threading.Event()
    mover.submit("w", lambda: result(1))
    assert mover.drain(WAIT)
    mover.submit("blocker", blocking_job(started, gate))
    assert started.wait(WAIT)
    mover.submit("w", lambda: result(2))
    mover.forget("w")
    assert mover.status("w") is None
    assert mover.last("w") is None
    gate.set()
    assert mover.drain(WAIT)
    assert mover.last("w") is None


def test_stop_finishes_the_running_job_drops_the_queue_and_joins(log: RecordingLog) -> None:
    started, gate = threading.Event(), threading.Event()
    worker = Mover(log)
    worker.submit("running", blocking_job(started, gate))
    assert started.wait(WAIT)
    worker.submit("queued", result)
    stopped: list[bool] = []
    stopper = threading.Thread(target=lambda: stopped.append(worker.stop(WAIT)))
    stopper.start()
    wait_until(lambda: worker.status("queued") is None)  # stop() has emptied the queue
    gate.set()
    stopper.join(WAIT)
    assert stopped == [True]
    assert not worker.alive
    assert worker.last("running") == result(1)
    assert worker.last("queued") is None
    assert log.named("memory_moves_dropped") == [{"workloads": ["queued"]}]
    with pytest.raises(NumadError, match="w: the memory mover has stopped"):
        worker.submit("w", result)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_worker_killed_outside_a_job_reads_as_stopped(log: RecordingLog) -> None:
    def broken_clock() -> float:
        raise OSError(errno.EINVAL, "no clock")

    worker = Mover(log, clock=broken_clock)
    worker.submit("w", result)
    assert worker.drain(WAIT)  # returns: the queue is not left waiting forever
    assert worker.stop(WAIT)
    assert worker.status("w") is None
    with pytest.raises(NumadError, match="has stopped"):
        worker.submit("w", result)


def test_stop_of_an_idle_mover_joins_at_once(log: RecordingLog) -> None:
    worker = Mover(log)
    assert worker.alive
    assert worker.stop(WAIT)
    assert not worker.alive
    assert worker.drain(0)


# -- the jobs ----------------------------------------------------------------------


@dataclass
class Readings:
    """numa_stat readings handed out one per call, checking the cgroup asked for."""

    cgroup: Path
    values: list[dict[int, int] | None]

    def __call__(self, cgroup_dir: Path) -> dict[int, int] | None:
        assert cgroup_dir == self.cgroup
        return self.values.pop(0)


@dataclass
class FakeMigrate:
    failures: dict[int, OSError] = field(default_factory=dict)
    not_moved: int = 0
    calls: list[tuple[int, NodeSet, NodeSet]] = field(default_factory=list)

    def __call__(self, pid: int, old: NodeSet, new: NodeSet) -> int:
        self.calls.append((pid, old, new))
        if pid in self.failures:
            raise self.failures[pid]
        return self.not_moved


CG = Path("/sys/fs/cgroup/numad/w")


def ticking(*values: float) -> Callable[[], float]:
    ticks = iter(values)
    return lambda: next(ticks)


def test_pull_job_moves_what_fits_and_skips_exited_pids() -> None:
    read = Readings(CG, [{0: 100, 1: 300, 2: 0, 3: 50}, {0: 420, 1: 30, 2: 0, 3: 0}])
    migrate = FakeMigrate({12: ProcessLookupError(errno.ESRCH, "gone")}, not_moved=2)
    free = {0: 200, 4: 200}
    job = pull_job(
        lambda: [11, 12, 13],
        CG,
        nodes("0,4"),
        read_anon=read,
        free=free.__getitem__,
        migrate=migrate,
        clock=ticking(1.0, 4.0),
    )
    got = job()
    assert migrate.calls == [(pid, nodes("1,3"), nodes("0,4")) for pid in (11, 12, 13)]
    assert got == MoveResult(
        Outcome.MOVED,
        bytes_moved=350 - 30,
        seconds=3.0,
        detail="from nodes 1,3 to 0,4",
        pages_not_moved=4,
        pids_gone=1,
    )
    assert read.values == []


def test_pull_job_skips_when_the_bytes_do_not_fit() -> None:
    migrate = FakeMigrate()
    job = pull_job(
        lambda: [11],
        CG,
        nodes("0"),
        read_anon=Readings(CG, [{0: 100, 1: 300}]),
        free={0: 299}.__getitem__,
        migrate=migrate,
        clock=ticking(0.0, 0.5),
    )
    got = job()
    assert got.outcome is Outcome.SKIPPED
    assert got.detail == "300 bytes off nodes 0 do not fit in their 299 free bytes"
    assert migrate.calls == []


def test_pull_job_with_nothing_off_the_target_does_nothing() -> None:
    migrate = FakeMigrate()

    def no_free(node: int) -> int:
        raise AssertionError("free memory is not needed")

    job = pull_job(
        lambda: [11],
        CG,
        nodes("0"),
        read_anon=Readings(CG, [{0: 100, 1: 0}]),
        free=no_free,
        migrate=migrate,
        clock=ticking(0.0, 0.0),
    )
    assert job().outcome is Outcome.NOTHING
    assert migrate.calls == []


def test_pull_job_without_numa_stat_is_skipped() -> None:
    job = pull_job(lambda: [11], CG, nodes("0"), read_anon=Readings(CG, [None]))
    got = job()
    assert got.outcome is Outcome.SKIPPED
    assert "no memory.numa_stat" in got.detail


def test_pull_job_stops_at_another_error_and_still_measures() -> None:
    migrate = FakeMigrate({11: PermissionError(errno.EPERM, "pid 11: migrate_pages failed")})
    job = pull_job(
        lambda: [11, 12],
        CG,
        nodes("0"),
        read_anon=Readings(CG, [{0: 0, 1: 300}, {0: 0, 1: 300}]),
        free={0: 1000}.__getitem__,
        migrate=migrate,
        clock=ticking(0.0, 1.0),
    )
    got = job()
    assert [pid for pid, _, _ in migrate.calls] == [11]
    assert got.outcome is Outcome.FAILED
    assert got.error == "[Errno 1] pid 11: migrate_pages failed"
    assert got.bytes_moved == 0


def test_narrow_job_measures_around_the_write() -> None:
    writes: list[str] = []
    job = narrow_job(
        lambda: writes.append("cpuset.mems"),
        CG,
        nodes("0"),
        read_anon=Readings(CG, [{0: 100, 1: 300}, {0: 380, 1: 20}]),
        clock=ticking(5.0, 9.0),
    )
    assert job() == MoveResult(Outcome.MOVED, bytes_moved=280, seconds=4.0, detail="to nodes 0")
    assert writes == ["cpuset.mems"]


def test_narrow_job_writes_even_with_nothing_to_move() -> None:
    writes: list[str] = []
    job = narrow_job(
        lambda: writes.append("cpuset.mems"),
        CG,
        nodes("0"),
        read_anon=Readings(CG, [{0: 100}, {0: 100}]),
        clock=ticking(0.0, 0.0),
    )
    assert job().outcome is Outcome.NOTHING
    assert writes == ["cpuset.mems"]


def test_narrow_job_without_numa_stat_is_not_measured() -> None:
    job = narrow_job(
        lambda: None, CG, nodes("0"), read_anon=Readings(CG, [None, None]), clock=ticking(0, 2)
    )
    assert job() == MoveResult(Outcome.MOVED, seconds=2, detail="written, not measured")


def test_a_failing_write_is_recorded_by_the_mover(mover: Mover) -> None:
    def write() -> None:
        raise CgroupError("/numad/w", "writing '0' to cpuset.mems: No space left on device")

    mover.submit("w", narrow_job(write, CG, nodes("0"), read_anon=Readings(CG, [{0: 1}])))
    assert mover.drain(WAIT)
    last = mover.last("w")
    assert last is not None
    assert last.outcome is Outcome.FAILED
    problem = "/numad/w: writing '0' to cpuset.mems: No space left on device"
    assert last.error == f"CgroupError: {problem}"
