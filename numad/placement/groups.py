"""Aligned pairs: each device of a container with the CPUs and memory that go with it.

Placement stage, pure; numad's own (the kubelet has no such notion). A container's
devices that have a NUMA node, in the order (node, class, address), each get an
equal share of its exclusive CPUs (``shares``). Two uses:

* Admission under the Topology Manager option ``align-per-resource`` asks the CPU
  manager for the devices' shares on their nodes first, near their local CPUs
  (``cpu_first``), and the memory manager for each device node's share of every
  amount (``memory_weights``), when no single preferred mask holds a best-effort
  container's request.
* ``groups`` reads the pairs back from what a container holds (its devices, CPUs
  and memory per node, from the books: restored workloads have them too), so
  ``show`` and ``numad run`` can say which CPUs and memory belong with which device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from numad.cpuset import CPUSet
from numad.placement.managers.cpu.topology import CPUTopology, bits
from numad.placement.managers.device import Device

Located = Sequence[tuple[str, Device]]  # (class, device with a node), DeviceState.located


@dataclass(frozen=True, slots=True)
class Group:
    """One device and what goes with it."""

    device_class: str
    device: str  # its PCI address
    node: int
    cpus: CPUSet
    memory: int  # bytes of the container's memory (every resource) on ``node``, its part
    local: bool  # it has CPUs, and all of them are on ``node``


def shares(total: int, parts: int) -> list[int]:
    """``total`` in ``parts`` shares: ``total // parts`` each, the first
    ``total % parts`` one more."""
    if parts <= 0:
        return []
    each, more = divmod(total, parts)
    return [each + (i < more) for i in range(parts)]


def _node(device: Device) -> int:
    assert device.node is not None  # DeviceState.located keeps only devices with a node
    return device.node


def cpu_first(devices: Located, count: int) -> tuple[tuple[int, int, int], ...]:
    """What to take first of ``count`` CPUs, for ``CPUState.allocate``: (node, how
    many, the CPUs to take them near), one entry per node and set of local CPUs
    (``local_cpulist``) of its devices, in the devices' order, with the shares of
    those devices. Where a device's local CPUs are narrower than its node (an L3
    group, a sub-NUMA cluster) each such set is asked for on its own."""
    wanted: dict[tuple[int, int], int] = {}
    for (_, device), share in zip(devices, shares(count, len(devices)), strict=True):
        local = device.local_cpus.bits if device.local_cpus is not None else 0
        where = (_node(device), local)
        wanted[where] = wanted.get(where, 0) + share
    return tuple((node, n, local) for (node, local), n in wanted.items() if n)


def memory_weights(devices: Located) -> dict[int, int]:
    """Each device node and how many of the devices sit there, for ``MemoryState.allocate``."""
    weights: dict[int, int] = {}
    for _, device in devices:
        weights[_node(device)] = weights.get(_node(device), 0) + 1
    return weights


def groups(
    devices: Located, cpus: CPUSet, memory: Mapping[int, int], topo: CPUTopology
) -> tuple[Group, ...]:
    """The container's aligned pairs, one per device of ``devices``, in their order
    (``_cpus`` says which CPUs). Memory: each node's bytes of the container
    (``memory``), split evenly among the devices on that node."""
    if not devices:
        return ()
    got = _cpus(devices, cpus, topo)
    parts = {n: shares(memory.get(n, 0), k) for n, k in memory_weights(devices).items()}
    out = []
    for (name, device), mine in zip(devices, got, strict=True):
        node = _node(device)
        mask = CPUSet(mine)
        local = bool(mine) and not mask.bits & ~topo.numa.get(node, 0)
        out.append(Group(name, device.address, node, mask, parts[node].pop(0), local))
    return tuple(out)


def _cpus(devices: Located, cpus: CPUSet, topo: CPUTopology) -> list[list[int]]:
    """Each device's CPUs: 1. each device node's CPUs of the container go to its
    devices in share sizes, a device's own local CPUs first, compact (by L3 group,
    core, id); 2. what is left over there, then the CPUs on nodes without devices
    (by node), make up the devices still short, in the same order."""
    info = topo.info

    def compact(cpu: int) -> tuple[int, int, int, int]:
        c = info.get(cpu)
        return (0, c.uncore, c.core, cpu) if c is not None else (1, 0, 0, cpu)

    by_node: dict[int, list[int]] = {}
    for cpu in sorted(bits(cpus.bits), key=compact):
        c = info.get(cpu)
        by_node.setdefault(-1 if c is None else c.numa, []).append(cpu)  # -1: not known
    want = shares(len(cpus), len(devices))
    got: list[list[int]] = [[] for _ in devices]
    spare: list[int] = []
    for node in sorted({_node(d) for _, d in devices}):
        pool = by_node.pop(node, [])
        for i, (_, device) in enumerate(devices):
            if _node(device) == node:
                local = device.local_cpus.bits if device.local_cpus is not None else 0
                mine = sorted(pool, key=lambda cpu: not (local >> cpu) & 1)[: want[i]]
                got[i] = sorted(mine, key=compact)
                taken = set(mine)
                pool = [cpu for cpu in pool if cpu not in taken]
        spare += pool
    for node in sorted(by_node, key=lambda n: (n < 0, n)):
        spare += by_node[node]
    for i in range(len(got)):
        short = want[i] - len(got[i])
        got[i] += spare[:short]
        del spare[:short]
    return got
