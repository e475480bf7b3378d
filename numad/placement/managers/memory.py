"""The memory manager (static policy): per-NUMA memory and hugepages, hints, allocation.

Pure core (reference/memory-device-managers.md section 1). Amounts are bytes.
Resources are ``memory`` and ``hugepages-<size>`` in binary SI (``hugepages-2Mi``).

Where numad does better than the kubelet:

* The state is the list of blocks, each with its explicit per-node split; the
  per-node tables are derived from it and from the machine's current
  capacity. A small drift of MemTotal across reboots therefore changes only
  the derived free amounts; a block that no longer fits is reported by
  ``MemoryState.conflicts`` instead of making the state unusable.
* Release gives back exactly the per-node split that allocation took.
* Hugepages: where the kernel's free page count per node is known
  (``observe``), a node never counts more free hugepages than the kernel has,
  less what numad handed out since the reading, so pages used outside numad
  are seen.
* Nodes without memory never appear in a memory hint, and a merged affinity's
  memory-less nodes are dropped before allocation: the kubelet lists them and
  then groups their neighbour with them, which keeps that neighbour from
  serving single-NUMA requests.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from numad.cpuset import NodeSet, digits
from numad.errors import AllocationError, ConfigError
from numad.placement.hintspace import HintSpace, bits, min_width
from numad.topology.model import Topology

MEMORY = "memory"
Key = tuple[str, str]  # (workload, container)
Amounts = Mapping[str, int]  # resource -> bytes


def page_size(resource: str) -> int:
    """The bytes of one page of a hugepage resource (``hugepages-2Mi``: 2 MiB); 1 for
    ``memory``, which is not split in pages."""
    if not resource.startswith("hugepages-"):
        return 1
    size = resource.removeprefix("hugepages-")
    for unit, factor in (("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if size.endswith(unit) and digits(size[: -len(unit)]):
            return int(size[: -len(unit)]) * factor
    return 1


def hugepage_resource(size_kb: int) -> str:
    """``hugepages-2Mi`` for 2048 kB pages, as the kubelet names them."""
    for unit, factor in (("Gi", 1 << 20), ("Mi", 1 << 10)):
        if size_kb % factor == 0:
            return f"hugepages-{size_kb // factor}{unit}"
    return f"hugepages-{size_kb}Ki"


@dataclass(frozen=True, slots=True)
class Capacity:
    total: int
    system_reserved: int
    allocatable: int


@dataclass(frozen=True, slots=True)
class MemoryTable:
    """Per node and resource: total, reserved for the system, allocatable."""

    nodes: tuple[int, ...]
    capacity: Mapping[tuple[int, str], Capacity]

    def allocatable(self, node: int, resource: str) -> int:
        cap = self.capacity.get((node, resource))
        return 0 if cap is None else cap.allocatable

    @classmethod
    def build(cls, topo: Topology, reserved: Mapping[int, Amounts] | None = None) -> MemoryTable:
        """The table of a discovered machine, with per-node system reservations validated."""
        reserved = reserved or {}
        _validate_reserved(topo, reserved)
        capacity: dict[tuple[int, str], Capacity] = {}
        for node in topo.nodes:
            huge_total = 0
            for pool in node.hugepages:
                resource = hugepage_resource(pool.size_kb)
                total = pool.total * pool.size_kb * 1024
                huge_total += total
                held = reserved.get(node.id, {}).get(resource, 0)
                capacity[(node.id, resource)] = Capacity(total, held, total - held)
            total = (node.memory_total_kb or 0) * 1024
            held = reserved.get(node.id, {}).get(MEMORY, 0)
            # Pre-allocated hugepages sit inside MemTotal: they are not regular memory.
            capacity[(node.id, MEMORY)] = Capacity(total, held, max(0, total - held - huge_total))
        return cls(tuple(n.id for n in topo.nodes), MappingProxyType(capacity))


def _validate_reserved(topo: Topology, reserved: Mapping[int, Amounts]) -> None:
    nodes = {n.id: n for n in topo.nodes}
    for node_id, amounts in reserved.items():
        subject = f"reserved-memory node {node_id}"
        if node_id not in nodes:
            raise ConfigError(
                subject, "no such NUMA node on this machine", f"use one of {sorted(nodes)}"
            )
        node = nodes[node_id]
        sizes = {hugepage_resource(p.size_kb): p for p in node.hugepages}
        for resource, amount in amounts.items():
            if resource != MEMORY and resource not in sizes:
                known = ", ".join([MEMORY, *sorted(sizes)])
                raise ConfigError(subject, f"unknown resource {resource!r}", f"use one of {known}")
            if amount <= 0:
                raise ConfigError(
                    subject, f"{resource} reservation must be above zero, got {amount}"
                )
            huge = {r: p.total * p.size_kb * 1024 for r, p in sizes.items()}
            if resource == MEMORY:
                # Pre-allocated hugepages sit inside MemTotal: regular memory is the rest.
                total = (node.memory_total_kb or 0) * 1024 - sum(huge.values())
                what = "regular memory (MemTotal less its hugepages)"
            else:
                total, what = huge[resource], f"{resource} pages"
            if amount > total:
                raise ConfigError(
                    subject,
                    f"{resource} reservation of {amount} bytes exceeds the node's {max(total, 0)}"
                    f" bytes of {what}",
                    "lower the reservation",
                )


@dataclass(frozen=True, slots=True)
class Block:
    """One container's amount of one resource, on ``nodes``, split per node."""

    resource: str
    nodes: NodeSet
    split: tuple[tuple[int, int], ...]  # (node, bytes), ascending node

    @property
    def size(self) -> int:
        return sum(b for _, b in self.split)


