"""The fault campaign (tests/campaign/) at length: many seeds, many steps each.

Run from the repository root:

    .venv/bin/python benchmarks/campaign.py [--seeds 0-49] [--steps 2000]

Each seed drives a real daemon on the recorded 2-socket machine through
``--steps`` random steps (admit, also below cgroups isolated as strays, release,
resize, moves, cgroup churn, hotplug, clock, config change, restarts, crashes at
cgroup writes and inside checkpoint writes, injected cgroup and checkpoint
faults, exceptions in the loops, cgroups gone
while numad is down, killed ``numad run`` clients, a full state disk during a
reconcile pass, unreadable cpusets, hostile numbers in specs), checks numad's
promises after every step and every cgroup write, then stops the faults and
checks that numad settles. A seed stops at its first violation, which is
printed with the seed that reproduces it; the others go on.

Prints one line per seed, then the totals: steps run, invariant checks,
faults injected by kind, known numad bugs met (reported, not yet fixed: not
violations), violations found. Target: 0 violations.
Exit status: 0 with no violation, 2 otherwise.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import structlog

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from numad.topology.record import load_fixture  # noqa: E402 - after the path is set
from tests.campaign import MACHINE, Simulation, Violation, step  # noqa: E402

ARCHIVE = ROOT / "fixtures" / "sysfs" / f"{MACHINE}.tar.bz2"


def _seeds(text: str) -> range:
    first, _, last = text.partition("-")
    return range(int(first), int(last or first) + 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0-49", help="a seed or a range (default 0-49)")
    parser.add_argument("--steps", type=int, default=2000, help="steps per seed (default 2000)")
    args = parser.parse_args()
    structlog.configure(logger_factory=structlog.ReturnLoggerFactory())  # quiet daemons
    steps = checks = 0
    faults: Counter[str] = Counter()
    known: Counter[str] = Counter()
    violations = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="numad-campaign-") as scratch:
        machine = load_fixture(ARCHIVE, Path(scratch) / "machine")
        for seed in _seeds(args.seeds):
            work = Path(scratch) / f"seed{seed}"
            work.mkdir()
            sim = Simulation(machine, work, seed)
            outcome = "ok"
            try:
                for _ in range(args.steps):
                    step(sim)
                sim.settle()
            except Violation as err:
                outcome = f"VIOLATION: {err}"
                violations.append((seed, str(err)))
            finally:
                sim.close()
            steps, checks = steps + sim.steps, checks + sim.checks
            faults += sim.faults.injected
            known += sim.known
            print(f"seed {seed}: {sim.steps} steps, {sim.checks} checks: {outcome}", flush=True)
    print(f"\n{steps} steps, {checks} invariant checks in {time.perf_counter() - started:.0f} s")
    print(f"faults injected ({faults.total()}):")
    print("".join(f"  {k}: {v}\n" for k, v in sorted(faults.items())), end="")
    print("known numad bugs met: " + (", ".join(f"{k} {v}" for k, v in known.items()) or "none"))
    print(f"violations: {len(violations)} (target 0)")
    for seed, text in violations:
        print(f"  seed {seed}: {text}")
    return 2 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
