"""Discovery of NUMA nodes: CPUs, memory, hugepages and distances.

Discovery edge: reads /sys/devices/system/node (and /proc/meminfo, /sys/kernel/mm
on machines without NUMA support) only through the ``Reader``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType

from numad.cpuset import CPUSet, NodeSet, digits
from numad.topology.model import HugePages, NumaNode
from numad.topology.sysread import Reader

NODE_DIR = "/sys/devices/system/node"
_NODE_NAME = re.compile(r"node(\d{1,5})")
_HUGEPAGES_NAME = re.compile(r"hugepages-(\d{1,12})kB")
_MEMINFO_LINE = re.compile(r"(?:Node \d+ )?(\w+):\s+(\d+)(?: kB)?")
_MAX_DISTANCE = 255  # the ACPI SLIT distance is one byte


def node_ids(r: Reader) -> NodeSet | None:
    """The online NUMA nodes, or None where the kernel has no NUMA support."""
    present = NodeSet(
        int(m.group(1)) for n in r.fs.listdir(NODE_DIR) if (m := _NODE_NAME.fullmatch(n))
    )
    if not present:
        # Quirk: kernels built without CONFIG_NUMA (small arm boards) have no
        # node directory at all; the machine is one node 0 (UMA).
        return None
    online = r.id_list(f"{NODE_DIR}/online", NodeSet)
    if online is None:
        # Quirk: old kernels have no node/online list; every node dir is online.
        return present
    # A node directory can outlive its node going offline (and vice versa).
    return present & online


def node_cpus(r: Reader, node: int) -> CPUSet:
    """Every CPU of the node, online or not; cpumap on kernels without cpulist."""
    base = f"{NODE_DIR}/node{node}"
    return r.cpus(f"{base}/cpulist", f"{base}/cpumap") or CPUSet()


def read_node(
    r: Reader,
    node: int,
    cpus: CPUSet,
    distances: Mapping[int, int] | None,
) -> NumaNode:
    base = f"{NODE_DIR}/node{node}"
    meminfo = _meminfo(r, f"{base}/meminfo")
    return NumaNode(
        id=node,
        cpus=cpus,
        memory_total_kb=meminfo.get("MemTotal"),
        memory_free_kb=meminfo.get("MemFree"),
        hugepages=_hugepages(r, f"{base}/hugepages"),
        distances=distances,
    )


def uma_node(r: Reader, online: CPUSet) -> NumaNode:
    """The single node of a kernel without NUMA support: all CPUs, all memory."""
    meminfo = _meminfo(r, "/proc/meminfo")
    return NumaNode(
        id=0,
        cpus=online,
        memory_total_kb=meminfo.get("MemTotal"),
        memory_free_kb=meminfo.get("MemFree"),
        hugepages=_hugepages(r, "/sys/kernel/mm/hugepages"),
        distances=None,
    )


def _meminfo(r: Reader, path: str) -> dict[str, int]:
    text = r.text(path)
    found: dict[str, int] = {}
    for line in (text or "").splitlines():
        m = _MEMINFO_LINE.fullmatch(line.strip())
        if m:
            found[m.group(1)] = int(m.group(2))
    if text is not None and "MemTotal" not in found:
        r.note(path, "no MemTotal line (memory unknown)")
    return found


def _hugepages(r: Reader, base: str) -> tuple[HugePages, ...]:
    pools = []
    for name in r.fs.listdir(base):
        m = _HUGEPAGES_NAME.fullmatch(name)
        if not m:
            continue
        total = r.integer(f"{base}/{name}/nr_hugepages")
        free = r.integer(f"{base}/{name}/free_hugepages")
        if total is None or total < 0:
            continue
        free = total if free is None or not 0 <= free <= total else free
        pools.append(HugePages(size_kb=int(m.group(1)), total=total, free=free))
    return tuple(sorted(pools, key=lambda p: p.size_kb))


def distances(
    r: Reader, nodes: NodeSet, online_list: NodeSet | None, possible: NodeSet | None
) -> dict[int, Mapping[int, int] | None]:
    """Each node's distances to the other nodes, keyed by node id.

    The kernel prints one column per *online* node, in id order, so a row maps
    onto the sorted online list. Quirk: a row can be longer than the node
    list (a node went offline after boot, its column stays, as in the
    offline-cpu0-node0 tree); it is then matched against the online list,
    then the possible list, then read as indexed by node id.
    """
    result: dict[int, Mapping[int, int] | None] = {}
    for node in nodes:
        path = f"{NODE_DIR}/node{node}/distance"
        row = _row(r, path)
        columns = _columns(row, nodes, online_list, possible) if row else None
        if row is None or columns is None:
            if row is not None:
                r.note(path, f"{len(row)} distances match no node list (distances unknown)")
            result[node] = None
            continue
        result[node] = MappingProxyType(
            {n: d for n, d in zip(columns, row, strict=True) if n in nodes}
        )
    return result


def _row(r: Reader, path: str) -> list[int] | None:
    text = r.text(path)
    if text is None:
        return None
    words = text.split()
    if not words or not all(digits(w) and 0 < int(w) <= _MAX_DISTANCE for w in words):
        r.note(path, f"not a distance row: {text[:40]!r} (distances unknown)")
        return None
    return [int(w) for w in words]


def _columns(
    row: list[int], nodes: NodeSet, online_list: NodeSet | None, possible: NodeSet | None
) -> tuple[int, ...] | None:
    for candidate in (nodes, online_list, possible):
        if candidate is not None and len(candidate) == len(row):
            return candidate.sorted()
    if len(row) > nodes.max():
        return tuple(range(len(row)))
    return None
