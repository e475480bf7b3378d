"""Re-placement to admit (numad.placement.moves), table-driven on the small machine of
test_resize (2 nodes of 8 CPUs, SMT2, CPU 15 reserved), under single-numa-node: a
single move, a pair, the other order (the moved first), the cost order (no memory
before memory, inside a node before across), what is never moved, a full machine,
the plan's books, the words, and a grown workload re-placed whole."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from itertools import combinations
from types import MappingProxyType

import pytest

from numad.cpuset import CPUSet, NodeSet
from numad.placement.admission import Books, ContainerRequest, WorkloadRequest, admit, release
from numad.placement.explain import Move
from numad.placement.managers.device import Device, DeviceInventory, DeviceState
from numad.placement.managers.memory import Capacity, MemoryState, MemoryTable
from numad.placement.moves import (
    Mover,
    candidates,
    cost,
    make_room,
    replace_grown,
)
from numad.placement.policy import Policy
from numad.placement.rooms import cheapest
from tests.placement.test_resize import GIB, books_on, engine_on, small

ENGINE = engine_on(small(), Policy.SINGLE_NUMA_NODE)
NODE = {n: CPUSet.from_bits(m) for n, m in small().numa.items()}


def _request(name: str, cpus: int, memory: int = GIB) -> WorkloadRequest:
    return WorkloadRequest(name, (ContainerRequest("main", cpus, {"memory": memory}),))


def _filled(*workloads: tuple[str, int]) -> Books:
    books = books_on(small(), reserved=1 << 15)
    for name, cpus in workloads:
        books, outcome = admit(ENGINE, books, _request(name, cpus))
        assert outcome.admitted, name
    return books


def _movers(books: Books, names: Sequence[str], sizes: dict[str, int]) -> dict[str, Mover]:
    return {n: Mover(_request(n, sizes[n])) for n in names}


def _cpus(books: Books, name: str) -> CPUSet:
    return CPUSet.from_bits(books.cpu.assignments.get((name, "main"), 0))


def _node(cpus: CPUSet) -> int:
    (node,) = {n for n, all_ in NODE.items() if cpus & all_}
    return node


SIZES = {"a": 4, "b": 2, "c": 4}  # a, b on node 0 (2 free); c on node 1 (3 free)


def test_one_move_admits_a_split_rejection() -> None:
    books = _filled(*SIZES.items())
    assert not admit(ENGINE, books, _request("new", 4))[1].admitted  # 2 + 3 free: split
    plan = make_room(ENGINE, books, _request("new", 4), _movers(books, "abc", SIZES))
    assert plan is not None
    assert [m.workload for m in plan.moves] == ["b"]  # the cheapest: 2 CPUs, 1Gi
    (move,) = plan.moves
    assert (move.nodes_from, move.nodes_to, move.bytes) == (NodeSet([0]), NodeSet([1]), GIB)
    assert move.text() == "moved b from node 0 to node 1, 1Gi of memory"
    assert plan.outcome.admitted
    assert plan.outcome.placements["main"].cpus == _cpus(plan.books, "new")
    assert _cpus(books, "b").issubset(_cpus(plan.books, "new"))  # it took b's CPUs
    assert _cpus(plan.books, "a") == _cpus(books, "a")  # not moved
    assert _node(_cpus(plan.books, "b")) == 1
    assert plan.moved["b"].admitted
    assert cost(plan.moves) == (GIB, 1, 2, 1)
    taken = list(plan.books.cpu.assignments.values())  # no CPU held twice
    assert sum(b.bit_count() for b in taken) == _union(taken).bit_count()


def _union(bits: Sequence[int]) -> int:
    out = 0
    for b in bits:
        out |= b
    return out


def test_fixed_workloads_are_never_moved() -> None:
    books = _filled(*SIZES.items())
    assert make_room(ENGINE, books, _request("new", 4), _movers(books, "ac", SIZES)) is None


def test_a_pair_when_no_single_move_does() -> None:
    # node 0: a (4), b (1), c (1): 2 free; node 1: d (4), e (1): 2 free (15 reserved).
    sizes = {"a": 4, "b": 1, "c": 1, "f": 2, "d": 4, "e": 1}
    books = release(_filled(*sizes.items()), "f")  # f filled node 0 while e came
    assert [_node(_cpus(books, n)) for n in "abcde"] == [0, 0, 0, 1, 1]
    new = _request("new", 4)
    assert not admit(ENGINE, books, new)[1].admitted
    movers = _movers(books, "bc", sizes)
    for name, mover in movers.items():  # neither alone leaves 4 on a node
        assert make_room(ENGINE, books, new, {name: mover}) is None
    assert make_room(ENGINE, books, new, movers, pair_trials=0) is None  # pairs bounded
    plan = make_room(ENGINE, books, new, movers)
    assert plan is not None
    assert sorted(m.workload for m in plan.moves) == ["b", "c"]
    assert {_node(_cpus(plan.books, n)) for n in "bc"} == {1}
    assert _node(_cpus(plan.books, "new")) == 0
    assert cost(plan.moves) == (2 * GIB, 2, 2, 2)


def test_three_moves_when_no_pair_does() -> None:
    # node 0: a (3), b, c, d (1 each): 2 free; node 1: e (3): 4 free (15 reserved).
    sizes = {"a": 3, "b": 1, "c": 1, "d": 1, "e": 3}
    books = _filled(*sizes.items())
    assert [_node(_cpus(books, n)) for n in "abcde"] == [0, 0, 0, 0, 1]
    new = _request("new", 5)
    movers = _movers(books, "bcd", sizes)
    assert make_room(ENGINE, books, new, movers, triple_trials=0) is None  # no pair does
    plan = make_room(ENGINE, books, new, movers)
    assert plan is not None
    assert sorted(m.workload for m in plan.moves) == ["b", "c", "d"]
    assert {_node(_cpus(plan.books, n)) for n in "bcd"} == {1}
    assert _node(_cpus(plan.books, "new")) == 0
    assert cost(plan.moves) == (3 * GIB, 3, 3, 3)
    taken = list(plan.books.cpu.assignments.values())  # no CPU held twice
    assert sum(b.bit_count() for b in taken) == _union(taken).bit_count()


def test_the_cheapest_single_move_is_taken() -> None:
    """b (no memory) and x (1Gi) each make room alone: b moves."""
    books = books_on(small(), reserved=1 << 15)
    for name, cpus, memory in (("a", 6, GIB), ("f", 2, GIB), ("x", 2, GIB), ("b", 2, 0)):
        request = WorkloadRequest(name, (ContainerRequest("main", cpus, {"memory": memory}),))
        books, outcome = admit(ENGINE, books, request)
        assert outcome.admitted
    books, _ = admit(ENGINE, books, _request("c", 1))
    books = release(books, "f")  # node 0: a, 2 free; node 1: x, b, c, 2 free
    new = _request("new", 3)
    assert not admit(ENGINE, books, new)[1].admitted
    no_memory = WorkloadRequest("b", (ContainerRequest("main", 2, {"memory": 0}),))
    movers = {"x": Mover(_request("x", 2)), "b": Mover(no_memory)}
    assert candidates(books, movers) == ["b", "x"]  # cheapest first
    for name, mover in movers.items():
        alone = make_room(ENGINE, books, new, {name: mover})
        assert alone is not None
        assert [m.workload for m in alone.moves] == [name]
    plan = make_room(ENGINE, books, new, movers)
    assert plan is not None
    assert [(m.workload, m.bytes) for m in plan.moves] == [("b", 0)]


def test_measured_resident_memory_is_the_cost() -> None:
    books = _filled(*SIZES.items())
    movers = _movers(books, "abc", SIZES)
    movers["b"] = Mover(_request("b", 2), {0: 300 << 20, 1: 5 << 20})
    plan = make_room(ENGINE, books, _request("new", 4), movers)
    assert plan is not None
    assert plan.moves[0].bytes == 300 << 20  # what it has on the node it leaves


def test_a_full_machine_is_not_searched() -> None:
    books = _filled(*SIZES.items())
    assert make_room(ENGINE, books, _request("new", 6), _movers(books, "abc", SIZES)) is None


HUGE = "hugepages-2Mi"


def _with_hugepages(nodes: Sequence[int], policy: Policy | None) -> tuple[Books, dict[str, Mover]]:
    """SIZES' workloads, b (under ``policy``) also holding 4 MiB of 2 MiB hugepages, which
    ``nodes`` offer (64 MiB each)."""
    books = books_on(small(), reserved=1 << 15)
    capacity = dict(books.memory.table.capacity)
    capacity |= {(n, HUGE): Capacity(64 << 20, 0, 64 << 20) for n in nodes}
    table = MemoryTable(books.memory.table.nodes, MappingProxyType(capacity))
    books = replace(books, memory=MemoryState(table))
    requests = {n: _request(n, c) for n, c in SIZES.items()}
    asked = {"memory": GIB, HUGE: 4 << 20}
    requests["b"] = WorkloadRequest("b", (ContainerRequest("main", 2, asked),), policy)
    for request in requests.values():
        books, outcome = admit(ENGINE, books, request)
        assert outcome.admitted, request.name
    assert _node(_cpus(books, "b")) == 0
    return books, {n: Mover(r) for n, r in requests.items()}


def _huge_split(books: Books) -> list[tuple[tuple[int, int], ...]]:
    return [b.split for b in books.memory.blocks[("b", "main")] if b.resource == HUGE]


def test_a_hugepage_holder_moves_only_where_its_hugepages_stay() -> None:
    """Before, a workload holding hugepages was never moved. Now it may move where its
    hugepages stay as they are (numad does not migrate them): here b, under its own
    best-effort policy, moves its CPUs to node 1 while its hugepages stay on node 0, the
    only node that has them."""
    books, movers = _with_hugepages([0], Policy.BEST_EFFORT)
    plan = make_room(ENGINE, books, _request("new", 4), movers)
    assert plan is not None
    assert [m.workload for m in plan.moves] == ["b"]
    assert _node(_cpus(plan.books, "b")) == 1
    assert _huge_split(plan.books) == _huge_split(books) == [((0, 4 << 20),)]


def test_a_hugepage_holder_is_not_moved_where_its_hugepages_would_follow() -> None:
    """Under single-numa-node, b on node 1 would take its hugepages there (node 1 has
    them too, and room for b): no move. A trial that let them follow would move b."""
    books, movers = _with_hugepages([0, 1], None)
    assert _huge_split(books) == [((0, 4 << 20),)]
    assert make_room(ENGINE, books, _request("new", 4), movers) is None


def _with_devices(nodes: Sequence[int | None]) -> tuple[Books, dict[str, Mover]]:
    """SIZES' workloads, b also holding one device of class acc; the class has a device
    on each of ``nodes`` (None: one the machine places on no node)."""
    devices = tuple(Device(f"0000:0{i}:00.0", n) for i, n in enumerate(nodes))
    inventory = DeviceInventory((0, 1), MappingProxyType({"acc": devices}))
    books = replace(books_on(small(), reserved=1 << 15), devices=DeviceState(inventory))
    requests = {n: _request(n, c) for n, c in SIZES.items()}
    requests["b"] = WorkloadRequest(
        "b", (ContainerRequest("main", 2, {"memory": GIB}, {"acc": 1}),)
    )
    for request in requests.values():
        books, outcome = admit(ENGINE, books, request)
        assert outcome.admitted, request.name
    return books, {n: Mover(r) for n, r in requests.items()}


def test_a_device_holder_moves_and_keeps_its_device() -> None:
    """Before, a workload holding a device was never moved. Now it moves keeping the
    device it holds (a bound device cannot follow a running process): here one the
    machine places on no node, so b may go to node 1 and make room on node 0."""
    books, movers = _with_devices([None])
    assert dict(books.devices.held[("b", "main")]) == {"acc": ("0000:00:00.0",)}
    plan = make_room(ENGINE, books, _request("new", 4), movers)
    assert plan is not None
    assert [m.text() for m in plan.moves] == ["moved b from node 0 to node 1, 1Gi of memory"]
    assert plan.books.devices.held == books.devices.held  # b keeps it; new takes none
    assert _node(_cpus(plan.books, "b")) == 1


def test_a_device_holder_is_not_moved_off_its_devices_node() -> None:
    """b holds the device on node 0 under single-numa-node: it may not leave node 0,
    though a fresh b would fit on node 1 with the device there (a release and a fresh
    admission would have taken it): no move makes room."""
    books, movers = _with_devices([0, 1])
    assert dict(books.devices.held[("b", "main")]) == {"acc": ("0000:00:00.0",)}
    fresh = release(books, "b")
    assert admit(ENGINE, fresh, replace(movers["b"].request))[1].admitted
    assert make_room(ENGINE, books, _request("new", 4), movers) is None


def test_a_mover_whose_request_no_longer_admits_is_passed_over() -> None:
    """b asks for a device class the config no longer has (it held its device when it
    was admitted; the class left the config since, and b came back on its record):
    placing b again raises, so no plan moves b, and the search goes on to d. Before,
    the error ended the newcomer's admission (found by the fault campaign, seed 103)."""
    books = _filled(("a", 2), ("b", 2), ("d", 2), ("c", 4))  # node 0: 2 free; node 1: 3
    assert not admit(ENGINE, books, _request("new", 4))[1].admitted
    gone = WorkloadRequest("b", (ContainerRequest("main", 2, {"memory": GIB}, {"ve": 1}),))
    movers = {"b": Mover(gone), "d": Mover(_request("d", 2))}
    plan = make_room(ENGINE, books, _request("new", 4), movers)
    assert plan is not None
    assert [m.workload for m in plan.moves] == ["d"]
    assert _cpus(plan.books, "b") == _cpus(books, "b")
    assert make_room(ENGINE, books, _request("new", 4), {"b": Mover(gone)}) is None


