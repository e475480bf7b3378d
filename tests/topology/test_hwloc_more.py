"""Golden tests: discovery on the 24 trees of fixtures/hwloc-more against hwloc's own reading.

19 trees come with NAME.console, what hwloc's lstopo printed for that tree. Each
fact below is stated once by hwloc (parsed from the console, tests/topology/
hwloc_console.py) and once by numad (``discover``), as a set of short strings, and
the two must be equal. Where they are not, DISAGREEMENTS names the tree, the fact,
what only hwloc says, what only numad says, who is right and why, with the kernel
document that decides; the test then checks that the difference is still exactly
that, so a change on either side fails it.

lstopo shows only what the recording process's cpuset allowed (the trees record
/proc/self/cpuset and the cpuset files); numad describes the whole machine, so its
facts are cut to the allowed CPUs and nodes before the comparison.

The other 5 trees have no console: SYSFS_FACTS states what their files say, read
by hand from the tree, and every tree must keep the model's invariants.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache

import pytest

from numad.hostfs import HostFS
from numad.topology.discover import discover
from numad.topology.model import Topology
from tests.topology import hwloc_console as hc
from tests.topology.conftest import MORE, MORE_TREES, MoreMachines

Facts = dict[str, frozenset[str]]

CONSOLE_TREES = [t for t in MORE_TREES if (MORE / f"{t}.console").is_file()]
SYSFS_TREES = [t for t in MORE_TREES if t not in CONSOLE_TREES]


@dataclass(frozen=True)
class Disagreement:
    hwloc: tuple[str, ...]  # what only hwloc states
    numad: tuple[str, ...]  # what only numad states
    right: str  # "numad", "hwloc" or "both" (the two state different facts)
    why: str


_MIXED_FILES = (
    "the tree was edited so that hwloc's reads conflict (its .test: '4th socket "
    "conflicts, ignored', '3rd L3 conflicts, ignored'): cpu3's core_siblings mask says "
    "0-3 and cpu2's L3 shared_cpu_map says 0-3, while core_siblings_list, "
    "physical_package_id and shared_cpu_list agree on 4 packages of 10 CPUs, each with "
    "its L3. hwloc reads the masks and drops what conflicts; numad reads the lists, the "
    "same sets in list form (Documentation/ABI/stable/sysfs-devices-system-cpu: "
    "package_cpus_list, core_cpus_list; cache shared_cpu_list in "
    "Documentation/ABI/testing/sysfs-devices-system-cpu)"
)
_PS3 = (
    "the PS3's 2.6 kernel writes neither physical_package_id nor core_siblings (only "
    "thread_siblings 0-1; Documentation/admin-guide/cputopology.rst: an architecture "
    "without the macros gets package id -1 and a one-CPU package mask), so hwloc shows "
    "no package; numad's model puts every core in a package and makes one from the "
    "core's threads. Both right: numad adds no claim beyond 'one core, one package'"
)

DISAGREEMENTS: dict[tuple[str, str], Disagreement] = {
    ("16ia64-8n2s", "packages"): Disagreement(
        hwloc=("0=1", "1024=5", "1536=7", "2048=9", "2560=11", "3072=13", "3584=15", "512=3"),
        numad=("3585=1", "3586=3", "3587=5", "3588=7", "3589=9", "3590=11", "3591=13", "3592=15"),
        right="both",
        why=(
            "the same 16 one-CPU packages, named differently: before Montecito the ia64 "
            "kernel builds physical_package_id as (SAL platform id << 8) | 0 "
            "(arch/ia64/kernel/smpboot.c identify_siblings), so both sockets of a node "
            "read one id while package_cpus names each alone. hwloc repeats the id (two "
            "Package P#0); numad keeps the package_cpus grouping (the ABI's definition "
            "of the package, Documentation/ABI/stable/sysfs-devices-system-cpu, where "
            "physical_package_id is 'architecture and platform dependent') and gives "
            "the second socket a fresh id, since a package id names one package"
        ),
    ),
    ("2pa-pcidomain32bits", "pci-numa-nodes"): Disagreement(
        hwloc=("0000:00:01.1=0", "0000:00:02.0=0", "0000:00:03.0=0", "10000:00:04.0=0"),
        numad=(
            "0000:00:01.1=None",
            "0000:00:02.0=None",
            "0000:00:03.0=None",
            "10000:00:04.0=None",
        ),
        right="numad",
        why=(
            "numa_node is -1, the firmware gave these devices no node "
            "(Documentation/ABI/testing/sysfs-bus-pci: numa_node, -1 when unknown), as "
            "the kubelet's device manager reads it. hwloc places them by local_cpus, "
            "hand-edited per PCI domain to CPU 0 or 1 (the mask says 1 or 2, "
            "local_cpulist still 0-1), and so under node 0, the only node"
        ),
    ),
    ("2ps3-2t", "packages"): Disagreement(hwloc=(), numad=("0=0-1",), right="both", why=_PS3),
    ("2ps3-2t", "dies"): Disagreement(hwloc=(), numad=("0-1",), right="both", why=_PS3),
    ("40intel64-4n10c+pci-conflicts", "packages"): Disagreement(
        hwloc=(), numad=("3=3,7,11,15,19,23,27,31,35,39",), right="numad", why=_MIXED_FILES
    ),
    ("40intel64-4n10c+pci-conflicts", "dies"): Disagreement(
        hwloc=(), numad=("3,7,11,15,19,23,27,31,35,39",), right="numad", why=_MIXED_FILES
    ),
    ("40intel64-4n10c+pci-conflicts", "l3"): Disagreement(
        hwloc=(), numad=("2,6,10,14,18,22,26,30,34,38",), right="numad", why=_MIXED_FILES
    ),
    ("8em64t-2s2ca2c-buggynuma", "numa-nodes"): Disagreement(
        hwloc=("0=0-7:2048MiB",),
        numad=(
            "0=0:2048MiB",
            "1=1:2047MiB",
            "2=2:2048MiB",
            "3=3:2048MiB",
            "4=4:2048MiB",
            "5=5:2048MiB",
            "6=6:2048MiB",
            "7=7:2048MiB",
        ),
        right="numad",
        why=(
            "a fake-NUMA kernel (8 nodes at distance 10) prints CPUs 0-7 in every "
            "node's cpulist, but links each cpuN under nodeN alone (drivers/base/node.c "
            "links a CPU under cpu_to_node() only; Documentation/ABI/stable/"
            "sysfs-devices-node: nodeX holds 'what CPUs are local to the node'). hwloc "
            "drops the 7 overlapping nodes and their 14 GiB (its Machine total is "
            "2048MiB, /proc/meminfo says 16331824 kB); numad keeps the 8 nodes and "
            "gives each CPU the node its link names"
        ),
    ),
    ("fakememinitiators-1np2c+1npp+gi", "numa-nodes"): Disagreement(
        hwloc=(
            "10=2-3,6-7:744GiB",
            "5=0-1:93GiB",
            "6=4-5:94GiB",
            "7=0-1,4-5:742GiB",
            "8=2-3:93GiB",
            "9=6-7:94GiB",
        ),
        numad=("10=:744GiB", "5=:93GiB", "6=:94GiB", "7=:742GiB", "8=:93GiB", "9=:94GiB"),
        right="both",
        why=(
            "different facts about memory-only nodes: numad gives a node the CPUs of "
            "its cpulist, empty here ('The CPUs associated to the node', "
            "Documentation/ABI/stable/sysfs-devices-node), as the kubelet's memory "
            "manager sees it; hwloc places the node at the CPUs of its best initiators "
            "(nodeX/access1/initiators in the same file), a locality numad gives as "
            "distances"
        ),
    ),
}

RIGHT = ("numad", "hwloc", "both")


# -- the two readings -------------------------------------------------------------


@cache
def _console(tree: str) -> hc.Console:
    return hc.parse(MORE / f"{tree}.console")


def hwloc_facts(console: hc.Console) -> Facts:
    """What hwloc states of the machine; a fact it does not state is left out."""
    pus = console.root.pus()
    dies = console.objects("Die") or console.objects("Package")
    facts: Facts = {
        "cpus": frozenset({hc.cpulist(pus | console.hidden)}),
        "pus": frozenset({hc.cpulist(pus)}),
        "packages": frozenset(
            f"{p.os_index}={hc.cpulist(p.pus())}" for p in console.objects("Package") if p.pus()
        ),
        "dies": frozenset(hc.cpulist(d.pus()) for d in dies if d.pus()),
        "numa-nodes": frozenset(
            f"{n.os_index}={hc.cpulist(n.parent.pus() if n.parent else ())}:{hc.local_memory(n)}"
            for n in console.objects("NUMANode")
        ),
        "l3": frozenset(hc.cpulist(c.pus()) for c in console.objects("L3Cache") if c.pus()),
    }
    if console.has("Core"):  # lstopo --filter all:structure hides cores
        facts["cores"] = frozenset(
            f"{c.os_index}={hc.cpulist(c.pus())}" for c in console.objects("Core")
        )
    devices = {b: _pci_node(console, o) for o in console.root.walk() if (b := hc.busid(o))}
    if devices:
        facts["pci-numa-nodes"] = frozenset(f"{b}={n}" for b, n in devices.items())
    return facts


def _pci_node(console: hc.Console, device: hc.HwlocObject) -> int | None:
    """The one NUMA node holding the CPUs a device hangs under; None at the machine's root."""
    local = hc.attach_point(device).pus()
    if local == console.root.pus():
        return None
    nodes = [
        n.os_index
        for n in console.objects("NUMANode")
        if n.parent is not None and local <= n.parent.pus()
    ]
    return nodes[0] if len(nodes) == 1 else None


