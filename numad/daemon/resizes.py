"""Resize in place (``PATCH /v1/workloads/NAME``): one container's CPUs and memory.

Daemon side, a collaborator of ``numad.daemon.root.Daemon`` on the shared ``Holdings``.
The request's body is read here; the decision is the pure core's
(``numad.placement.resize``); the change then takes the path every change takes
(``numad.daemon.commits``): the new books and spec written to the checkpoint, then the
cgroups through ``numad.host.enforce``, whose order keeps every CPU in one exclusive
cpuset at most: a growing container's new CPUs leave the shared cgroups before it is
granted them, a shrinking one gives its CPUs up before the shared cgroups get them. A
unit's cpuset goes through systemd, as at its admission. A refusal changes nothing. A
grown movable container that no longer fits is re-placed by the search for moves, run
after the lock as an admission's is (``numad.daemon.moving``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

from numad.cpuset import CPUSet
from numad.daemon.answers import outcome_json
from numad.daemon.commits import Commits
from numad.daemon.holdings import Holdings
from numad.daemon.metrics import Metrics
from numad.daemon.moving import Resident, View, movers, recorded
from numad.daemon.views import Views
from numad.errors import WorkloadError
from numad.host.targets import Log
from numad.placement.admission import Books, Outcome, placements
from numad.placement.moves import Mover, Plan, replace_grown
from numad.placement.resize import resize
from numad.workload.quantity import is_whole, quantity
from numad.workload.shape import MAX_BYTES, MAX_CPUS, WorkloadSpec

Answer = tuple[int, dict[str, Any]]
FIELDS = ("cpus", "memory", "container")
SEARCHES = 3  # searches for moves after the lock before one under it


@dataclass(frozen=True, slots=True)
class Ask:
    """A resize request's body: the container (None: the only app container), its
    exclusive CPUs and memory bytes (None: as they are)."""

    container: str | None
    cpus: int | None
    memory: int | None


def _error(status: int, code: str, message: str) -> Answer:
    return status, {"error": {"code": code, "message": message}}


def parse_ask(name: str, raw: bytes) -> Ask | Answer:
    """The body ``{"cpus": N, "memory": "2Gi", "container": "main"}``, or a 400."""
    try:
        doc = json.loads(raw or b"null")
    except (ValueError, RecursionError):
        doc = None
    problem = _problem(doc)
    if problem or not isinstance(doc, dict):
        return _error(400, "bad_request", f"{name}: {problem}")
    memory = doc.get("memory")
    return Ask(doc.get("container"), doc.get("cpus"), None if memory is None else _bytes(memory))


def _problem(doc: object) -> str:
    """What is wrong with a resize body ("" if nothing)."""
    if not isinstance(doc, dict) or not doc:
        return f"give a JSON object of {', '.join(FIELDS)}"
    unknown = [str(k)[:60] for k in doc if k not in FIELDS]
    cpus, memory, container = doc.get("cpus"), doc.get("memory"), doc.get("container")
    problem = ""
    if unknown:
        problem = f"unknown field {unknown[0]!r}; known: {', '.join(FIELDS)}"
    elif cpus is None and memory is None:
        problem = "give cpus, memory or both"
    elif cpus is not None and (type(cpus) is not int or not 0 <= cpus <= MAX_CPUS):
        problem = f"cpus: give a whole number of exclusive CPUs, 0 to {MAX_CPUS}"
    elif memory is not None and _bytes(memory) is None:
        problem = "memory: give bytes, or a size like 2Gi"
    elif container is not None and not isinstance(container, str):
        problem = "container: give a container's name"
    return problem


def _bytes(value: object) -> int | None:
    """Bytes from an integer or a quantity like "2Gi"; None for anything else."""
    amount: Decimal | None = None
    if type(value) is int:
        amount = Decimal(value)
    elif isinstance(value, str):
        amount = quantity(value)
    if amount is None or not 0 < amount <= MAX_BYTES or not is_whole(amount):
        return None
    return int(amount)


@dataclass(frozen=True, slots=True)
class Decided:
    """The core's decision on a resize, made under the lock: its books where it fits,
    else why not and whether moves may make it fit (``search``)."""

    name: str
    container: str
    who: str  # the workload, or workload/container, as answers name it
    new: WorkloadSpec
    books: Books
    refused: str
    search: bool


class Resizes:
    """``PATCH /v1/workloads/NAME``: the body read, the core's decision, the commit."""

    def __init__(  # noqa: PLR0917 - what a resize reads and changes
        self,
        held: Holdings,
        commits: Commits,
        views: Views,
        metrics: Metrics,
        log: Log,
        update_gauges: Callable[[], None],
    ) -> None:
        self.held = held
        self.commits = commits
        self.views = views
        self.metrics = metrics
        self.log = log
        self.update_gauges = update_gauges
        # A workload's memory per node, by the specs a search reads (the root's).
        self.resident_in: Callable[[View], Resident] = lambda _: lambda _: {}

    def _step(self, phase: str) -> None:
        self.commits.crash_point(f"resize:after-{phase}")

    def resize(self, name: str, raw: bytes) -> Answer:
        """200 with the new placement; 409 with the reason and nothing changed; 400 for
        a body numad cannot read or a container it cannot tell; 404 for no workload.
        A grown movable container that no longer fits is re-placed by a search run
        after the lock, on what it read under it, as an admission's (SEARCHES); a
        unit's placement is told to systemd after it too (``Commits.settle_units``)."""
        ask = parse_ask(name, raw)
        if not isinstance(ask, Ask):
            return ask
        answer = self._resize(name, ask)
        spec = self.held.specs.get(name)
        if answer[0] == 200 and spec is not None:
            self.commits.settle_units(spec)
        return answer

    def _resize(self, name: str, ask: Ask) -> Answer:
        held = self.held
        for _ in range(SEARCHES):
            with held.changing:
                decided = self._decide(name, ask)
                if not isinstance(decided, Decided):
                    return decided
                if not decided.search:
                    return self._commit(decided, None)
                view = View.of(held)
            plan = self._search(decided, view)
            with held.changing:
                if view.same(held):
                    return self._commit(decided, plan)
        with held.changing:  # overtaken every time: searched under the lock
            decided = self._decide(name, ask)
            if not isinstance(decided, Decided):
                return decided
            plan = self._search(decided, View.of(held)) if decided.search else None
            return self._commit(decided, plan)

    def _decide(self, name: str, ask: Ask) -> Decided | Answer:
        """The core's decision (under the lock), or the answer that ends the request."""
        held = self.held
        if name not in held.specs:
            raise WorkloadError(name, "no such workload")
        spec = held.specs[name]
        container = spec.container(ask.container)
        if container is None:
            names = ", ".join(c.name for c in spec.containers)
            which = "no container " + repr(ask.container) if ask.container else "which one?"
            return _error(400, "bad_request", f"{name}: {which}; its containers: {names}")
        who = f"{name}/{container.name}" if len(spec.containers) > 1 else name
        if name in held.unplaced or name in held.outside:
            why = "it is unplaced" if name in held.unplaced else "its cgroup is outside"
            return self._refused(who, f"{why}: numad holds nothing to resize for it")
        result = resize(
            held.engine,
            held.books,
            (name, container.name),
            cpus=ask.cpus,
            memory=ask.memory,
            policy=spec.policy,
            movable=spec.movable,
        )
        new = spec.resized(container.name, ask.cpus, ask.memory)
        grows = (ask.cpus or 0) > _held(held, name, container.name)
        search = bool(result.refused) and spec.movable and grows
        if result.refused and not search:
            return self._refused(who, result.refused)
        return Decided(name, container.name, who, new, result.books, result.refused, search)

    def _search(self, decided: Decided, view: View) -> Plan | None:
        """The grown container re-placed by moves (``view``: what the search reads)."""
        resident = self.resident_in(view)
        grown = Mover(decided.new.to_request(), resident(decided.name))
        return replace_grown(view.engine, view.books, decided.name, grown, movers(view, resident))

    def _commit(self, decided: Decided, plan: Plan | None) -> Answer:
        """The decision committed (under the lock): checkpoint, then the cgroups."""
        held, name, container = self.held, decided.name, decided.container
        if decided.search and plan is None:
            return self._refused(decided.who, decided.refused)
        books = decided.books if plan is None else plan.books
        key = (name, container)
        was, now = (b.cpu.assignments.get(key, 0) for b in (held.books, books))
        added, removed = CPUSet.from_bits(now & ~was), CPUSet.from_bits(was & ~now)
        specs = {**held.specs, name: decided.new}
        self.commits.commit(books, specs)  # before any cgroup change
        self._step("checkpoint")
        held.books, held.specs = books, specs
        if plan is not None:
            held.outcomes[name] = replace(plan.outcome, moves=())
            recorded(held, self.metrics, self.log, plan, to_resize=name)
        self.commits.after_commit(lambda: self.commits.enforce(self._step, changed=decided.new))
        self.update_gauges()
        self.metrics.resizes.labels("resized").inc()
        self.log.info(
            "workload_resized",
            workload=name,
            container=container,
            added=added.format_list(),
            removed=removed.format_list(),
            replaced=plan is not None,
        )
        placed = placements(held.books, name, held.engine.cpu_policy.topo)
        moves = () if plan is None else plan.moves
        return 200, {
            **outcome_json(Outcome(True, (), placed, moves=moves)),
            "resized": container,
            "added": added.format_list(),
            "removed": removed.format_list(),
            "workload": self.views.show(name),
        }

    def _refused(self, who: str, reason: str) -> Answer:
        self.metrics.resizes.labels("refused").inc()
        self.log.info("resize_refused", workload=who, reason=reason)
        return _error(409, "resize_refused", f"{who}: not resized: {reason}")


def _held(held: Holdings, name: str, container: str) -> int:
    return held.books.cpu.assignments.get((name, container), 0).bit_count()
