"""The CPU manager's pools: reserved, shared, exclusive; init-container reuse; release."""

from __future__ import annotations

import pytest

from numad.cpuset import NodeSet
from numad.errors import AllocationError
from numad.placement.hintspace import listed
from numad.placement.managers.cpu.state import ContainerKind, CPUState
from numad.placement.managers.cpu.static import StaticOptions, StaticPolicy
from numad.placement.managers.cpu.topology import CPUInfo, CPUTopology, bits, mask_of

# The kubelet's topoSingleSocketHT: one socket, 4 cores x 2 threads, siblings (0,4) .. (3,7).
SINGLE_SOCKET_HT = CPUTopology.of(CPUInfo(c, c % 4, 0, 0, 0) for c in range(8))
# Two sockets/NUMA nodes of 3 cores x 2 threads, siblings (n, n+6).
DUAL = CPUTopology.of(
    CPUInfo(c, c % 6, (c % 6) // 3, (c % 6) // 3, (c % 6) // 3) for c in range(12)
)


def _state(topo: CPUTopology, reserved: list[int], strict: bool = False) -> CPUState:
    return CPUState(online=topo.all, reserved=mask_of(reserved), strict=strict)


def test_init_container_cpus_are_reused_by_the_app_container() -> None:
    """The kubelet's fixture (reference 7.3)."""
    policy = StaticPolicy(SINGLE_SOCKET_HT, StaticOptions())
    state = _state(SINGLE_SOCKET_HT, [])
    state = state.allocate(policy, ("pod", "init"), 4, None, ContainerKind.INIT)
    assert bits(state.assignments[("pod", "init")]) == [0, 1, 4, 5]
    state = state.allocate(policy, ("pod", "app"), 2, None, ContainerKind.APP)
    assert bits(state.assignments[("pod", "app")]) == [0, 4]
    assert bits(state.shared_pool) == [2, 3, 6, 7]
    # Releasing the init container keeps the CPUs the app still holds out of the pool.
    state = state.release("pod", "init")
    assert bits(state.shared_pool) == [1, 2, 3, 5, 6, 7]
    assert bits(state.release("pod").shared_pool) == list(range(8))


def test_sidecar_cpus_are_never_reused() -> None:
    policy = StaticPolicy(SINGLE_SOCKET_HT, StaticOptions())
    state = _state(SINGLE_SOCKET_HT, [])
    state = state.allocate(policy, ("pod", "side"), 2, None, ContainerKind.SIDECAR)
    state = state.allocate(policy, ("pod", "app"), 2, None)
    assert state.assignments[("pod", "side")] & state.assignments[("pod", "app")] == 0


def test_reserved_cpus_stay_in_the_shared_pool_unless_strict() -> None:
    policy = StaticPolicy(DUAL, StaticOptions())
    loose = _state(DUAL, [0, 6]).allocate(policy, ("w", "c"), 2, NodeSet([0]))
    assert bits(loose.assignments[("w", "c")]) == [1, 7]
    assert bits(loose.shared_pool) == [0, 2, 3, 4, 5, 6, 8, 9, 10, 11]
    assert bits(loose.available) == [2, 3, 4, 5, 8, 9, 10, 11]
    strict = _state(DUAL, [0, 6], strict=True).allocate(policy, ("w", "c"), 2, NodeSet([0]))
    assert bits(strict.shared_pool) == [2, 3, 4, 5, 8, 9, 10, 11]


def test_exclusive_sets_are_disjoint_across_workloads_and_released_exactly() -> None:
    policy = StaticPolicy(DUAL, StaticOptions())
    state = _state(DUAL, [0])
    before = state
    for name, count in [("a", 2), ("b", 4), ("c", 1)]:
        state = state.allocate(policy, (name, "main"), count, None)
    sets = [state.assignments[(n, "main")] for n in "abc"]
    assert sets[0] & sets[1] == sets[1] & sets[2] == sets[0] & sets[2] == 0
    assert all(s & state.reserved == 0 for s in sets)
    for name in "abc":
        state = state.release(name)
    assert state.shared_pool == before.shared_pool
    assert dict(state.assignments) == {}


def test_the_shared_pool_never_becomes_empty() -> None:
    policy = StaticPolicy(DUAL, StaticOptions())
    state = _state(DUAL, [0, 6], strict=True)
    with pytest.raises(AllocationError, match="would leave the shared pool empty"):
        state.allocate(policy, ("w", "all"), 10, None)


def test_an_existing_assignment_is_kept_and_its_hints_come_from_it() -> None:
    policy = StaticPolicy(DUAL, StaticOptions())
    state = _state(DUAL, [0]).allocate(policy, ("w", "c"), 2, NodeSet([1]))
    assert state.allocate(policy, ("w", "c"), 2, NodeSet([0])) is state
    hints = listed(state.hints(policy, "w", "c", 2))
    assert hints is not None
    assert [(list(h.affinity or ()), h.preferred) for h in hints] == [([1], True), ([0, 1], False)]
    assert state.hints(policy, "w", "c", 4) == ()  # another size than assigned: cannot satisfy
    assert state.hints(policy, "w", "other", 0) is None  # no exclusive CPUs: no preference


@pytest.mark.parametrize(
    ("affinity", "count"),
    [
        pytest.param(NodeSet([0]), 12, id="aligned-part-first"),
        pytest.param(None, 12, id="no-affinity"),
        pytest.param(NodeSet([0, 1]), 13, id="both-nodes"),
    ],
)
def test_not_enough_cpus_names_the_whole_request(affinity: NodeSet | None, count: int) -> None:
    """The allocator takes node 0's 5 available CPUs first and would report only the 7
    still missing (as the kubelet does); the manager names what was asked for."""
    policy = StaticPolicy(DUAL, StaticOptions())
    with pytest.raises(AllocationError) as caught:
        _state(DUAL, [0]).allocate(policy, ("w", "c"), count, affinity)
    assert caught.value.problem == (
        f"not enough cpus available to satisfy request: requested={count}, available=11"
    )
