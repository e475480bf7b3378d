"""What numad has decided and holds now: one object, shared by reference.

Daemon side, no host access. The composition root (``numad.daemon.root``), the
commit path (``numad.daemon.commits``), the reconciler and the views all read and
change this one object; none of them declares another's attributes. The machine's
part (``topology`` to ``reserved``) is set by ``Daemon.start`` and again by each
rediscovery.

Two locks, always taken in this order:

- ``changing``: one change at a time (a request, a pass, a stop): whoever changes
  the holdings, or writes the cgroups, holds it from its decision to its last
  cgroup write. It takes ``lock`` too.
- ``lock``, the daemon's lock (``numad_lock_held_seconds``): readers (the views,
  ``plan``, a search for moves) take it alone. A change lets go of it around its
  checkpoint's write and fsync (a disk slow to sync) and its slow cgroup writes
  (``unlocked``: thousands of isolated cgroups to shrink, a kernel's walk at a
  partition change), keeping ``changing``; readers see every decision already
  committed, and no one else changes anything.

Each reader waits for the writes at the lock's gate for at most ``GRACE`` (50 ms), then
gets in beside them, once: a reader running beside the writes shares the interpreter
with them, and each of the writes' system calls waits for it (two readers in a loop:
admit+release cycles beside 1,000 strays 6x slower with no wait, 1.0x with it). A
change comes before readers that arrive while it waits for the lock, at its start and
at the end of its writes: a reader in a loop cannot hold it off. ``numad_lock_wait_seconds``
shows what readers waited, the gate included. A pass's walk of the tree, made before it
takes either, waits for a change under way at its next beat (``Changing.step_aside``).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType, TracebackType

from numad.placement.admission import Books, Engine, Outcome
from numad.placement.managers.cpu.static import StaticPolicy
from numad.topology.model import Topology
from numad.workload.shape import WorkloadSpec

# How long each thread that wants the daemon's lock waits at its gate while a change
# writes (then it gets in beside the writes, once). Changes short enough end within it;
# a reader in a loop runs once per grace beside longer ones. Readers that ran beside the
# writes all along shared the interpreter with them, and each of the writes' system
# calls waited for them (measured 2026-12-05, ``benchmarks/readers.py``, two readers in
# a loop: cycles beside 1,000 strays 6x slower; with this wait 1.0x, each read waiting
# at most 51-73 ms).
GRACE = 0.05
# How often a walk stepping aside for a change looks whether numad stops (SIGTERM is
# honoured within 2 s).
STEP_ASIDE_POLL = 0.1
# A hold of the daemon's lock this long (s, 10x the p99 target) is reported with the
# code that held it (``TimedLock.long``): the histogram shows that one was slow, this
# says where it ended, and who called.
LONG_HOLD = 0.1


class Gate:
    """Where a thread that wants the daemon's lock waits first, while a change writes
    with the lock let go: until ``open``, or for at most the ``grace`` that ``close``
    set, counted from its own arrival (none: until ``open``). A reader in a loop thus
    runs once per grace beside the writes, not all along. The change's own thread (the
    keeper) never waits."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._closed = False
        self._grace: float | None = None
        self._keeper: int | None = None

    def close(self, grace: float | None = None) -> None:
        with self._cond:
            self._closed, self._grace, self._keeper = True, grace, threading.get_ident()

    def open(self) -> None:
        with self._cond:
            self._closed, self._grace, self._keeper = False, None, None
            self._cond.notify_all()

    def wait(self, timeout: float = -1) -> bool:
        """Pass: at once if open or this thread keeps it; else once it opens or the
        grace since this call is over. False if ``timeout`` (s; negative: none) ran out
        first."""
        arrived = time.monotonic()
        give_up = None if timeout < 0 else arrived + timeout
        with self._cond:
            while self._closed and self._keeper != threading.get_ident():
                through = None if self._grace is None else arrived + self._grace
                ends = [t for t in (through, give_up) if t is not None]
                if not ends:
                    self._cond.wait()
                    continue
                left = min(ends) - time.monotonic()
                if left <= 0:
                    return through is not None and through <= time.monotonic()
                self._cond.wait(left)
            return True

    @property
    def shut(self) -> bool:
        """Closed until it opens (no deadline)."""
        return self._closed and self._grace is None


