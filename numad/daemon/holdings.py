"""What numad has decided and holds now: one object, shared by reference.

Daemon side, no host access. The composition root (``numad.daemon.root``), the
commit path (``numad.daemon.commits``), the reconciler and the views all read and
change this one object, under its ``lock``; none of them declares another's
attributes. The machine's part (``topology`` to ``reserved``) is set by
``Daemon.start`` and again by each rediscovery.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
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
        self.observe = observe

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if not self._lock.acquire(blocking, timeout):
            return False
        self._depth += 1
        if self._depth == 1:
            self._since = time.perf_counter()
        return True

    def release(self) -> None:
        self._depth -= 1
        held = time.perf_counter() - self._since if self._depth == 0 else None
        self._lock.release()
        if held is not None:
            self.observe(held)

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


class Holdings:
    topology: Topology
    cpu_policy: StaticPolicy
    engine: Engine
    books: Books
    reserved: int  # the reserved CPUs, as bits

    def __init__(self, lock: TimedLock | None = None) -> None:
        self.lock = lock or TimedLock()
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
