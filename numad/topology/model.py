"""The topology model: an immutable picture of one machine.

Pure values, built by ``numad.topology.discover`` and read by every later
stage. Vocabulary follows hwloc: ids are the kernel's OS indexes; a CPU is one
hardware thread (a PU); a core is a physical core (its SMT threads: the sibling
set, split by core_id where an AMD compute unit's two cores share one); a package
is a socket. Only online CPUs belong to cores, packages, L3 groups and the
``cpus`` of a node: offline CPUs keep no topology in sysfs. ``all_cpus``
lists every CPU the kernel knows of, online or not.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NewType

from numad.cpuset import CPUSet, NodeSet

CPUId = NewType("CPUId", int)
NodeId = NewType("NodeId", int)


@dataclass(frozen=True, slots=True)
class CPU:
    """One logical CPU (hardware thread)."""

    id: int
    online: bool
    node: int | None  # None: the kernel puts it on no (online) NUMA node
    package: int | None = None  # None for offline CPUs
    die: int | None = None
    cluster: int | None = None
    core: int | None = None  # numad's core id: the lowest thread of the core
    core_id: int | None = None  # the kernel's core_id, unique only per package/die
    l3: int | None = None  # id of its L3 group, None where it has no L3


@dataclass(frozen=True, slots=True)
class Core:
    """A physical core; ``id`` is its lowest online thread, as the kubelet numbers cores."""

    id: int
    package: int
    die: int | None
    core_id: int | None
    cpus: CPUSet


@dataclass(frozen=True, slots=True)
class Package:
    """A socket; ``id`` is ``physical_package_id``, or a synthesized index where that is -1."""

    id: int
    cpus: CPUSet


@dataclass(frozen=True, slots=True)
class CacheGroup:
    """CPUs sharing one L3 cache; ``id`` is the group's index in order of lowest CPU."""

    id: int
    cpus: CPUSet
    cache_id: int | None = None  # the kernel's cache/indexN/id, where present
    size_kb: int | None = None


@dataclass(frozen=True, slots=True)
class HugePages:
    """One hugepage size on one node."""

    size_kb: int
    total: int
    free: int


@dataclass(frozen=True, slots=True)
class NumaNode:
    """One online NUMA node. ``cpus`` are its online CPUs (empty for memory-only nodes)."""

    id: int
    cpus: CPUSet
    memory_total_kb: int | None = None
    memory_free_kb: int | None = None
    hugepages: tuple[HugePages, ...] = ()
    # Distance to every node with a known distance, or None where the kernel
    # gave no usable distance row.
    distances: Mapping[int, int] | None = None


@dataclass(frozen=True, slots=True)
class PciDevice:
    """One PCI function; text fields are the sysfs values, lower case (``0x8086``)."""

    address: str
    numa_node: int | None  # None: numa_node was -1, the device has no NUMA node
    vendor: str | None = None
    device: str | None = None
    pci_class: str | None = None
    driver: str | None = None
    local_cpus: CPUSet | None = None
    # Its place in the PCIe tree, from the top: the host bridge (``pci0000:17``),
    # the root port, then any switch ports above it (``numad.topology.pcie``);
    # empty where sysfs does not show the tree.
    path: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Topology:
    """The whole machine. Build with ``Topology.build``; never mutate."""

    all_cpus: tuple[CPU, ...]
    nodes: tuple[NumaNode, ...]
    packages: tuple[Package, ...]
    cores: tuple[Core, ...]
    l3_groups: tuple[CacheGroup, ...]
    pci_devices: tuple[PciDevice, ...] = ()
    isolated: CPUSet = field(default_factory=CPUSet)
    nohz_full: CPUSet = field(default_factory=CPUSet)
    # What discovery had to work around, one line per quirk met (for `topology`).
    notes: tuple[str, ...] = ()
    _cpu: Mapping[int, CPU] = field(default_factory=dict, repr=False, compare=False)
    _node: Mapping[int, NumaNode] = field(default_factory=dict, repr=False, compare=False)
    _package: Mapping[int, Package] = field(default_factory=dict, repr=False, compare=False)
    _core: Mapping[int, Core] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_cpu", MappingProxyType({c.id: c for c in self.all_cpus}))
        object.__setattr__(self, "_node", MappingProxyType({n.id: n for n in self.nodes}))
        object.__setattr__(self, "_package", MappingProxyType({p.id: p for p in self.packages}))
        object.__setattr__(self, "_core", MappingProxyType({c.id: c for c in self.cores}))

    # -- sets --------------------------------------------------------------

    @property
    def online_cpus(self) -> CPUSet:
        return CPUSet(c.id for c in self.all_cpus if c.online)

    @property
    def node_ids(self) -> NodeSet:
        return NodeSet(n.id for n in self.nodes)

    # -- lookups -----------------------------------------------------------

    def cpu(self, cpu_id: int) -> CPU:
        return self._cpu[cpu_id]

    def node(self, node_id: int) -> NumaNode:
        return self._node[node_id]

    def package(self, package_id: int) -> Package:
        return self._package[package_id]

    def core(self, core_id: int) -> Core:
        """The physical core whose lowest online thread is ``core_id``."""
        return self._core[core_id]

    def cpus_of_node(self, node_id: int) -> CPUSet:
        return self._node[node_id].cpus

    def cpus_of_package(self, package_id: int) -> CPUSet:
        return self._package[package_id].cpus

    def core_of(self, cpu_id: int) -> Core:
        core = self._cpu[cpu_id].core
        if core is None:
            raise KeyError(f"cpu {cpu_id} is offline and belongs to no core")
        return self._core[core]

    def siblings(self, cpu_id: int) -> CPUSet:
        """The online SMT threads of ``cpu_id``'s core, itself included."""
        return self.core_of(cpu_id).cpus

    def l3_of(self, cpu_id: int) -> CacheGroup | None:
        l3 = self._cpu[cpu_id].l3
        return None if l3 is None else self.l3_groups[l3]

    def distance(self, a: int, b: int) -> int | None:
        distances = self._node[a].distances
        return None if distances is None else distances.get(b)

    def nodes_of_cpus(self, cpus: CPUSet) -> NodeSet:
        return NodeSet(n for c in cpus if (n := self._cpu[c].node) is not None)

    def devices_of_node(self, node_id: int | None) -> tuple[PciDevice, ...]:
        return tuple(d for d in self.pci_devices if d.numa_node == node_id)
