"""Who holds what, for the picture: reserved CPUs, each workload's exclusive CPUs and
devices (every other online CPU is in the shared pool), and each node's memory as
numad's books have it (held by workloads, free to admit).

Pure, plus one reader at the edge: ``from_api`` takes the answers of the daemon's
``GET /v1/workloads``, ``GET /v1/host`` and ``GET /v1/nrt`` (or the same views in
process), so the CLI and the live page draw the same holders from the same words.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from numad.cpuset import CPUSet
from numad.errors import NumadError


class Kind(StrEnum):
    """Who holds a CPU; the value is the CSS class the picture gives it."""

    RESERVED = "reserved"
    SHARED = "shared"
    EXCLUSIVE = "exclusive"
    OFFLINE = "offline"


@dataclass(frozen=True, slots=True)
class Workload:
    """One workload's exclusive CPUs and the PCI devices (addresses) it holds."""

    name: str
    cpus: CPUSet
    devices: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NodeMemory:
    """One node's ordinary memory in numad's books, in bytes: ``allocatable`` is what
    workloads may hold (the total less the system's reservation and the hugepages),
    ``free`` what is not held."""

    node: int
    total: int
    allocatable: int
    free: int

    @property
    def held(self) -> int:
        return max(0, self.allocatable - self.free)


@dataclass(frozen=True, slots=True)
class Holders:
    """The CPUs, devices and memory held on one machine. Workloads hold disjoint CPUs.
    ``memory`` is empty where numad's books are not known (no daemon): then nothing
    is held."""

    reserved: CPUSet = field(default_factory=CPUSet)
    workloads: tuple[Workload, ...] = ()
    memory: tuple[NodeMemory, ...] = ()

    def memory_of(self, node: int) -> NodeMemory | None:
        return next((m for m in self.memory if m.node == node), None)

    def holder(self, cpu: int) -> tuple[Kind, int | None]:
        """The kind of holder of an online ``cpu``, and the workload's index for EXCLUSIVE."""
        for index, w in enumerate(self.workloads):
            if cpu in w.cpus:
                return Kind.EXCLUSIVE, index
        return (Kind.RESERVED if cpu in self.reserved else Kind.SHARED), None

    def device_holder(self, address: str) -> int | None:
        """The index of the workload holding the device at ``address``, if one does."""
        for index, w in enumerate(self.workloads):
            if address in w.devices:
                return index
        return None


NOBODY = Holders()


def from_api(
    workloads: Sequence[Mapping[str, Any]],
    host: Mapping[str, Any],
    nrt: Mapping[str, Any] | None = None,
) -> Holders:
    """The holders named by ``/v1/workloads``' list, ``/v1/host`` and ``/v1/nrt``.

    A container's CPUs count only where it is exclusive: a shared container lists the
    shared pool, which is nobody's. A workload holding no exclusive CPU and no device
    is still listed, so the legend names every admitted workload.
    """
    try:
        listed = tuple(_workload(w) for w in workloads)
        reserved = CPUSet.parse_list(str(host.get("reserved", "")))
        memory = () if nrt is None else _memory(nrt)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise NumadError("numad API", f"a workload or host view is not as served: {err!r}") from err
    return Holders(reserved=reserved, workloads=listed, memory=memory)


def _memory(nrt: Mapping[str, Any]) -> tuple[NodeMemory, ...]:
    """Each zone's ``memory`` resource: capacity, allocatable, available (bytes)."""
    found = []
    for zone in nrt["zones"]:
        node = int(str(zone["name"]).removeprefix("node-"))
        for r in zone.get("resources", ()):
            if r["name"] == "memory":
                total, allocatable = int(r["capacity"]), int(r["allocatable"])
                found.append(NodeMemory(node, total, allocatable, int(r["available"])))
    return tuple(found)


def _workload(w: Mapping[str, Any]) -> Workload:
    cpus = CPUSet()
    devices: list[str] = []
    for c in w["containers"].values():
        if c["exclusive"]:
            cpus |= CPUSet.parse_list(c["cpus"])
        devices += _addresses(c["devices"].values())
    return Workload(str(w["name"]), cpus, tuple(sorted(set(devices))))


def _addresses(groups: Iterable[Iterable[str]]) -> list[str]:
    return [str(a) for group in groups for a in group]
