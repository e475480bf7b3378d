"""The fault campaign's faults at numad's cgroup backend: the real backend
wrapped to fail writes (EBUSY, EINVAL, ENOSPC, EACCES), crash at a chosen write,
raise inside the loops, and have the simulation check its invariants after every
write that went through.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from numad.cpuset import CPUSet, NodeSet
from numad.errors import CgroupError

if TYPE_CHECKING:
    from tests.campaign.world import Simulation

ERRNOS = ("EBUSY", "EINVAL", "ENOSPC", "EACCES")


class Crash(BaseException):
    """SIGKILL: nothing in numad catches a BaseException."""


@dataclass
class Faults:
    write_failure: float = 0.0  # chance that a cgroup write fails
    crash_in: int = -1  # writes until a crash (-1: none armed)
    loop_exception: bool = False  # the next exists() raises RuntimeError
    injected: Counter[str] = field(default_factory=Counter)


class Recording:
    """The real cgroup backend, with faults, and the invariants checked after each write."""

    def __init__(self, inner: Any, sim: Simulation) -> None:
        self.inner = inner
        self.sim = sim
        self.root = inner.root

    def exists(self, path: str) -> bool:
        faults = self.sim.faults
        if faults.loop_exception:
            faults.loop_exception = False
            faults.injected["loop exception"] += 1
            raise RuntimeError("injected: exists() failed")
        return bool(self.inner.exists(path))

    def write(self, path: str, cpus: CPUSet | None, mems: NodeSet | None) -> None:
        faults, sim = self.sim.faults, self.sim
        sim.writes += 1
        if faults.crash_in == 0:
            faults.crash_in = -1
            faults.injected["crash at a cgroup write"] += 1
            raise Crash
        if faults.crash_in > 0:
            faults.crash_in -= 1
        if sim.rng.random() < faults.write_failure:
            code = sim.rng.choice(ERRNOS)
            faults.injected[f"cgroup {code}"] += 1
            sim.failing.add(path)
            raise CgroupError(path, f"cannot write cpuset.cpus: injected {code}")
        self.inner.write(path, cpus, mems)
        sim.failing.discard(path)
        sim.drifted.discard(path)
        if sim.checking:
            sim.classify(path, cpus)
            sim.check_files(f"after writing {path}")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
