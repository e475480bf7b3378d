"""The DGX-like synthetic machine (fixtures/synthetic/make.py), read through discovery.

Its facts stated again by hand, as fixtures/synthetic/README.md states them: 2 sockets
of 56 cores x 2 threads, one NUMA node each; 4 PCIe switches, each below a root port
of its own host bridge, 2 per socket; switch s holds GPUs 2s and 2s+1 and NICs 2s and
2s+1 (GPU i with NIC i, as the DGX user guides map mlx5_i to GPU i), switches 1 and 3
an NVMe drive too; a boot NVMe drive on a root port of socket 0. Every device's
local_cpulist is its socket's CPUs.
"""

from __future__ import annotations

import pytest

from numad.cpuset import CPUSet
from numad.hostfs import HostFS
from numad.topology.discover import discover
from numad.topology.model import PciDevice, Topology
from numad.topology.pcie import SWITCH, shared
from numad.topology.switches import switch_of
from tests.conftest import Machines

DGX = "224intel64-2pa56co2t+8gpu8nic-dgxlike"
SOCKET_CPUS = (CPUSet.parse_list("0-55,112-167"), CPUSet.parse_list("56-111,168-223"))
# host bridge bus of switch s; its root port is BB:01.0, its upstream port BB+1:00.0,
# its downstream ports BB+2:0p.0, the device below port p on bus BB+3+p.
BUSES = (0x15, 0x37, 0x9A, 0xBC)


@pytest.fixture(scope="module")
def dgx(machines: Machines) -> Topology:
    return discover(HostFS(machines.root(DGX)))


def _of_class(topo: Topology, pci_class: str) -> list[PciDevice]:
    return sorted(
        (d for d in topo.pci_devices if d.pci_class == pci_class), key=lambda d: d.address
    )


def _expected_path(s: int, port: int) -> tuple[str, ...]:
    b = BUSES[s]
    return (
        f"pci0000:{b:02x}",
        f"0000:{b:02x}:01.0",
        f"0000:{b + 1:02x}:00.0",
        f"0000:{b + 2:02x}:{port:02x}.0",
    )


def test_sockets_nodes_and_cpus(dgx: Topology) -> None:
    assert len(dgx.packages) == 2
    assert len(dgx.cores) == 112
    assert [n.cpus for n in dgx.nodes] == list(SOCKET_CPUS)
    assert dgx.siblings(0) == CPUSet([0, 112])
    assert dgx.distance(0, 1) == 21
    assert dgx.notes == ()


def test_gpus_and_nics_sit_where_the_model_puts_them(dgx: Topology) -> None:
    gpus = _of_class(dgx, "0x030200")
    nics = _of_class(dgx, "0x020700")
    assert len(gpus) == len(nics) == 8
    for i, (gpu, nic) in enumerate(zip(gpus, nics, strict=True)):
        s, k = divmod(i, 2)
        assert gpu.path == _expected_path(s, 2 * k), gpu.address
        assert nic.path == _expected_path(s, 2 * k + 1), nic.address
        assert gpu.numa_node == nic.numa_node == s // 2
        assert gpu.local_cpus == nic.local_cpus == SOCKET_CPUS[s // 2]
        assert (gpu.vendor, gpu.driver, nic.vendor, nic.driver) == (
            "0x10de",
            "nvidia",
            "0x15b3",
            "mlx5_core",
        )


def test_gpu_i_and_nic_i_share_a_switch(dgx: Topology) -> None:
    gpus = _of_class(dgx, "0x030200")
    nics = _of_class(dgx, "0x020700")
    for i, (gpu, nic) in enumerate(zip(gpus, nics, strict=True)):
        upstream = f"0000:{BUSES[i // 2] + 1:02x}:00.0"
        together = shared(gpu, nic)
        assert together is not None
        assert (together.kind, together.address) == (SWITCH, upstream)
        assert switch_of(gpu, dgx) == switch_of(nic, dgx) == upstream
    # GPUs of different switches meet only at the socket (different host bridges).
    assert shared(gpus[0], gpus[2]) is None


def test_nvme_drives(dgx: Topology) -> None:
    drives = _of_class(dgx, "0x010802")
    assert [d.address for d in drives] == ["0000:01:00.0", "0000:3e:00.0", "0000:c3:00.0"]
    boot, *switched = drives
    assert boot.path == ("pci0000:00", "0000:00:1d.0")
    assert switch_of(boot, dgx) is None
    assert [d.path for d in switched] == [_expected_path(1, 4), _expected_path(3, 4)]
    assert [d.numa_node for d in drives] == [0, 0, 1]
