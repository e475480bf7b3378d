"""Memory follows placement, without stalling numad: what to move, when, and locality.

Daemon side. The enforcer asks ``Migrations`` before it writes a cgroup's
``cpuset.mems``:

- a write that narrows the nodes the cgroup may use is left to the background
  mover when the cgroup has memory off the new nodes: the enforcer writes the
  CPUs and the old and new nodes together now (a write that moves nothing); the
  mover moves the pages with migrate_pages(2), then narrows the mems, one
  workload at a time, never under the daemon's lock or on the API path. The
  narrowing write alone would move them inside the kernel's cpuset workqueue,
  which every cpuset write on the host waits for: numad's admissions too;
- an exclusive placement whose mems do not pin memory to its CPUs' nodes
  (memory policy ``none``, or mems wider than those nodes) gets its pages there
  pulled with migrate_pages(2) where they fit (``[memory] pull``), like Red Hat's
  numad.

Locality is a workload's anonymous bytes on its own nodes (its mems, else its
CPUs' nodes) over all of them, read from ``memory.numa_stat`` each reconcile
pass; it is shown, exported, and a workload below ``[memory]
locality-threshold`` for three passes in a row is listed in health.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from numad.cpuset import CPUSet, NodeSet
from numad.errors import NumadError
from numad.host.memory_move import AnonReader, Mover, MoveResult, Outcome, narrow_job, pull_job
from numad.host.pages import locality, off_bytes, read_anon_by_node
from numad.host.targets import Cgroups, Deferred, Log
from numad.observe import MemoryMoveCounters, Problems

LOW_PASSES = 3  # passes in a row below the threshold before a workload is listed


class Migrations:
    def __init__(
        self,
        cgroups: Cgroups,
        root: Path | None,
        lock: AbstractContextManager[object],
        *,
        log: Log,
        metrics: MemoryMoveCounters,
        health: Problems,
        nodes_of: Callable[[CPUSet], NodeSet],
        pull: bool,
        emulated: bool,
        on_failed: Callable[[str], object] = lambda path: None,
        send: Callable[[], object] = lambda: None,
        read_anon: AnonReader = read_anon_by_node,
        make_pull: Callable[..., Any] = pull_job,
        make_narrow: Callable[..., Any] = narrow_job,
    ) -> None:
        self.cgroups = cgroups
        self.root = root  # the v2 hierarchy's directory; None: nothing is measured
        self.lock = lock
        self.log = log
        self.metrics = metrics
        self.health = health
        self.nodes_of = nodes_of
        self.pull_enabled = pull
        self.emulated = emulated  # a scratch tree: no pages, writes are instant
        self.read_anon = read_anon
        self.make_pull = make_pull
        self.make_narrow = make_narrow
        self.on_failed = on_failed  # a mems write failed: the enforcer writes it again
        self.send = send  # tells systemd a unit's Deferred write (a round of the unit loop)
        self.pending: dict[str, NodeSet] = {}  # cgroup -> mems the mover has yet to write
        self.pending_wide: dict[str, NodeSet] = {}  # cgroup -> what it holds meanwhile
        self.low: dict[str, int] = {}  # workload -> passes in a row below the threshold
        self._mover: Mover | None = None  # its thread starts with the first move

    @property
    def mover(self) -> Mover:
        if self._mover is None:
            self._mover = Mover(self.log, self._done)
        return self._mover

    # -- asked by the enforcer, under the daemon's lock --------------------------------------

    def interim(self, path: str, mems: NodeSet) -> NodeSet | None:
        """The mems to write now when writing ``mems`` would move pages: the nodes the
        cgroup may use now and the new ones (a write that moves nothing); None when
        ``mems`` can be written at once. The mover moves the pages, then narrows."""
        if path in self.pending:
            return self.pending_wide.get(path)
        try:
            now = self.cgroups.read_effective(path)[1]
        except NumadError:
            return None  # the write itself will say what is wrong
        if not now - mems:
            return None
        by_node = self._anon(path)
        if by_node is None and self.emulated:
            return None  # a scratch tree: no pages
        if by_node is not None and not off_bytes(by_node, mems):
            return None
        return now | mems

    def narrow(self, path: str, mems: NodeSet, wide: NodeSet) -> None:
        """Queue the move of the cgroup's pages onto ``mems`` and the mems write after."""
        self.pending[path] = mems
        self.pending_wide[path] = wide

        def write() -> None:
            try:
                self.cgroups.write(path, None, mems)
            except Deferred:  # a unit's: systemd writes it, now (the mover holds no lock)
                self.send()
                self.cgroups.write(path, None, mems)  # done, or Deferred again with why

        def pids() -> list[int]:
            return self._pids(path)

        job = self.make_narrow(write, self._dir(path), mems, pids=pids, read_anon=self.read_anon)
        self.mover.submit(path, job)

    def placed(self, path: str, cpus: CPUSet, mems: NodeSet | None) -> None:
        """An exclusive set was granted: pull the pages that sit off its CPUs' nodes."""
        if not self.pull_enabled or self.root is None or (self.emulated and not self._anon(path)):
            return
        to = self.nodes_of(cpus)
        if mems is not None:
            to &= mems
            if not to or not mems - to:
                return  # mems alone keep the memory on the CPUs' nodes (or cannot)
        if not to:
            return

        def pids() -> list[int]:
            return self._pids(path)

        job = self.make_pull(pids, self._dir(path), to, read_anon=self.read_anon)
        self.mover.submit(path, job)

    def drifting(self, path: str) -> bool:
        """The mover has yet to write this cgroup's mems: a read-back differs, rightly."""
        return path in self.pending

    def settled(self, path: str) -> None:
        """The enforcer wrote the cgroup's mems itself (nothing to move), or the cgroup is
        gone: a move that failed there is over, and so is its health problem (else a
        unit whose move timed out on a slow systemd kept it after a later write)."""
        if path not in self.pending:
            self.health.clear(f"memory:{path}")

    # -- the mover's report, on its thread ----------------------------------------------------

    def _done(self, path: str, result: MoveResult) -> None:
        with self.lock:
            mems = self.pending.pop(path, None)
            self.pending_wide.pop(path, None)
            self.metrics.memory_moves.labels(result.outcome.value).inc()
            self.metrics.memory_moved.inc(result.bytes_moved)
            self.metrics.memory_move_seconds.inc(result.seconds)
            key = f"memory:{path}"
            if result.outcome is Outcome.FAILED:
                what = f"mems {mems} not written" if mems is not None else "pages not pulled"
                self.health.set(key, f"{path}: moving its memory failed ({what}): {result.error}")
            else:
                self.health.clear(key)
            if mems is not None and result.outcome is Outcome.FAILED:
                self.on_failed(path)

    # -- reading -------------------------------------------------------------------------------

    def status(self, paths: Iterable[str]) -> str | None:
        if self._mover is None:
            return None
        return "migrating" if any(self._mover.status(p) for p in paths) else None

    def last(self, paths: Iterable[str]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for path in paths:
            result = self._mover.last(path) if self._mover is not None else None
            if result is not None:
                out.append(
                    {
                        "cgroup": path,
                        "outcome": result.outcome.value,
                        "bytes_moved": result.bytes_moved,
                        "seconds": round(result.seconds, 3),
                        "detail": result.error or result.detail,
                    }
                )
        return out

    def locality(self, paths: Iterable[str], nodes: NodeSet) -> tuple[float | None, int]:
        """The share of the cgroups' anonymous bytes on ``nodes``, and the bytes."""
        total = self.resident(paths)
        return locality(total, nodes), sum(total.values())

    def resident(self, paths: Iterable[str]) -> dict[int, int]:
        """The cgroups' anonymous bytes per node (``memory.numa_stat``); {} unknown."""
        total: dict[int, int] = {}
        for path in paths:
            for node, size in (self._anon(path) or {}).items():
                total[node] = total.get(node, 0) + size
        return total

    def check(self, name: str, share: float | None, threshold: float, moving: bool) -> None:
        """Count the passes a workload's locality stays below the threshold."""
        key = f"locality:{name}"
        if share is None or share >= threshold or moving:
            self.low.pop(name, None)
            self.health.clear(key)
            return
        self.low[name] = self.low.get(name, 0) + 1
        if self.low[name] >= LOW_PASSES:
            self.health.set(
                key,
                f"{name}: {share:.0%} of its memory is on its own NUMA nodes, below"
                f" [memory] locality-threshold {threshold:.0%} for {self.low[name]} passes",
            )

    def forget(self, name: str, paths: Iterable[str]) -> None:
        self.low.pop(name, None)
        self.health.clear(f"locality:{name}")
        for path in paths:
            if self._mover is not None:
                self._mover.forget(path)

    def stop(self, timeout: float = 10.0) -> None:
        """Let a move under way finish (a mems write cannot be cut short); drop the rest."""
        if self._mover is not None:
            self._mover.stop(timeout)

    def _dir(self, path: str) -> Path:
        return (self.root or Path("/nonexistent")) / path

    def _anon(self, path: str) -> dict[int, int] | None:
        if self.root is None:
            return None
        try:
            return self.read_anon(self._dir(path))
        except NumadError:
            return None

    def _pids(self, path: str) -> list[int]:
        pids: list[int] = []
        processes = getattr(self.cgroups, "processes", None)
        if processes is None:
            return pids
        for cgroup in [path, *self.cgroups.descendants(path)]:
            try:
                pids += processes(cgroup)
            except NumadError:
                continue  # gone meanwhile
        return pids
