"""The fault campaign: a seeded simulation that drives a real daemon through random
steps and faults, and checks numad's promises after every step and every cgroup
write (``tests.campaign.world`` says which).

The modules: ``world`` (the simulation and the invariants), ``faults`` (the wrapped
cgroup backend), and the steps. Inside numad's own life (``steps``): admit,
release, resize in place (grow and shrink; also inside the crash and checkpoint
fault steps), cgroups created (with the inotify event of the mkdir) and removed,
workloads admitted below cgroups isolated as strays (with the cgroups they bounded
checked after every write), CPUs offline and online, vector engines leaving, clock
past the release grace, config changes, restarts, crashes at cgroup writes and
inside checkpoint writes, injected cgroup and checkpoint faults, exceptions in the
loops. Around it (``outages``): cgroups gone while numad is down, killed ``numad
run`` clients, a full state disk during a reconcile pass, unreadable cpusets. And
hostile numbers in specs (``hostile``).

Used by tests/daemon/test_campaign.py (a bounded run) and benchmarks/campaign.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import structlog

from tests.campaign import hostile, outages, steps
from tests.campaign.faults import Crash, Faults
from tests.campaign.world import MACHINE, Simulation, Violation

__all__ = ["MACHINE", "STEPS", "Crash", "Faults", "Simulation", "Violation", "run", "step"]

# name: (weight, step)
STEPS: dict[str, tuple[int, Callable[[Simulation], None]]] = {
    "admit": (30, steps.admit),
    "release": (12, steps.release),
    "resize": (8, steps.resize),
    "move": (6, steps.move),
    "admit below a stray": (4, steps.admit_below),
    "cgroup churn": (8, steps.cgroup_churn),
    "hotplug": (8, steps.hotplug),
    "device churn": (3, steps.device_churn),
    "reconcile": (14, steps.reconcile),
    "clock": (6, steps.advance_clock),
    "checkpoint fault": (5, steps.checkpoint_fault),
    "crash": (6, steps.crash_soon),
    "crash in checkpoint": (2, steps.crash_in_checkpoint),
    "restart": (3, steps.restart),
    "config change": (2, steps.config_change),
    "cgroups gone while down": (2, outages.gone_while_down),
    "killed client": (3, outages.killed_client),
    "full disk": (3, outages.full_disk),
    "unreadable cpuset": (2, outages.unreadable_cpuset),
    "hostile numbers": (2, hostile.hostile_numbers),
}


def step(sim: Simulation) -> str:
    """One random step, its promises checked; returns its name."""
    sim.steps += 1
    kind = sim.rng.choices(list(STEPS), weights=[w for w, _ in STEPS.values()])[0]
    sim.faults.write_failure = 0.15 if sim.rng.random() < 0.3 else 0.0
    try:
        STEPS[kind][1](sim)
    except Crash:
        sim.restart()
        kind += " (crashed)"
    sim.faults.write_failure = 0.0
    sim.faults.loop_exception = False
    sim.check(f"step {sim.steps} ({kind})")
    return kind


def run(machine_root: Path, work: Path, seed: int, steps: int) -> Simulation:
    """``steps`` random steps, then the faults stop and numad must settle; raises
    Violation at the first broken promise."""
    structlog.configure(logger_factory=structlog.ReturnLoggerFactory())
    sim = Simulation(machine_root, work, seed)
    try:
        for _ in range(steps):
            step(sim)
        sim.settle()
    finally:
        sim.close()
    return sim
