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

1. every single candidate in turn (exact for one move: the cheapest that admits both
   is taken);
2. then, only where no single move does, pairs of candidates, cheapest pairs first,
   at most ``PAIR_TRIALS`` of them;
3. then, only where no pair tried does, triples of the ``TRIPLE_POOL`` cheapest
   candidates, cheapest first, at most ``TRIPLE_TRIALS`` of them.

Where the newcomer must sit on one node (single-numa-node or restricted, one
container, a node holds its CPUs) and no node has its CPUs free, counting prunes
without losing a plan: a single move helps only if it frees CPUs on a node where the
newcomer's CPUs are then free, a pair or triple only if they together do; a single move
there costs at least a bound (it gives up the CPUs the newcomer lacks there; one on a
single node changes nodes; one whose policy keeps it on one node leaves that node
whole and migrates its pinned memory there), so the singles are tried by that bound,
cheapest first, and stop once the best found costs no more than the next one's bound.

Cost, compared in this order: bytes of memory to migrate (the moved workloads'
resident memory on the nodes their new ``cpuset.mems`` leaves out), moves across nodes
(a move inside its nodes first), CPUs changed, workloads moved. Work is bounded by the
trials: at most ``len(candidates) + PAIR_TRIALS + TRIPLE_TRIALS`` trials of up to eight
admissions each, and the pruning's counts (``benchmarks/churn.py`` and ``benchmarks/moves.py`` time
them). A moved workload keeps its devices (a bound device cannot follow a running
process): only its CPUs and memory are given back for the trial, so it is placed again
by the devices it holds, the kubelet's way for a restarted container, and under a
policy that aligns it stays on their nodes. A workload holding hugepages moves only
where its hugepages stay as they are, node by node (numad does not migrate them): its
CPUs may change, within its nodes or across them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from numad.cpuset import CPUSet, NodeSet
from numad.errors import NumadError
from numad.placement.admission import (
    Books,
    Engine,
    Outcome,
    WorkloadRequest,
    admit,
    placements,
    release,
)
from numad.placement.explain import Move
from numad.placement.managers.memory import MEMORY
from numad.placement.rooms import Key, Room, cheapest, per_node, split, summed, whole

PAIR_TRIALS = 64  # two-move trials at most, after every single move failed
TRIPLE_TRIALS = 64  # three-move trials at most, after every pair tried failed
TRIPLE_POOL = 24  # the triples are of the cheapest candidates only (2,024 sets at most)
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
    """The movers that can move: they hold exclusive CPUs or memory; cheapest first
    (resident bytes, then CPUs held, then name)."""
    index = _index(books)
    out = []
    for name in movers:
        keys = index.get(name, set())
        blocks = [b for k in keys for b in books.memory.blocks.get(k, ())]
        if blocks or any(books.cpu.assignments.get(k) for k in keys):
            out.append(name)

    def cheap(name: str) -> tuple[int, int, str]:
        keys = index[name]
        resident = movers[name].resident or split(books, keys)
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
    triple_trials: int = TRIPLE_TRIALS,
    triple_pool: int = TRIPLE_POOL,
    single_trials: int | None = None,
) -> Plan | None:
    """The cheapest plan that admits ``request`` after moving one, two or three of
    ``movers``; None when none within the bounds does (module docstring).
    ``single_trials`` bounds the single moves too (None: every candidate, exact)."""
    if max((c.cpus for c in request.containers), default=0) > books.cpu.available.bit_count():
        return None  # a move frees no CPU: the machine is full
    names = candidates(books, movers)[:single_trials]
    room = Room.of(engine, books, request)
    index = _index(books)
    held = {n: per_node(engine, books, index[n]) for n in names}
    sizes = {n: whole(engine, movers[n].request) for n in names}
    singles, bound = names, {}
    if room is not None:  # only moves off the node it takes help; each costs at least
        singles = [n for n in names if room.helps(held[n], _sizes(sizes, (n,)))]
        bound = {
            n: room.bound(held[n], index[n], books, movers[n].request.policy, movers[n].resident)
            for n in singles
        }
        singles.sort(key=lambda n: (bound[n], n))
    best: Plan | None = None
    for name in singles:
        if best is not None and name in bound and best.cost <= bound[name]:
            break  # no later single move can cost less
        best = _better(best, _trial(engine, books, request, (name,), movers))
    if best is not None:
        return best
    for size, trials in ((2, pair_trials), (3, triple_trials)):
        pool, tried = names[: len(names) if size == 2 else triple_pool], 0
        for combo in cheapest(len(pool), size):
            if tried >= trials:
                break
            moved = tuple(pool[i] for i in combo)
            together = summed(*(held[n] for n in moved))
            if room is not None and not room.helps(together, _sizes(sizes, moved)):
                continue
            tried += 1
            best = _better(best, _trial(engine, books, request, moved, movers))
        if best is not None:
            return best
    return best


