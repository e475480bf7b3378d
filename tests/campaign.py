"""The fault campaign: a seeded simulation that drives a real daemon through random
steps and injected faults, and checks numad's promises after every cgroup write.

The daemon is the real one (``numad.daemon.service.build``) on a copy of a recorded
machine with a scratch cgroup v2 tree; only the cgroup backend is wrapped, to
record every write, inject failures and crashes, and check the invariants
after each write. A crash is a ``Crash`` (a BaseException no numad code
catches) raised at a chosen write or inside a checkpoint write; the daemon
object is then dropped, as SIGKILL would drop the process, and a new one starts
on the same files. The steps: admit, release, cgroup create and remove, CPU
offline and online (hotplug), clock advance past the release grace, config
change and restart, crash and restart, faults (cgroup EBUSY/EINVAL/ENOSPC/
EACCES, checkpoint short writes/ENOSPC/EIO/fsync failures, exceptions inside
the reconcile and hotplug loops).

Invariants, checked against the checkpoint on disk and every cgroup file:

1. exclusive CPU sets (checkpoint) pairwise disjoint and free of reserved CPUs;
2. a cgroup whose file holds an exclusive grant is the only cgroup holding
   those CPUs (no exclusive CPU in a shared, unplaced or released cgroup);
3. every workload answered "admitted" is in the checkpoint, placed or
   unplaced, until released (or its cgroup was removed);
4. reserved CPUs move only when the config changes them;
5. health names every cgroup whose last write failed.

Used by tests/test_campaign.py (a bounded run) and benchmarks/campaign.py.
"""

from __future__ import annotations

import json
import random
import shutil
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from numad.cpuset import CPUSet, NodeSet
from numad.daemon import state
from numad.daemon.config import parse
from numad.daemon.root import Daemon
from numad.daemon.service import build
from numad.errors import CgroupError, CheckpointError
from numad.host import durable
from numad.host.cgroup.v2 import CgroupV2Backend
from numad.host.scratch import scratch_mkdir

MACHINE = "32intel64-2p8co2t+8ve"  # 32 CPUs, 2 nodes, 8 vector engines
ALL = CPUSet.parse_list("0-31")
NAMES = [f"w{i}" for i in range(12)]
STRAYS = ["x0", "x1", "x2/inner"]
TOPS = ["system.slice", "user.slice", "init.scope"]  # beside numad.slice: host isolation
VE_DEVICES = ["0000:1b:00.0", "0000:1c:00.0", "0000:3d:00.0"]  # of its 8 vector engines
ERRNOS = ("EBUSY", "EINVAL", "ENOSPC", "EACCES")


class Crash(BaseException):
    """SIGKILL: nothing in numad catches a BaseException."""


