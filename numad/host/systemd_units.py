"""What numad asks of systemd about a unit, and waiting for systemd to write a value.

Shared by ``numad.host.unit_record`` (the cgroups numad isolates) and
``numad.host.workload_units`` (the workloads that are units); the real bus is
``numad.host.systemd_bus.Systemd``. systemd answers a property's call before it
writes the cgroup: ``settle`` waits for the write, bounded by ``APPLY_SECONDS``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

from numad.cpuset import CPUSet, NodeSet

APPLY_SECONDS = 5.0  # how long systemd may take to write a property it accepted


def settle(
    done: Callable[[], bool],
    sleep: Callable[[float], None],
    seconds: float,
    stopping: threading.Event,
) -> bool:
    """Ask ``done`` until it says yes, 5 ms apart at first and up to 200 ms; False once
    ``seconds`` have passed (systemd writes a property after it answers), or at once
    when numad stops."""
    deadline = time.monotonic() + seconds
    delay = 0.005
    while not done():
        if time.monotonic() >= deadline or stopping.is_set():
            return False
        sleep(delay)
        delay = min(delay * 2, 0.2)
    return True


class Units(Protocol):
    """What isolation needs of systemd (``numad.host.systemd_bus.Systemd``)."""

    def unit(self, name: str) -> str | None: ...
    def control_group(self, name: str) -> str | None: ...
    def transient(self, name: str) -> bool: ...
    def allowed(self, name: str) -> tuple[CPUSet, NodeSet]: ...
    def set_allowed(
        self, name: str, cpus: CPUSet | None, mems: NodeSet | None, *, runtime: bool = True
    ) -> None: ...
    def load(self, name: str) -> str: ...
    def hurry(self, seconds: float) -> None: ...
    def slice(self, name: str) -> str: ...
