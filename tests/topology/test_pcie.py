"""What two PCI devices share in the PCIe tree (numad.topology.pcie)."""

from __future__ import annotations

from numad.topology.model import PciDevice
from numad.topology.pcie import HOST_BRIDGE, ROOT_PORT, SWITCH, Shared, common, shared

# Two GPUs under one switch (upstream port 18:00.0, downstream ports 19:00.0 and
# 19:01.0), a NIC under another switch of the same root port, an NVMe drive on a root
# port of its own, and a device whose place sysfs did not show.
GPU0 = PciDevice(
    "0000:1a:00.0", 0, path=("pci0000:17", "0000:17:00.0", "0000:18:00.0", "0000:19:00.0")
)
GPU1 = PciDevice(
    "0000:1b:00.0", 0, path=("pci0000:17", "0000:17:00.0", "0000:18:00.0", "0000:19:01.0")
)
NIC = PciDevice("0000:1d:00.0", 0, path=("pci0000:17", "0000:17:00.0", "0000:1c:00.0"))
NVME = PciDevice("0000:21:00.0", 0, path=("pci0000:17", "0000:17:02.0"))
FAR = PciDevice("0000:81:00.0", 1, path=("pci0000:80", "0000:80:01.0"))
UNKNOWN = PciDevice("0000:05:00.0", 0)


def test_devices_under_one_switch_share_its_upstream_port() -> None:
    assert shared(GPU0, GPU1) == Shared(3, SWITCH, "0000:18:00.0")


def test_devices_under_different_switches_share_their_root_port() -> None:
    assert shared(GPU0, NIC) == Shared(2, ROOT_PORT, "0000:17:00.0")


def test_devices_on_different_root_ports_share_the_host_bridge() -> None:
    assert shared(GPU1, NVME) == Shared(1, HOST_BRIDGE, "pci0000:17")


def test_nothing_shared_across_host_bridges_or_without_a_path() -> None:
    assert shared(GPU0, FAR) is None
    assert shared(GPU0, UNKNOWN) is None


def test_a_set_shares_what_all_its_members_share() -> None:
    assert common([GPU0, GPU1]) == Shared(3, SWITCH, "0000:18:00.0")
    assert common([GPU0, GPU1, NIC]) == Shared(2, ROOT_PORT, "0000:17:00.0")
    assert common([GPU0, GPU1, NIC, NVME]) == Shared(1, HOST_BRIDGE, "pci0000:17")
    assert common([GPU0]) is None
    assert common([GPU0, FAR]) is None


def test_deeper_is_closer() -> None:
    found = [shared(GPU0, x) for x in (NVME, NIC, GPU1)]
    assert found == sorted(f for f in found if f is not None)  # ordered by depth