def numad_facts(
    topo: Topology,
    memory: Callable[[int], str],
    cpus: frozenset[int] | None = None,
    nodes: frozenset[int] | None = None,
) -> Facts:
    """What numad states, cut to the allowed ``cpus`` and ``nodes`` where given."""
    allowed = cpus if cpus is not None else frozenset(topo.online_cpus)

    def cut(ids: Iterable[int]) -> frozenset[int]:
        return frozenset(ids) & allowed

    dies: dict[tuple[int | None, int | None], set[int]] = {}
    for cpu in topo.all_cpus:
        if cpu.online and cpu.id in allowed:
            dies.setdefault((cpu.package, cpu.die), set()).add(cpu.id)
    return {
        "cpus": frozenset({hc.cpulist(c.id for c in topo.all_cpus)}),
        "pus": frozenset({hc.cpulist(cut(topo.online_cpus))}),
        "packages": frozenset(
            f"{p.id}={hc.cpulist(cut(p.cpus))}" for p in topo.packages if cut(p.cpus)
        ),
        "dies": frozenset(hc.cpulist(d) for d in dies.values()),
        "numa-nodes": frozenset(
            f"{n.id}={hc.cpulist(cut(n.cpus))}:"
            f"{None if n.memory_total_kb is None else memory(n.memory_total_kb)}"
            for n in topo.nodes
            if nodes is None or n.id in nodes
        ),
        "cores": frozenset(
            f"{c.core_id}={hc.cpulist(cut(c.cpus))}" for c in topo.cores if cut(c.cpus)
        ),
        "l3": frozenset(hc.cpulist(cut(g.cpus)) for g in topo.l3_groups if cut(g.cpus)),
        "pci-numa-nodes": frozenset(f"{d.address}={d.numa_node}" for d in topo.pci_devices),
    }


