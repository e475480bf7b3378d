"""What numad observes of itself: the problems ``/v1/health`` lists, keyed by subject,
and the counters the host side counts into (``numad.daemon.metrics`` has them).

Shared vocabulary, below every stage: the host side reports here without knowing
the daemon, which owns the objects and passes them in. No host access. A problem
is set under a key (``write:<cgroup>``, ``loop:reconcile``, ``workload:<name>``...)
and cleared under the same key once the fault is gone, so a fault that repeats is
one line, not one line a time, and a fault that is mended leaves no line behind.
Readers take a snapshot without the daemon's lock.
"""

from __future__ import annotations

import threading
from typing import Protocol


class Problems:
    def __init__(self) -> None:
        self._items: dict[str, str] = {}
        self._lock = threading.Lock()

    def set(self, key: str, text: str) -> None:
        with self._lock:
            self._items[key] = text

    def clear(self, key: str) -> None:
        with self._lock:
            self._items.pop(key, None)

    def clear_prefix(self, prefix: str) -> None:
        with self._lock:
            for key in [k for k in self._items if k.startswith(prefix)]:
                del self._items[key]

    def has(self, key: str) -> bool:
        with self._lock:
            return key in self._items

    def subjects(self) -> list[str]:
        with self._lock:
            return list(self._items)

    def snapshot(self) -> list[str]:
        """Every problem's text, oldest first."""
        with self._lock:
            return list(self._items.values())


class Counter(Protocol):
    """A monotonic count (a prometheus-client ``Counter`` or one of its children)."""

    def inc(self, amount: float = 1) -> None: ...


class LabelledCounter(Protocol):
    def labels(self, *values: str) -> Counter: ...


class Observed(Protocol):
    """A distribution (a prometheus-client ``Histogram`` or one of its children)."""

    def observe(self, amount: float) -> None: ...


class LabelledHistogram(Protocol):
    def labels(self, *values: str) -> Observed: ...


class EnforcementCounters(Protocol):
    """What ``numad.host.enforce`` counts."""

    @property
    def cgroup_write_errors(self) -> Counter: ...
    @property
    def cgroup_not_effective(self) -> Counter: ...
    @property
    def drift_repairs(self) -> Counter: ...
    @property
    def cgroup_write_seconds(self) -> LabelledHistogram: ...


class MemoryMoveCounters(Protocol):
    """What ``numad.host.migration`` counts."""

    @property
    def memory_moves(self) -> LabelledCounter: ...
    @property
    def memory_moved(self) -> Counter: ...
    @property
    def memory_move_seconds(self) -> Counter: ...
