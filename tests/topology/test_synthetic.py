"""The GB200-like and SGI-UV-like synthetic machines of fixtures/synthetic, read
through discovery (the DGX-like one: test_dgxlike.py).

fixtures/synthetic/make.py states a GB200-like tray (2 Grace nodes and 32
CPU-less GPU-memory nodes) and an SGI-UV-like machine (64 nodes, hop-count
distances) and writes them as sysfs trees. The facts below are stated again by
hand, not taken from the script, and discovery must find them in the archives;
the archives and their catalogue entries must be what the script writes today,
so neither can drift from it.
"""

from __future__ import annotations

import bz2
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from numad.cpuset import CPUSet
from numad.hostfs import HostFS
from numad.topology.discover import discover
from numad.topology.model import Topology
from tests.conftest import FIXTURES, MACHINES, Machines

MAKE = Path(__file__).resolve().parents[2] / "fixtures" / "synthetic" / "make.py"
GB200 = "144arm-2pa72co+32gpumem-gb200like"
UV = "256intel64-64n2co2t-sgiuvlike"

GIB_KB = 1 << 20


@pytest.fixture(scope="module")
def gb200(machines: Machines) -> Topology:
    return discover(HostFS(machines.root(GB200)))


@pytest.fixture(scope="module")
def uv(machines: Machines) -> Topology:
    return discover(HostFS(machines.root(UV)))


