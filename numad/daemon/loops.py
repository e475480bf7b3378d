"""The daemon's background loops (reconcile, hotplug, watchdog), each supervised.

Daemon side. A loop survives any exception of its body: the exception is
logged once with its traceback, counted in ``numad_loop_errors_total{loop}``
and shown in ``/v1/health`` until a later pass of that loop succeeds. The
systemd watchdog is fed only while the reconcile loop makes progress, so a
loop that is stuck (a lock never released) or fails pass after pass lets
systemd restart numad (DESIGN invariant 9).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from functools import partial
from typing import TYPE_CHECKING, Protocol

from numad.daemon import notify
from numad.daemon.metrics import Metrics
from numad.daemon.watch import Event, debounce
from numad.errors import NumadError
from numad.host.cgroup.events import CgroupEvents
from numad.observe import Problems

if TYPE_CHECKING:
    from numad.host.targets import Log


# A pass under way feeds the watchdog while it advances, up to this long (seconds): past
# it numad is taken as stuck whatever it does (10,000 cgroups take ~0.2 s a pass here).
LONGEST_PASS = 600.0


class Supervisor:
    def __init__(
        self,
        log: Log,
        metrics: Metrics,
        problems: Problems,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.log = log
        self.metrics = metrics
        self.problems = problems
        self.clock = clock
        self.progress: dict[str, float] = {}  # loop -> when a pass last succeeded
        self.failing: dict[str, str] = {}  # loop -> how its last pass failed
        self.running: dict[str, float] = {}  # loop -> when its pass under way began
        self.beats: dict[str, float] = {}  # loop -> when its pass under way last advanced

    def run_once(self, loop: str, body: Callable[[], object]) -> bool:
        """One pass of ``loop``; True when it succeeded. Never raises an Exception. A
        failure is counted every pass but logged once while it stays the same (with its
        traceback); the pass that succeeds again says so."""
        self.running[loop] = self.clock()
        try:
            body()
        except Exception as err:
            self.metrics.loop_errors.labels(loop).inc()
            problem = f"{type(err).__name__}: {err}"
            self.problems.set(f"loop:{loop}", f"{loop} loop: {problem}; retried next pass")
            if self.failing.get(loop) != problem:
                self.log.exception("loop_failed", loop=loop, problem=repr(err))
            self.failing[loop] = problem
            return False
        finally:
            self.running.pop(loop, None)
        self.problems.clear(f"loop:{loop}")
        if self.failing.pop(loop, None) is not None:
            self.log.info("loop_recovered", loop=loop)
        self.progress[loop] = self.clock()
        return True

    def beat(self, loop: str) -> None:
        """``loop``'s pass under way advanced (a directory of the tree walked, a cgroup
        written): on a busy or slow host a pass may outlast the watchdog's window."""
        self.beats[loop] = self.clock()

    def progressing(self, loop: str, within: float) -> bool:
        """Whether ``loop`` completed a pass in the last ``within`` seconds, or has one
        under way that advanced within them and began less than ``LONGEST_PASS`` ago
        (alive and making progress; a pass that hangs, or never ends, is not)."""
        now = self.clock()
        last = self.progress.get(loop)
        if last is not None and now - last <= within:
            return True
        began = self.running.get(loop)
        beat = self.beats.get(loop)
        return (
            began is not None
            and beat is not None
            and beat >= began
            and now - beat <= within
            and now - began <= LONGEST_PASS
        )


def reconcile_loop(
    supervisor: Supervisor,
    reconcile: Callable[[], object],
    stop: threading.Event,
    period: float,
    wake: threading.Event | None = None,
) -> None:
    """A pass every ``period`` seconds, or at once when ``wake`` is set."""
    wake = wake or threading.Event()
    while not stop.is_set():
        wake.wait(period)
        wake.clear()
        if stop.is_set():
            return
        if supervisor.run_once("reconcile", reconcile):
            notify.status(f"last reconcile {time.strftime('%H:%M:%S')}")


def hotplug_loop(
    supervisor: Supervisor,
    events: Callable[[], Iterable[Event]],
    rediscover: Callable[[], object],
    stop: threading.Event,
) -> None:
    """Rediscover after each burst of events. Without netlink access numad runs
    without hotplug (said once); an event source that breaks is opened again."""
    while not stop.is_set():
        try:
            source = events()
        except (OSError, ImportError) as err:
            supervisor.log.warning("hotplug_unavailable", problem=str(err))
            return

        supervisor.run_once(
            "hotplug", partial(debounce, source, _pass(supervisor, rediscover), stop=stop)
        )
        stop.wait(1.0)  # the source ended or broke: open it again, not in a tight loop