def _sizes(each: Mapping[str, int | None], names: Sequence[str]) -> list[int] | None:
    sizes = [each[n] for n in names]
    return None if None in sizes else [s for s in sizes if s is not None]


def replace_grown(
    engine: Engine,
    books: Books,
    name: str,
    grown: Mover,
    movers: Mapping[str, Mover],
) -> Plan | None:
    """A movable workload resized past its nodes' room, re-placed whole by its new
    request (``grown``): where it fits once it leaves its place, else after moving one
    to three of ``movers`` (``make_room``). Its own move leads the plan's moves. None
    where its request no longer admits (it names what the config has no more, e.g. a
    device class: it stays as it is)."""
    request = grown.request
    without = _vacate(books, name)
    try:
        after, outcome = admit(engine, without, request)
    except NumadError:
        return None
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
    before = books
    for name in order:
        books = _vacate(books, name)
    books, outcome = admit(engine, books, request)
    again = _again(engine, before, books, order, movers) if outcome.admitted else None
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
    before = books
    for name in order:
        old = _held(books, name)[0]
        books = _vacate(books, name)
        books = replace(books, cpu=books.cpu.reassigned((HOLD, name), old))
    again = _again(engine, before, books, order, movers)
    if again is None:
        return None
    books, outcome = admit(engine, release(again[0], HOLD), request)
    return (books, outcome, again[1]) if outcome.admitted else None


def _vacate(books: Books, name: str) -> Books:
    """The workload's CPUs and memory given back; its devices stay held by it."""
    return replace(release(books, name), devices=books.devices)


def _again(
    engine: Engine,
    before: Books,
    books: Books,
    order: Sequence[str],
    movers: Mapping[str, Mover],
) -> tuple[Books, dict[str, Outcome]] | None:
    """``books`` with each of ``order`` admitted again by its own request, and their
    outcomes; None when one does not fit, its request no longer admits (it names what
    the config has no more, e.g. a device class: it stays where it is), or its
    hugepages would not stay as they were in ``before``."""
    moved = {}
    for name in order:
        request = movers[name].request
        try:
            books, again = admit(engine, books, request)
        except NumadError:
            return None
        if not again.admitted or _hugepages(books, request) != _hugepages(before, request):
            return None
        moved[name] = again
    return books, moved


def _hugepages(books: Books, request: WorkloadRequest) -> list[tuple[str, str, Split]]:
    """A workload's hugepage blocks, node by node (container, resource, split)."""
    return sorted(
        (c.name, b.resource, b.split)
        for c in request.containers
        for b in books.memory.blocks.get((request.name, c.name), ())
        if b.resource != MEMORY
    )


Split = tuple[tuple[int, int], ...]  # (node, bytes), as a memory block holds them


def describe(
    engine: Engine, before: Books, after: Books, name: str, resident: Mapping[int, int]
) -> Move:
    """What moving ``name`` from its place in ``before`` to ``after`` changes."""
    topo = engine.cpu_policy.topo
    old_cpus, old_mems = _held(before, name)
    new_cpus, new_mems = _held(after, name)
    old_nodes = NodeSet(topo.numas_of(old_cpus)) | old_mems
    new_nodes = NodeSet(topo.numas_of(new_cpus)) | new_mems
    measured = resident or split(before, {(name, c) for c in placements(before, name)})
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


def _index(books: Books) -> dict[str, set[Key]]:
    """Each workload's container keys, in one pass over the books."""
    out: dict[str, set[Key]] = {}
    for table in (books.cpu.assignments, books.memory.blocks, books.devices.held):
        for key in table:
            out.setdefault(key[0], set()).add(key)
    return out


def _held(books: Books, name: str) -> tuple[int, NodeSet]:
    """A workload's exclusive CPUs and ``cpuset.mems``, over its containers."""
    cpus, mems = 0, NodeSet()
    for placed in placements(books, name).values():
        cpus |= placed.cpus.bits
        mems |= placed.mems
    return cpus, mems


def _cpus(books: Books, name: str) -> int:
    return _held(books, name)[0].bit_count()