@pytest.fixture(scope="module")
def make() -> ModuleType:
    spec = importlib.util.spec_from_file_location("synthetic_make", MAKE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[spec.name]
        raise
    return module


def _matrix(topo: Topology) -> list[list[int]]:
    ids = [n.id for n in topo.nodes]
    rows = [[topo.distance(a, b) for b in ids] for a in ids]
    return [[d for d in row if d is not None] for row in rows]  # no gap: checked by length


def _memory(topo: Topology) -> dict[int, int]:
    memory = {n.id: n.memory_total_kb for n in topo.nodes}
    return {n: kb for n, kb in memory.items() if kb is not None}


def _pools(topo: Topology, node: int) -> list[tuple[int, int, int]]:
    return [(p.size_kb, p.total, p.free) for p in topo.node(node).hugepages]


# -- GB200-like: 2 Grace nodes, 32 GPU-memory nodes ----------------------------------


def test_gb200_nodes_and_their_cpus(gb200: Topology) -> None:
    assert [n.id for n in gb200.nodes] == list(range(34))
    assert gb200.node(0).cpus == CPUSet(range(72))
    assert gb200.node(1).cpus == CPUSet(range(72, 144))
    assert [n.id for n in gb200.nodes if not n.cpus] == list(range(2, 34))
    assert list(gb200.online_cpus) == list(range(144))
    assert all(gb200.cpu(c).node == c // 72 for c in range(144))
    assert gb200.notes == ()


def test_gb200_packages_cores_and_l3(gb200: Topology) -> None:
    assert [list(p.cpus) for p in gb200.packages] == [list(range(72)), list(range(72, 144))]
    assert len(gb200.cores) == 144
    assert all(len(core.cpus) == 1 for core in gb200.cores)
    assert [list(g.cpus) for g in gb200.l3_groups] == [list(range(72)), list(range(72, 144))]
    assert {gb200.cpu(c).die for c in range(144)} == {None}  # arm64 die_id is -1


def test_gb200_memory_and_hugepages(gb200: Topology) -> None:
    memory = _memory(gb200)
    assert memory == {0: 501_991_104, 1: 503_165_632, **dict.fromkeys(range(2, 34), 22_806_528)}
    assert all(470 * GIB_KB < memory[n] < 480 * GIB_KB for n in (0, 1))
    # Eight nodes per GPU: 174 GiB (186.8 GB) of GPU memory each.
    per_gpu = [sum(memory[n] for n in range(2 + 8 * g, 10 + 8 * g)) for g in range(4)]
    assert per_gpu == [174 * GIB_KB] * 4
    assert _pools(gb200, 0) == [(2048, 4096, 4000), (1048576, 16, 16)]
    assert _pools(gb200, 1) == [(2048, 4096, 4096), (1048576, 16, 12)]
    for n in range(2, 34):
        assert _pools(gb200, n) == [(2048, 0, 0), (1048576, 0, 0)]


def test_gb200_distances(gb200: Topology) -> None:
    def grace(n: int) -> int:  # GPUs 0-1 (nodes 2-17) hang off Grace 0, GPUs 2-3 off Grace 1
        return n if n < 2 else (n - 2) // 16

    def distance(a: int, b: int) -> int:
        if a == b:
            return 10
        if a < 2 and b < 2:
            return 40
        return 80 if grace(a) == grace(b) else 120

    ids = range(34)
    assert _matrix(gb200) == [[distance(a, b) for b in ids] for a in ids]
    assert gb200.distance(0, 1) == gb200.distance(1, 0) == 40
    assert [gb200.distance(0, n) for n in (2, 17, 18, 33)] == [80, 80, 120, 120]
    assert [gb200.distance(1, n) for n in (2, 17, 18, 33)] == [120, 120, 80, 80]


def test_gb200_gpus_sit_on_the_grace_nodes(gb200: Topology) -> None:
    gpus = [d for d in gb200.pci_devices if d.pci_class == "0x030200"]
    assert [(d.address, d.numa_node, d.vendor, d.driver) for d in gpus] == [
        ("0008:01:00.0", 0, "0x10de", "nvidia"),
        ("0009:01:00.0", 0, "0x10de", "nvidia"),
        ("0018:01:00.0", 1, "0x10de", "nvidia"),
        ("0019:01:00.0", 1, "0x10de", "nvidia"),
    ]
    assert all(d.local_cpus == gb200.node(d.numa_node or 0).cpus for d in gpus)
    # Each GPU's root port (class 0x0604) is the only other device.
    others = [d for d in gb200.pci_devices if d not in gpus]
    assert [(d.address, d.numa_node, (d.pci_class or "")[:6]) for d in others] == [
        ("0008:00:00.0", 0, "0x0604"),
        ("0009:00:00.0", 0, "0x0604"),
        ("0018:00:00.0", 1, "0x0604"),
        ("0019:00:00.0", 1, "0x0604"),
    ]
    assert all(gb200.devices_of_node(n) == () for n in range(2, 34))


# -- SGI-UV-like: 64 nodes, hop-count distances ---------------------------------------


def _uv_node_cpus(n: int) -> CPUSet:
    # Two cores of two threads; x86 numbers all first threads (0-127) before the second.
    return CPUSet({2 * n, 2 * n + 1, 2 * n + 128, 2 * n + 129})


def test_uv_nodes_packages_and_cores(uv: Topology) -> None:
    assert [n.id for n in uv.nodes] == list(range(64))
    assert [n.id for n in uv.nodes if not n.cpus] == []
    assert all(uv.node(n).cpus == _uv_node_cpus(n) for n in range(64))
    assert list(uv.online_cpus) == list(range(256))
    assert [p.cpus for p in uv.packages] == [_uv_node_cpus(n) for n in range(64)]
    assert len(uv.cores) == 128
    assert all(core.cpus == CPUSet({core.id, core.id + 128}) for core in uv.cores)
    assert uv.siblings(133) == CPUSet({5, 133})
    assert [g.cpus for g in uv.l3_groups] == [_uv_node_cpus(n) for n in range(64)]
    assert uv.notes == ()


def test_uv_memory_and_hugepages(uv: Topology) -> None:
    memory = _memory(uv)
    assert memory == {0: 64_880_640, **dict.fromkeys(range(1, 64), 63 * GIB_KB)}
    assert _pools(uv, 0) == [(2048, 1024, 896), (1048576, 2, 2)]
    assert _pools(uv, 1) == [(2048, 1024, 1024), (1048576, 0, 0)]
    assert _pools(uv, 62) == [(2048, 1024, 1024), (1048576, 2, 2)]


def test_uv_distances_grow_with_hops(uv: Topology) -> None:
    def distance(a: int, b: int) -> int:
        if a == b:
            return 10
        hops = bin((a // 2) ^ (b // 2)).count("1")  # blades of 2 nodes on a 5-cube
        return 13 + 3 * hops

    ids = range(64)
    matrix = _matrix(uv)
    assert matrix == [[distance(a, b) for b in ids] for a in ids]
    assert all(matrix[a][b] == matrix[b][a] for a in ids for b in ids)
    assert all(matrix[a][b] > 10 for a in ids for b in ids if a != b)
    assert {d for row in matrix for d in row} == {10, 13, 16, 19, 22, 25, 28}
    assert matrix[0][:4] == [10, 13, 16, 16]
    assert matrix[0][63] == 28  # blade 0 to blade 31: five hops


def test_uv_nics_are_spread_across_the_nodes(uv: Topology) -> None:
    nics = [d for d in uv.pci_devices if d.pci_class == "0x020000"]
    assert [(d.address, d.numa_node) for d in nics] == [
        (f"{i:04x}:01:00.0", 8 * i) for i in range(8)
    ]
    assert all(d.local_cpus == _uv_node_cpus(8 * i) for i, d in enumerate(nics))
    assert all((d.vendor, d.device, d.driver) == ("0x8086", "0x10fb", "ixgbe") for d in nics)
    assert len(uv.pci_devices) == 16  # and a root port above each


# -- the script they come from --------------------------------------------------------


def test_the_archives_are_what_the_script_writes(make: ModuleType) -> None:
    """Regenerating gives the same tar stream, byte for byte (the bzip2 layer around
    it is compared decompressed, so another libbz2 build does not fail this)."""
    names = []
    for machine in make.machines():
        names.append(machine.name)
        archive = FIXTURES / f"{machine.name}.tar.bz2"
        assert bz2.decompress(archive.read_bytes()) == make.tar_bytes(machine), machine.name
    assert names == [GB200, UV, "224intel64-2pa56co2t+8gpu8nic-dgxlike"]


def test_the_catalogue_entries_are_what_the_script_states(make: ModuleType) -> None:
    for machine in make.machines():
        entry = make.catalogue_entry(machine)
        assert json.loads(json.dumps(entry)) == MACHINES[machine.name]
        assert MACHINES[machine.name]["origin"] == "synthetic"