def _cases() -> list[object]:
    return [
        pytest.param(tree, fact, id=f"{tree}-{fact}")
        for tree in CONSOLE_TREES
        for fact in hwloc_facts(_console(tree))
    ]


@pytest.fixture(scope="module")
def topologies(more_machines: MoreMachines) -> dict[str, Topology]:
    return {tree: discover(HostFS(more_machines.root(tree))) for tree in MORE_TREES}


@pytest.mark.parametrize(("tree", "fact"), _cases())
def test_discovery_agrees_with_hwloc(
    topologies: dict[str, Topology], more_machines: MoreMachines, tree: str, fact: str
) -> None:
    hwloc = hwloc_facts(_console(tree))[fact]
    cpus, nodes = hc.cgroup_allowed(more_machines.root(tree))
    numad = numad_facts(topologies[tree], hc.memory_size, cpus, nodes)[fact]
    if fact == "pci-numa-nodes":  # lstopo lists only the devices it finds important
        listed = {f.partition("=")[0] for f in hwloc}
        numad = frozenset(f for f in numad if f.partition("=")[0] in listed)
    known = DISAGREEMENTS.get((tree, fact))
    if known is None:
        assert numad == hwloc
    else:
        assert (sorted(hwloc - numad), sorted(numad - hwloc)) == (
            sorted(known.hwloc),
            sorted(known.numad),
        ), f"{tree} {fact}: no longer the known disagreement ({known.why})"