@dataclass(frozen=True, slots=True)
class MemoryState:
    table: MemoryTable
    blocks: Mapping[Key, tuple[Block, ...]] = field(default_factory=lambda: MappingProxyType({}))
    kernel_free: Mapping[tuple[int, str], int] = field(default_factory=lambda: MappingProxyType({}))
    # What numad itself held of each pool when the kernel's free count was read.
    kernel_base: Mapping[tuple[int, str], int] = field(default_factory=lambda: MappingProxyType({}))

    def observe(self, kernel_free: Mapping[tuple[int, str], int]) -> MemoryState:
        """The kernel's free bytes per (node, hugepage resource), read now."""
        base = {k: self.used(*k) for k in kernel_free}
        return replace(
            self,
            kernel_free=MappingProxyType(dict(kernel_free)),
            kernel_base=MappingProxyType(base),
        )

    # -- derived tables ------------------------------------------------------------

    def used(self, node: int, resource: str) -> int:
        return sum(
            b
            for blocks in self.blocks.values()
            for blk in blocks
            if blk.resource == resource
            for n, b in blk.split
            if n == node
        )

    def free(self, node: int, resource: str) -> int:
        free = self.table.allocatable(node, resource) - self.used(node, resource)
        key = (node, resource)
        if resource != MEMORY and key in self.kernel_free:
            # Pages numad handed out since the reading are gone from the kernel's count too.
            since = self.used(node, resource) - self.kernel_base.get(key, 0)
            free = min(free, self.kernel_free[key] - since)
        return max(0, free)

    def groups(self, node: int) -> set[NodeSet]:
        """The masks of the blocks on ``node`` (one mask at most, by the group rule)."""
        return {blk.nodes for blocks in self.blocks.values() for blk in blocks if node in blk.nodes}

    def conflicts(self) -> list[str]:
        """Nodes and resources where the blocks hold more than the machine now allows
        (a node that is gone allows nothing)."""
        held = {
            (n, blk.resource) for bl in self.blocks.values() for blk in bl for n, _ in blk.split
        }
        found = []
        for node, resource in sorted(held):
            over = self.used(node, resource) - self.table.allocatable(node, resource)
            if over > 0:
                found.append(
                    f"node {node} {resource}: {over} bytes more allocated than allocatable"
                )
        return found

    def per_node(self, key: Key) -> dict[int, int]:
        """The container's bytes on each node, every resource together."""
        out: dict[int, int] = {}
        for blk in self.blocks.get(key, ()):
            for node, size in blk.split:
                out[node] = out.get(node, 0) + size
        return out

    def mems(self, key: Key) -> NodeSet:
        """The container's ``cpuset.mems``: the union of its blocks' nodes."""
        nodes = NodeSet()
        for blk in self.blocks.get(key, ()):
            nodes |= blk.nodes
        return nodes

    # -- hints (reference 1.5) ---------------------------------------------------------

    def _usable(
        self, mask: tuple[int, ...], groups: Mapping[int, set[NodeSet]] | None = None
    ) -> bool:
        """The group rule: a node in a multi-node group serves only that exact group;
        a node used single-NUMA never joins a group."""
        of = groups if groups is not None else {n: self.groups(n) for n in mask}
        if len(mask) == 1:
            return all(len(g) <= 1 for g in of[mask[0]])
        wanted = NodeSet(mask)
        return all(g == wanted for n in mask for g in of[n])

    def hints(self, request: Amounts) -> dict[str, HintSpace] | None:
        """The same hints for every requested resource, described (None: nothing
        requested): node sets whose free amounts hold the request, under the group
        rule; preferred when as narrow as the fewest nodes whose allocatable amounts
        could hold it."""
        wanted = sorted((r, v) for r, v in request.items() if v > 0)
        if not wanted:
            return None
        # Unlike the kubelet, nodes with no capacity for any requested resource
        # (memory-less nodes) are left out: in a mask they add nothing but a
        # group that would keep their neighbour from serving single-NUMA requests.
        ids = [n for n in self.table.nodes if any(self.table.allocatable(n, r) for r, _ in wanted)]
        size = max(ids, default=0) + 1
        nodes = sum(1 << n for n in ids)
        free = tuple(_row(size, {n: self.free(n, r) for n in ids}) for r, _ in wanted)
        capacity = tuple(
            _row(size, {n: self.table.allocatable(n, r) for n in ids}) for r, _ in wanted
        )
        need = tuple(v for _, v in wanted)
        groups = {n: self.groups(n) for n in ids}
        pool = sum(1 << n for n in ids if not groups[n])
        singles = sum(1 << n for n in ids if all(len(g) <= 1 for g in groups[n]))
        multi = {g.bits for gs in groups.values() for g in gs if len(g) > 1}
        usable = tuple(
            sorted(
                g
                for g in multi
                if not g & ~nodes and all(groups[n] == {NodeSet.from_bits(g)} for n in bits(g))
            )
        )
        space = HintSpace(
            nodes,
            free,
            need,
            min_width(capacity, need, nodes),
            pool=pool,
            singles=singles,
            groups=usable,
        )
        return dict.fromkeys((r for r, _ in wanted), space)

    # -- allocation (reference 1.6) and release ----------------------------------------------

    def allocate(
        self,
        key: Key,
        request: Amounts,
        affinity: NodeSet | None,
        prefer: Mapping[int, int] | None = None,
    ) -> MemoryState:
        """One container's blocks, on the mask the kubelet's memory manager chooses.
        ``prefer`` (node -> weight; align-per-resource): each of its nodes in the mask
        first takes its weight's share of every amount (``_split``); the mask, and so
        the group rule and ``cpuset.mems``, stay the same."""
        wanted = {r: v for r, v in request.items() if v > 0}
        if not wanted or key in self.blocks:
            return self
        subject = f"{key[0]}/{key[1]}"
        space = next(iter((self.hints(wanted) or {}).values()))
        if affinity is not None:  # memory-less nodes of the merged affinity hold nothing
            affinity = NodeSet(
                n for n in affinity if any(self.table.allocatable(n, r) for r in wanted)
            )
        mask = affinity or _best(space.first(), subject, "get the default NUMA affinity")
        if any(sum(self.free(n, r) for n in mask) < v for r, v in wanted.items()):
            wider = space.first(base=mask.bits) if mask.bits & ~space.nodes == 0 else None
            mask = _best(wider, subject, "find NUMA nodes to extend the current topology hint")
        if not self._usable(tuple(mask)):
            raise AllocationError(
                subject,
                "[memorymanager] preferred hint violates NUMA node allocation",
                f"nodes {mask} already serve allocations of another NUMA group",
            )
        blocks = []
        for resource, amount in sorted(wanted.items()):
            split, left = self._split(resource, amount, mask, prefer or {})
            if left:
                raise AllocationError(
                    subject, f"{left} bytes of {resource} do not fit on nodes {mask}"
                )
            blocks.append(Block(resource, mask, split))
        new_blocks = dict(self.blocks)
        new_blocks[key] = tuple(blocks)
        return replace(self, blocks=MappingProxyType(new_blocks))

    def _split(
        self, resource: str, amount: int, mask: NodeSet, prefer: Mapping[int, int]
    ) -> tuple[tuple[tuple[int, int], ...], int]:
        """``amount`` over ``mask``: 1. each node of ``prefer`` in the mask, its weight's
        share (in whole pages of a hugepage resource), as much as it has free; 2. the
        rest greedily by ascending node id (the kubelet's whole rule when ``prefer`` is
        empty). The split, ascending, and what did not fit."""
        took = dict.fromkeys(mask, 0)
        left = amount
        weights = sum(prefer.values())
        page = page_size(resource)
        for node in mask:
            if prefer.get(node):
                share = amount * prefer[node] // weights // page * page
                took[node] = min(self.free(node, resource), share)
                left -= took[node]
        for node in mask:  # ascending node id, greedy
            take = min(self.free(node, resource) - took[node], left)
            took[node] += take
            left -= take
        return tuple((n, b) for n, b in took.items() if b), left

    def release(self, workload: str, container: str | None = None) -> MemoryState:
        kept = {
            k: v
            for k, v in self.blocks.items()
            if not (k[0] == workload and container in (None, k[1]))
        }
        return replace(self, blocks=MappingProxyType(kept))


def _best(found: int | None, subject: str, what: str) -> NodeSet:
    """The kubelet's pick among the hints: preferred first, then narrowest, then the
    first listed; preferred hints are the narrowest ones, so the first hint in the
    kubelet's order (``HintSpace.first``)."""
    if found is None:
        raise AllocationError(
            subject,
            f"[memorymanager] failed to {what}, no NUMA nodes with enough memory is available",
            "free memory on this machine or ask for less",
        )
    return NodeSet.from_bits(found)


def _row(size: int, amounts: Mapping[int, int]) -> tuple[int, ...]:
    """Amounts by node id as a row indexed by node id (0 where none is given)."""
    row = [0] * size
    for n, amount in amounts.items():
        row[n] = amount
    return tuple(row)
