"""The composition root: builds every part, wires them, answers requests.

The only module that calls more than one stage. Its parts are collaborators on
one shared ``Holdings`` (``numad.daemon.holdings``), each given what it may touch:
``Commits`` (checkpoint, then cgroups through ``numad.host.enforce``), ``Views``
(read-only), the ``Reconciler`` (the pass over time), ``resume`` (the checkpoint
read back at start). Every change follows one sequence, one change at a time
(``Holdings.changing``): decide (pure) -> checkpoint (atomic) -> cgroups, the
daemon's lock let go around the cgroup writes. A change whose checkpoint cannot
be written changes nothing in memory and raises ``CheckpointError``; a cgroup write
that fails after the commit is retried by every reconcile pass and shown in the
health problems until it succeeds.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from numad.cpuset import CPUSet
from numad.daemon import state
from numad.daemon.admissions import Admissions
from numad.daemon.commits import Commits
from numad.daemon.config import Config, check_reserved
from numad.daemon.holdings import Holdings, TimedLock
from numad.daemon.loops import Supervisor
from numad.daemon.metrics import Metrics
from numad.daemon.reconcile import Reconciler
from numad.daemon.resizes import Resizes
from numad.daemon.restore import choose_reserved, distances
from numad.daemon.resume import resume
from numad.daemon.views import Views
from numad.errors import CheckpointError
from numad.host import durable
from numad.host.cgroup import host_parts
from numad.host.cgroup.v2 import CgroupV2Backend
from numad.host.enforce import Enforcer
from numad.host.exclusive import leftover_partitions, partitions
from numad.host.irqs import IrqAffinity
from numad.host.isolation import Isolation, Units
from numad.host.migration import Migrations
from numad.host.targets import Cgroups, Log
from numad.hostfs import HostFS
from numad.observe import Problems
from numad.placement.admission import Books, Engine, Outcome
from numad.placement.managers.cpu.state import CPUState
from numad.placement.managers.cpu.static import StaticOptions, StaticPolicy
from numad.placement.managers.cpu.topology import CPUTopology
from numad.placement.managers.device import DeviceInventory, DeviceState
from numad.placement.managers.memory import MemoryState, MemoryTable
from numad.placement.policy import Machine, check_machine, parse_options
from numad.topology.discover import discover
from numad.topology.model import Topology
from numad.workload.shape import WorkloadSpec

__all__ = ["Cgroups", "Daemon", "Log"]

# SIGTERM to exit within 2 s: each give-back waits this long for systemd, and a
# systemd that lets one go unanswered is asked nothing more (``Systemd.hurry``).
STOP_SYSTEMD_SECONDS = 1.5


class Daemon:
    """Builds every part and wires them; the state they share is one ``Holdings``."""

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
        self.started = False
        self.health = Problems()
        self.held = held = Holdings(
            TimedLock(
                self.metrics.lock_held.observe,
                self.metrics.lock_wait.observe,
                lambda seconds, holder: log.warning(
                    "lock_held_long", seconds=round(seconds, 3), holder=holder
                ),
            )
        )
        self.lock = held.lock
        self.isolation = Isolation(
            cgroups, state_dir, log, systemd=systemd, problems=self.health, **host_parts(cgroups)
        )
        if self.isolation.problem:
            self.health.set("isolation", self.isolation.problem)
        self.enforcer = Enforcer(self.isolation, self.metrics, log, self.health)
        made, how = None, "one by one: [host] partitions = false"
        if config.isolate and config.partitions is not False:
            made, how = partitions(cgroups, self.health, asked=config.partitions is True)
        self.enforcer.partitions = made
        self.irqs = IrqAffinity(Path(str(fs.root)) / "proc/irq", state_dir, log)
        if self.irqs.problem:
            self.health.set("irqs", self.irqs.problem)
        self.migrations = Migrations(
            self.isolation,
            cgroups.root if isinstance(cgroups, CgroupV2Backend) else None,
            held.changing,  # its report changes what the enforcer knows
            log=log,
            metrics=self.metrics,
            health=self.health,
            nodes_of=lambda cpus: held.topology.nodes_of_cpus(cpus),  # noqa: PLW0108 - of now
            pull=config.memory_pull,
            emulated=bool(getattr(cgroups, "emulate_kernel", False)),
            on_failed=lambda path: self.enforcer.written.pop(path, None),
            send=self.isolation.workloads.send,
        )
        self.enforcer.moves = self.migrations
        self.enforcer.cancelled = held.stopping.is_set
        self.supervisor = Supervisor(log, self.metrics, self.health, clock)
        self.enforcer.beat = lambda: self.supervisor.beat("reconcile")
        self.commits = Commits(
            held, config, state_dir, log, self.health, self.enforcer, self.isolation, self.irqs
        )
        self.views = Views(held, config, self.metrics, self.isolation, self.irqs, self.migrations)
        self.views.clock = clock
        enforcer = self.enforcer
        self.views.partitions = lambda: (
            enforcer.partitions.view(enforcer.grants) if enforcer.partitions else []
        )
        self.views.isolating = lambda: (  # refused at run time: the kernel's word
            f"one by one: {made.refused}" if made and made.refused else how
        )
        self.reconciler = Reconciler(
            held,
            self.commits,
            config,
            fs,
            cgroups,
            log,
            self.metrics,
            self.health,
            self.migrations,
            release=self.release,
            update_gauges=self.views.update_gauges,
            memory_of=self.views.memory_of,
            clock=clock,
        )
        # What the API, the loops and the page call: each part's own methods.
        self.reconcile, self.rediscover = self.reconciler.reconcile, self.reconciler.rediscover
        self.show, self.list_all, self.explain = (
            self.views.show,
            self.views.list_all,
            self.views.explain,
        )
        self.nrt, self.host, self.memory_of = self.views.nrt, self.views.host, self.views.memory_of
        self.update_gauges = self.views.update_gauges
        self.isolate_new = self.commits.isolate_new
        parts = (held, self.commits, self.views, self.metrics, log, self.update_gauges)
        resizes = Resizes(*parts)
        self.resize = resizes.resize  # PATCH /v1/workloads/NAME
        self.admissions = Admissions(
            held,
            self.commits,
            self.views,
            config,
            self.isolation,
            self.migrations,
            self.metrics,
            self.health,
            log,
        )
        self.plan = self.admissions.plan
        resizes.resident_in = self.admissions.resident_in

    # The shared state, read where the API, the page and tests look for it.
    @property
    def topology(self) -> Topology:
        return self.held.topology

    @property
    def books(self) -> Books:
        return self.held.books

    @property
    def engine(self) -> Engine:
        return self.held.engine

    @property
    def reserved(self) -> int:
        return self.held.reserved

    @property
    def specs(self) -> Mapping[str, WorkloadSpec]:
        return self.held.specs

    @property
    def outcomes(self) -> Mapping[str, Outcome]:
        return self.held.outcomes

    @property
    def orphans(self) -> set[str]:
        return self.held.orphans

    @property
    def others(self) -> set[str]:
        return self.held.others

    @property
    def repairs(self) -> int:
        return self.held.repairs

    @property
    def syscalls(self) -> durable.Syscalls:
        return self.commits.syscalls

    @syscalls.setter
    def syscalls(self, value: durable.Syscalls) -> None:
        self.commits.syscalls = value

    @property
    def clock(self) -> Callable[[], float]:
        return self.reconciler.clock

    @clock.setter
    def clock(self, value: Callable[[], float]) -> None:
        self.reconciler.clock = self.views.clock = value

    def interrupt(self) -> None:
        """SIGTERM: a pass or request under way ends its cgroup writes now (``stop``
        follows, once the API server has stopped)."""
        self.held.stopping.set()
        self.isolation.hurry(STOP_SYSTEMD_SECONDS)

    def stop(self) -> None:
        self.interrupt()
        self.reconciler.stop()

    @property
    def managed_roots(self) -> tuple[str, ...]:
        return self.config.paths.managed_roots

    @property
    def ready(self) -> bool:
        """Started, and able to do its job: the checkpoint writable, the cgroup root
        there, the last reconcile pass done, no workload held outside the managed roots
        (its placement is committed, but numad can no longer enforce it)."""
        blocking = ("checkpoint", "cgroup-root", "loop:reconcile")
        return self.started and not self.held.outside and not any(map(self.health.has, blocking))

    @property
    def problems(self) -> list[str]:
        return self.health.snapshot()

    @property
    def written(self) -> Mapping[str, object]:
        return self.enforcer.written

    # -- start-up ------------------------------------------------------------------------

    def start(self) -> None:
        held = self.held
        held.topology = discover(self.fs)
        view = CPUTopology.from_topology(held.topology)
        options = parse_options(self.config.policy, self.config.topology_options)
        machine = Machine(held.topology.node_ids, distances(held.topology))
        check_machine(self.config.policy, options, machine)
        cpu_options = StaticOptions.parse(self.config.cpu_options)
        cpu_options.check(view, str(self.config.policy))
        held.cpu_policy = StaticPolicy(view, cpu_options)
        checkpoint, problem = state.read(self.state_dir)
        if problem:
            self.health.set("checkpoint-read", problem)
            self.log.error("checkpoint_unreadable", problem=problem)
        known = CPUSet(c.id for c in held.topology.all_cpus)
        check_reserved(self.config, known, len(held.topology.online_cpus))
        held.reserved, changed = choose_reserved(self.config, held.cpu_policy, checkpoint)
        if changed:
            self.log.warning("reserved_cpus_changed", change=changed)
        held.engine = Engine(
            machine,
            held.cpu_policy,
            self.config.policy,
            options,
            self.config.scope,
            self.config.memory_static,
        )
        held.books = Books(
            CPUState(view.all, held.reserved & view.all, cpu_options.strict_reservation),
            MemoryState(MemoryTable.build(held.topology, self.config.memory_reserved)),
            DeviceState(DeviceInventory.build(held.topology, self.config.device_classes)),
        )
        self.reconciler.check_classes()
        if checkpoint is not None:
            resume(self.held, self.commits, checkpoint, self.config, self.health, self.log)
        active, grants = self.enforcer.partitions is not None, self.enforcer.grants
        for problem in leftover_partitions(self.cgroups, active, grants):
            self.log.error("partition_end_failed", problem=problem)
        with contextlib.suppress(CheckpointError):  # not ready, said in health; retried
            self.commits.commit(held.books, held.specs)
        self.supervisor.run_once("reconcile", self.reconcile)
        self.admissions.declared()
        self.update_gauges()
        self.started = True
        self.log.info(
            "daemon_started",
            workloads=len(held.specs),
            unplaced=len(held.unplaced),
            reserved=str(CPUSet.from_bits(held.reserved)),
        )

    # -- requests ------------------------------------------------------------------------

    def parse(self, text: str, fmt: str) -> WorkloadSpec:
        return self.admissions.parse(text, fmt)

    def admit(self, spec: WorkloadSpec) -> Outcome:
        return self.admissions.admit(spec)

    def release(self, name: str) -> None:
        self.admissions.release(name)

    def reload_workloads(self) -> None:
        """SIGHUP: admit what the workloads directory declares anew."""
        held = self.held
        with held.changing:
            self.admissions.declared()
            self.update_gauges()
        self.log.info("workloads_reloaded", workloads=len(held.specs))