def test_every_disagreement_is_a_tested_fact_with_a_verdict() -> None:
    cases = {(tree, fact) for tree in CONSOLE_TREES for fact in hwloc_facts(_console(tree))}
    for key, known in DISAGREEMENTS.items():
        assert key in cases, key
        assert known.right in RIGHT, key
        assert known.hwloc or known.numad, key
        assert "Documentation/" in known.why, key


def test_console_trees_are_the_ones_with_an_hwloc_reading() -> None:
    assert len(MORE_TREES) == 24
    assert len(CONSOLE_TREES) == 19
    assert SYSFS_TREES == [
        "2i386-2c-nohugepage",
        "2i386-2t-hugepagesizecount",
        "32em64t-2n8c+dax+nvme+mic+dimms",
        "fakeheterocpunuma",
        "fakepcilocalities",
    ]


# -- the trees without a console ----------------------------------------------------

# Read by hand from each tree's files: cpu/online (or cpuN/online), physical_package_id,
# core_id, thread_siblings, node*/cpumap, node*/meminfo (else /proc/meminfo),
# /sys/kernel/mm/hugepages, cache/index*/level, and each PCI device's numa_node.
SYSFS_FACTS: dict[str, Facts] = {
    "2i386-2c-nohugepage": {
        "cpus": frozenset({"0-1"}),
        "pus": frozenset({"0-1"}),
        "packages": frozenset({"0=0-1"}),
        "dies": frozenset({"0-1"}),
        "cores": frozenset({"0=0", "1=1"}),
        # No node directory (no CONFIG_NUMA): one node, /proc/meminfo's MemTotal.
        "numa-nodes": frozenset({"0=0-1:2075428kB"}),
        "l3": frozenset(),  # caches index0-2 only: L1d, L1i, L2
        "pci-numa-nodes": frozenset(),
    },
    "2i386-2t-hugepagesizecount": {
        "cpus": frozenset({"0-1"}),
        "pus": frozenset({"0-1"}),
        "packages": frozenset({"0=0-1"}),
        "dies": frozenset({"0-1"}),
        "cores": frozenset({"0=0-1"}),  # thread_siblings 0-1, both core_id 0
        # A 32-bit kernel whose MemTotal needs 64 bits (hwloc's XML: 409617181966336 B).
        "numa-nodes": frozenset({"0=0-1:400016779264kB"}),
        "l3": frozenset(),
        "pci-numa-nodes": frozenset(),
    },
    "32em64t-2n8c+dax+nvme+mic+dimms": {
        "cpus": frozenset({"0-15"}),
        "pus": frozenset({"0-15"}),
        "packages": frozenset({"0=0-7", "1=8-15"}),
        "dies": frozenset({"0-7", "8-15"}),
        "cores": frozenset({f"{i}={i}" for i in range(8)} | {f"{i}={i + 8}" for i in range(8)}),
        "numa-nodes": frozenset({"0=0-7:16747124kB", "1=8-15:16777216kB"}),
        "l3": frozenset({"0-7", "8-15"}),
    },
    "fakeheterocpunuma": {
        "cpus": frozenset({"0-23"}),
        "pus": frozenset({"0-23"}),
        "packages": frozenset({"0=0-11", "1=12-23"}),
        "dies": frozenset({"0-11", "12-23"}),
        "cores": frozenset(f"{i // 2}={i}-{i + 1}" for i in range(0, 24, 2)),
        # cpumaps: node0 0-3, node1 8-11, node2 none, node3 20-23, node4 16-23,
        # node5 12-23. A kernel cannot write overlapping nodes (cpu_to_node() is one
        # node): each contested CPU stays in its lowest claimant, which the notes name;
        # CPUs 4-7 are in no node.
        "numa-nodes": frozenset(
            f"{n}={cpus}:1048576kB"
            for n, cpus in enumerate(["0-3", "8-11", "", "20-23", "16-19", "12-15"])
        ),
        "l3": frozenset(),
        "pci-numa-nodes": frozenset(),
    },
    "fakepcilocalities": {
        "cpus": frozenset({"0-39"}),
        "pus": frozenset({"0-39"}),
        "packages": frozenset(f"{p}={hc.cpulist(range(p, 40, 4))}" for p in range(4)),
        "dies": frozenset(hc.cpulist(range(p, 40, 4)) for p in range(4)),
        "cores": frozenset(
            f"{core_id}={cpu}"
            for cpu, core_id in enumerate(
                c for c in (0, 1, 2, 8, 9, 16, 17, 18, 24, 25) for _ in range(4)
            )
        ),
        "numa-nodes": frozenset(
            f"{n}={hc.cpulist(range(n, 40, 4))}:{kb}kB"
            for n, kb in enumerate([134204252, 134217728, 134217728, 134217728])
        ),
        "l3": frozenset(),  # the tree has no cache directories
    },
}

