"""The emulated machines: each one's QEMU arguments and what the guest must then show.

A ``Machine`` states the topology once (sockets, dies, cores, threads, which CPUs
and how much memory each NUMA node has, the distances, a PCI device's node); both
the QEMU command line and the expected ``numad topology --json`` facts are derived
from that statement, never from numad's output.

QEMU numbers CPUs socket-major (socket, die, core, thread), as the guest kernel does
for the CPUs present at boot; ``-cpu max,vendor=GenuineIntel`` makes TCG report SMT
and dies (the AMD default drops them).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

# The PCI device behind the expander bridge: virtio-rng, modern-only under a PCIe port.
RNG_VENDOR, RNG_DEVICE = "0x1af4", "0x1044"
RNG_ADDRESS = "0000:81:00.0"  # pxb-pcie bus_nr=128: root port on bus 0x80, device on 0x81


@dataclass(frozen=True)
class Node:
    id: int
    cpus: tuple[int, ...]
    memory_mib: int  # 0: a memory-less node


@dataclass(frozen=True)
class Machine:
    name: str
    sockets: int
    dies: int
    cores: int
    threads: int
    nodes: tuple[Node, ...]
    distances: dict[tuple[int, int], int] = field(default_factory=dict)  # one direction each
    pci_node: int | None = None
    present: int | None = None  # CPUs present at boot (the rest are possible, absent)

    @property
    def cpus(self) -> int:
        return self.sockets * self.dies * self.cores * self.threads

    @property
    def memory_mib(self) -> int:
        return sum(n.memory_mib for n in self.nodes)

    def qemu_args(self) -> list[str]:
        smp = (
            f"{self.present or self.cpus},maxcpus={self.cpus},sockets={self.sockets},"
            f"dies={self.dies},cores={self.cores},threads={self.threads}"
        )
        args = ["-smp", smp]
        for node in self.nodes:
            spec = f"node,nodeid={node.id}"
            if node.memory_mib:
                args += ["-object", f"memory-backend-ram,id=m{node.id},size={node.memory_mib}M"]
                spec += f",memdev=m{node.id}"
            args += ["-numa", spec]
            for cpu in node.cpus:
                args += ["-numa", f"cpu,node-id={node.id},{self._location(cpu)}"]
        for (a, b), value in sorted(self.distances.items()):
            args += ["-numa", f"dist,src={a},dst={b},val={value}"]
        if self.pci_node is not None:
            args += [
                "-device", f"pxb-pcie,id=pxb,bus_nr=128,numa_node={self.pci_node},bus=pcie.0",
                "-device", "pcie-root-port,id=rp,bus=pxb,chassis=1,slot=0",
                "-device", "virtio-rng-pci,bus=rp",
            ]  # fmt: skip
        return args

    def _location(self, cpu: int) -> str:
        thread = cpu % self.threads
        core = cpu // self.threads % self.cores
        die = cpu // (self.threads * self.cores) % self.dies
        socket = cpu // (self.threads * self.cores * self.dies)
        where = f"socket-id={socket},core-id={core},thread-id={thread}"
        return where if self.dies == 1 else f"{where},die-id={die}"

    def online_cpus(self) -> list[int]:
        return list(range(self.present or self.cpus))

    def _online_nodes(self) -> list[Node]:
        """The kernel onlines a node that has memory or a CPU present at boot."""
        online = set(self.online_cpus())
        return [n for n in self.nodes if n.memory_mib or online & set(n.cpus)]

    def expected(self) -> dict[str, Any]:
        """The facts ``numad topology --json`` must show, derived from this statement."""
        online = set(self.online_cpus())
        per_package = self.dies * self.cores * self.threads
        nodes = {}
        for node in self._online_nodes():
            others = {b: d for (a, b), d in self.distances.items() if a == node.id}
            others |= {a: d for (a, b), d in self.distances.items() if b == node.id}
            distances = {
                str(other.id): 10 if other.id == node.id else others.get(other.id, 20)
                for other in self._online_nodes()
            }
            nodes[str(node.id)] = {
                "cpus": sorted(online & set(node.cpus)),
                "memory_mib": node.memory_mib,
                "distances": distances,
            }
        return {
            "name": self.name,
            "packages": {
                str(p): sorted(online & set(range(p * per_package, (p + 1) * per_package)))
                for p in range(self.sockets)
                if online & set(range(p * per_package, (p + 1) * per_package))
            },
            "cpus": {
                str(cpu): {
                    "package": cpu // per_package,
                    "die": cpu // (self.cores * self.threads) % self.dies,
                    "core": cpu - cpu % self.threads,  # the core's lowest thread
                    "node": next(n.id for n in self.nodes if cpu in n.cpus),
                }
                for cpu in sorted(online)
            },
            "nodes": nodes,
            "pci": None
            if self.pci_node is None
            else {"address": RNG_ADDRESS, "numa_node": self.pci_node},
            "pci_vendor": RNG_VENDOR,
            "pci_device": RNG_DEVICE,
        }


def _span(first: int, count: int) -> tuple[int, ...]:
    return tuple(range(first, first + count))


# 2 sockets x 2 cores x 2 threads, one node per socket, distance 21.
TWO_NODES = Machine(
    "2node", 2, 1, 2, 2,
    (Node(0, _span(0, 4), 256), Node(1, _span(4, 4), 256)),
    {(0, 1): 21},
)  # fmt: skip

MACHINES = {
    m.name: m
    for m in (
        TWO_NODES,
        # 4 nodes, one per die, asymmetric SLIT 10/12/20/32.
        Machine(
            "4node", 2, 2, 2, 1,
            tuple(Node(i, _span(2 * i, 2), 128) for i in range(4)),
            {(0, 1): 12, (0, 2): 20, (0, 3): 32, (1, 2): 32, (1, 3): 20, (2, 3): 12},
        ),
        # A third node with memory and no CPUs.
        replace(
            TWO_NODES,
            name="memonly",
            nodes=(*TWO_NODES.nodes, Node(2, (), 256)),
            distances={(0, 1): 21, (0, 2): 30, (1, 2): 30},
        ),
        # Node 1 has CPUs and no memory.
        replace(
            TWO_NODES, name="memless", nodes=(Node(0, _span(0, 4), 512), Node(1, _span(4, 4), 0))
        ),
        # Sparse node ids: node 1 owns only absent CPUs and no memory, so the kernel
        # leaves it offline and shows nodes 0 and 2 (possible CPUs 0-7, present 0-3).
        replace(
            TWO_NODES,
            name="sparse",
            nodes=(Node(0, _span(0, 4), 256), Node(1, (4, 5), 0), Node(2, (6, 7), 256)),
            distances={(0, 1): 21, (0, 2): 21, (1, 2): 21},
            present=4,
        ),
        # The PCI device behind an expander bridge on node 1.
        replace(TWO_NODES, name="pci", pci_node=1),
    )
}  # fmt: skip
