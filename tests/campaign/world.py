"""The fault campaign's world: a real daemon on a copy of a recorded machine, the
cgroup backend wrapped to record every write and inject faults, and numad's
promises checked against the checkpoint on disk and every cgroup file.

The daemon is the real one (``numad.daemon.service.build``) with a scratch cgroup
v2 tree; only the cgroup backend is wrapped (``tests.campaign.faults``), to record
every write, inject failures and crashes, and check the invariants after each
write. A crash is a
``Crash`` (a BaseException no numad code catches) raised at a chosen write or
inside a checkpoint write; the daemon object is then dropped, as SIGKILL would
drop the process, and a new one starts on the same files.

Invariants, checked after every step and every cgroup write:

1. exclusive CPU sets (checkpoint) pairwise disjoint and free of reserved CPUs;
2. a cgroup whose file holds an exclusive grant is the only cgroup holding
   those CPUs (no exclusive CPU in a shared, unplaced or released cgroup; one
   whose cpuset cannot be read holds what its nearest readable ancestor applies);
3. every workload answered "admitted" is in the checkpoint, placed or
   unplaced, until released (or its cgroup was removed, or its client killed);
4. reserved CPUs move only when the config changes them;
5. health names every cgroup whose last write failed.

The steps (``tests.campaign.steps``, ``tests.campaign.outages``,
``tests.campaign.hostile``) check their own promises with ``Simulation.expect``.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from numad.cpuset import CPUSet
from numad.daemon import state
from numad.daemon.config import parse
from numad.daemon.root import Daemon
from numad.daemon.service import build
from numad.host.scratch import scratch_mkdir
from tests.campaign.faults import Crash, Faults, Recording

MACHINE = "32intel64-2p8co2t+8ve"  # 32 CPUs, 2 nodes, 8 vector engines
ALL = CPUSet.parse_list("0-31")
NAMES = [f"w{i}" for i in range(12)]
STRAYS = ["x0", "x1", "x2/inner"]
TOPS = ["system.slice", "user.slice", "init.scope"]  # beside numad.slice: host isolation
VE_DEVICES = ["0000:1b:00.0", "0000:1c:00.0", "0000:3d:00.0"]  # of its 8 vector engines
GRACE = 30.0  # [daemon] release-grace-seconds
POD = "numad.slice/pod"  # a pod's cgroup with its own cpuset: it bounds its containers'


class Violation(BaseException):
    """A broken promise."""


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
        # Whose cgroup numad has seen (at its admission, or after a pass): released
        # once it goes, also while numad is down.
        self.witnessed: set[str] = set()
        # Whose cgroup the simulation removed or whose client it killed: numad may
        # release them after the grace.
        self.removed: set[str] = set()
        self.exclusive_files: dict[str, int] = {}  # cgroup -> CPUs of an exclusive grant
        self.failing: set[str] = set()
        self.drifted: set[str] = set()  # written by another writer, until numad writes it
        self.unreadable: set[str] = set()  # cgroups without their cpuset files
        # Cgroups no workload's that an isolated cgroup above bounds at a step's start:
        # they must stay off every written grant at each write of the step (cgroup v2).
        self.bounded: set[str] = set()
        self.children: list[subprocess.Popen[bytes]] = []  # clients' commands, to reap
        self.checking = True
        self.known: Counter[str] = Counter()  # numad bugs met, reported, not yet fixed
        self.reserved: str | None = None
        self.writes = 0
        self.steps = 0
        self.checks = 0
        self.admitted = 0
        self.resizes: Counter[str] = Counter()  # resize steps answered, by outcome
        self.moves: Counter[str] = Counter()  # admissions by moves, workloads moved
        self.daemon = self._start()

    # -- the daemon's life ---------------------------------------------------------------

    def _config(self) -> dict[str, Any]:
        raw: dict[str, Any] = {
            "topology": {"policy": "single-numa-node"},
            "cpu": {"reserved-count": self.reserved_count},
            "memory": {"policy": "none"},
            "daemon": {"release-grace-seconds": GRACE},
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
                daemon.reconcile = self._witnessing(daemon)
                daemon.start()
            except Crash:
                continue
            self._check_reserved()
            return daemon
        raise Violation("numad never started: a crash at every start")

    def _witnessing(self, daemon: Daemon) -> Callable[[], None]:
        reconcile = daemon.reconcile

        def witnessed() -> None:
            reconcile()
            specs = daemon.specs
            self.witnessed = {n for n in self.witnessed if n in specs} | {
                n for n, s in specs.items() if (self.cgroups / s.cgroup).is_dir()
            }

        return witnessed

    def admit(self, spec: dict[str, Any]) -> bool:
        """Ask numad to admit ``spec`` (raises what numad raises); remembers its answer."""
        name = spec["name"]
        self.answered.discard(name)  # released by numad since, or never answered
        self.witnessed.discard(name)
        if not self.daemon.admit(self.daemon.parse(json.dumps(spec), "json")).admitted:
            return False
        self.answered.add(name)
        self.admitted += 1
        if (self.cgroups / spec["cgroup"]).is_dir():
            self.witnessed.add(name)
        return True

    def restart(self, *, change_config: bool = False) -> None:
        if change_config:
            self.reserved_count = self.rng.choice((1, 2, 3))
            self.devices = self.rng.random() < 0.7
            self.reserved = None  # the config may change them: learn them again
        self.faults.crash_in = -1
        self.faults.loop_exception = False
        self.daemon = self._start()

    def stop(self) -> None:
        """A clean ``numad stop``: the cgroups numad isolated get their CPUs back, and
        the grants are no promise until the next numad writes them again."""
        failure, self.faults.write_failure = self.faults.write_failure, 0.0
        self.checking = False
        try:
            self.daemon.stop()
        finally:
            self.checking = True
            self.faults.write_failure = failure
        self.exclusive_files.clear()

    def remove(self, path: str) -> None:
        """Cgroup ``path`` goes, with every cgroup below it (an ``rm -r`` of the tree):
        numad may release the workloads whose cgroups were there once the grace passes."""
        shutil.rmtree(self.cgroups / path)
        for name, spec in self.daemon.specs.items():
            if _within(spec.cgroup, path):
                self.removed.add(name)
        for known in (self.failing, self.drifted, self.unreadable, self.bounded):
            known.difference_update([p for p in known if _within(p, path)])

    def reconcile_pass(self) -> bool:
        return bool(self.daemon.supervisor.run_once("reconcile", self.daemon.reconcile))

    def close(self) -> None:
        """The clients' commands still running are killed and reaped."""
        for child in self.children:
            child.kill()
            child.wait()
        self.children.clear()

    # -- invariants ----------------------------------------------------------------------

    def expect(self, holds: bool, broken: str) -> None:
        """One of a step's own promises: ``broken`` says how it broke."""
        self.checks += 1
        if not holds:
            raise Violation(f"step {self.steps}: {broken}")

    def checkpoint_bytes(self) -> bytes | None:
        try:
            return (self.root / "var/lib/numad" / state.FILE).read_bytes()
        except FileNotFoundError:
            return None

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

    def applied_above(self, path: str) -> int:
        """The CPUs a cgroup without a cpuset of its own runs on: its nearest
        ancestor's that has one, else the root's."""
        parts = path.split("/")
        for depth in range(len(parts) - 1, 0, -1):
            f = self.cgroups.joinpath(*parts[:depth], "cpuset.cpus")
            text = f.read_text().strip() if f.is_file() else ""
            if text:
                return CPUSet.parse_list(text).bits
        return CPUSet.parse_list((self.cgroups / "cpuset.cpus.effective").read_text()).bits

    def runs_on(self, path: str) -> int:
        """The CPUs a cgroup's processes may run on, as the (emulated) kernel says: on
        cgroup v2 its own setting masked by its parent's, so a cgroup below an isolated one
        runs on the shared pool whatever its own file holds."""
        f = self.cgroups / path / "cpuset.cpus.effective"
        return CPUSet.parse_list(f.read_text()).bits if f.is_file() else self.applied_above(path)

    def held_files(self) -> dict[str, int]:
        """Each cgroup's CPUs as its file holds them (an empty file: none of its own);
        one whose cpuset cannot be read, what its nearest readable ancestor applies."""
        held = {}
        for f in self.cgroups.rglob("cpuset.cpus"):
            text = f.read_text().strip()
            if text and f.parent != self.cgroups:
                held[str(f.parent.relative_to(self.cgroups))] = CPUSet.parse_list(text).bits
        for path in self.unreadable:
            cgroup = self.cgroups / path
            if cgroup.is_dir() and not (cgroup / "cpuset.cpus").exists():
                held[path] = self.applied_above(path)
        return held

    def _excused(self, other: str) -> bool:
        """A cgroup whose file may hold exclusive CPUs: a managed root (the parent of
        every workload), the pod above its containers and any cgroup above a
        workload's that exists (it only bounds them: on cgroup v2 a cgroup with
        children holds no process), or above a released one's until the next pass
        isolates it, one with cgroups below it whose write fails (health names it),
        and one another writer changed, until numad writes it again."""
        above = other == POD and self._has_children(POD)
        mine = [s.cgroup for s in self.daemon.specs.values()] + sorted(self.daemon.orphans)
        above |= any(m.startswith(other + "/") and (self.cgroups / m).is_dir() for m in mine)
        # One given back above a workload whose cgroup then went, and whose shrink fails
        # now: numad retries it every pass and health names it; with cgroups below it,
        # it holds no process (cgroup v2), and those below are isolated on their own.
        failing = other in self.failing and self._has_children(other)
        return other.count("/") == 0 or above or failing or other in self.drifted

    def _has_children(self, path: str) -> bool:
        return any(p.is_dir() for p in (self.cgroups / path).iterdir())

    def check_files(self, when: str) -> None:
        self.checks += 1
        held = self.held_files()
        bounded = {o: self.runs_on(o) for o in self.bounded if (self.cgroups / o).is_dir()}
        for path, grant in self.exclusive_files.items():
            if held.get(path) != grant:
                continue  # rewritten by another writer or gone
            for other, cpus in held.items():
                shared = cpus & grant
                if other != path and shared and not path.startswith(other + "/"):
                    if self._excused(other) or not self.runs_on(other) & grant:
                        continue  # cgroup v2: its file may, where a cgroup above bounds it
                    raise Violation(
                        f"{when}: cpus {CPUSet.from_bits(shared)} are in the exclusive"
                        f" {path} and in {other}"
                    )
            for other, runs_on in bounded.items():
                shared = runs_on & grant
                if shared and not _within(other, path):  # not the grant's own cgroup
                    raise Violation(
                        f"{when}: {other}, bounded by an isolated cgroup before, runs on"
                        f" cpus {CPUSet.from_bits(shared)} of the exclusive {path}"
                    )

    def check_empty(self, when: str) -> None:
        """After a step: a workload's cgroup with an empty cpuset (cgroup v2: its parent's
        CPUs, every CPU of numad.slice) runs on no other's written grant. numad writes it
        at its mkdir's event (delivered by ``make``), at its admission, or the shared pool
        while its grant waits; but not where the write failed (health names it) or it is
        outside the managed roots."""
        daemon, held = self.daemon, self.held_files()
        grants = {p: g for p, g in self.exclusive_files.items() if held.get(p) == g}
        subjects = set(daemon.health.subjects())
        for name, spec in daemon.specs.items():
            for c in spec.containers:
                path = spec.container_cgroup(c)
                own = self.cgroups / path / "cpuset.cpus"
                if name in daemon.held.outside or f"write:{path}" in subjects:
                    continue
                if not own.is_file() or own.read_text().strip():
                    continue
                runs_on = self.runs_on(path)
                for other, grant in grants.items():
                    shared = runs_on & grant
                    if other != path and shared and not _within(path, other):
                        raise Violation(
                            f"{when}: {path}, a workload's cgroup with an empty cpuset, runs"
                            f" on cpus {CPUSet.from_bits(shared)} of the exclusive {other}"
                        )

    def make(self, path: str) -> None:
        """``mkdir`` of a cgroup, and the inotify event numad's watcher gets for it."""
        scratch_mkdir(self.cgroups, path)
        self.daemon.isolate_new([path])

    def check(self, when: str) -> None:
        self.check_files(when)
        self.check_empty(when)
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

    # -- the end -------------------------------------------------------------------------

    def heal(self) -> None:
        """The faults that outlive a step end: a cgroup without its cpuset files gets
        them back (its controller enabled again: a new, empty cpuset)."""
        for path in sorted(self.unreadable):
            if (self.cgroups / path).is_dir():
                shutil.rmtree(self.cgroups / path)
                scratch_mkdir(self.cgroups, path)
        self.unreadable.clear()

    def settle(self) -> None:
        """Faults stop: within a few reconcile passes every exclusive set is granted,
        every shared cgroup holds the pool, and no write or grant problem is left."""
        self.heal()
        for _ in range(3):
            self.clock_now += 1.0
            if not self.reconcile_pass():
                raise Violation(f"reconcile fails without faults: {self.daemon.problems}")
        left = [p for p in self.daemon.health.subjects() if p.split(":")[0] in ("write", "grant")]
        if left:
            raise Violation(f"problems left after the faults stopped: {self.daemon.problems}")
        self._settled_strays()
        books = self.daemon.books
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

    def _settled_strays(self) -> None:
        """Every cgroup that is no workload's (inside numad.slice, or top-level) runs
        on the shared pool, never on an exclusive CPU nor on every CPU: its own file
        names them where nothing above it bounds it, its effective set does below."""
        books = self.daemon.books.cpu
        exclusive, pool = books.exclusive, books.shared_pool
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
            if stray.count("/") > 1 and self.applied_above(stray) == pool:
                cpus = self.runs_on(stray)  # below an isolated stray: its own file is its own
                if cpus & ~pool:
                    where = CPUSet.from_bits(cpus).format_list()
                    raise Violation(f"{stray}, no workload's, below another, runs on {where}")
            elif not cpus or cpus & exclusive:
                where = CPUSet.from_bits(cpus).format_list() or "every CPU (inherited)"
                raise Violation(f"{stray}, no workload's, runs on {where}")


def _within(path: str, top: str) -> bool:
    return path == top or path.startswith(top + "/")
