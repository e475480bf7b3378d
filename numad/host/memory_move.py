"""Moving a workload's memory on a worker thread: the jobs and the one-thread Mover.

Daemon side: the daemon decides what to move and when (``numad.host.migration``);
this module runs one move at a time on its own thread, measuring before and
after with ``numad.host.pages``. It writes no file (``narrow_job`` runs the daemon's
write).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from numad.cpuset import NodeSet
from numad.errors import NumadError
from numad.host.pages import free_bytes, migrate_pages, off_bytes, read_anon_by_node


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
