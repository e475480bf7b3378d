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
  slow cgroup writes (``unlocked``: thousands of isolated cgroups to shrink, a
  kernel's walk at a partition change), keeping ``changing``: readers get in then,
  and see every decision already committed; no one else changes anything. The price:
  readers busy meanwhile share the interpreter with the writes and slow them (4 API
  clients reading in a loop: 10 admit+release cycles 4.2 s, against 0.6 s quiet and
  0.7 s when readers waited out the writes; measured 2026-12-05, not yet remedied).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from types import TracebackType

from numad.placement.admission import Books, Engine, Outcome
from numad.placement.managers.cpu.static import StaticPolicy
from numad.topology.model import Topology
from numad.workload.shape import WorkloadSpec


class TimedLock:
    """A re-entrant lock that reports how long it was held, from the outermost
    acquire to the outermost release (``numad_lock_held_seconds``)."""

    def __init__(self, observe: Callable[[float], object] = lambda _: None) -> None:
        self._lock = threading.RLock()
        self._depth = 0
        self._since = 0.0
        self._owner: int | None = None
        self.observe = observe

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if not self._lock.acquire(blocking, timeout):
            return False
        self._depth += 1
        if self._depth == 1:
            self._owner = threading.get_ident()
            self._since = time.perf_counter()
        return True

    def release(self) -> None:
        self._depth -= 1
        held = time.perf_counter() - self._since if self._depth == 0 else None
        if held is not None:
            self._owner = None
        self._lock.release()
        if held is not None:
            self.observe(held)

    def mine(self) -> bool:
        """Whether this thread holds the lock."""
        return self._owner == threading.get_ident()

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


class Changing:
    """One change at a time: ``writes`` (whoever holds it is the only one to change the
    holdings or write a cgroup), then the daemon's ``lock``. A thread that holds the
    daemon's lock alone may not start a change: it would wait on a change that waits
    on it (a programming error, raised)."""

    def __init__(self, lock: TimedLock) -> None:
        self.lock = lock
        self.writes = TimedLock()

    def __enter__(self) -> bool:
        if self.lock.mine() and not self.writes.mine():
            raise RuntimeError("a change started under the daemon's lock alone: take changing")
        self.writes.acquire()
        try:
            self.lock.acquire()
        except BaseException:
            self.writes.release()
            raise
        return True

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.lock.release()
        self.writes.release()

    @contextlib.contextmanager
    def unlocked(self) -> Iterator[None]:
        """The daemon's lock let go for the block, if this thread holds the change (else
        nothing is let go: whoever took the lock alone keeps it)."""
        if not self.writes.mine():
            yield
            return
        with self.lock.released():
            yield


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
