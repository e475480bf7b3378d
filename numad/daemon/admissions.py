"""Admission and release: the two requests that add and remove a workload.

Daemon side, a collaborator of ``numad.daemon.root.Daemon`` on the shared
``Holdings``. Each follows the one sequence every change takes (``changing``):
decide (pure: the plain admission, and on a rejection the search for moves, which runs
after the lock on what it read under it: ``numad.daemon.moving``) -> checkpoint
(atomic, ``numad.daemon.commits``) -> cgroups. A change
whose checkpoint cannot be written changes nothing in memory and raises
``CheckpointError``. An admission made possible by moves commits the moved
workloads' new places with it, in the same checkpoint.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from numad.daemon.commits import Commits
from numad.daemon.config import Config
from numad.daemon.holdings import Holdings
from numad.daemon.metrics import Metrics
from numad.daemon.moving import Resident, View, decide, recorded, search
from numad.daemon.views import Views
from numad.errors import NumadError, SpecError, WorkloadError
from numad.host.isolation import Isolation
from numad.host.migration import Migrations
from numad.host.targets import Log
from numad.observe import Problems
from numad.placement.admission import Books, Outcome, admit, release
from numad.placement.moves import Plan
from numad.workload import units
from numad.workload.shape import WorkloadSpec
from numad.workload.spec import load_spec, parse_spec

SEARCHES = 3  # searches for moves after the lock before one under it


@dataclass
class Admissions:
    held: Holdings
    commits: Commits
    views: Views
    config: Config
    isolation: Isolation
    migrations: Migrations
    metrics: Metrics
    health: Problems
    log: Log

    def _admit_step(self, phase: str) -> None:
        self.commits.crash_point(f"admit:after-{phase}")

    def _release_step(self, phase: str) -> None:
        self.commits.crash_point(f"release:after-{phase}")

    def spec_args(self) -> dict[str, Any]:
        return {
            "managed_roots": self.config.paths.managed_roots,
            "device_classes": [c.name for c in self.config.device_classes],
        }

    def parse(self, text: str, fmt: str) -> WorkloadSpec:
        return parse_spec(text, fmt, **self.spec_args())  # type: ignore[arg-type]

    def resident(self, name: str) -> dict[int, int]:
        """A workload's resident memory per node, as ``memory.numa_stat`` says."""
        spec = self.held.specs[name]
        return self.migrations.resident(spec.container_cgroup(c) for c in spec.containers)

    def plan(self, spec: WorkloadSpec) -> Outcome:
        """What admitting ``spec`` would do, moves included; for a workload admitted
        already, what it holds. The search for moves runs after the lock."""
        held = self.held
        with held.lock:
            if spec.name in held.specs:
                return self.views.holding(spec.name)
            books, outcome = admit(held.engine, held.books, spec.to_request())
            view = View.of(held)
        if not outcome.admitted:
            _, outcome, _ = search(view, spec.to_request(), self.resident_in(view), books, outcome)
        return replace(outcome, planned=True)

    def admit(self, spec: WorkloadSpec) -> Outcome:
        """Admit ``spec``: decide, checkpoint, cgroups. A rejection's search for moves runs
        after the daemon's lock, on what it read under it; its plan commits only if
        nothing it read changed meanwhile, else the search runs again (the last time
        under the lock, so an admission never starves)."""
        spec = self._resolved(spec)  # systemd's answer, before the lock
        outcome = self._admit(spec)
        if outcome.admitted:  # a unit's placement, or a move's: told systemd now
            self.commits.settle_units(spec)
        return outcome

    def _admit(self, spec: WorkloadSpec) -> Outcome:
        held, request = self.held, spec.to_request()
        for _ in range(SEARCHES):
            with held.changing:
                self._check_new(spec)
                started = time.perf_counter()
                books, outcome = admit(held.engine, held.books, request)
                if outcome.admitted:
                    return self._commit(spec, books, outcome, None, started)
                view = View.of(held)
            found = search(view, request, self.resident_in(view), books, outcome)
            with held.changing:
                if view.same(held):
                    self._check_new(spec)
                    return self._commit(spec, *found, started)
        with held.changing:
            self._check_new(spec)
            started = time.perf_counter()
            return self._commit(spec, *decide(held, request, self.resident), started)

    def _check_new(self, spec: WorkloadSpec) -> None:
        if spec.name in self.held.specs:
            raise WorkloadError(spec.name, "is already admitted", "release it first")
        self.views.check_cgroups_free(spec)

    def resident_in(self, view: View) -> Resident:
        """A workload's resident memory per node, by the specs the search reads."""

        def of(name: str) -> dict[int, int]:
            spec = view.specs[name]
            return self.migrations.resident(spec.container_cgroup(c) for c in spec.containers)

        return of

    def _commit(
        self,
        spec: WorkloadSpec,
        books: Books,
        outcome: Outcome,
        plan: Plan | None,
        started: float,
    ) -> Outcome:
        """The decision made (under the lock): counted, and if admitted, checkpointed,
        then written."""
        held = self.held
        self.views.count(spec, outcome, time.perf_counter() - started)
        if not outcome.admitted:
            self.log.info("admission_rejected", workload=spec.name, reason=str(outcome.reason))
            return outcome
        specs = {**held.specs, spec.name: spec}
        seen = held.seen
        if any(self.commits.enforcer.exists(spec.container_cgroup(c)) for c in spec.containers):
            seen = seen | {spec.name}  # released when its cgroups go (after the grace)
        self.commits.commit(books, specs, seen=seen)  # invariant 3: before any cgroup change
        self.commits.crash_point("admit:after-checkpoint")
        held.books, held.specs, held.seen = books, specs, seen
        held.outcomes[spec.name] = outcome
        if plan is not None:
            self.metrics.admitted_by_moves.inc()
            recorded(held, self.metrics, self.log, plan, to_admit=spec.name)
        self.commits.after_commit(lambda: self.commits.enforce(self._admit_step, changed=spec))
        self.views.update_gauges()
        self.log.info("admission_accepted", workload=spec.name, moved=len(outcome.moves))
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
        held = self.held
        with held.changing:
            if name not in held.specs:
                raise WorkloadError(name, "no such workload")
            spec = held.specs[name]
            books = release(held.books, name)
            specs = {k: v for k, v in held.specs.items() if k != name}
            orphans = held.orphans | {spec.container_cgroup(c) for c in spec.containers}
            unplaced = {k: why for k, why in held.unplaced.items() if k != name}
            self.commits.commit(books, specs, orphans=orphans, unplaced=unplaced)
            self.commits.crash_point("release:after-checkpoint")
            held.books, held.specs, held.orphans = books, specs, orphans
            held.unplaced.pop(name, None)
            held.forget(name)
            for problem in ("workload", "outside", "cgroup-of"):
                self.health.clear(f"{problem}:{name}")
            self.health.clear_prefix(f"hotplug:{name}/")  # its containers' flags
            self.migrations.forget(name, [spec.container_cgroup(c) for c in spec.containers])
            with contextlib.suppress(KeyError):  # never measured
                self.metrics.locality.remove(name)
            self.commits.after_commit(
                lambda: self.commits.enforce(self._release_step, changed=spec)
            )
            self.commits.settle_orphans()
            self.views.update_gauges()
            self.log.info("workload_released", workload=name)
        self.commits.settle_units(spec)  # a unit leaves the exclusive CPUs before the answer

    def declared(self) -> None:
        """Admit the specs of the workloads directory that are not admitted yet."""
        held = self.held
        directory = Path(self.config.paths.workloads_dir)
        if not directory.is_dir():
            return
        self.health.clear_prefix("declared:")
        for path in sorted(directory.iterdir()):
            if path.suffix.lower() not in (".toml", ".json", ".yaml", ".yml"):
                continue
            try:
                spec = load_spec(path, **self.spec_args())
                if spec.name in held.specs:
                    continue
                outcome = self.admit(spec)
            except NumadError as err:
                self.health.set(f"declared:{path}", f"{path}: {err}")
                self.log.error("declared_workload_failed", file=str(path), problem=str(err))
                continue
            if not outcome.admitted:
                why = outcome.explanation
                text = "; ".join((why.text() if why else outcome.detail, *outcome.move_lines()))
                self.health.set(f"declared:{path}", f"{path}: not admitted: {text}")
