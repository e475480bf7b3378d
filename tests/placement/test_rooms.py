"""The move search's counting (numad.placement.rooms): the bin packing it prunes
by, against brute force, and what it says of a set of moves."""

from __future__ import annotations

import itertools
import random

import pytest

from numad.placement.policy import Policy
from numad.placement.rooms import Room, packs


def _brute(room: list[int], items: list[int]) -> bool:
    """Every assignment of items to bins, tried."""
    for bins in itertools.product(range(len(room)), repeat=len(items)):
        left = list(room)
        for item, b in zip(items, bins, strict=True):
            left[b] -= item
        if min(left, default=0) >= 0:
            return True
    return False


@pytest.mark.parametrize("seed", range(4))
def test_packs_agrees_with_trying_every_assignment(seed: int) -> None:
    rng = random.Random(seed)  # noqa: S311 - seeded, repeatable cases
    for _ in range(500):
        room = [rng.randrange(0, 9) for _ in range(rng.randrange(1, 5))]
        items = [rng.randrange(0, 7) for _ in range(rng.randrange(0, 4))]
        assert packs(room, items) == _brute(room, items), (room, items)


def test_a_set_helps_only_where_the_moved_then_fit() -> None:
    # the newcomer asks 4; node 0 has 2 free, node 1 has 1.
    room = Room(4, {0: 2, 1: 1}, Policy.SINGLE_NUMA_NODE)
    frees = {0: 2}  # a workload of 2 CPUs on node 0 leaves it: 4 free there
    assert room.helps(frees)  # where it may spread over nodes: by the newcomer alone
    assert not room.helps(frees, [2])  # it must sit on one node: none has 2 left
    assert Room(4, {0: 2, 1: 2}, Policy.SINGLE_NUMA_NODE).helps(frees, [2])
    assert not room.helps({1: 2}, [2])  # node 1 then has 3 free: not the 4 asked
