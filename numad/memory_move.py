"""Where a workload's anonymous memory is, and moving it: numa_stat, migrate_pages, a worker.

Daemon side: the daemon decides what to move and when; this module measures,
moves, and runs one move at a time on its own thread. It reads cgroups'
``memory.numa_stat`` and ``/sys/devices/system/node/nodeN/meminfo`` and calls
migrate_pages(2); it writes no file (``narrow_job`` runs the daemon's write).

Kernel behaviour (measured on the VM kernels 6.1 and 6.12): on v2 a write that
narrows ``cpuset.mems`` migrates the cgroup's pages inside the write(), slowly
(about 1 s per 64 MiB under emulation), and any other cpuset write made
meanwhile waits for it (benchmarks/migration.py saw an admission wait 4.1 s);
a write that keeps the old node moves nothing, and migrate_pages(2) then moves
the pages without holding up anyone's cpuset writes. On v1 a mems change moves
pages only where ``cpuset.memory_migrate`` is 1.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from numad.cpuset import NodeSet
from numad.errors import CgroupError, HostFileError, NumadError, SysfsFormatError


def anon_by_node(text: str, *, v1_page_size: int | None = None) -> dict[int, int]:
    """Anonymous bytes per node from the text of a cgroup's ``memory.numa_stat``.

    * v2 (Documentation/admin-guide/cgroup-v2.rst, "memory.numa_stat"): lines
      ``type N0=<bytes in node 0> N1=<bytes in node 1> ...`` in BYTES, found by key
      (the doc warns that new entries can show up in the middle).
    * v1 (Documentation/admin-guide/cgroup-v1/memory.rst, "numa_stat"): lines
      ``anon=<total pages> N0=<node 0 pages> ...`` in PAGES (pass ``v1_page_size``);
      ``hierarchical_anon`` (children's pages too) is preferred. Lines with no
      ``=`` in the first word are skipped, as runc does for vendor additions.

    Raises ValueError naming the line when a line is malformed, when no anon
    line is present, or when a v1 text comes without ``v1_page_size``.
    """
    rows: dict[str, dict[int, int]] = {}
    v1 = any("=" in line.split(maxsplit=1)[0] for line in text.splitlines() if line.strip())
    for number, line in enumerate(text.splitlines(), start=1):
        words = line.split()
        if not words:
            continue
        key, eq, total = words[0].partition("=")
        if v1 and not eq:
            continue
        if not key or (eq and not total.isdigit()):
            raise ValueError(f"memory.numa_stat line {number}: {line!r} does not start with a key")
        rows[key] = _per_node(words[1:], number, line)
    key = "hierarchical_anon" if v1 and "hierarchical_anon" in rows else "anon"
    if key not in rows:
        raise ValueError("memory.numa_stat: no anon line")
    if not v1:
        return rows[key]
    if v1_page_size is None or v1_page_size <= 0:
        raise ValueError("memory.numa_stat: the v1 format counts pages; pass v1_page_size")
    return {node: pages * v1_page_size for node, pages in rows[key].items()}


def _per_node(words: list[str], number: int, line: str) -> dict[int, int]:
    counts: dict[int, int] = {}
    for word in words:
        name, _, value = word.partition("=")
        node = name[1:]
        if name[:1] != "N" or not node.isdigit() or not value.isdigit() or int(node) in counts:
            raise ValueError(f"memory.numa_stat line {number}: {line!r}: bad field {word!r}")
        counts[int(node)] = int(value)
    return counts


def read_anon_by_node(cgroup_dir: Path) -> dict[int, int] | None:
    """Anonymous bytes per node of v2 ``cgroup_dir`` and its descendants; None without the file.

    The file is missing where the memory controller is not enabled. It already
    covers the subtree, so descendants are not summed: memory_numa_stat_show()
    (mm/memcontrol.c) prints lruvec_page_state(), the rstat counter to which
    mem_cgroup_css_rstat_flush() adds each child's delta (``state``, where the
    cgroup's own share is ``state_local``). CgroupError: unreadable or malformed.
    """
    path = cgroup_dir / "memory.numa_stat"
    try:
        return anon_by_node(path.read_text())
    except FileNotFoundError:
        return None
    except OSError as err:
        raise CgroupError(str(path), f"cannot be read: {err.strerror or err}") from err
    except ValueError as err:
        raise CgroupError(str(path), f"unexpected content: {err}") from err


def locality(by_node: Mapping[int, int], nodes: NodeSet) -> float | None:
    """The share of the bytes that sit on ``nodes`` (0.0 to 1.0); None when there are none."""
    total = sum(by_node.values())
    if total <= 0:
        return None
    return sum(size for node, size in by_node.items() if node in nodes) / total


def free_bytes(node: int, sys_root: Path = Path("/sys")) -> int:
    """``MemFree`` of ``node`` in bytes, from ``devices/system/node/node<N>/meminfo``."""
    path = sys_root / "devices" / "system" / "node" / f"node{node}" / "meminfo"
    try:
        text = path.read_text()
    except OSError as err:
        raise HostFileError(str(path), f"cannot be read: {err.strerror or err}") from err
    for line in text.splitlines():
        # "Node 0 MemFree:         8618408 kB" (drivers/base/node.c, node_read_meminfo)
        words = line.split()
        if words[2:3] == ["MemFree:"] and len(words) == 5 and words[3].isdigit():
            return int(words[3]) * 1024
    raise SysfsFormatError(str(path), "has no 'MemFree: <n> kB' line")


def off_bytes(by_node: Mapping[int, int], nodes: NodeSet) -> int:
    """Bytes that sit on nodes outside ``nodes``."""
    return sum(size for node, size in by_node.items() if node not in nodes)


# arch/x86/entry/syscalls/syscall_64.tbl and include/uapi/asm-generic/unistd.h
# (arm64 uses the generic table); checked in this host's linux-libc-dev headers.
SYSCALL_NUMBERS: Mapping[str, int] = {"x86_64": 256, "aarch64": 238}
MAX_NUMNODES = 1024  # the kernel's largest: CONFIG_NODES_SHIFT is at most 10
_WORD_BITS = ctypes.sizeof(ctypes.c_ulong) * 8

Syscall = Callable[[int, int, int, tuple[int, ...], tuple[int, ...]], tuple[int, int]]
"""(number, pid, maxnode, old mask words, new mask words) -> (return value, errno)."""


@functools.cache
def _libc() -> Any:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def libc_syscall(
    number: int, pid: int, maxnode: int, old: tuple[int, ...], new: tuple[int, ...]
) -> tuple[int, int]:
    """The real syscall through libc's syscall(); the masks become unsigned long arrays."""
    words = ctypes.c_ulong * len(old)
    args = (ctypes.c_long(number), ctypes.c_int(pid), ctypes.c_ulong(maxnode))
    result = int(_libc().syscall(*args, words(*old), words(*new)))
    return result, (ctypes.get_errno() if result == -1 else 0)


def migrate_pages(
    pid: int, old: NodeSet, new: NodeSet, *, syscall: Syscall = libc_syscall, machine: str = ""
) -> int:
    """Move ``pid``'s pages on ``old`` to ``new``; the number of pages that could not be moved.

    Raises OSError with the kernel's errno: ProcessLookupError (ESRCH) when the
    process has exited; PermissionError (EPERM) without ptrace access to it, or
    without CAP_SYS_NICE when ``new`` leaves its cpuset; EINVAL for a node the
    kernel lacks or when ``new`` misses numad's own cpuset (kernel_migrate_pages,
    mm/mempolicy.c). NumadError on a machine whose syscall number is unknown.
    """
    arch = machine or platform.machine()
    number = SYSCALL_NUMBERS.get(arch)
    if number is None:
        known = ", ".join(f"{m} ({n})" for m, n in SYSCALL_NUMBERS.items())
        raise NumadError("migrate_pages", f"no syscall number known for {arch!r}", known)
    union = old | new
    highest = union.max() if union else 0
    if highest >= MAX_NUMNODES:
        raise ValueError(f"node {highest} is beyond any kernel's MAX_NUMNODES ({MAX_NUMNODES})")
    # Both masks are arrays of unsigned long, as many words as the highest node
    # needs. maxnode is the mask's bit count PLUS ONE: the man page calls it
    # "the maximum node number plus one", but get_nodes() (mm/mempolicy.c) starts
    # with "--maxnode" and reads only maxnode - 1 bits, so maxnode = highest + 1
    # would drop the highest node. libnuma passes mask size + 1 for the same
    # reason. Bits above the kernel's MAX_NUMNODES must be zero (else EINVAL).
    count = highest // _WORD_BITS + 1
    maxnode = count * _WORD_BITS + 1
    result, err = syscall(number, pid, maxnode, _words(old, count), _words(new, count))
    if result < 0:
        raise OSError(err, f"pid {pid}: migrate_pages failed: {os.strerror(err)}")
    return result


def _words(nodes: NodeSet, count: int) -> tuple[int, ...]:
    mask = (1 << _WORD_BITS) - 1
    return tuple((nodes.bits >> (i * _WORD_BITS)) & mask for i in range(count))


class Outcome(StrEnum):
    MOVED = "moved"  # the move ran; bytes_moved says how much left the other nodes
    NOTHING = "nothing"  # no anonymous bytes were off the target nodes
    SKIPPED = "skipped"  # not attempted; detail says why
    FAILED = "failed"  # error says what went wrong


@dataclass(frozen=True, slots=True)
class MoveResult:
    """What one move did. ``bytes_moved`` is anon bytes off the target, before - after."""

    outcome: Outcome
    bytes_moved: int = 0
    seconds: float = 0.0
    error: str | None = None
    detail: str = ""
    pages_not_moved: int = 0  # migrate_pages' count, summed over the processes
    pids_gone: int = 0  # processes that exited before their move (ESRCH)


Job = Callable[[], MoveResult]
Clock = Callable[[], float]
AnonReader = Callable[[Path], dict[int, int] | None]


def pull_job(
    pids: Callable[[], list[int]],
    cgroup_dir: Path,
    to: NodeSet,
    *,
    read_anon: AnonReader = read_anon_by_node,
    free: Callable[[int], int] = free_bytes,
    migrate: Callable[[int, NodeSet, NodeSet], int] = migrate_pages,
    clock: Clock = time.monotonic,
) -> Job:
    """A job that pulls the cgroup's anon pages onto ``to`` with migrate_pages(2).

    The cgroup's cpuset.mems must already allow ``to`` (the daemon writes old
    and new nodes together first, a write that moves nothing).

    1. measure; nothing off ``to``: NOTHING; no numa_stat: SKIPPED.
    2. the bytes off ``to`` must fit in the free memory of ``to``, else SKIPPED
       (migrate_pages moves a process whole; a node filled up makes it reclaim).
    3. migrate_pages(pid, nodes holding the bytes, ``to``) for each pid; a pid
       that exited is counted and skipped; another error stops the loop (FAILED).
    4. measure again: bytes_moved = bytes off ``to`` before - after.
    """

    def job() -> MoveResult:
        start = clock()
        before = read_anon(cgroup_dir)
        if before is None:
            detail = "no memory.numa_stat (memory controller off)"
            return MoveResult(Outcome.SKIPPED, seconds=clock() - start, detail=detail)
        off = NodeSet(node for node, size in before.items() if node not in to and size > 0)
        wanted = off_bytes(before, to)
        if not wanted:
            return MoveResult(Outcome.NOTHING, seconds=clock() - start)
        room = sum(free(node) for node in to)
        if wanted > room:
            detail = f"{wanted} bytes off nodes {to} do not fit in their {room} free bytes"
            return MoveResult(Outcome.SKIPPED, seconds=clock() - start, detail=detail)
        not_moved = gone = 0
        error: str | None = None
        for pid in pids():
            try:
                not_moved += migrate(pid, off, to)
            except ProcessLookupError:
                gone += 1
            except OSError as err:
                error = str(err)
                break
        after = read_anon(cgroup_dir)
        moved = wanted - off_bytes(after, to) if after is not None else 0
        return MoveResult(
            Outcome.FAILED if error else Outcome.MOVED,
            bytes_moved=max(moved, 0),
            seconds=clock() - start,
            error=error,
            detail=f"from nodes {off} to {to}",
            pages_not_moved=not_moved,
            pids_gone=gone,
        )

    return job


def narrow_job(
    write: Callable[[], None],
    cgroup_dir: Path,
    to: NodeSet,
    *,
    pids: Callable[[], list[int]] = list,
    read_anon: AnonReader = read_anon_by_node,
    migrate: Callable[[int, NodeSet, NodeSet], int] = migrate_pages,
    clock: Clock = time.monotonic,
) -> Job:
    """A job that moves the cgroup's pages onto ``to``, then runs ``write`` (the
    daemon's cpuset.mems write, narrowing the cgroup to ``to``) and measures.

    The daemon has widened the cgroup's mems to old and new nodes first (a write
    that moves nothing). The pages move with migrate_pages(2), process by process,
    on this thread: a mems write that moves them itself (v2; v1 with
    memory_migrate) does it in the kernel's cpuset workqueue, and *every* cpuset
    write on the host flushes that queue before it returns (cpuset_write_resmask,
    kernel/cgroup/cpuset.c), so numad's other writes would wait for the move.
    The narrowing write then finds little left to move. Where migrate_pages is
    refused (EPERM: no CAP_SYS_PTRACE for a root workload) the write moves them,
    slowly, and the result says so.
    """

    def job() -> MoveResult:
        before = read_anon(cgroup_dir)
        start = clock()
        off = NodeSet(n for n, size in (before or {}).items() if n not in to and size > 0)
        not_moved = gone = 0
        refused: str | None = None
        for pid in pids() if off else []:
            try:
                not_moved += migrate(pid, off, to)
            except ProcessLookupError:
                gone += 1
            except OSError as err:
                refused = f"migrate_pages: {err}; the mems write moved them"
                break
        write()
        seconds = clock() - start
        after = read_anon(cgroup_dir)
        if before is None or after is None:
            return MoveResult(Outcome.MOVED, seconds=seconds, detail="written, not measured")
        wanted = off_bytes(before, to)
        moved = max(wanted - off_bytes(after, to), 0)
        return MoveResult(
            Outcome.MOVED if wanted else Outcome.NOTHING,
            bytes_moved=moved,
            seconds=seconds,
            detail=refused or f"to nodes {to}",
            pages_not_moved=not_moved,
            pids_gone=gone,
        )

    return job


OnDone = Callable[[str, MoveResult], None]


class Log(Protocol):
    def info(self, event: str, **kw: Any) -> Any: ...
    def error(self, event: str, **kw: Any) -> Any: ...


class Mover:
    """One worker thread running move jobs one at a time, oldest workload first.

    A job for a workload whose job is still queued replaces it in place; one
    submitted while its job runs waits its turn. ``on_done(name, result)`` runs
    on the worker thread after each job, outside the Mover's lock, when last(name)
    is the result and status(name) is None (unless a newer job is queued).
    drain() and stop() wait for on_done: never call them holding on_done's lock.
    """

    def __init__(self, log: Log, on_done: OnDone | None = None, *, clock: Clock = time.monotonic):
        self._log = log
        self._on_done = on_done
        self._clock = clock
        self._cond = threading.Condition()
        self._queue: dict[str, Job] = {}  # insertion-ordered: the oldest first
        self._running: str | None = None
        self._busy = False  # a job or its on_done is under way
        self._last: dict[str, MoveResult] = {}
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="numad-mover", daemon=True)
        self._thread.start()

    def submit(self, name: str, job: Job) -> None:
        """Queue ``job`` for workload ``name``, replacing its job that has not started yet."""
        with self._cond:
            if self._stopping:
                raise NumadError(name, "the memory mover has stopped; the move was not queued")
            self._queue[name] = job
            self._cond.notify_all()

    def status(self, name: str) -> str | None:
        """``"migrating"`` while a job for ``name`` is queued or running, else None."""
        with self._cond:
            return "migrating" if name in self._queue or self._running == name else None

    def last(self, name: str) -> MoveResult | None:
        """The result of the last finished job for ``name``."""
        with self._cond:
            return self._last.get(name)

    def forget(self, name: str) -> None:
        """Drop ``name``'s queued job and last result (the workload is gone)."""
        with self._cond:
            self._queue.pop(name, None)
            self._last.pop(name, None)

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until no job is queued or running; False when ``timeout`` passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._queue and not self._busy, timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float | None = None) -> bool:
        """Drop the queued jobs, let the running one finish, join the thread; True when it ended."""
        with self._cond:
            self._stopping = True
            dropped = sorted(self._queue)
            self._queue.clear()
            self._cond.notify_all()
        if dropped:
            self._log.info("memory_moves_dropped", workloads=dropped)
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        try:
            self._loop()
        finally:  # ended by stop(), or killed outside a job (the clock, the logger): say so
            with self._cond:
                self._stopping, self._running, self._busy = True, None, False
                self._queue.clear()
                self._cond.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._stopping)
                if self._stopping:
                    return
                name = next(iter(self._queue))
                job = self._queue.pop(name)
                self._running, self._busy = name, True
            result = self._execute(name, job)
            with self._cond:
                self._last[name] = result
                self._running = None
            try:
                if self._on_done is not None:
                    self._on_done(name, result)
            except Exception as err:  # noqa: BLE001 - the daemon's callback must not end the worker
                self._log.error("memory_move_callback_failed", workload=name, problem=repr(err))
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    def _execute(self, name: str, job: Job) -> MoveResult:
        start = self._clock()
        try:
            result = job()
        except Exception as err:  # noqa: BLE001 - one workload's failed move never ends the worker
            self._log.error("memory_move_failed", workload=name, problem=repr(err))
            problem = f"{type(err).__name__}: {err}"
            return MoveResult(Outcome.FAILED, seconds=self._clock() - start, error=problem)
        report = self._log.error if result.error else self._log.info
        report("memory_move_finished", workload=name, **asdict(result))
        return result
