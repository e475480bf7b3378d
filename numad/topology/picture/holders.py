"""Who holds what, for the picture: reserved CPUs, each workload's exclusive CPUs and
devices; every other online CPU is in the shared pool.

Pure, plus one reader at the edge: ``from_api`` takes the answers of the daemon's
``GET /v1/workloads`` and ``GET /v1/host`` (or the same views in process), so the
CLI and the live page draw the same holders from the same words.
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
class Holders:
    """The CPUs and devices held on one machine. Workloads hold disjoint CPUs."""

    reserved: CPUSet = field(default_factory=CPUSet)
    workloads: tuple[Workload, ...] = ()

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


def from_api(workloads: Sequence[Mapping[str, Any]], host: Mapping[str, Any]) -> Holders:
    """The holders named by ``/v1/workloads``' list and ``/v1/host``.

    A container's CPUs count only where it is exclusive: a shared container lists the
    shared pool, which is nobody's. A workload holding no exclusive CPU and no device
    is still listed, so the legend names every admitted workload.
    """
    try:
        listed = tuple(_workload(w) for w in workloads)
        reserved = CPUSet.parse_list(str(host.get("reserved", "")))
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise NumadError("numad API", f"a workload or host view is not as served: {err!r}") from err
    return Holders(reserved=reserved, workloads=listed)


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
