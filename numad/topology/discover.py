"""Discovery: the host's sysfs, read through a ``HostFS``, into a ``Topology``.

Discovery edge; the only stage besides the cgroup writer that reads host files,
and only through the seam. Garbage in any file never crashes it: a value that
cannot be used falls back as documented beside the read (and is listed in
``Topology.notes``); a machine that cannot be described at all (no online
CPU) raises ``TopologyError`` naming the directory.
"""

from __future__ import annotations

import posixpath
import re

from numad.cpuset import CPUSet, NodeSet
from numad.errors import TopologyError
from numad.hostfs import HostFS
from numad.topology import cpus as cpu_discovery
from numad.topology import nodes as node_discovery
from numad.topology.model import CPU, NumaNode, PciDevice, Topology
from numad.topology.sysread import Reader

PCI_DIR = "/sys/bus/pci/devices"
_PCI_ADDRESS = re.compile(r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]")
_HOST_BRIDGE = re.compile(r"pci[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}")
_HEX_ID = re.compile(r"0x[0-9a-f]{1,8}")


def discover(fs: HostFS) -> Topology:
    """Read the whole machine under ``fs``."""
    r = Reader(fs)
    known, online = cpu_discovery.cpu_ids(r)
    if not online:
        raise TopologyError(
            f"{cpu_discovery.CPU_DIR}", "no online CPU found; is this a sysfs tree?"
        )
    facts = {c: cpu_discovery.cpu_facts(r, c, online) for c in online}
    packages, package_of = cpu_discovery.group_packages(r, facts)
    facts = cpu_discovery.dies_within_packages(facts, package_of)
    cores = cpu_discovery.group_cores(facts, package_of)
    core_of = {c: core.id for core in cores for c in core.cpus}
    l3_groups = cpu_discovery.l3_groups(
        r, online, {c: core.cpus for core in cores for c in core.cpus}
    )
    l3_of = {c: g.id for g in l3_groups for c in g.cpus}

    nodes, node_of = _nodes(r, known, online)
    all_cpus = tuple(
        CPU(
            id=c,
            online=c in online,
            node=node_of.get(c),
            package=package_of.get(c),
            die=facts[c].die if c in facts else None,
            cluster=facts[c].cluster if c in facts else None,
            core=core_of.get(c),
            core_id=facts[c].core_id if c in facts else None,
            l3=l3_of.get(c),
        )
        for c in known
    )
    node_ids = NodeSet(n.id for n in nodes)
    return Topology(
        all_cpus=all_cpus,
        nodes=nodes,
        packages=packages,
        cores=cores,
        l3_groups=l3_groups,
        pci_devices=_pci_devices(r, node_ids),
        isolated=r.id_list(f"{cpu_discovery.CPU_DIR}/isolated", CPUSet) or CPUSet(),
        nohz_full=r.id_list(f"{cpu_discovery.CPU_DIR}/nohz_full", CPUSet) or CPUSet(),
        notes=tuple(r.notes),
    )


def _nodes(r: Reader, known: CPUSet, online: CPUSet) -> tuple[tuple[NumaNode, ...], dict[int, int]]:
    """The online nodes and each CPU's node."""
    ids = node_discovery.node_ids(r)
    if ids is None:
        r.note(node_discovery.NODE_DIR, "missing: no NUMA support, one node 0 holds everything")
        return (node_discovery.uma_node(r, online),), dict.fromkeys(known, 0)
    claims: dict[int, list[int]] = {}
    for node in ids:
        for c in node_discovery.node_cpus(r, node) & known:
            claims.setdefault(c, []).append(node)
    node_of = {c: claimants[0] for c, claimants in claims.items()}
    for c, claimants in claims.items():
        if len(claimants) > 1:
            node_of[c] = _contested(r, c, claimants, ids)
    for c in online:
        if c not in node_of and (link := _node_link(r, c, ids)) is not None:
            node_of[c] = link
    online_list = r.id_list(f"{node_discovery.NODE_DIR}/online", NodeSet)
    possible = r.id_list(f"{node_discovery.NODE_DIR}/possible", NodeSet)
    rows = node_discovery.distances(r, ids, online_list, possible)
    nodes = tuple(
        node_discovery.read_node(
            r, n, CPUSet(c for c, m in node_of.items() if m == n and c in online), rows[n]
        )
        for n in ids
    )
    return nodes, node_of


