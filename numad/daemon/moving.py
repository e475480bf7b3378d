"""Admission with moves: a workload the merge rejects, admitted by moving movable ones.

Daemon side, over the pure search (``numad.placement.moves``), on the shared
``Holdings``. ``decide`` is the whole decision under the daemon's lock: the plain
admission first; only on a rejection, ``search`` over the movable workloads
(each one's resident memory per node read from ``memory.numa_stat``: one small file
per container of a movable workload, on the rejection path only). When no move of a
movable workload admits it, a bounded second search over every workload says which
ones would have to be movable (``Outcome.unmovable``). An admission and a ``plan`` run
``search`` after the lock, on a ``View`` taken under it, and commit its plan only if
nothing it read changed meanwhile (``numad.daemon.admissions``).

The plan commits as one change: the checkpoint holds the moved workloads' new places
and the newcomer's at once, and ``numad.host.enforce`` writes them so that no CPU is in
two exclusive cpusets at any instant (a moved workload's cpuset is rewritten to its new
CPUs, free ones, before the newcomer is granted the CPUs it gave up); its memory
follows through the mover (state ``migrating``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from numad.daemon.holdings import Holdings
from numad.daemon.metrics import Metrics
from numad.host.targets import Log
from numad.placement.admission import Books, Engine, Outcome, WorkloadRequest, admit
from numad.placement.moves import Mover, Plan, make_room
from numad.workload.shape import WorkloadSpec

# The search that names workloads which would need ``movable``: the cheapest this
# many single moves, no pairs (it runs on every rejection that moves could not help).
HINT_SINGLES = 32

Resident = Callable[[str], Mapping[int, int]]  # workload -> its bytes per node


@dataclass(frozen=True)
class View:
    """What the search reads of the daemon's state, taken under its lock and searched
    after it (the books, engine and specs are replaced, never changed, by a commit)."""

    engine: Engine
    books: Books
    specs: Mapping[str, WorkloadSpec]
    unplaced: frozenset[str]
    outside: frozenset[str]

    @classmethod
    def of(cls, held: Holdings) -> View:
        return cls(
            held.engine, held.books, held.specs, frozenset(held.unplaced), frozenset(held.outside)
        )

    def same(self, held: Holdings) -> bool:
        """Whether nothing the search read has changed since (the plan still holds)."""
        return (
            held.books is self.books
            and held.engine is self.engine
            and held.specs is self.specs
            and frozenset(held.unplaced) == self.unplaced
            and frozenset(held.outside) == self.outside
        )


def decide(
    held: Holdings, request: WorkloadRequest, resident: Resident
) -> tuple[Books, Outcome, Plan | None]:
    """The books and outcome of admitting ``request``, by moves where the plain
    admission rejects it and moving movable workloads admits it (the plan, else None)."""
    books, outcome = admit(held.engine, held.books, request)
    if outcome.admitted:
        return books, outcome, None
    return search(View.of(held), request, resident, books, outcome)


def search(
    view: View, request: WorkloadRequest, resident: Resident, books: Books, outcome: Outcome
) -> tuple[Books, Outcome, Plan | None]:
    """A rejected ``request`` (``books``/``outcome``: the plain admission's) admitted by
    moves of movable workloads where any admit it; else the rejection, naming the
    workloads that would have to be movable. Reads ``view`` only, so the daemon runs
    it after its lock (milliseconds to ~100 ms: ``benchmarks/churn.py``)."""
    movable = movers(view, resident)
    plan = make_room(view.engine, view.books, request, movable) if movable else None
    if plan is not None:
        return plan.books, plan.outcome, plan
    fixed = movers(view, lambda _: {}, movable=False)
    if fixed:
        hint = make_room(
            view.engine,
            view.books,
            request,
            fixed,
            pair_trials=0,
            triple_trials=0,
            single_trials=HINT_SINGLES,
        )
        if hint is not None and hint.moves:
            outcome = replace(outcome, unmovable=tuple(m.workload for m in hint.moves))
    return books, outcome, None


def movers(held: Holdings | View, resident: Resident, *, movable: bool = True) -> dict[str, Mover]:
    """The placed workloads whose ``movable`` is ``movable``, as the search takes them."""
    return {
        name: Mover(spec.to_request(), resident(name) if movable else {})
        for name, spec in held.specs.items()
        if spec.movable is movable and name not in held.unplaced and name not in held.outside
    }


def recorded(held: Holdings, metrics: Metrics, log: Log, plan: Plan, **why: str) -> None:
    """A committed plan's moves: each moved workload's new outcome, the counters, a log
    line (``why``: what the moves made room for)."""
    for move in plan.moves:
        if move.workload in plan.moved:
            held.outcomes[move.workload] = plan.moved[move.workload]
        metrics.moves.inc()
        metrics.moved_bytes.inc(move.bytes)
        log.info(
            "workload_moved",
            workload=move.workload,
            **why,
            cpus_from=move.cpus_from.format_list(),
            cpus_to=move.cpus_to.format_list(),
            nodes_from=move.nodes_from.format_list(),
            nodes_to=move.nodes_to.format_list(),
            bytes=move.bytes,
        )
