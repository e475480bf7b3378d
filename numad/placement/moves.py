"""Re-placement to admit: the cheapest moves of running workloads after which a
rejected workload fits.

Pure core, over ``numad.placement.admission``: ``make_room`` returns new books with the
newcomer admitted and the moved workloads placed anew, or None; it never changes the
books it is given. A move is a release and a fresh admission of the moved workload by
its own request and policy, so a moved workload holds what the merge would admit it
on, as any other: its alignment is kept by construction.

One trial: release the workloads to move; admit the newcomer into the room they leave;
admit each moved workload again (the most CPUs first). Where that fails, the other
order: each moved workload admitted again while its old CPUs are still held (so it
goes elsewhere), then those CPUs freed and the newcomer admitted. The trials:

1. every single candidate in turn (exact for one move: each is tried, the cheapest
   that admits both is taken);
2. then, only where no single move does, pairs of candidates, cheapest pairs first,
   at most ``PAIR_TRIALS`` of them.

Cost, compared in this order: bytes of memory to migrate (the moved workloads'
resident memory on the nodes their new ``cpuset.mems`` leaves out), moves across nodes
(a move inside its nodes first), CPUs changed, workloads moved. Work is bounded by the
trials: at most ``len(candidates) + PAIR_TRIALS`` trials of up to six admissions each
(``benchmarks/churn.py`` times them). Candidates hold no devices (a bound device cannot
follow a running process) and no hugepages (numad does not migrate them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import combinations

from numad.cpuset import CPUSet, NodeSet
from numad.placement.admission import Books, Engine, Outcome, WorkloadRequest, admit, release
from numad.placement.explain import Move
from numad.placement.managers.memory import MEMORY

PAIR_TRIALS = 64  # two-move trials at most, after every single move failed
HOLD = "\x00moving"  # the placeholder holding a moved workload's CPUs (no spec's name)


@dataclass(frozen=True, slots=True)
class Mover:
    """A running workload the search may move: its request, and its memory's bytes on
    each node as measured (``memory.numa_stat``); empty: its blocks' split stands in."""

    request: WorkloadRequest
    resident: Mapping[int, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Plan:
    """The books after the moves and the admission; the newcomer's outcome (its
    ``moves`` set); each moved workload's outcome of its new admission."""

    books: Books
    outcome: Outcome
    moved: Mapping[str, Outcome]

    @property
    def moves(self) -> tuple[Move, ...]:
        return self.outcome.moves

    @property
    def cost(self) -> tuple[int, int, int, int]:
        return cost(self.moves)


def cost(moves: Sequence[Move]) -> tuple[int, int, int, int]:
    """Bytes to migrate, moves across nodes, CPUs changed, workloads moved."""
    return (
        sum(m.bytes for m in moves),
        sum(1 for m in moves if m.across),
        sum(m.changed for m in moves),
        len(moves),
    )


def candidates(books: Books, movers: Mapping[str, Mover]) -> list[str]:
    """The movers that can move: they hold exclusive CPUs or memory, no device and no
    hugepages; cheapest first (resident bytes, then CPUs held, then name)."""
    index = _index(books)
    out = []
    for name in movers:
        keys = index.get(name, set())
        if any(books.devices.held.get(k) for k in keys):
            continue
        blocks = [b for k in keys for b in books.memory.blocks.get(k, ())]
        if any(b.resource != MEMORY for b in blocks):
            continue
        if blocks or any(books.cpu.assignments.get(k) for k in keys):
            out.append(name)

    def cheap(name: str) -> tuple[int, int, str]:
        keys = index[name]
        resident = movers[name].resident or _split(books, keys)
        held = sum(books.cpu.assignments.get(k, 0).bit_count() for k in keys)
        return (sum(resident.values()), held, name)

    return sorted(out, key=cheap)


def make_room(
    engine: Engine,
    books: Books,
    request: WorkloadRequest,
    movers: Mapping[str, Mover],
    *,
    pair_trials: int = PAIR_TRIALS,
    single_trials: int | None = None,
) -> Plan | None:
    """The cheapest plan that admits ``request`` after moving one or two of
    ``movers``; None when none within the bounds does (module docstring).
    ``single_trials`` bounds the single moves too (None: every candidate, exact)."""
    if max((c.cpus for c in request.containers), default=0) > books.cpu.available.bit_count():
        return None  # a move frees no CPU: the machine is full
    names = candidates(books, movers)[:single_trials]
    best: Plan | None = None
    for name in names:
        best = _better(best, _trial(engine, books, request, (name,), movers))
    if best is not None:
        return best
    pairs = sorted(combinations(range(len(names)), 2), key=lambda p: (p[0] + p[1], p))
    for i, j in pairs[:pair_trials]:
        best = _better(best, _trial(engine, books, request, (names[i], names[j]), movers))
    return best


def replace_grown(
    engine: Engine,
    books: Books,
    name: str,
    grown: Mover,
    movers: Mapping[str, Mover],
) -> Plan | None:
    """A movable workload resized past its nodes' room, re-placed whole by its new
    request (``grown``): where it fits once it leaves its place, else after moving one
    or two of ``movers`` (``make_room``). Its own move leads the plan's moves."""
    request = grown.request
    without = release(books, name)
    after, outcome = admit(engine, without, request)
    moved: Mapping[str, Outcome] = {}
    if not outcome.admitted:
        plan = make_room(engine, without, request, {n: m for n, m in movers.items() if n != name})
        if plan is None:
            return None
        after, outcome, moved = plan.books, plan.outcome, plan.moved
    itself = describe(engine, books, after, name, grown.resident)
    return Plan(after, replace(outcome, moves=(itself, *outcome.moves)), moved)


def _better(best: Plan | None, plan: Plan | None) -> Plan | None:
    if plan is None:
        return best
    return plan if best is None or plan.cost < best.cost else best


Tried = tuple[Books, Outcome, dict[str, Outcome]]  # books, newcomer's outcome, moved


def _trial(
    engine: Engine,
    books: Books,
    request: WorkloadRequest,
    names: Sequence[str],
    movers: Mapping[str, Mover],
) -> Plan | None:
    order = sorted(names, key=lambda n: (-_cpus(books, n), n))  # the most CPUs first
    tried = _newcomer_first(engine, books, request, order, movers) or _moved_first(
        engine, books, request, order, movers
    )
    if tried is None:
        return None
    after, outcome, moved = tried
    moves = tuple(
        m
        for name in names
        if (m := describe(engine, books, after, name, movers[name].resident)).changed or m.across
    )
    return Plan(after, replace(outcome, moves=moves), moved)


def _newcomer_first(
    engine: Engine,
    books: Books,
    request: WorkloadRequest,
    order: Sequence[str],
    movers: Mapping[str, Mover],
) -> Tried | None:
    """The newcomer into the room the moved leave, then they, each where it fits."""
    for name in order:
        books = release(books, name)
    books, outcome = admit(engine, books, request)
    again = _again(engine, books, order, movers) if outcome.admitted else None
    return None if again is None else (again[0], outcome, again[1])


def _moved_first(
    engine: Engine,
    books: Books,
    request: WorkloadRequest,
    order: Sequence[str],
    movers: Mapping[str, Mover],
) -> Tried | None:
    """The moved placed anew while a placeholder holds their old CPUs (so they go
    elsewhere), then those CPUs freed and the newcomer admitted."""
    for name in order:
        old = _held(books, name)[0]
        books = release(books, name)
        books = replace(books, cpu=books.cpu.reassigned((HOLD, name), old))
    again = _again(engine, books, order, movers)
    if again is None:
        return None
    books, outcome = admit(engine, release(again[0], HOLD), request)
    return (books, outcome, again[1]) if outcome.admitted else None


def _again(
    engine: Engine, books: Books, order: Sequence[str], movers: Mapping[str, Mover]
) -> tuple[Books, dict[str, Outcome]] | None:
    """``books`` with each of ``order`` admitted again by its own request, and their
    outcomes; None when one does not fit."""
    moved = {}
    for name in order:
        books, again = admit(engine, books, movers[name].request)
        if not again.admitted:
            return None
        moved[name] = again
    return books, moved


def describe(
    engine: Engine, before: Books, after: Books, name: str, resident: Mapping[int, int]
) -> Move:
    """What moving ``name`` from its place in ``before`` to ``after`` changes."""
    topo = engine.cpu_policy.topo
    old_cpus, old_mems = _held(before, name)
    new_cpus, new_mems = _held(after, name)
    old_nodes = NodeSet(topo.numas_of(old_cpus)) | old_mems
    new_nodes = NodeSet(topo.numas_of(new_cpus)) | new_mems
    measured = resident or _split(before, _keys(before, name))
    moving = 0
    if new_mems and new_mems != old_mems:
        moving = sum(size for node, size in measured.items() if node not in new_mems)
    return Move(
        name,
        CPUSet.from_bits(old_cpus),
        CPUSet.from_bits(new_cpus),
        old_nodes,
        new_nodes,
        moving,
    )


Key = tuple[str, str]


def _index(books: Books) -> dict[str, set[Key]]:
    """Each workload's container keys, in one pass over the books."""
    out: dict[str, set[Key]] = {}
    for table in (books.cpu.assignments, books.memory.blocks, books.devices.held):
        for key in table:
            out.setdefault(key[0], set()).add(key)
    return out


def _keys(books: Books, name: str) -> set[Key]:
    keys = {k for k in books.cpu.assignments if k[0] == name}
    keys |= {k for k in books.memory.blocks if k[0] == name}
    return keys | {k for k in books.devices.held if k[0] == name}


def _held(books: Books, name: str) -> tuple[int, NodeSet]:
    cpus, mems = 0, NodeSet()
    for key in _keys(books, name):
        cpus |= books.cpu.assignments.get(key, 0)
        mems |= books.memory.mems(key)
    return cpus, mems


def _cpus(books: Books, name: str) -> int:
    return _held(books, name)[0].bit_count()


def _split(books: Books, keys: set[Key]) -> dict[int, int]:
    """A workload's bytes per node as its blocks say (what it asked, not touched)."""
    out: dict[int, int] = {}
    for key in keys:
        for node, size in books.memory.per_node(key).items():
            out[node] = out.get(node, 0) + size
    return out
