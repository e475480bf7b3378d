"""The composition root: builds every part, owns the state, commits each change.

The only module that calls more than one stage. Every change follows the same
sequence under one lock: decide (pure) -> checkpoint (atomic) -> cgroups
(``numad.host.enforce``, which owns the order of the writes). A change whose
checkpoint cannot be written changes nothing in memory and raises
``CheckpointError``; a cgroup write that fails after the commit is retried by
every reconcile pass and shown in the health problems until it succeeds.
Restoring lives in ``numad.daemon.restore``, rediscovery and the reconcile pass in
``numad.daemon.reconcile``, the loops in ``numad.daemon.loops``, the read-only views in
``numad.daemon.views``.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from numad.cpuset import CPUSet, NodeSet
from numad.daemon import state
from numad.daemon.config import Config, check_reserved
from numad.daemon.loops import Supervisor
from numad.daemon.metrics import Metrics
from numad.daemon.reconcile import Reconciler
from numad.daemon.restore import choose_reserved, distances, reserved_setting, restore
from numad.daemon.views import Views
from numad.errors import CheckpointError, NumadError, SpecError, WorkloadError
from numad.host import durable
from numad.host.cgroup import CgroupPath
from numad.host.cgroup.v2 import CgroupV2Backend
from numad.host.enforce import Cgroups, Enforcer, Log, targets
from numad.host.irqs import IrqAffinity
from numad.host.isolation import Isolation, Units, host_parts
from numad.host.migration import Migrations
from numad.hostfs import HostFS
from numad.observe import Problems
from numad.placement.admission import Books, Engine, Outcome, admit, release
from numad.placement.managers.cpu.state import CPUState
from numad.placement.managers.cpu.static import StaticOptions, StaticPolicy
from numad.placement.managers.cpu.topology import CPUTopology
from numad.placement.managers.device import DeviceInventory, DeviceState
from numad.placement.managers.memory import MemoryState, MemoryTable
from numad.placement.policy import Machine, check_machine, parse_options
from numad.topology.discover import discover
from numad.workload import units
from numad.workload.spec import WorkloadSpec, load_spec, parse_spec

__all__ = ["Cgroups", "Daemon", "Log"]


class Daemon(Views, Reconciler):
    def __init__(  # noqa: PLR0917 - the composition root takes every part
        self,
        config: Config,
        fs: HostFS,
        cgroups: Cgroups,
        state_dir: Path,
        log: Log,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        systemd: Units | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics or Metrics()
        self.metrics_address = ""  # host:port of the metrics endpoint, once serving
        self.fs = fs
        self.cgroups = cgroups
        self.state_dir = state_dir
        self.log = log
        self.clock = clock
        self.lock = threading.RLock()
        self.started = False
        self.health = Problems()
        self.isolation = Isolation(cgroups, state_dir, log, systemd=systemd, **host_parts(cgroups))
        if self.isolation.problem:
            self.health.set("isolation", self.isolation.problem)
        self.enforcer = Enforcer(self.isolation, self.metrics, log, self.health)
        self.irqs = IrqAffinity(Path(str(fs.root)) / "proc/irq", state_dir, log)
        if self.irqs.problem:
            self.health.set("irqs", self.irqs.problem)
        self.migrations = Migrations(
            self.isolation,
            cgroups.root if isinstance(cgroups, CgroupV2Backend) else None,
            self.lock,
            log=log,
            metrics=self.metrics,
            health=self.health,
            nodes_of=self._nodes_of,
            pull=config.memory_pull,
            emulated=bool(getattr(cgroups, "emulate_kernel", False)),
            on_failed=lambda path: self.enforcer.written.pop(path, None),
        )
        self.enforcer.moves = self.migrations
        self.supervisor = Supervisor(log, self.metrics, self.health, clock)
        self.specs: dict[str, WorkloadSpec] = {}
        self.outcomes: dict[str, Outcome] = {}
        self.unplaced: dict[str, str] = {}  # admitted, holding nothing: the reason
        self.orphans: set[str] = set()  # released cgroups that still exist
        self.others: set[str] = set()  # no workload's, isolated from exclusive CPUs
        self.seen: set[str] = set()  # workloads whose cgroup has existed
        self.gone_since: dict[str, float] = {}  # workload -> when its cgroups went
        self.rediscover_pending = False
        self.stopped = False
        self.syscalls = durable.SYSCALLS  # the checkpoint's writes (a seam for fault injection)
        self.passes = 0
        self.repairs = 0
        # A failpoint for the crash tests: die at the named step, as SIGKILL would.
        self._crash_at = os.environ.get("NUMAD_TEST_CRASH_AT", "")

    def _nodes_of(self, cpus: CPUSet) -> NodeSet:
        return self.topology.nodes_of_cpus(cpus)  # the topology of now (rediscovery)

    @property
    def ready(self) -> bool:
        """Started, and able to do its job: the checkpoint writable, the cgroup root there."""
        return self.started and not any(self.health.has(k) for k in ("checkpoint", "cgroup-root"))

    @property
    def problems(self) -> list[str]:
        return self.health.snapshot()

    @property
    def written(self) -> Mapping[str, object]:
        return self.enforcer.written

    # -- start-up ------------------------------------------------------------------------

    def start(self) -> None:
        self.topology = discover(self.fs)
        view = CPUTopology.from_topology(self.topology)
        options = parse_options(self.config.policy, self.config.topology_options)
        machine = Machine(self.topology.node_ids, distances(self.topology))
        check_machine(self.config.policy, options, machine)
        cpu_options = StaticOptions.parse(self.config.cpu_options)
        cpu_options.check(view, str(self.config.policy))
        self.cpu_policy = StaticPolicy(view, cpu_options)
        checkpoint, problem = state.read(self.state_dir)
        if problem:
            self.health.set("checkpoint-read", problem)
            self.log.error("checkpoint_unreadable", problem=problem)
        known = CPUSet(c.id for c in self.topology.all_cpus)
        check_reserved(self.config, known, len(self.topology.online_cpus))
        self.reserved, changed = choose_reserved(self.config, self.cpu_policy, checkpoint)
        if changed:
            self.log.warning("reserved_cpus_changed", change=changed)
        self.engine = Engine(
            machine,
            self.cpu_policy,
            self.config.policy,
            options,
            self.config.scope,
            self.config.memory_static,
        )
        self.books = Books(
            CPUState(view.all, self.reserved & view.all, cpu_options.strict_reservation),
            MemoryState(MemoryTable.build(self.topology, self.config.memory_reserved)),
            DeviceState(DeviceInventory.build(self.topology, self.config.device_classes)),
        )
        if checkpoint is not None:
            self._restore(checkpoint)
        with contextlib.suppress(CheckpointError):  # not ready, said in health; retried
            self._commit(self.books, self.specs)
        self.supervisor.run_once("reconcile", self.reconcile)
        self._declared()
        self.update_gauges()
        self.started = True
        self.log.info(
            "daemon_started",
            workloads=len(self.specs),
            unplaced=len(self.unplaced),
            reserved=str(CPUSet.from_bits(self.reserved)),
        )

    def _restore(self, checkpoint: state.Checkpoint) -> None:
        """Every recorded workload back: exactly, repaired, or unplaced; never dropped
        while its spec can be read."""
        roots = self.config.paths.managed_roots
        grants = self.enforcer.grants  # what each file may still hold, until rewritten
        for path, cpus in checkpoint.grants.items():
            grants[path] = CPUSet.parse_list(cpus).bits
        for orphan in checkpoint.orphans:
            try:
                CgroupPath.parse(orphan).managed_by([CgroupPath.parse(r) for r in roots])
            except NumadError as err:
                self.log.warning("orphan_dropped", cgroup=orphan, problem=str(err))
                continue
            self.orphans.add(orphan)
        for name, record in sorted(checkpoint.workloads.items()):
            try:
                spec = self._restored_spec(name, record)
            except NumadError as err:
                self.health.set(f"workload:{name}", f"{name}: dropped on restart: {err}")
                self.log.error("workload_dropped", workload=name, problem=str(err))
                continue
            self.specs[name] = spec
            for c in spec.containers:  # a checkpoint from before grants were recorded
                path, cpus = spec.container_cgroup(c), record.cpus.get(c.name, "")
                if CPUSet.parse_list(cpus).bits:
                    grants[path] = grants.get(path, 0) | CPUSet.parse_list(cpus).bits
            self.books, what = restore(self.books, spec, record, self.cpu_policy, self.topology)
            if what.startswith("unplaced: "):
                self._unplace(name, what.removeprefix("unplaced: "))
            elif what:
                self.log.warning("workload_replaced", workload=name, change=what)
        managed = self.orphans | {
            s.container_cgroup(c) for s in self.specs.values() for c in s.containers
        }
        for path in set(grants) - managed:  # numad no longer writes them
            del grants[path]

    def _restored_spec(self, name: str, record: state.Record) -> WorkloadSpec:
        """The recorded spec, read without the config's device classes (a class removed
        from the config leaves the workload unplaced, not dropped); a cgroup now
        outside the managed roots keeps its workload, flagged, holding its CPUs."""
        text = json.dumps(record.spec)
        roots = self.config.paths.managed_roots
        try:
            return parse_spec(text, "json", managed_roots=roots, device_classes=None)
        except SpecError:
            cgroup = str(record.spec.get("cgroup", ""))
            spec = parse_spec(
                text,
                "json",
                managed_roots=(*roots, cgroup.split("/", maxsplit=1)[0]),
                device_classes=None,
            )
        self.health.set(
            f"workload:{name}",
            f"{name}: cgroup {spec.cgroup} is outside the managed roots"
            f" ({', '.join(roots)}); numad cannot write it; release it or add its root back",
        )
        return spec

    def _unplace(self, name: str, why: str) -> None:
        if self.unplaced.get(name) == why:
            return
        self.unplaced[name] = why
        self.health.set(f"workload:{name}", f"{name}: unplaced: {why}; admitted again once it fits")
        self.log.error("workload_unplaced", workload=name, problem=why)

    # -- commits ---------------------------------------------------------------------------

    def _commit(self, books: Books, specs: Mapping[str, WorkloadSpec]) -> None:
        """Write the checkpoint of ``books``/``specs``; CheckpointError leaves the
        daemon's state as it was and makes numad not ready until a write succeeds."""
        records = {
            name: state.record_of(books, name, spec.to_dict(), self.unplaced.get(name, ""))
            for name, spec in specs.items()
        }
        reserved = CPUSet.from_bits(self.reserved).format_list()
        orphans = tuple(sorted(self.orphans))
        grants = {p: CPUSet.from_bits(c).format_list() for p, c in self.enforcer.grants.items()}
        try:
            state.write(
                self.state_dir,
                state.Checkpoint(reserved, records, orphans, reserved_setting(self.config), grants),
                self.syscalls,
            )
        except CheckpointError as err:
            self.health.set("checkpoint", f"{err}; numad cannot commit changes")
            self.log.error("checkpoint_write_failed", problem=str(err))
            raise
        self.health.clear("checkpoint")

    def _admit_step(self, phase: str) -> None:
        self._crash_point(f"admit:after-{phase}")

    def _release_step(self, phase: str) -> None:
        self._crash_point(f"release:after-{phase}")

    def _crash_point(self, name: str) -> None:
        if self._crash_at == name:
            os._exit(137)

    def _spec_args(self) -> dict[str, Any]:
        return {
            "managed_roots": self.config.paths.managed_roots,
            "device_classes": [c.name for c in self.config.device_classes],
        }

    # -- requests ------------------------------------------------------------------------

    def parse(self, text: str, fmt: str) -> WorkloadSpec:
        return parse_spec(text, fmt, **self._spec_args())  # type: ignore[arg-type]

    def plan(self, spec: WorkloadSpec) -> Outcome:
        with self.lock:
            _, outcome = admit(self.engine, self.books, spec.to_request())
            return outcome

    def admit(self, spec: WorkloadSpec) -> Outcome:
        with self.lock:
            if spec.name in self.specs:
                raise WorkloadError(spec.name, "is already admitted", "release it first")
            spec = self._resolved(spec)
            self._check_cgroups_free(spec)
            started = time.perf_counter()
            books, outcome = admit(self.engine, self.books, spec.to_request())
            self._count(spec, outcome, time.perf_counter() - started)
            if not outcome.admitted:
                self.log.info("admission_rejected", workload=spec.name, reason=str(outcome.reason))
                return outcome
            specs = {**self.specs, spec.name: spec}
            self._commit(books, specs)  # invariant 3: before any cgroup change
            self._crash_point("admit:after-checkpoint")
            self.books, self.specs = books, specs
            self.outcomes[spec.name] = outcome
            self._after_commit(lambda: self._enforce(self._admit_step))
            if any(self.enforcer.exists(spec.container_cgroup(c)) for c in spec.containers):
                self.seen.add(spec.name)  # released when its cgroups go (after the grace)
            self.update_gauges()
            self.log.info("admission_accepted", workload=spec.name)
            return outcome

    def _resolved(self, spec: WorkloadSpec) -> WorkloadSpec:
        """A unit's spec with its cgroup as systemd has it (a given one must match)."""
        if spec.unit is None:
            return spec
        roots = tuple(r.strip("/") for r in self.config.paths.managed_roots)
        path = units.resolve(self.isolation.systemd, spec.unit, spec.name, roots)
        if spec.cgroup and spec.cgroup != path:
            problem = f"cgroup: {spec.cgroup} is not {spec.unit}'s cgroup ({path})"
            raise SpecError(spec.name, problem, "leave cgroup out: numad asks systemd")
        return replace(spec, cgroup=path)

    def release(self, name: str) -> None:
        with self.lock:
            if name not in self.specs:
                raise WorkloadError(name, "no such workload")
            spec = self.specs[name]
            books = release(self.books, name)
            specs = {k: v for k, v in self.specs.items() if k != name}
            was_orphan, was_unplaced = set(self.orphans), self.unplaced.pop(name, None)
            self.orphans |= {spec.container_cgroup(c) for c in spec.containers}
            try:
                self._commit(books, specs)
            except CheckpointError:
                self.orphans = was_orphan
                if was_unplaced is not None:
                    self.unplaced[name] = was_unplaced
                raise
            self._crash_point("release:after-checkpoint")
            self.books, self.specs = books, specs
            self.seen.discard(name)
            self.outcomes.pop(name, None)
            self.gone_since.pop(name, None)
            self.health.clear(f"workload:{name}")
            self.migrations.forget(name, [spec.container_cgroup(c) for c in spec.containers])
            with contextlib.suppress(KeyError):  # never measured
                self.metrics.locality.remove(name)
            self._after_commit(lambda: self._enforce(self._release_step))
            self._settle_orphans()
            self.update_gauges()
            self.log.info("workload_released", workload=name)

    def _enforce(self, step: Callable[[str], None] | None = None) -> None:
        self._find_others()  # new ones are isolated as they appear
        owned = {s.cgroup: s.unit for s in self.specs.values() if s.unit is not None}
        self.isolation.own(owned, self.orphans)  # units' placements go through systemd
        wanted = targets(self.books, self.specs, self.orphans, self.others)
        self.enforcer.apply(wanted, self.books.cpu.shared_pool, step)
        self.isolation.preset(wanted)
        self._place_irqs()

    def _after_commit(self, step: Callable[[], None]) -> None:
        """A cgroup step after a commit: the change stands whatever the step raises
        (the caller's answer says what was committed); the next reconcile pass
        writes everything again."""
        try:
            step()
        except Exception as err:
            self.health.set("enforce", f"cgroup writes failed after a commit: {err!r}; retried")
            self.log.exception("enforcement_failed", problem=repr(err))

    def reload_workloads(self) -> None:
        """SIGHUP: admit what the workloads directory declares anew."""
        with self.lock:
            self._declared()
            self.update_gauges()
        self.log.info("workloads_reloaded", workloads=len(self.specs))

    def _declared(self) -> None:
        """Admit the specs of the workloads directory that are not admitted yet."""
        directory = Path(self.config.paths.workloads_dir)
        if not directory.is_dir():
            return
        self.health.clear_prefix("declared:")
        for path in sorted(directory.iterdir()):
            if path.suffix.lower() not in (".toml", ".json", ".yaml", ".yml"):
                continue
            try:
                spec = load_spec(path, **self._spec_args())
                if spec.name in self.specs:
                    continue
                outcome = self.admit(spec)
            except NumadError as err:
                self.health.set(f"declared:{path}", f"{path}: {err}")
                self.log.error("declared_workload_failed", file=str(path), problem=str(err))
                continue
            if not outcome.admitted:
                why = outcome.explanation
                text = why.text() if why else outcome.detail
                self.health.set(f"declared:{path}", f"{path}: not admitted: {text}")
