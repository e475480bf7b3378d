"""The topology JSON (``numad topology --json``, ``GET /v1/topology``) read back into a
``Topology``.

Edge: a client (``numad show --svg``) gets the daemon's machine as JSON and draws it
from the model, as ``numad topology --svg`` does offline. The inverse of
``numad.topology.render.to_json``: ``from_json(to_json(t)) == t`` for every machine.
Cores are rebuilt from the CPUs (a core is the online CPUs naming it). A shape that
is not the JSON's raises ``TopologyError`` naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from numad.cpuset import CPUSet
from numad.errors import TopologyError
from numad.topology.model import (
    CPU,
    CacheGroup,
    Core,
    HugePages,
    NumaNode,
    Package,
    PciDevice,
    Topology,
)

SUBJECT = "topology JSON"


def from_json(data: Mapping[str, Any]) -> Topology:
    """The ``Topology`` whose ``to_json`` is ``data``."""
    try:
        cpus = tuple(_cpu(c) for c in data["cpus"])
        return Topology(
            all_cpus=cpus,
            nodes=tuple(_node(int(k), v) for k, v in data["numa_nodes"].items()),
            packages=tuple(Package(p["id"], CPUSet(p["cpus"])) for p in data["packages"]),
            cores=_cores(cpus),
            l3_groups=tuple(
                CacheGroup(g["id"], CPUSet(g["cpus"]), g["cache_id"], g["size_kb"])
                for g in data["l3_groups"]
            ),
            pci_devices=tuple(_pci(d) for d in data["pci"]),
            isolated=CPUSet(data["isolated"]),
            nohz_full=CPUSet(data["nohz_full"]),
            notes=tuple(data["notes"]),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise TopologyError(SUBJECT, f"not the shape of `numad topology --json`: {err!r}") from err


def _cpu(c: Mapping[str, Any]) -> CPU:
    return CPU(
        id=c["id"],
        online=c["online"],
        node=c["node"],
        package=c["package"],
        die=c["die"],
        cluster=c["cluster"],
        core=c["core"],
        core_id=c["core_id"],
        l3=c["l3"],
    )


def _node(node_id: int, n: Mapping[str, Any]) -> NumaNode:
    distances = n["distances"]
    return NumaNode(
        id=node_id,
        cpus=CPUSet(n["cpus"]),
        memory_total_kb=n["memory_kb"],
        memory_free_kb=n["memory_free_kb"],
        hugepages=tuple(
            HugePages(int(size), h["total"], h["free"]) for size, h in n["hugepages"].items()
        ),
        distances=None if distances is None else {int(k): v for k, v in distances.items()},
    )


def _pci(d: Mapping[str, Any]) -> PciDevice:
    local = d["local_cpus"]
    return PciDevice(
        address=d["address"],
        numa_node=d["numa_node"],
        vendor=d["vendor"],
        device=d["device"],
        pci_class=d["class"],
        driver=d["driver"],
        local_cpus=None if local is None else CPUSet(local),
        # Absent from the JSON of a numad before the PCIe tree (issue 27).
        path=tuple(d.get("path", ())),
    )


def _cores(cpus: tuple[CPU, ...]) -> tuple[Core, ...]:
    threads: dict[int, list[CPU]] = {}
    for c in cpus:
        if c.online and c.core is not None:
            threads.setdefault(c.core, []).append(c)
    cores = []
    for core_id in sorted(threads):
        first = min(threads[core_id], key=lambda c: c.id)
        if first.package is None:
            raise TypeError(f"cpu {first.id} is online in core {core_id} but has no package")
        cores.append(
            Core(
                id=core_id,
                package=first.package,
                die=first.die,
                core_id=first.core_id,
                cpus=CPUSet(c.id for c in threads[core_id]),
            )
        )
    return tuple(cores)
