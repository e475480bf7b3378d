"""The CPU manager's view of the machine: each online CPU's core, socket, NUMA node, uncore cache.

Pure core. Sets are integer bit masks over CPU ids (the fast form of CPUSet)
so that the allocator's many "free CPUs in this domain" questions are one AND
and one popcount. Core ids are the lowest thread id of the core, as the
kubelet numbers them; the uncore id falls back to the socket id where a core
has no L3 (as the kubelet's does).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from numad.topology.model import Topology


@dataclass(frozen=True, slots=True)
class CPUInfo:
    cpu: int
    core: int
    socket: int
    numa: int
    uncore: int


def _group(cpus: Iterable[CPUInfo], attr: str) -> dict[int, int]:
    masks: dict[int, int] = {}
    for c in cpus:
        key = getattr(c, attr)
        masks[key] = masks.get(key, 0) | (1 << c.cpu)
    return masks


@dataclass(frozen=True)
class CPUTopology:
    """Online CPUs and the kubelet's counters (which drive its integer averages)."""

    cpus: tuple[CPUInfo, ...]
    num_cpus: int
    num_cores: int
    num_sockets: int
    num_numa_nodes: int
    num_uncore: int
    core: Mapping[int, int] = field(init=False)  # core id -> CPU mask
    socket: Mapping[int, int] = field(init=False)
    numa: Mapping[int, int] = field(init=False)
    uncore: Mapping[int, int] = field(init=False)
    info: Mapping[int, CPUInfo] = field(init=False)
    all: int = field(init=False)
    # Which domains meet which (static; the allocator filters them by free CPUs).
    numa_sockets: Mapping[int, tuple[int, ...]] = field(init=False)
    socket_numas: Mapping[int, tuple[int, ...]] = field(init=False)
    socket_cores: Mapping[int, tuple[int, ...]] = field(init=False)
    numa_cores: Mapping[int, tuple[int, ...]] = field(init=False)
    numa_uncores: Mapping[int, tuple[int, ...]] = field(init=False)
    uncore_cores: Mapping[int, tuple[int, ...]] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "core", _group(self.cpus, "core"))
        object.__setattr__(self, "socket", _group(self.cpus, "socket"))
        object.__setattr__(self, "numa", _group(self.cpus, "numa"))
        object.__setattr__(self, "uncore", _group(self.cpus, "uncore"))
        object.__setattr__(self, "info", {c.cpu: c for c in self.cpus})
        all_mask = 0
        for c in self.cpus:
            all_mask |= 1 << c.cpu
        object.__setattr__(self, "all", all_mask)
        pairs = {
            "numa_sockets": ("numa", "socket"),
            "socket_numas": ("socket", "numa"),
            "socket_cores": ("socket", "core"),
            "numa_cores": ("numa", "core"),
            "numa_uncores": ("numa", "uncore"),
            "uncore_cores": ("uncore", "core"),
        }
        for name, (outer, inner) in pairs.items():
            related: dict[int, set[int]] = {}
            for c in self.cpus:
                related.setdefault(getattr(c, outer), set()).add(getattr(c, inner))
            object.__setattr__(self, name, {k: tuple(sorted(v)) for k, v in related.items()})

    @classmethod
    def of(cls, cpus: Iterable[CPUInfo], counts: Mapping[str, int] | None = None) -> CPUTopology:
        """A view of ``cpus``; ``counts`` overrides the counters (kubelet test fixtures do)."""
        cpus = tuple(sorted(cpus, key=lambda c: c.cpu))
        counts = counts or {}
        return cls(
            cpus=cpus,
            num_cpus=counts.get("num_cpus", len(cpus)),
            num_cores=counts.get("num_cores", len({c.core for c in cpus})),
            num_sockets=counts.get("num_sockets", len({c.socket for c in cpus})),
            num_numa_nodes=counts.get("num_numa_nodes", len({c.numa for c in cpus})),
            num_uncore=counts.get("num_uncore_cache", len({c.uncore for c in cpus})),
        )

    @classmethod
    def from_topology(cls, topo: Topology) -> CPUTopology:
        """The view of a discovered machine: online CPUs that sit on a NUMA node."""
        infos = []
        for cpu in topo.all_cpus:
            if not cpu.online or cpu.core is None or cpu.package is None or cpu.node is None:
                continue
            l3 = topo.l3_of(cpu.id)
            infos.append(
                CPUInfo(
                    cpu=cpu.id,
                    core=cpu.core,
                    socket=cpu.package,
                    numa=cpu.node,
                    uncore=l3.id if l3 is not None else cpu.package,
                )
            )
        return cls.of(infos)

    # -- the kubelet's integer averages (reference 1, 13.2) ------------------------

    @property
    def cpus_per_core(self) -> int:
        return self.num_cpus // self.num_cores if self.num_cores else 0

    @property
    def cpus_per_socket(self) -> int:
        return self.num_cpus // self.num_sockets if self.num_sockets else 0

    @property
    def cpus_per_uncore(self) -> int:
        return self.num_cpus // self.num_uncore if self.num_uncore else 0

    # -- derived masks -----------------------------------------------------------

    def numa_mask(self, nodes: Iterable[int]) -> int:
        mask = 0
        for n in nodes:
            mask |= self.numa.get(n, 0)
        return mask

    def sockets_of(self, cpus: int) -> set[int]:
        return {s for s, m in self.socket.items() if m & cpus}

    def numas_of(self, cpus: int) -> set[int]:
        return {n for n, m in self.numa.items() if m & cpus}


def bits(mask: int) -> list[int]:
    """The set bits of ``mask``, ascending."""
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


def mask_of(ids: Iterable[int]) -> int:
    mask = 0
    for i in ids:
        mask |= 1 << i
    return mask
