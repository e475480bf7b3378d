"""Rendering a ``Topology`` for tools (JSON-ready dicts) and for people (a text tree).

Pure: reads only the model, touches no host file. Output is deterministic:
everything is listed in id order, so two renderings of equal topologies are
equal text. The JSON shape is a contract with external tools: fields may be
added, never removed or renamed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol, TypeVar

from numad.cpuset import CPUSet
from numad.topology.model import CPU, CacheGroup, NumaNode, Topology
from numad.topology.pcirender import pci_json, pci_section

# -- JSON ---------------------------------------------------------------------


def to_json(topo: Topology) -> dict[str, object]:
    """The machine as plain JSON values (``json.dumps`` takes it as is)."""
    return {
        "packages": [{"id": p.id, "cpus": _ids(p.cpus)} for p in _by_id(topo.packages)],
        "cores": sum(1 for c in topo.cores if c.cpus),
        "numa_nodes": {str(n.id): _node_json(n) for n in _by_id(topo.nodes)},
        "cpus": [_cpu_json(c) for c in sorted(topo.all_cpus, key=lambda c: c.id)],
        "pci": pci_json(topo),
        "online_cpus": _ids(topo.online_cpus),
        "isolated": _ids(topo.isolated),
        "nohz_full": _ids(topo.nohz_full),
        "l3_groups": [_l3_json(g) for g in _by_id(topo.l3_groups)],
        "notes": list(topo.notes),
    }


def _node_json(node: NumaNode) -> dict[str, object]:
    distances = node.distances
    return {
        "cpus": _ids(node.cpus),
        "memory_kb": node.memory_total_kb,
        "memory_free_kb": node.memory_free_kb,
        "hugepages": {
            str(h.size_kb): {"total": h.total, "free": h.free}
            for h in sorted(node.hugepages, key=lambda h: h.size_kb)
        },
        "distances": None
        if distances is None
        else {str(other): distances[other] for other in sorted(distances)},
    }


def _cpu_json(cpu: CPU) -> dict[str, object]:
    return {
        "id": cpu.id,
        "online": cpu.online,
        "package": cpu.package,
        "die": cpu.die,
        "cluster": cpu.cluster,
        "core": cpu.core,
        "core_id": cpu.core_id,
        "node": cpu.node,
        "l3": cpu.l3,
    }


def _l3_json(group: CacheGroup) -> dict[str, object]:
    return {
        "id": group.id,
        "cpus": _ids(group.cpus),
        "cache_id": group.cache_id,
        "size_kb": group.size_kb,
    }


def _ids(cpus: CPUSet) -> list[int]:
    return list(cpus.sorted())


# -- text ---------------------------------------------------------------------


def to_text(topo: Topology) -> str:
    """A readable tree, in the spirit of ``lstopo`` and ``numactl -H``.

    Packages hold the part of each NUMA node that lies in them, nodes hold L3
    groups, L3 groups hold cores. A node spanning packages (or an L3 spanning
    nodes) shows up once per part, each marked as a part; memory-only nodes,
    memory, distances and PCI devices (``pcirender``: by node, then by PCIe
    switch) follow in their own sections.
    """
    sections = [
        [_summary(topo)],
        _package_tree(topo),
        _node_section(topo),
        _cpu_states(topo),
        _distance_table(topo),
        pci_section(topo),
        _notes(topo),
    ]
    return "\n\n".join("\n".join(s) for s in sections if s) + "\n"


def _summary(topo: Topology) -> str:
    memory_only = sum(1 for n in topo.nodes if not n.cpus)
    nodes = _count(len(topo.nodes), "NUMA node")
    if memory_only:
        nodes += f" ({memory_only} memory-only)"
    cores = sum(1 for c in topo.cores if c.cpus)
    return (
        f"Machine: {_count(len(topo.packages), 'package')}, {nodes}, "
        f"{_count(cores, 'core')}, CPUs {len(topo.online_cpus)}/{len(topo.all_cpus)} online"
    )


def _package_tree(topo: Topology) -> list[str]:
    lines: list[str] = []
    placed = CPUSet()
    for pkg in _by_id(topo.packages):
        placed |= pkg.cpus
        cores = [c for c in topo.cores if c.package == pkg.id and c.cpus]
        head = f"Package {pkg.id}: {_count(len(cores), 'core')}, cpus {pkg.cpus}"
        dies = sorted({c.die for c in cores if c.die is not None})
        if len(dies) > 1:
            head += f", dies {','.join(map(str, dies))}"
        lines.append(head)
        for node_id, part in _split(topo, pkg.cpus, lambda c: c.node):
            if node_id is None:
                label = "no NUMA node"
            else:
                whole = topo.node(node_id).cpus if node_id in topo.node_ids else part
                label = f"NUMA node {node_id}" + _extra(_part_of(part, whole))
            lines.append(f"  {label}: cpus {part}")
            lines += _l3_lines(topo, part)
    unplaced = topo.online_cpus - placed
    if unplaced:
        lines.append(f"Online CPUs in no package: {unplaced}")
    return lines


def _l3_lines(topo: Topology, part: CPUSet) -> list[str]:
    groups = _split(topo, part, lambda c: c.l3)
    if len(groups) == 1 and groups[0][0] is None:
        return _core_lines(topo, part, "    ")
    lines: list[str] = []
    by_id = {g.id: g for g in topo.l3_groups}
    for l3_id, cpus in groups:
        if l3_id is None or l3_id not in by_id:
            lines.append(f"    no L3: cpus {cpus}")
        else:
            group = by_id[l3_id]
            size = [_size_label(group.size_kb)] if group.size_kb else []
            lines.append(f"    L3 {l3_id}{_extra(*size, _part_of(cpus, group.cpus))}: cpus {cpus}")
        lines += _core_lines(topo, cpus, "      ")
    return lines


def _core_lines(topo: Topology, part: CPUSet, indent: str) -> list[str]:
    lines = []
    for core in sorted(topo.cores, key=lambda c: c.id):
        threads = core.cpus & part
        if threads:
            lines.append(f"{indent}core {core.id}: cpus {','.join(map(str, threads))}")
    return lines


def _node_section(topo: Topology) -> list[str]:
    lines = ["NUMA nodes:"]
    for node in _by_id(topo.nodes):
        if node.cpus:
            packages = sorted({p for c in node.cpus if (p := topo.cpu(c).package) is not None})
            where = f" in {'packages' if len(packages) > 1 else 'package'} " if packages else ""
            lines.append(f"  node {node.id}: cpus {node.cpus}{where}{','.join(map(str, packages))}")
        else:
            lines.append(f"  node {node.id}: no CPUs (memory only)")
        lines.append(f"    memory: {_memory(node)}")
        if node.hugepages:
            pools = ", ".join(
                f"{_size_label(h.size_kb)} {h.total} total / {h.free} free"
                for h in sorted(node.hugepages, key=lambda h: h.size_kb)
            )
            lines.append(f"    hugepages: {pools}")
    return lines


def _memory(node: NumaNode) -> str:
    if node.memory_total_kb is None:
        return "unknown"
    text = f"{_human_kb(node.memory_total_kb)} total"
    if node.memory_free_kb is not None:
        text += f", {_human_kb(node.memory_free_kb)} free"
    return text


def _cpu_states(topo: Topology) -> list[str]:
    offline = CPUSet(c.id for c in topo.all_cpus if not c.online)
    lines = []
    if offline:
        lines.append(f"Offline CPUs: {offline}")
    if topo.isolated:
        lines.append(f"Isolated CPUs (isolcpus): {topo.isolated}")
    if topo.nohz_full:
        lines.append(f"nohz_full CPUs: {topo.nohz_full}")
    return lines


def _distance_table(topo: Topology) -> list[str]:
    nodes = _by_id(topo.nodes)
    if all(n.distances is None for n in nodes):
        return ["Node distances: unknown"]
    ids = [n.id for n in nodes]
    cells = {
        (n.id, m): "-" if n.distances is None or m not in n.distances else str(n.distances[m])
        for n in nodes
        for m in ids
    }
    width = max(3, *(len(str(i)) for i in ids), *(len(v) for v in cells.values()))
    lines = ["Node distances:", "  node" + "".join(f" {m:>{width}}" for m in ids)]
    lines += [f"  {n:>4}" + "".join(f" {cells[n, m]:>{width}}" for m in ids) for n in ids]
    return lines


def _notes(topo: Topology) -> list[str]:
    if not topo.notes:
        return []
    return ["Notes (quirks discovery worked around):", *(f"  - {n}" for n in topo.notes)]


# -- helpers --------------------------------------------------------------------


def _split(
    topo: Topology, cpus: CPUSet, key: Callable[[CPU], int | None]
) -> list[tuple[int | None, CPUSet]]:
    """``cpus`` grouped by ``key`` of each CPU, in key order, None last."""
    groups: dict[int | None, list[int]] = {}
    for c in cpus:
        groups.setdefault(key(topo.cpu(c)), []).append(c)
    order = sorted(groups, key=lambda k: (k is None, k or 0))
    return [(k, CPUSet(groups[k])) for k in order]


def _part_of(part: CPUSet, whole: CPUSet) -> str:
    return "" if part == whole else f"part of cpus {whole}"


def _extra(*details: str) -> str:
    """`` (a, b)`` for the non-empty details, or nothing."""
    shown = [d for d in details if d]
    return f" ({', '.join(shown)})" if shown else ""


class _HasId(Protocol):
    @property
    def id(self) -> int: ...


_T = TypeVar("_T", bound=_HasId)


def _by_id(items: Iterable[_T]) -> list[_T]:
    return sorted(items, key=lambda i: i.id)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")


def _human_kb(kb: int) -> str:
    """``kb`` in binary units, one decimal: 47919812 -> ``45.7 GiB``."""
    value = float(kb)
    for unit in _UNITS[:-1]:
        if value < 1024:
            return f"{value:.1f} {unit}" if unit != "KiB" else f"{kb} KiB"
        value /= 1024
    return f"{value:.1f} {_UNITS[-1]}"


def _size_label(kb: int) -> str:
    """A page or cache size: exact where a unit holds it (2048 -> ``2 MiB``), else rounded."""
    value, unit = kb, 0
    while value >= 1024 and value % 1024 == 0 and unit < len(_UNITS) - 1:
        value //= 1024
        unit += 1
    return f"{value} {_UNITS[unit]}" if value < 1024 else _human_kb(kb)
