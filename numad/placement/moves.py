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
   at most ``PAIR_TRIALS`` of them.

Where the newcomer must sit on one node (single-numa-node or restricted, one
container, a node holds its CPUs) and no node has its CPUs free, counting prunes
without losing a plan: a single move helps only if it frees CPUs on a node where the
newcomer's CPUs are then free, a pair only if the two together do; and a single move
there costs at least a bound (it gives up the CPUs the newcomer lacks there; one on a
single node changes nodes; one whose policy keeps it on one node leaves that node
whole and migrates its pinned memory there), so the singles are tried by that bound,
cheapest first, and stop once the best found costs no more than the next one's bound.

Cost, compared in this order: bytes of memory to migrate (the moved workloads'
resident memory on the nodes their new ``cpuset.mems`` leaves out), moves across nodes
(a move inside its nodes first), CPUs changed, workloads moved. Work is bounded by the
trials: at most ``len(candidates) + PAIR_TRIALS`` trials of up to six admissions each,
and the pruning's counts (``benchmarks/churn.py`` and ``benchmarks/moves.py`` time
them). A moved workload keeps its devices (a bound device cannot follow a running
process): only its CPUs and memory are given back for the trial, so it is placed again
by the devices it holds, the kubelet's way for a restarted container, and under a
policy that aligns it stays on their nodes. A workload holding hugepages moves only
where its hugepages stay as they are, node by node (numad does not migrate them): its
CPUs may change, within its nodes or across them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

from numad.cpuset import CPUSet, NodeSet
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
from numad.placement.policy import Policy

PAIR_TRIALS = 64  # two-move trials at most, after every single move failed
HOLD = "\x00moving"  # the placeholder holding a moved workload's CPUs (no spec's name)
ONE_NODE = frozenset({Policy.SINGLE_NUMA_NODE, Policy.RESTRICTED})


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
    room = _Room.of(engine, books, request)
    index = _index(books)
    per_node = {n: _per_node(engine, books, index[n]) for n in names}
    singles, bound = names, {}
    if room is not None:  # only moves off the node it takes help; each costs at least
        singles = [n for n in names if room.helps(per_node[n])]
        bound = {n: room.bound(per_node[n], index[n], books, movers[n]) for n in singles}
        singles.sort(key=lambda n: (bound[n], n))
    best: Plan | None = None
    for name in singles:
        if best is not None and name in bound and best.cost <= bound[name]:
            break  # no later single move can cost less
        best = _better(best, _trial(engine, books, request, (name,), movers))
    if best is not None:
        return best
    tried = 0
    for i, j in _cheapest_pairs(len(names)):
        if tried >= pair_trials:
            break
        both = _summed(per_node[names[i]], per_node[names[j]])
        if room is not None and not room.helps(both):
            continue
        tried += 1
        best = _better(best, _trial(engine, books, request, (names[i], names[j]), movers))
    return best


@dataclass(frozen=True, slots=True)
class _Room:
    """A newcomer of one container that must sit on one node (single-numa-node or
    restricted, and a node holds its CPUs) and that no node has the CPUs free for: a
    move helps only if it frees CPUs on a node where then ``ask`` are free, and the
    moved workload leaves that node (else the newcomer would have fit)."""

    ask: int
    free: Mapping[int, int]  # node -> free CPUs
    policy: Policy  # the host's

    @classmethod
    def of(cls, engine: Engine, books: Books, request: WorkloadRequest) -> _Room | None:
        if len(request.containers) != 1 or (request.policy or engine.policy) not in ONE_NODE:
            return None
        ask, numa = request.containers[0].cpus, engine.cpu_policy.topo.numa
        free = {n: (books.cpu.available & m).bit_count() for n, m in numa.items()}
        if not ask or max(free.values(), default=0) >= ask:
            return None  # not refused by the count: alignment, memory (no pruning then)
        if not any(m.bit_count() >= ask for m in numa.values()):
            return None  # no node holds it: a multi-node placement may be preferred
        return cls(ask, free, engine.policy)

    def helps(self, held: Mapping[int, int]) -> bool:
        """Whether freeing ``held`` (node -> CPUs) leaves ``ask`` free on a node."""
        return any(self.free[n] + cpus >= self.ask for n, cpus in held.items())

    def bound(
        self, held: Mapping[int, int], keys: set[Key], books: Books, mover: Mover
    ) -> tuple[int, int, int, int]:
        """The least a single move of a workload (``held``: its CPUs per node) can cost:
        it gives up at least the CPUs the newcomer lacks on a node it helps on; one on
        a single node changes nodes; one that must stay on one node (its policy) leaves
        that node whole, and migrates its pinned memory there."""
        one = (mover.request.policy or self.policy) in ONE_NODE and len(held) == 1
        pinned = one and any(books.memory.blocks.get(k) for k in keys)
        resident = (mover.resident or _split(books, keys)) if pinned else {}
        return min(
            (resident.get(n, 0), int(len(held) == 1), cpus if one else self.ask - self.free[n], 1)
            for n, cpus in held.items()
            if self.free[n] + cpus >= self.ask
        )


def _per_node(engine: Engine, books: Books, keys: set[Key]) -> dict[int, int]:
    """A workload's exclusive CPUs on each node (``keys``: its containers)."""
    held = 0
    for key in keys:
        held |= books.cpu.assignments.get(key, 0)
    numa = engine.cpu_policy.topo.numa
    return {n: (held & m).bit_count() for n, m in numa.items() if held & m}


def _summed(a: Mapping[int, int], b: Mapping[int, int]) -> dict[int, int]:
    return {n: a.get(n, 0) + b.get(n, 0) for n in a.keys() | b.keys()}


def _cheapest_pairs(n: int) -> Iterator[tuple[int, int]]:
    """Pairs of ``range(n)`` (candidates, cheapest first), by the sum of their ranks,
    then the first's: (0, 1), (0, 2), (0, 3), (1, 2), ... made as they are taken."""
    for total in range(1, 2 * n - 2):
        for i in range(max(0, total - n + 1), (total + 1) // 2):
            yield i, total - i


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
    without = _vacate(books, name)
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
    outcomes; None when one does not fit, or its hugepages would not stay as they
    were in ``before``."""
    moved = {}
    for name in order:
        request = movers[name].request
        books, again = admit(engine, books, request)
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
    measured = resident or _split(before, {(name, c) for c in placements(before, name)})
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


def _held(books: Books, name: str) -> tuple[int, NodeSet]:
    """A workload's exclusive CPUs and ``cpuset.mems``, over its containers."""
    cpus, mems = 0, NodeSet()
    for placed in placements(books, name).values():
        cpus |= placed.cpus.bits
        mems |= placed.mems
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
