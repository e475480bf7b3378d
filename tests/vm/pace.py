"""How fast this host runs the VM tier now, and the deadlines that gives each guest.

A guest under TCG is CPU work on the host, so the time it takes stretches with
whatever else the host's cores run: with two other CPU-heavy jobs on a 2-core
machine, busybox guests that take 96-141 s on a quiet one did not finish in a fixed
300 s, and systemd guests (362-439 s quiet) not in 600 s. So no VM deadline is fixed
seconds: ``measure`` times a fixed piece of CPU work (~1 s on the reference machine)
once per test session and worker, at the start of the VM tier, and its wall time
against the reference gives the slowdown; ``deadline`` scales each guest's quiet
time by it. The wall time is what counts: other jobs on the same cores stretch it,
and a slower CPU stretches it too. The guest's own waits scale by the same factor
(``VMTEST_SLOWDOWN`` in its environment, read by tests/vm/guest/*.py).

Host side; touches nothing but the CPU.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

# The slowest quiet run of each kind of guest, in seconds (2-core CI machine, TCG;
# README, "Tests on a real kernel"): busybox guests (tests/vm/test_vm.py) took
# 96-141 s, systemd guests (tests/vm/test_systemd_vm.py) 362-439 s while their CPU hog
# ran throughout, 184-229 s at pace 1.44 since it runs only while sampled; the 6.12
# one 437 s at pace 1.19 (367 s at 1.0) since it also times admissions beside 10,000
# strays; 400 s keeps a margin over those for the package install and podman.
QUIET_SECONDS = {"busybox": 141.0, "systemd": 400.0}
RUNC_SECONDS = 30.0  # the one busybox guest that also runs runc and four hook runs
MARGIN = 2.0  # over the quiet time scaled by the slowdown: load that grows mid-tier
# The cap: a hung guest still ends, at most MAX_SLOWDOWN x MARGIN x its quiet time
# (a bogus calibration cannot hold the tier for hours).
MAX_SLOWDOWN = 4.0
ENV = "VMTEST_SLOWDOWN"  # the slowdown, as the guest's checks read it

ROUNDS = 5
ROUND_STEPS = 5_000_000
# ROUNDS x ROUND_STEPS of ``_work`` on the quiet reference machine (the 2-core CI
# machine the quiet times above come from: Intel Xeon, CPython 3.11), wall seconds.
REFERENCE_SECONDS = 1.10


def _work(steps: int) -> int:
    """Interpreter-bound integer work: what the guest's Python (and QEMU's
    translated code) competes for is a core, and this takes one."""
    total = 0
    for i in range(steps):
        total = (total * 31 + i) & 0xFFFF
    return total


@dataclass(frozen=True, slots=True)
class Pace:
    """One calibration: the work's wall and CPU seconds here, now."""

    wall_seconds: float
    cpu_seconds: float

    @property
    def slowdown(self) -> float:
        """Wall time against the reference: 2.0 means guests run half as fast."""
        return self.wall_seconds / REFERENCE_SECONDS

    @property
    def factor(self) -> float:
        """What the guest's own waits are multiplied by (``guest_factor``)."""
        return guest_factor(self.slowdown)

    def deadline(self, kind: str, *, runc: bool = False) -> float:
        """The seconds a guest of ``kind`` ("busybox", "systemd") gets to power off."""
        quiet = QUIET_SECONDS[kind] + (RUNC_SECONDS if runc else 0.0)
        return deadline(quiet, self.slowdown)

    def describe(self) -> str:
        """``pace 2.04x (work 2.18 s, CPU 1.08 s; reference 1.10 s)``: the slowdown,
        and what it came from (a CPU share well below 1 means other jobs, not a slow
        CPU)."""
        return (
            f"pace {self.slowdown:.2f}x (work {self.wall_seconds:.2f} s,"
            f" CPU {self.cpu_seconds:.2f} s; reference {REFERENCE_SECONDS:.2f} s)"
        )


def deadline(quiet_seconds: float, slowdown: float) -> float:
    """``quiet_seconds`` scaled by the slowdown (never below 1: a faster host keeps
    the quiet margin; never above ``MAX_SLOWDOWN``), times ``MARGIN``."""
    return quiet_seconds * guest_factor(slowdown) * MARGIN


def guest_factor(slowdown: float) -> float:
    """What the guest's own waits are multiplied by: the slowdown, from 1 up to the cap."""
    return min(max(1.0, slowdown), MAX_SLOWDOWN)


def measure(rounds: int = ROUNDS, steps: int = ROUND_STEPS) -> Pace:
    """Time ``rounds`` x ``steps`` of the reference work (after a short warm-up)."""
    _work(steps // 20)
    wall, cpu = time.perf_counter(), time.thread_time()
    for _ in range(rounds):
        _work(steps)
    return Pace(time.perf_counter() - wall, time.thread_time() - cpu)