class Violation(BaseException):
    """A broken promise."""


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
        sim.classify(path, cpus)
        sim.check_files(f"after writing {path}")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class Simulation:
    def __init__(self, machine_root: Path, work: Path, seed: int) -> None:
        self.rng = random.Random(seed)  # noqa: S311 - seeded: a run is reproducible
        self.root = work / "machine"
        shutil.copytree(machine_root, self.root, symlinks=True)
        self.cgroups = self.root / "sys/fs/cgroup"
        self.faults = Faults()
        self.clock_now = 0.0
        self.reserved_count = 2
        self.devices = True
        self.answered: set[str] = set()  # answered "admitted" and not released since
        self.removed: set[str] = set()  # whose cgroup the simulation removed
        self.exclusive_files: dict[str, int] = {}  # cgroup -> CPUs of an exclusive grant
        self.failing: set[str] = set()
        self.reserved: str | None = None
        self.writes = 0
        self.steps = 0
        self.checks = 0
        self.admitted = 0
        self.daemon = self._start()

    # -- the daemon's life ---------------------------------------------------------------

    def _config(self) -> dict[str, Any]:
        raw: dict[str, Any] = {
            "topology": {"policy": "single-numa-node"},
            "cpu": {"reserved-count": self.reserved_count},
            "memory": {"policy": "none"},
            "daemon": {"release-grace-seconds": 30},
        }
        if self.devices:
            raw["devices"] = {"ve": {"class-prefix": "0x0b40"}}
        return raw

    def _start(self) -> Daemon:
        for _ in range(20):  # a crash may come during start-up too
            try:
                daemon = build(parse(self._config()), str(self.root))
                daemon.clock = lambda: self.clock_now
                daemon.supervisor.clock = daemon.clock
                daemon.cgroups = daemon.isolation.cgroups = Recording(daemon.cgroups, self)
                daemon.start()
            except Crash:
                continue
            self._check_reserved()
            return daemon
        raise Violation("numad never started: a crash at every start")

    def restart(self, *, change_config: bool = False) -> None:
        if change_config:
            self.reserved_count = self.rng.choice((1, 2, 3))
            self.devices = self.rng.random() < 0.7
            self.reserved = None  # the config may change them: learn them again
        self.faults.crash_in = -1
        self.faults.loop_exception = False
        self.daemon = self._start()

    # -- invariants ----------------------------------------------------------------------

    def checkpoint(self) -> state.Checkpoint | None:
        try:
            data = (self.root / "var/lib/numad" / state.FILE).read_bytes()
        except FileNotFoundError:
            return None
        return state.decode(data, "checkpoint")

    def classify(self, path: str, cpus: CPUSet | None) -> None:
        """Whether the file now holds an exclusive grant: the committed checkpoint
        (always written before cgroups) gives ``path``'s container exactly ``cpus``."""
        self.exclusive_files.pop(path, None)
        cp = self.checkpoint()
        if cp is None or not cpus:
            return
        for record in cp.workloads.values():
            if record.spec.get("cgroup") == path and record.cpus.get("main") == cpus.format_list():
                self.exclusive_files[path] = cpus.bits

    def check_files(self, when: str) -> None:
        self.checks += 1
        held = {}
        for f in self.cgroups.rglob("cpuset.cpus"):
            text = f.read_text().strip()
            if text and f.parent != self.cgroups:
                held[str(f.parent.relative_to(self.cgroups))] = CPUSet.parse_list(text).bits
        for path, grant in self.exclusive_files.items():
            if held.get(path) != grant:
                continue  # rewritten by another writer or gone
            for other, cpus in held.items():
                shared = cpus & grant
                if other != path and shared and not path.startswith(other + "/"):
                    if other.count("/") == 0:
                        continue  # a managed root: the parent of every workload
                    raise Violation(
                        f"{when}: cpus {CPUSet.from_bits(shared)} are in the exclusive"
                        f" {path} and in {other}"
                    )

    def check(self, when: str) -> None:
        self.check_files(when)
        cp = self.checkpoint()
        if cp is None:
            return
        union = 0
        reserved = CPUSet.parse_list(cp.reserved).bits
        flagged = " ".join(self.daemon.problems)
        for name, record in cp.workloads.items():
            for cpus_text in record.cpus.values():
                cpus = CPUSet.parse_list(cpus_text).bits
                if cpus & union or cpus & reserved:
                    raise Violation(f"{when}: {name} holds {cpus_text}: taken or reserved")
                union |= cpus
                wanted = record.spec.get("cpus")
                if cpus.bit_count() != wanted and f"{name}/main: cpus" not in flagged:
                    raise Violation(f"{when}: {name} holds {cpus_text}, not {wanted} cpus")
        held = [a for r in cp.workloads.values() for d in r.devices.values() for a in d.values()]
        addresses = [a for group in held for a in group]
        if len(addresses) != len(set(addresses)):
            raise Violation(f"{when}: a device is held twice: {sorted(addresses)}")
        lost = self.answered - self.removed - set(cp.workloads)
        if lost:
            raise Violation(f"{when}: admitted workloads lost: {sorted(lost)}")
        self._check_reserved(cp)
        problems = " ".join(self.daemon.problems)
        managed = set(self.daemon.orphans) | {s.cgroup for s in self.daemon.specs.values()}
        unnamed = [
            p for p in self.failing & managed if p not in problems and (self.cgroups / p).is_dir()
        ]
        if self.daemon.health.has("loop:reconcile"):
            unnamed = []  # the pass that retries them failed, and health says so
        if unnamed:
            raise Violation(f"{when}: failing writes not in health: {unnamed}")

    def _check_reserved(self, cp: state.Checkpoint | None = None) -> None:
        cp = cp or self.checkpoint()
        if cp is None:
            return
        if self.reserved is None:
            self.reserved = cp.reserved
        elif cp.reserved != self.reserved:
            raise Violation(f"reserved cpus moved from {self.reserved} to {cp.reserved}")

    # -- steps ---------------------------------------------------------------------------

    def step(self) -> str:
        """One random step; returns its name."""
        self.steps += 1
        kind = self.rng.choices(list(STEPS), weights=[w for w, _ in STEPS.values()])[0]
        self.faults.write_failure = 0.15 if self.rng.random() < 0.3 else 0.0
        try:
            STEPS[kind][1](self)
        except Crash:
            self.restart()
            kind += " (crashed)"
        self.faults.write_failure = 0.0
        self.faults.loop_exception = False
        self.check(f"step {self.steps} ({kind})")
        return kind

    def admit(self) -> None:
        free = [n for n in NAMES if n not in self.daemon.specs]
        if not free:
            return
        name = self.rng.choice(free)
        self.answered.discard(name)  # released by numad since (its cgroup went)
        if self.rng.random() < 0.8:
            scratch_mkdir(self.cgroups, f"numad.slice/{name}")
            self.removed.discard(name)
        spec: dict[str, Any] = {"name": name, "cgroup": f"numad.slice/{name}"}
        spec["cpus"] = self.rng.choice((1, 2, 3, 4, 6, "500m"))
        if self.devices and self.rng.random() < 0.3:
            spec["devices"] = {"ve": 1}
        try:
            outcome = self.daemon.admit(self.daemon.parse(json.dumps(spec), "json"))
        except CheckpointError:
            if name in self.daemon.specs:
                raise Violation(f"{name}: checkpoint failed but admitted in memory") from None
            return
        if outcome.admitted:
            self.answered.add(name)
            self.admitted += 1

    def release(self) -> None:
        if not self.daemon.specs:
            return
        name = self.rng.choice(sorted(self.daemon.specs))
        was_answered = name in self.answered
        self.answered.discard(name)  # a crash inside may or may not have released it
        try:
            self.daemon.release(name)
        except CheckpointError:
            if name not in self.daemon.specs:
                raise Violation(f"{name}: checkpoint failed but released in memory") from None
            if was_answered:
                self.answered.add(name)

    def cgroup_churn(self) -> None:
        if self.rng.random() < 0.2:  # a top-level cgroup comes or goes (a slice, a scope)
            top = self.rng.choice(TOPS)
            if (self.cgroups / top).is_dir():
                shutil.rmtree(self.cgroups / top)
            else:
                CgroupV2Backend(self.cgroups, [top], emulate_kernel=True).ensure(top)
            return
        name = self.rng.choice(NAMES + STRAYS)  # strays are never admitted: isolated
        path = self.cgroups / "numad.slice" / name
        if path.is_dir():
            shutil.rmtree(path)
            self.removed.add(name)
            self.failing.discard(f"numad.slice/{name}")  # a new one has not been written yet
        else:
            scratch_mkdir(self.cgroups, f"numad.slice/{name}")

    def hotplug(self) -> None:
        online_file = self.root / "sys/devices/system/cpu/online"
        online = CPUSet.parse_list(online_file.read_text())
        victim = self.rng.choice(sorted(ALL))
        if victim in online and len(online) > 8:
            new = online - CPUSet([victim])
            self.faults.injected["cpu offline"] += 1
        else:
            new = online | CPUSet([victim])
        online_file.write_text(new.format_list() + "\n")
        if self.rng.random() < 0.2:
            self.faults.loop_exception = True
        self.daemon.supervisor.run_once("hotplug", self.daemon.rediscover)

    def device_churn(self) -> None:
        """A vector engine leaves (removed, or its driver not bound yet) or comes back;
        numad hears of it by hotplug or at its next start."""
        devices, stash = self.root / "sys/bus/pci/devices", self.root / "stash"
        stash.mkdir(exist_ok=True)
        address = self.rng.choice(VE_DEVICES)
        if (devices / address).exists():
            (devices / address).rename(stash / address)
            self.faults.injected["device removed"] += 1
        elif (stash / address).exists():
            (stash / address).rename(devices / address)
        if self.rng.random() < 0.5:
            self.daemon.supervisor.run_once("hotplug", self.daemon.rediscover)
        else:
            self.restart()

    def reconcile(self) -> None:
        if self.daemon.specs and self.rng.random() < 0.2:  # exists() is asked of each
            self.faults.loop_exception = True
            if self.daemon.supervisor.run_once("reconcile", self.daemon.reconcile):
                raise Violation("an injected exception did not reach the supervisor")
            if not self.daemon.health.has("loop:reconcile"):
                raise Violation("a failed reconcile pass is not in health")
            return
        self.daemon.supervisor.run_once("reconcile", self.daemon.reconcile)

    def advance_clock(self) -> None:
        self.clock_now += self.rng.choice((1.0, 10.0, 31.0))

    def checkpoint_fault(self) -> None:
        fault = self.rng.choice(list(durable.Fault))
        self.faults.injected[f"checkpoint {fault}"] += 1
        self.daemon.syscalls = durable.Syscalls.injecting(fault)
        try:
            (self.admit if self.rng.random() < 0.6 else self.release)()
        finally:
            self.daemon.syscalls = durable.SYSCALLS

    def crash_soon(self) -> None:
        self.faults.crash_in = self.rng.randrange(0, 3)
        (self.admit if self.rng.random() < 0.6 else self.release)()
        self.faults.crash_in = -1

    def crash_in_checkpoint(self) -> None:
        self.faults.injected["crash inside a checkpoint write"] += 1

        def dying(fd: int, data: memoryview) -> int:
            import os  # noqa: PLC0415

            os.write(fd, data[: len(data) // 2])
            raise Crash

        self.daemon.syscalls = durable.Syscalls(write=dying)
        (self.admit if self.rng.random() < 0.6 else self.release)()

    def settle(self) -> None:
        """Faults stop: within a few reconcile passes every exclusive set is granted,
        every shared cgroup holds the pool, and no write or grant problem is left."""
        for _ in range(3):
            self.clock_now += 1.0
            if not self.daemon.supervisor.run_once("reconcile", self.daemon.reconcile):
                raise Violation(f"reconcile fails without faults: {self.daemon.problems}")
        left = [p for p in self.daemon.health.subjects() if p.split(":")[0] in ("write", "grant")]
        if left:
            raise Violation(f"problems left after the faults stopped: {self.daemon.problems}")
        books = self.daemon.books
        mine = {spec.cgroup for spec in self.daemon.specs.values()}
        tops = [self.cgroups / t / "cpuset.cpus" for t in TOPS]
        for f in [*(self.cgroups / "numad.slice").glob("**/*/cpuset.cpus"), *tops]:
            if not f.exists():
                continue
            stray = str(f.parent.relative_to(self.cgroups))
            if any(
                stray == m or m.startswith(f"{stray}/") or stray.startswith(f"{m}/") for m in mine
            ):
                continue
            cpus = CPUSet.parse_list(f.read_text()).bits
            if not cpus or cpus & books.cpu.exclusive:
                where = CPUSet.from_bits(cpus).format_list() or "every CPU (inherited)"
                raise Violation(f"{stray}, no workload's, runs on {where}")
        for name, spec in self.daemon.specs.items():
            path = self.cgroups / spec.cgroup / "cpuset.cpus"
            if not path.exists():
                continue
            want = books.cpu.assignments.get((name, "main")) or books.cpu.shared_pool
            have = CPUSet.parse_list(path.read_text()).bits
            if have != want:
                raise Violation(
                    f"{spec.cgroup} holds {CPUSet.from_bits(have)}, not {CPUSet.from_bits(want)}"
                )

    def restart_step(self) -> None:
        self.restart()

    def config_change(self) -> None:
        self.faults.injected["config change"] += 1
        self.restart(change_config=True)


STEPS: dict[str, tuple[int, Callable[[Simulation], None]]] = {
    "admit": (30, Simulation.admit),
    "release": (12, Simulation.release),
    "cgroup churn": (8, Simulation.cgroup_churn),
    "hotplug": (8, Simulation.hotplug),
    "device churn": (3, Simulation.device_churn),
    "reconcile": (14, Simulation.reconcile),
    "clock": (6, Simulation.advance_clock),
    "checkpoint fault": (5, Simulation.checkpoint_fault),
    "crash": (6, Simulation.crash_soon),
    "crash in checkpoint": (2, Simulation.crash_in_checkpoint),
    "restart": (3, Simulation.restart_step),
    "config change": (2, Simulation.config_change),
}


def run(machine_root: Path, work: Path, seed: int, steps: int) -> Simulation:
    """``steps`` random steps, then the faults stop and numad must settle; raises
    Violation at the first broken promise."""
    structlog.configure(logger_factory=structlog.ReturnLoggerFactory())
    sim = Simulation(machine_root, work, seed)
    for _ in range(steps):
        sim.step()
    sim.settle()
    return sim