# numa_node of every PCI device, counted by node (None: -1); the .test of
# fakepcilocalities overrides localities through HWLOC_PCI_LOCALITY, not numa_node.
SYSFS_PCI_NODES: dict[str, dict[int | None, int]] = {
    "32em64t-2n8c+dax+nvme+mic+dimms": {0: 28, 1: 16, None: 93},  # None: 0000:00:02.0, uncore
    "fakepcilocalities": {0: 14, 1: 4, 2: 6, 3: 6},
}


@pytest.mark.parametrize("tree", SYSFS_TREES)
def test_discovery_agrees_with_the_files(topologies: dict[str, Topology], tree: str) -> None:
    topo = topologies[tree]
    got = numad_facts(topo, lambda kb: f"{kb}kB")
    expected = SYSFS_FACTS[tree]
    assert {fact: got[fact] for fact in expected} == expected
    if tree in SYSFS_PCI_NODES:
        assert Counter(d.numa_node for d in topo.pci_devices) == SYSFS_PCI_NODES[tree]


def test_hugepage_pools_of_a_kernel_without_numa(topologies: dict[str, Topology]) -> None:
    # /sys/kernel/mm/hugepages: hugepages-2048kB and hugepages-16777216kB, one page each.
    (node,) = topologies["2i386-2t-hugepagesizecount"].nodes
    assert [(p.size_kb, p.total, p.free) for p in node.hugepages] == [
        (2048, 1, 0),
        (16777216, 1, 0),
    ]
    (node,) = topologies["2i386-2c-nohugepage"].nodes
    assert node.hugepages == ()


def test_overlapping_nodes_are_named_in_the_notes(topologies: dict[str, Topology]) -> None:
    topo = topologies["fakeheterocpunuma"]
    contested = {
        int(note.split("cpu ")[1].split()[0])
        for note in topo.notes
        if "also in the cpulist" in note
    }
    assert contested == set(range(16, 24))
    assert [c.id for c in topo.all_cpus if c.node is None] == [4, 5, 6, 7]


@pytest.mark.parametrize("tree", MORE_TREES)
def test_model_is_consistent(topologies: dict[str, Topology], tree: str) -> None:
    """Cores partition the online CPUs inside one package each; nodes are disjoint."""
    topo = topologies[tree]
    seen: set[int] = set()
    for core in topo.cores:
        assert core.id == core.cpus.min()
        assert core.cpus.issubset(topo.package(core.package).cpus)
        assert seen.isdisjoint(core.cpus)
        seen |= set(core.cpus)
        assert all(topo.core_of(c) is core for c in core.cpus)
    assert seen == set(topo.online_cpus)
    assert sum(len(p.cpus) for p in topo.packages) == len(topo.online_cpus)
    in_nodes = [c for n in topo.nodes for c in n.cpus]
    assert len(in_nodes) == len(set(in_nodes))
    assert all(topo.cpu(c).node == n.id for n in topo.nodes for c in n.cpus)
    for group in topo.l3_groups:
        assert all(topo.cpu(c).l3 == group.id for c in group.cpus)
        # Every thread of a core shares its caches.
        assert all(topo.core_of(c).cpus.issubset(group.cpus) for c in group.cpus)
