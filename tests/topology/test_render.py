"""Rendering: the JSON contract external tools rely on, and the text tree people read."""

from __future__ import annotations

import json
from types import MappingProxyType
from typing import TypeVar

import pytest

from numad.cpuset import CPUSet
from numad.hostfs import HostFS
from numad.topology.discover import discover
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
from numad.topology.render import to_json, to_text
from tests.conftest import CATALOGUE, Machines

GIB_KB = 1024 * 1024
_T = TypeVar("_T")


def _distances(row: dict[int, int]) -> MappingProxyType[int, int]:
    return MappingProxyType(row)


def two_socket(*, reverse: bool = False) -> Topology:
    """2 packages x 4 cores x 2 threads, one node and one L3 per package, a
    memory-only node 2 (CXL-like), CPU 16 offline, three PCI devices.

    ``reverse`` builds the same machine with every tuple in reverse order.
    """
    cpus = []
    cores = []
    for cpu in range(16):
        package = (cpu % 8) // 4
        core = cpu % 8
        cpus.append(
            CPU(
                id=cpu,
                online=True,
                node=package,
                package=package,
                die=0,
                core=core,
                core_id=core % 4,
                l3=package,
            )
        )
    cpus.append(CPU(id=16, online=False, node=None))
    for core in range(8):
        cores.append(
            Core(id=core, package=core // 4, die=0, core_id=core % 4, cpus=CPUSet((core, core + 8)))
        )
    pkg_cpus = [CPUSet((0, 1, 2, 3, 8, 9, 10, 11)), CPUSet((4, 5, 6, 7, 12, 13, 14, 15))]
    nodes = [
        NumaNode(
            id=0,
            cpus=pkg_cpus[0],
            memory_total_kb=47_919_812,
            memory_free_kb=42_048_000,
            hugepages=(HugePages(2048, 512, 500), HugePages(1_048_576, 4, 4)),
            distances=_distances({0: 10, 1: 21, 2: 30}),
        ),
        NumaNode(
            id=1,
            cpus=pkg_cpus[1],
            memory_total_kb=48 * GIB_KB,
            memory_free_kb=None,
            hugepages=(HugePages(2048, 0, 0),),
            distances=_distances({0: 21, 1: 10, 2: 30}),
        ),
        NumaNode(id=2, cpus=CPUSet(), memory_total_kb=None, distances=None),
    ]
    devices = [
        PciDevice("0000:3b:00.0", 0, "0x15b3", "0x1017", "0x020000", "mlx5_core", pkg_cpus[0]),
        PciDevice("0000:af:00.0", 1, "0x10de", "0x20b0", "0x030200", None, None),
        PciDevice("0000:00:1f.2", None, "0x8086", "0xa182", "0x010601", "ahci", None),
    ]

    return Topology(
        all_cpus=_order(cpus, reverse),
        nodes=_order(nodes, reverse),
        packages=_order([Package(0, pkg_cpus[0]), Package(1, pkg_cpus[1])], reverse),
        cores=_order(cores, reverse),
        l3_groups=(
            CacheGroup(0, pkg_cpus[0], cache_id=0, size_kb=36_608),
            CacheGroup(1, pkg_cpus[1], cache_id=1, size_kb=36_608),
        ),
        pci_devices=_order(devices, reverse),
        isolated=CPUSet((2, 3)),
        nohz_full=CPUSet((2, 3, 10, 11)),
        notes=("/sys/devices/system/node/node2/distance: not a distance row: 'x'",),
    )


def _order(items: list[_T], reverse: bool) -> tuple[_T, ...]:
    return tuple(reversed(items)) if reverse else tuple(items)


# -- JSON ----------------------------------------------------------------------


def _assert_int_list(value: object) -> None:
    assert isinstance(value, list)
    assert all(type(v) is int for v in value)
    assert value == sorted(value)


def _assert_optional_int(value: object) -> None:
    assert value is None or type(value) is int


def test_json_has_the_contract_shape() -> None:
    data = to_json(two_socket())
    assert json.loads(json.dumps(data)) == data  # plain JSON values only
    assert {"packages", "cores", "numa_nodes", "cpus", "pci"} <= set(data)

    packages = data["packages"]
    assert isinstance(packages, list)
    for package in packages:
        assert {"id", "cpus"} <= set(package)
        assert type(package["id"]) is int
        _assert_int_list(package["cpus"])

    assert type(data["cores"]) is int

    nodes = data["numa_nodes"]
    assert isinstance(nodes, dict)
    for key, node in nodes.items():
        assert isinstance(key, str)
        assert key.isdigit()
        assert {"cpus", "memory_kb", "hugepages", "distances"} <= set(node)
        _assert_int_list(node["cpus"])
        _assert_optional_int(node["memory_kb"])
        assert isinstance(node["hugepages"], dict)
        for size, pool in node["hugepages"].items():
            assert isinstance(size, str)
            assert size.isdigit()
            assert set(pool) == {"total", "free"}
            assert type(pool["total"]) is int
            assert type(pool["free"]) is int
        distances = node["distances"]
        assert distances is None or isinstance(distances, dict)
        for other, distance in (distances or {}).items():
            assert isinstance(other, str)
            assert other.isdigit()
            assert type(distance) is int

    cpus = data["cpus"]
    assert isinstance(cpus, list)
    for cpu in cpus:
        assert {"id", "online", "package", "die", "core", "node", "l3"} <= set(cpu)
        assert type(cpu["id"]) is int
        assert type(cpu["online"]) is bool
        for key in ("package", "die", "core", "node", "l3"):
            _assert_optional_int(cpu[key])

    pci = data["pci"]
    assert isinstance(pci, list)
    for device in pci:
        assert {"address", "numa_node", "class", "vendor", "device"} <= set(device)
        assert isinstance(device["address"], str)
        _assert_optional_int(device["numa_node"])
        for key in ("class", "vendor", "device"):
            assert device[key] is None or isinstance(device[key], str)


def test_json_values_of_a_two_socket_machine() -> None:
    data = to_json(two_socket())
    assert data["packages"] == [
        {"id": 0, "cpus": [0, 1, 2, 3, 8, 9, 10, 11]},
        {"id": 1, "cpus": [4, 5, 6, 7, 12, 13, 14, 15]},
    ]
    assert data["cores"] == 8
    nodes = data["numa_nodes"]
    assert isinstance(nodes, dict)
    assert list(nodes) == ["0", "1", "2"]
    assert nodes["0"]["memory_kb"] == 47_919_812
    assert nodes["0"]["hugepages"] == {
        "2048": {"total": 512, "free": 500},
        "1048576": {"total": 4, "free": 4},
    }
    assert nodes["0"]["distances"] == {"0": 10, "1": 21, "2": 30}
    assert nodes["2"] == {
        "cpus": [],
        "memory_kb": None,
        "memory_free_kb": None,
        "hugepages": {},
        "distances": None,
    }
    cpus = data["cpus"]
    assert isinstance(cpus, list)
    assert [c["id"] for c in cpus] == list(range(17))
    nine = {"id": 9, "online": True, "package": 0, "die": 0, "core": 1, "node": 0, "l3": 0}
    assert cpus[9].items() >= nine.items()
    offline = {"id": 16, "online": False, "package": None, "core": None, "node": None}
    assert cpus[16].items() >= offline.items()
    assert data["pci"] == [
        {
            "address": "0000:00:1f.2",
            "numa_node": None,
            "class": "0x010601",
            "vendor": "0x8086",
            "device": "0xa182",
            "driver": "ahci",
            "local_cpus": None,
            "path": [],
            "switch": None,
        },
        {
            "address": "0000:3b:00.0",
            "numa_node": 0,
            "class": "0x020000",
            "vendor": "0x15b3",
            "device": "0x1017",
            "driver": "mlx5_core",
            "local_cpus": [0, 1, 2, 3, 8, 9, 10, 11],
            "path": [],
            "switch": None,
        },
        {
            "address": "0000:af:00.0",
            "numa_node": 1,
            "class": "0x030200",
            "vendor": "0x10de",
            "device": "0x20b0",
            "driver": None,
            "local_cpus": None,
            "path": [],
            "switch": None,
        },
    ]
    assert data["online_cpus"] == list(range(16))
    assert data["isolated"] == [2, 3]
    assert data["nohz_full"] == [2, 3, 10, 11]
    assert data["l3_groups"] == [
        {"id": 0, "cpus": [0, 1, 2, 3, 8, 9, 10, 11], "cache_id": 0, "size_kb": 36_608},
        {"id": 1, "cpus": [4, 5, 6, 7, 12, 13, 14, 15], "cache_id": 1, "size_kb": 36_608},
    ]


def test_json_and_text_do_not_depend_on_tuple_order() -> None:
    assert to_json(two_socket(reverse=True)) == to_json(two_socket())
    assert to_text(two_socket(reverse=True)) == to_text(two_socket())


# -- text ----------------------------------------------------------------------


def test_text_tree_of_a_two_socket_machine() -> None:
    text = to_text(two_socket())
    lines = text.splitlines()
    assert (
        lines[0] == "Machine: 2 packages, 3 NUMA nodes (1 memory-only), 8 cores, CPUs 16/17 online"
    )
    tree = "\n".join(
        [
            "Package 0: 4 cores, cpus 0-3,8-11",
            "  NUMA node 0: cpus 0-3,8-11",
            "    L3 0 (35.8 MiB): cpus 0-3,8-11",
            "      core 0: cpus 0,8",
            "      core 1: cpus 1,9",
            "      core 2: cpus 2,10",
            "      core 3: cpus 3,11",
            "Package 1: 4 cores, cpus 4-7,12-15",
            "  NUMA node 1: cpus 4-7,12-15",
            "    L3 1 (35.8 MiB): cpus 4-7,12-15",
            "      core 4: cpus 4,12",
        ]
    )
    assert tree in text
    assert text.endswith("\n")


def test_text_memory_hugepages_and_memory_only_nodes() -> None:
    text = to_text(two_socket())
    assert "  node 0: cpus 0-3,8-11 in package 0\n" in text
    assert "    memory: 45.7 GiB total, 40.1 GiB free\n" in text
    assert "    hugepages: 2 MiB 512 total / 500 free, 1 GiB 4 total / 4 free\n" in text
    assert "    memory: 48.0 GiB total\n" in text  # free unknown
    assert "  node 2: no CPUs (memory only)\n    memory: unknown\n" in text


def test_text_cpu_states() -> None:
    text = to_text(two_socket())
    assert "Offline CPUs: 16\n" in text
    assert "Isolated CPUs (isolcpus): 2-3\n" in text
    assert "nohz_full CPUs: 2-3,10-11\n" in text


def test_text_distance_table() -> None:
    text = to_text(two_socket())
    table = "\n".join(
        [
            "Node distances:",
            "  node   0   1   2",
            "     0  10  21  30",
            "     1  21  10  30",
            "     2   -   -   -",
        ]
    )
    assert table in text


def test_text_pci_devices_under_their_node() -> None:
    text = to_text(two_socket())
    section = text[text.index("PCI devices:") : text.index("Notes")]
    assert section.index("  NUMA node 0:") < section.index("0000:3b:00.0")
    assert section.index("0000:3b:00.0") < section.index("  NUMA node 1:")
    assert section.index("  NUMA node 1:") < section.index("0000:af:00.0")
    assert section.index("0000:af:00.0") < section.index("  no NUMA node:")
    assert section.index("  no NUMA node:") < section.index("0000:00:1f.2")
    assert "network [0x020000]" in section
    assert "15b3:1017  driver mlx5_core" in section
    assert "storage [0x010601]" in section


def test_text_notes_come_last() -> None:
    text = to_text(two_socket())
    assert text.endswith(
        "Notes (quirks discovery worked around):\n"
        "  - /sys/devices/system/node/node2/distance: not a distance row: 'x'\n"
    )


def _spanning() -> Topology:
    """One package, two sub-NUMA nodes (SNC) sharing one L3; node 1 also holds
    the CPUs of a second package: a node spanning packages, a package spanning
    nodes, an L3 spanning nodes."""
    cpus = tuple(
        CPU(
            id=c,
            online=True,
            node=0 if c < 2 else 1,
            package=0 if c < 4 else 1,
            core=c,
            l3=0 if c < 4 else None,
        )
        for c in range(6)
    )
    return Topology(
        all_cpus=cpus,
        nodes=(
            NumaNode(0, CPUSet((0, 1)), distances=_distances({0: 10, 1: 11})),
            NumaNode(1, CPUSet((2, 3, 4, 5)), distances=_distances({0: 11, 1: 10})),
        ),
        packages=(Package(0, CPUSet((0, 1, 2, 3))), Package(1, CPUSet((4, 5)))),
        cores=tuple(Core(c, 0 if c < 4 else 1, None, c, CPUSet((c,))) for c in range(6)),
        l3_groups=(CacheGroup(0, CPUSet((0, 1, 2, 3)), size_kb=32768),),
    )


def test_text_marks_parts_of_spanning_nodes_and_caches() -> None:
    text = to_text(_spanning())
    tree = "\n".join(
        [
            "Package 0: 4 cores, cpus 0-3",
            "  NUMA node 0: cpus 0-1",
            "    L3 0 (32 MiB, part of cpus 0-3): cpus 0-1",
            "      core 0: cpus 0",
            "      core 1: cpus 1",
            "  NUMA node 1 (part of cpus 2-5): cpus 2-3",
            "    L3 0 (32 MiB, part of cpus 0-3): cpus 2-3",
            "      core 2: cpus 2",
            "      core 3: cpus 3",
            "Package 1: 2 cores, cpus 4-5",
            "  NUMA node 1 (part of cpus 2-5): cpus 4-5",
            "    core 4: cpus 4",
            "    core 5: cpus 5",
        ]
    )
    assert tree in text
    assert "  node 1: cpus 2-5 in packages 0,1\n" in text
    assert "PCI devices: none\n" in text
    assert "Notes" not in text


# -- every recorded machine ----------------------------------------------------

NAMES = [entry["name"] for entry in CATALOGUE]


@pytest.mark.parametrize("name", NAMES)
def test_every_recorded_machine_renders(machines: Machines, name: str) -> None:
    topo = discover(HostFS(machines.root(name)))
    data = to_json(topo)
    assert json.loads(json.dumps(data)) == data
    text = to_text(topo)
    assert text.startswith(f"Machine: {len(topo.packages)} package")
    # Each online CPU sits in exactly one core line of the tree.
    threads = [
        int(c)
        for line in text.splitlines()
        if line.lstrip().startswith("core ")
        for c in line.split("cpus ")[1].split(",")
    ]
    assert sorted(threads) == list(topo.online_cpus)
    for node in topo.nodes:
        assert f"  node {node.id}: " in text