class TimedLock:
    """A re-entrant lock that reports how long it was held, from the outermost
    acquire to the outermost release (``numad_lock_held_seconds``), and where a hold
    of ``LONG_HOLD`` or more ended, in its holder's code (``long``). A thread that
    does not hold it passes its ``gate`` first."""

    def __init__(
        self,
        observe: Callable[[float], object] = lambda _: None,
        waited: Callable[[float], object] = lambda _: None,
        long: Callable[[float, str], object] = lambda _s, _w: None,
    ) -> None:
        self._lock = threading.RLock()
        self._depth = 0
        self._since = 0.0
        self._owner: int | None = None
        self.observe = observe  # each hold, once let go
        self.waited = waited  # each wait for it (at the gate, then for the lock)
        self.long = long  # each hold of LONG_HOLD or more, and where it ended (``holder``)
        self.gate = Gate()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        outer = not self.mine()
        start = time.perf_counter()
        if outer and blocking:
            if not self.gate.wait(timeout):
                return False
            if timeout >= 0:
                timeout = max(0.0, timeout - (time.perf_counter() - start))
        if not self._lock.acquire(blocking, timeout):
            return False
        self._depth += 1
        if self._depth == 1:
            self._owner = threading.get_ident()
            self._since = time.perf_counter()
        if outer:
            self.waited(self._since - start)
        return True

    def release(self) -> None:
        self._depth -= 1
        held = time.perf_counter() - self._since if self._depth == 0 else None
        if held is not None:
            self._owner = None
        self._lock.release()
        if held is not None:
            self.observe(held)
            if held >= LONG_HOLD:
                self.long(held, holder())

    def mine(self) -> bool:
        """Whether this thread holds the lock."""
        return self._owner == threading.get_ident()

    def theirs(self) -> bool:
        """Whether another thread holds the lock."""
        return self._owner not in {None, threading.get_ident()}

    @contextlib.contextmanager
    def released(self) -> Iterator[None]:
        """Let go of the lock (at every depth this thread holds it) for the block, then
        take it back as deep: each side is a hold of its own."""
        depth = self._depth if self.mine() else 0
        for _ in range(depth):
            self.release()
        try:
            yield
        finally:
            for _ in range(depth):
                self.acquire()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


def holder(depth: int = 6) -> str:
    """Where the calling thread lets go of a lock: its innermost ``depth`` frames
    outside this module and ``contextlib``, innermost first ("file:line in function",
    the file from its package's directory). Looked up only for a long hold, so an
    ordinary one costs nothing."""
    frames: list[str] = []
    frame: FrameType | None = sys._getframe(1)  # the caller's frames, read only here
    while frame is not None and len(frames) < depth:
        code = frame.f_code
        if code.co_filename not in {__file__, contextlib.__file__}:
            where = "/".join(code.co_filename.rsplit("/", 3)[-3:])
            frames.append(f"{where}:{frame.f_lineno} in {code.co_qualname}")
        frame = frame.f_back
    return " < ".join(frames)