def test_the_words() -> None:
    across = Move("db", CPUSet([1, 9]), CPUSet([4, 12]), NodeSet([0]), NodeSet([1]), 64 << 20)
    assert across.text("would move") == "would move db from node 0 to node 1, 64Mi of memory"
    within = Move("db", CPUSet([1, 9]), CPUSet([2, 10]), NodeSet([0]), NodeSet([0]))
    assert within.text() == "moved db within node 0 (CPUs 1,9 to 2,10), no memory to migrate"
    assert (across.across, within.across, within.changed) == (True, False, 2)


def test_a_grown_workload_whose_request_no_longer_admits_is_not_re_placed() -> None:
    """b, movable, grows past its node's room, but its request names a device class
    the config has no more (it came back on its record): placing it again raises, so
    there is no plan, and the resize is refused with nothing changed. Before, the error
    escaped the resize (found by the fault campaign, seed 36)."""
    books = _filled(("a", 4), ("b", 2), ("c", 1))  # node 0: 1 free; node 1: 7 free
    gone = WorkloadRequest("b", (ContainerRequest("main", 5, {"memory": GIB}, {"ve": 1}),))
    assert replace_grown(ENGINE, books, "b", Mover(gone), {"c": Mover(_request("c", 1))}) is None


def test_a_grown_movable_workload_is_re_placed_whole() -> None:
    books = _filled(("a", 4), ("b", 2), ("c", 1))  # node 0: 1 free; node 1: 7 free
    assert _node(_cpus(books, "b")) == 0
    plan = replace_grown(ENGINE, books, "b", Mover(_request("b", 5)), {})
    assert plan is not None
    assert [m.workload for m in plan.moves] == ["b"]
    assert plan.moves[0].text() == "moved b from node 0 to node 1, 1Gi of memory"
    assert len(_cpus(plan.books, "b")) == 5
    assert _node(_cpus(plan.books, "b")) == 1
    assert replace_grown(ENGINE, books, "b", Mover(_request("b", 8)), {}) is None


@pytest.mark.parametrize("seed", range(3))
def test_the_old_books_are_never_changed(seed: int) -> None:
    books = _filled(*SIZES.items())
    snapshot = (dict(books.cpu.assignments), dict(books.memory.blocks))
    make_room(ENGINE, books, _request("new", 2 + seed), _movers(books, "abc", SIZES))
    assert (dict(books.cpu.assignments), dict(books.memory.blocks)) == snapshot
    assert release(books, "zzz").cpu.assignments == books.cpu.assignments


@pytest.mark.parametrize("size", [1, 2, 3])
def test_sets_come_cheapest_first(size: int) -> None:
    for n in range(12):
        want = sorted(combinations(range(n), size), key=lambda p: (sum(p), p))
        assert list(cheapest(n, size)) == want
