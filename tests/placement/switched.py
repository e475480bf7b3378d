"""A constructed 2-node machine with PCIe switches, for device picking by locality.

Each node: 8 cores x 2 threads (CPUs 16n+k and 16n+k+8), two L3 groups of 4 cores,
16 GiB, and two host bridges, each with its devices' ``local_cpus`` its own L3
group's CPUs:

    host bridge A   root port 0 -> switch: gpu, gpu, nic
                    root port 1 -> switch: gpu, gpu, nic
    host bridge B   root port 2 -> switch: gpu, gpu
                    root port 3 -> gpu (no switch)
                    root port 4 -> nic (no switch)

7 GPUs (vendor 0x10de) and 3 NICs (vendor 0x15b3) a node. Device addresses are
dealt so that the lowest ones sit under different switches: the kubelet's order
spreads a pair that locality keeps together.
"""

from __future__ import annotations

from dataclasses import replace

from numad.cpuset import CPUSet
from numad.placement.managers.device import DeviceClass, Pick
from numad.topology.model import CPU, CacheGroup, Core, NumaNode, Package, PciDevice, Topology

GPU, NIC = "0x10de", "0x15b3"
# (root port, switch or None, vendor) in the order addresses are dealt within a node
_LAYOUT = (
    (0, True, GPU),
    (2, True, GPU),
    (3, False, GPU),
    (1, True, GPU),
    (0, True, NIC),
    (4, False, NIC),
    (0, True, GPU),
    (2, True, GPU),
    (1, True, NIC),
    (1, True, GPU),
)


def machine(*, paths: bool = True) -> Topology:
    cpus, cores, packages, nodes, groups, devices = [], [], [], [], [], []
    for n in (0, 1):
        ids = list(range(16 * n, 16 * n + 16))
        for k in range(8):
            pair = (16 * n + k, 16 * n + k + 8)
            l3 = 2 * n + k // 4
            cpus += [CPU(c, True, n, n, core=pair[0], l3=l3) for c in pair]
            cores.append(Core(pair[0], n, None, k, CPUSet(pair)))
        for half in (0, 1):
            group = [16 * n + 4 * half + k for k in range(4)]
            groups.append(CacheGroup(2 * n + half, CPUSet(group + [c + 8 for c in group])))
        packages.append(Package(n, CPUSet(ids)))
        nodes.append(
            NumaNode(n, CPUSet(ids), 1 << 24, 1 << 24, (), {0: 10 + 11 * n, 1: 21 - 11 * n})
        )
        devices += _devices(n, groups[-2:], paths)
    cpus.sort(key=lambda c: c.id)
    return Topology(
        tuple(cpus), tuple(nodes), tuple(packages), tuple(cores), tuple(groups), tuple(devices)
    )


def _devices(node: int, groups: list[CacheGroup], paths: bool) -> list[PciDevice]:
    base = 0x80 * node
    out = []
    for i, (port, switch, vendor) in enumerate(_LAYOUT):
        bridge = 0 if port < 2 else 1
        top = f"pci0000:{base + 0x40 * bridge:02x}"
        root = f"0000:{base + 0x40 * bridge:02x}:{port + 1:02x}.0"
        path: tuple[str, ...] = (top, root)
        if switch:
            upstream = f"0000:{base + 0x30 + port:02x}:00.0"
            path += (upstream, f"0000:{base + 0x38 + port:02x}:{i:02x}.0")
        devices = PciDevice(
            f"0000:{base + 0x10 + i:02x}:00.0",
            node,
            vendor,
            local_cpus=groups[bridge].cpus,
            path=path if paths else (),
        )
        out.append(devices)
    return out


def classes(gpu: Pick = Pick.LOCALITY, nic: Pick = Pick.LOCALITY) -> list[DeviceClass]:
    return [DeviceClass("gpu", vendor=GPU, pick=gpu), DeviceClass("nic", vendor=NIC, pick=nic)]


def without_paths(topo: Topology) -> Topology:
    return replace(topo, pci_devices=tuple(replace(d, path=()) for d in topo.pci_devices))