class Changing:
    """One change at a time: ``writes`` (whoever holds it is the only one to change the
    holdings or write a cgroup), then the daemon's ``lock``. A thread that holds the
    daemon's lock alone may not start a change: it would wait on a change that waits
    on it (a programming error, raised). While a change waits for the lock, readers
    that come wait at its gate: they do not go first."""

    def __init__(self, lock: TimedLock, grace: float = GRACE) -> None:
        self.lock = lock
        self.writes = TimedLock()
        self.grace = grace

    def __enter__(self) -> bool:
        if self.lock.mine() and not self.writes.mine():
            raise RuntimeError("a change started under the daemon's lock alone: take changing")
        first = not self.writes.mine()
        self.writes.acquire()
        if first:  # readers that come now wait for the change to have the lock
            self.lock.gate.close()
        try:
            self.lock.acquire()
        except BaseException:
            self.writes.release()
            raise
        finally:
            if first:
                self.lock.gate.open()
        return True

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.lock.release()
        self.writes.release()

    def step_aside(self, stopping: threading.Event, timeout: float) -> float:
        """For a long walk made before any lock (a pass's scan of the tree): while
        another thread's change runs, wait until it ends, numad stops or ``timeout``
        (s) runs out, so that the walk does not share the interpreter with the change's
        decision and writes (measured 2026-12-05 beside 10,000 strays: an admission's
        own part 3.5 ms alone, 8.4 ms beside scans in a loop, 3.9 ms with them stepping
        aside). At once when no change runs, or when this thread holds either lock (it
        would wait on itself). The seconds waited."""
        if self.writes.mine() or self.lock.mine():
            return 0.0
        start = time.monotonic()
        while self.writes.theirs() and not stopping.is_set():
            left = timeout - (time.monotonic() - start)
            if left <= 0:
                break
            if self.writes.acquire(timeout=min(left, STEP_ASIDE_POLL)):
                self.writes.release()
                break
        return time.monotonic() - start

    @contextlib.contextmanager
    def unlocked(self) -> Iterator[None]:
        """The daemon's lock let go for the block, if this thread holds the change (else
        nothing is let go: whoever took the lock alone keeps it). Each reader that comes
        waits at the gate for ``grace``, then gets in; from the block's end readers wait
        until the change has the lock back."""
        if not (self.writes.mine() and self.lock.mine()):  # not a change, or let go already
            yield
            return
        gate = self.lock.gate
        gate.close(self.grace)
        try:
            with self.lock.released():
                try:
                    yield
                finally:
                    gate.close()  # readers wait from here until the change has it back
        finally:
            gate.open()


class Holdings:
    topology: Topology
    cpu_policy: StaticPolicy
    engine: Engine
    books: Books
    reserved: int  # the reserved CPUs, as bits

    def __init__(self, lock: TimedLock | None = None) -> None:
        self.lock = lock or TimedLock()
        self.changing = Changing(self.lock)
        self.specs: dict[str, WorkloadSpec] = {}
        self.outcomes: dict[str, Outcome] = {}
        self.unplaced: dict[str, str] = {}  # admitted, holding nothing: the reason
        self.orphans: set[str] = set()  # released cgroups that still exist
        self.others: set[str] = set()  # no workload's, isolated from exclusive CPUs
        self.seen: set[str] = set()  # workloads whose cgroup has existed
        # Workloads whose cgroup lies outside [paths] managed-roots now (a root taken
        # out of the config since): their CPUs stay held, their cgroups unwritten.
        self.outside: set[str] = set()
        self.gone_since: dict[str, float] = {}  # workload -> when its cgroups went
        self.rediscover_pending = False
        self.stopped = False
        self.stopping = threading.Event()  # SIGTERM: writes end, passes return
        self.passes = 0  # reconcile passes
        self.repairs = 0  # drift repaired, over all passes

    def cgroups_of(self, spec: WorkloadSpec) -> set[str]:
        return {spec.container_cgroup(c) for c in spec.containers}

    def forget(self, name: str) -> None:
        """What is known of a released workload besides its spec and books."""
        self.seen.discard(name)
        self.outcomes.pop(name, None)
        self.gone_since.pop(name, None)
        self.outside.discard(name)

    def owned(self) -> set[str]:
        """Every cgroup of an admitted workload."""
        return {p for s in self.specs.values() for p in self.cgroups_of(s)}
