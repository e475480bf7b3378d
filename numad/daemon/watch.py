"""Hotplug: udev events (cpu, node, memory, pci), debounced, make numad rediscover.

Edge module; pyudev lives only here. ``udev_events`` is the real event source;
tests feed ``debounce`` any iterable of events instead.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

Event = tuple[str, str]  # (subsystem, action)
SUBSYSTEMS = ("cpu", "node", "memory", "pci")
UDEV_CONTROL = Path("/run/udev/control")  # the running udev daemon's control socket


def netlink_source(udev_control: Path) -> str:
    """The netlink source to listen to: ``"udev"`` (events udev has processed) when
    udev runs, told by its control socket ``udev_control``; else ``"kernel"`` (the raw
    uevents), because udev's events never come on a host without udev."""
    return "udev" if udev_control.exists() else "kernel"


def udev_events() -> Iterator[Event]:
    """Kernel uevents of the subsystems that change numad's topology, as they come:
    from udev when it runs, else straight from the kernel (``netlink_source``)."""
    import pyudev  # noqa: PLC0415 - imported only where numad really watches a host

    context = pyudev.Context()
    monitor = pyudev.Monitor.from_netlink(context, source=netlink_source(UDEV_CONTROL))
    for subsystem in SUBSYSTEMS:
        monitor.filter_by(subsystem)
    while True:
        device = monitor.poll()
        if device is None:  # a message libudev filtered out (raw kernel uevents reach it)
            continue
        yield str(device.subsystem), str(device.action)


def debounce(
    source: Iterable[Event],
    on_change: Callable[[list[Event]], object],
    *,
    quiet: float = 1.0,
    stop: threading.Event | None = None,
) -> None:
    """Call ``on_change`` with each burst of events, once ``quiet`` seconds pass
    without a new one (a CPU hot-add brings several events at once). Returns when
    the source ends (after the last burst) or ``stop`` is set."""
    stop = stop or threading.Event()
    events: queue.Queue[Event | None] = queue.Queue()

    def read() -> None:
        for event in source:
            events.put(event)
            if stop.is_set():
                break
        events.put(None)

    threading.Thread(target=read, daemon=True).start()
    burst: list[Event] = []
    while not stop.is_set():
        try:
            event = events.get(timeout=quiet if burst else 0.5)
        except queue.Empty:
            if burst:
                on_change(burst)
                burst = []
            continue
        if event is None:
            break
        burst.append(event)
    if burst:
        on_change(burst)
