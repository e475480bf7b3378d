"""Device picking by PCIe locality, and the words that say what a container's devices share.

Pure core: functions of device paths (``PciDevice.path``, from the top: host bridge,
root port, switch ports) and of what the device manager hands them; no host access.

The rule. The device manager first takes devices in the kubelet's order
(``DeviceState.order``). A class that picks by locality then keeps, node for node
and class for class, as many devices as that order took (so every later hint, and
so every later merge and admission, is what it would be with ``pick = "index"``),
and moves them to the set that, in the PCIe tree, shares the deepest common
ancestor: a switch, then a root port, then a host bridge. Ties go, in turn, to
the set closest to the container's fixed devices (the most levels shared with
each, summed) (those of ``pick = "index"``
classes, those taken over from a finished init container, those with no node),
then to the subtree with the fewest free devices to spare (a best fit: larger
groups stay whole for the next container), then to the lowest addresses, the
kubelet's order within a node. Nothing moves where no ancestor holds the whole
set (devices on several nodes, or without a path: recordings without the tree,
conformance vectors), nor for a container with a single device, nor for a single
locality device that shares nothing with the fixed ones.

Mixed classes: the devices of ``pick = "index"`` classes are never moved; they are
fixed points the locality classes' set is drawn towards (second key above), after
its own closeness (first key): one NIC by locality beside GPUs by index goes to
the NIC that shares the most with those GPUs.

Cost: every candidate device adds each of its ancestors once (D devices times L levels
counted), each distinct ancestor (at most D*L) is checked against the K
(class, node) counts and the F fixed paths, and the tied best ones list their
devices: O(D*L*(K + L*F + D)) steps, a few thousand for 16 devices in 5 levels.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from numad.cpuset import NodeSet
from numad.topology.pcie import common_path

Path = tuple[str, ...]
Slot = tuple[str, int]  # (device class, NUMA node)


def closest(
    need: Mapping[Slot, int],
    candidates: Mapping[Slot, Sequence[tuple[str, Path]]],
    fixed: Sequence[Path] = (),
) -> dict[Slot, tuple[str, ...]] | None:
    """The addresses to take for each slot: ``need[slot]`` of ``candidates[slot]``
    (free devices, (address, path), in the kubelet's order), chosen by the rule of
    this module; None: keep the kubelet's order."""
    # 1. How many candidates of each slot sit under each ancestor.
    under: dict[tuple[Path, Slot], int] = {}
    for slot, members in candidates.items():
        for _, path in members:
            for depth in range(1, len(path) + 1):
                under[(path[:depth], slot)] = under.get((path[:depth], slot), 0) + 1
    # 2. Score every ancestor that holds the whole request: its depth (for a set of two
    # or more), its closeness to the fixed devices, then the fewest to spare.
    several = sum(need.values()) >= 2
    scored: list[tuple[tuple[int, int, int], Path]] = []
    for ancestor in sorted({a for a, _ in under}):
        counts = [under.get((ancestor, slot), 0) for slot in need]
        if any(c < n for c, n in zip(counts, need.values(), strict=True)):
            continue
        score = (
            len(ancestor) if several else 0,
            sum(_depth(ancestor, path) for path in fixed),
            sum(need.values()) - sum(counts),
        )
        scored.append((score, ancestor))
    if not scored:
        return None
    best = max(score for score, _ in scored)
    if best[:2] == (0, 0):
        return None  # one device that shares nothing with the fixed ones: the kubelet's
    # 3. Of the tied ancestors, the lowest addresses in the kubelet's order.
    picks = [_under(ancestor, need, candidates) for score, ancestor in scored if score == best]
    return min(picks, key=lambda p: [_positions(p[s], candidates[s]) for s in sorted(need)])


def _depth(a: Path, b: Path) -> int:
    shared = common_path([a, b])
    return 0 if shared is None else shared.depth


def _under(
    ancestor: Path, need: Mapping[Slot, int], candidates: Mapping[Slot, Sequence[tuple[str, Path]]]
) -> dict[Slot, tuple[str, ...]]:
    depth = len(ancestor)
    return {
        slot: tuple(a for a, path in candidates[slot] if path[:depth] == ancestor)[:count]
        for slot, count in need.items()
    }


def _positions(chosen: tuple[str, ...], members: Sequence[tuple[str, Path]]) -> list[int]:
    order = [a for a, _ in members]
    return sorted(order.index(a) for a in chosen)


# -- explained ------------------------------------------------------------------------------


def wiring(devices: Sequence[tuple[str, str, Path, int | None]]) -> str:
    """What a container's devices, (class, address, path, node), share, in words:
    "gpu 0000:1b:00.0 and nic 0000:1a:00.0 share switch 0000:18:00.0"; empty for
    fewer than two devices."""
    if len(devices) < 2:
        return ""
    classes = list(dict.fromkeys(d[0] for d in devices))
    names = []
    for name in classes:  # "and" between classes, or between one class's devices
        addresses = [d[1] for d in devices if d[0] == name]
        listed = _joined(addresses) if len(classes) == 1 else ", ".join(addresses)
        names.append(f"{name} {listed}")
    who = _joined(names)
    nodes = {d[3] for d in devices}
    known = NodeSet(n for n in nodes if n is not None)
    where = " and ".join(
        ([_nodes(known)] if known else []) + (["no NUMA node"] if None in nodes else [])
    )
    if any(not d[2] for d in devices):
        return f"{who} are on {where} (their place in the PCIe tree is not known)"
    shared = common_path([d[2] for d in devices])
    if shared is not None:
        return f"{who} share {shared.kind} {shared.address}"
    if len(nodes) == 1 and None not in nodes:
        return f"{who} share only {where}"
    return f"{who} share no PCIe ancestor (on {where})"


def _joined(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _nodes(nodes: NodeSet) -> str:
    return f"node {nodes.format_list()}" if len(nodes) == 1 else f"nodes {nodes.format_list()}"