def _contested(r: Reader, cpu: int, claimants: list[int], ids: NodeSet) -> int:
    """The node of a CPU that several nodes' cpulists name.

    Quirk: an old x86_64 kernel with 8 nodes all at distance 10 (fake NUMA,
    8em64t-2s2ca2c-buggynuma) prints every CPU in every node's cpulist, while
    it links each CPU under the one node it belongs to (register_cpu_under_node
    in drivers/base/node.c makes nodeM/cpuN and cpuN/nodeM for cpu_to_node(N)
    only): the link decides. Without one, the lowest claimant keeps it.
    """
    link = _node_link(r, cpu, ids)
    chosen = link if link in claimants else claimants[0]
    others = ", ".join(f"node{n}" for n in claimants if n != chosen)
    r.note(
        f"{node_discovery.NODE_DIR}/node{chosen}/cpulist",
        f"cpu {cpu} is also in the cpulist of {others}; kept in node{chosen}",
    )
    return chosen


def _node_link(r: Reader, cpu: int, ids: NodeSet) -> int | None:
    """The node a cpuN/nodeM link names, for a CPU no node's cpulist claims, or several.

    Quirk: a link to a node that is offline or has no directory dangles (seen
    in offline-cpu0-node0, where node 0 is gone); such a CPU has no node.
    """
    base = f"{cpu_discovery.CPU_DIR}/cpu{cpu}"
    for name in r.fs.listdir(base):
        m = re.fullmatch(r"node(\d{1,5})", name)
        if m and int(m.group(1)) in ids:
            return int(m.group(1))
    return None


def _pci_devices(r: Reader, nodes: NodeSet) -> tuple[PciDevice, ...]:
    devices = []
    for address in r.fs.listdir(PCI_DIR):
        if not _PCI_ADDRESS.fullmatch(address):
            continue
        base = f"{PCI_DIR}/{address}"
        node = r.integer(f"{base}/numa_node")
        if node is not None and node >= 0 and node not in nodes:
            r.note(f"{base}/numa_node", f"names node {node}, which is not online (no node)")
            node = None
        driver = r.fs.readlink(f"{base}/driver")
        devices.append(
            PciDevice(
                address=address.lower(),
                # Quirk: -1 means the firmware gave the device no NUMA node
                # (single-node machines, some VMs); it is not node 0.
                numa_node=node if node is not None and node >= 0 else None,
                vendor=_hex_id(r, f"{base}/vendor"),
                device=_hex_id(r, f"{base}/device"),
                pci_class=_hex_id(r, f"{base}/class"),
                driver=posixpath.basename(driver) if driver else None,
                local_cpus=r.cpus(f"{base}/local_cpulist", f"{base}/local_cpus"),
                path=_pcie_path(r, base, address),
            )
        )
    return tuple(devices)


def _pcie_path(r: Reader, base: str, address: str) -> tuple[str, ...]:
    """What is above the device in the PCIe tree, from the host bridge down.

    ``/sys/bus/pci/devices/ADDR`` links to the device's place under
    ``/sys/devices``: ``../../../devices/pci0000:17/0000:17:00.0/0000:18:00.0/ADDR``.
    The link is resolved inside the root (the reads of its attributes resolve it
    anyway, so this costs no more than that one readlink). Only PCI entries count,
    from the first host bridge on: a Hyper-V or platform device tree puts other
    directories above it (``LNXSYSTM:00/.../pci0001:00``).

    Quirk: some recordings (hwloc's) keep plain directories in
    /sys/bus/pci/devices instead of links; such a device's place is unknown, ().
    """
    parts = r.fs.resolve(base).split("/")
    if parts[-1].lower() != address.lower():
        return ()
    starts = [i for i, p in enumerate(parts[:-1]) if _HOST_BRIDGE.fullmatch(p)]
    if not starts:
        return ()
    above = parts[starts[0] : -1]
    if not all(_HOST_BRIDGE.fullmatch(p) or _PCI_ADDRESS.fullmatch(p) for p in above):
        r.note(base, "links to a place with non-PCI entries between its bridges (no path)")
        return ()
    return tuple(p.lower() for p in above)


def _hex_id(r: Reader, path: str) -> str | None:
    text = r.text(path)
    if text is None:
        return None
    text = text.lower()
    if not _HEX_ID.fullmatch(text):
        r.note(path, f"not a hex id: {text[:40]!r} (ignored)")
        return None
    return text