class Writes(Protocol):
    """The workloads' cgroups whose cpusets numad holds (``numad.daemon.commits.Commits``)."""

    watched: frozenset[str]

    def written_elsewhere(self, paths: set[str]) -> bool: ...


def cgroup_loop(  # noqa: PLR0917 - the loop's parts
    supervisor: Supervisor,
    open_events: Callable[[], CgroupEvents],
    isolate_new: Callable[[list[str]], object],
    stop: threading.Event,
    wake_reconcile: threading.Event | None = None,
    writes: Writes | None = None,
) -> None:
    """Isolate each cgroup as it appears in the managed roots (inotify), not at the
    next reconcile pass, which stays the safety net; one removed wakes the reconcile
    loop (a released unit's settings reset, a vanished workload's grace started), and
    so does a workload's cpuset written by another (``writes``: the drift repaired
    now). Without inotify numad runs on the passes alone (said once)."""
    try:
        events = open_events()
    except (OSError, NumadError) as err:
        supervisor.log.warning("cgroup_events_unavailable", problem=str(err))
        return
    try:
        while not stop.is_set():
            if writes is not None:
                events.watch_writes(writes.watched)
            found = events.read(0.25)
            if found:
                supervisor.run_once("cgroups", partial(isolate_new, found))
            wake = bool(events.removed)
            events.removed.clear()
            if events.modified and writes is not None:
                wake |= _drifted(supervisor, writes, events.modified)
            if wake and wake_reconcile is not None:
                wake_reconcile.set()
    finally:
        events.close()


def _drifted(supervisor: Supervisor, writes: Writes, modified: set[str]) -> bool:
    """Whether a pass should repair the ``modified`` cgroups (emptied): one of them
    was written by another, or it could not be told."""
    paths = set(modified)
    modified.clear()
    found: list[bool] = []
    ran = supervisor.run_once("drift", lambda: found.append(writes.written_elsewhere(paths)))
    return not ran or any(found)


class Sender(Protocol):
    """What numad owes systemd (``numad.host.isolation.Isolation``)."""

    pending: threading.Event

    def owed(self) -> bool: ...
    def send(self) -> bool: ...


def unit_loop(
    supervisor: Supervisor,
    units: Sender,
    wake_reconcile: threading.Event,
    stop: threading.Event,
) -> None:
    """Tell systemd, off the daemon's lock, the values numad wants its units to hold
    (the workloads' own units: ``numad.host.workload_units``; the cgroups isolated:
    ``numad.host.unit_record``): at once when there is a new one, and every second
    while one is owed (a failed call, retried with the bus's backoff). A value
    settled that may have held back a write wakes the reconcile loop."""

    def round_() -> None:
        if units.send():
            wake_reconcile.set()

    while not stop.is_set():
        units.pending.wait(1.0)
        if stop.is_set():
            return
        units.pending.clear()  # before asking: one asked for meanwhile sets it again
        if units.owed():
            supervisor.run_once("units", round_)


def _pass(
    supervisor: Supervisor, rediscover: Callable[[], object]
) -> Callable[[list[Event]], None]:
    def burst(_events: list[Event]) -> None:
        supervisor.run_once("hotplug", rediscover)

    return burst


def watchdog_loop(
    supervisor: Supervisor, stop: threading.Event, interval: float, stale_after: float
) -> None:
    """Ping systemd's watchdog every ``interval`` seconds while the reconcile loop
    has completed a pass within ``stale_after`` seconds, or has one under way that
    advances (``Supervisor.progressing``); otherwise say so and let the watchdog fire."""
    withheld = [False]

    def ping() -> None:
        if supervisor.progressing("reconcile", stale_after):
            notify.watchdog()
            withheld[0] = False
        elif not withheld[0]:
            withheld[0] = True
            supervisor.log.error(
                "watchdog_withheld",
                problem=f"no reconcile pass succeeded or advanced in {stale_after:g} s",
            )

    while not stop.wait(interval):
        supervisor.run_once("watchdog", ping)


def periods(reconcile_seconds: float, watchdog: float | None) -> tuple[float, float]:
    """The reconcile period and how old its last success may be before the watchdog
    is starved: with a watchdog armed, reconcile runs at least once per ping
    interval, so a long ``reconcile-seconds`` cannot starve a healthy numad."""
    period = reconcile_seconds if watchdog is None else min(reconcile_seconds, watchdog)
    return period, 2 * period + (watchdog or 0.0)
