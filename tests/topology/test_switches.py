"""Which switch a PCI device sits under (numad.topology.switches)."""

from __future__ import annotations

from pathlib import Path

import pytest

from numad.cpuset import CPUSet
from numad.topology.archive import ArchiveFS
from numad.topology.discover import discover
from numad.topology.model import Package, PciDevice, Topology
from numad.topology.switches import slot, switch_of, switches

HB, RP = "pci0000:17", "0000:17:00.0"
USP = "0000:18:00.0"
# A switch (upstream port 18:00.0) with two downstream ports, a GPU below each, a
# dual-port NIC alone below a second switch whose ports were not recorded, a VGA
# behind a lone PCI-to-PCI bridge, an NVMe drive on the root port.
DEVICES = (
    PciDevice(USP, 0, path=(HB, RP)),
    PciDevice("0000:19:00.0", 0, path=(HB, RP, USP)),
    PciDevice("0000:19:01.0", 0, path=(HB, RP, USP)),
    PciDevice("0000:1a:00.0", 0, path=(HB, RP, USP, "0000:19:00.0")),
    PciDevice("0000:1b:00.0", 0, path=(HB, RP, USP, "0000:19:01.0")),
    PciDevice("0000:60:00.0", 0, path=("pci0000:5d", "0000:5d:02.0", "0000:5e:00.0", "5f:03.0")),
    PciDevice("0000:60:00.1", 0, path=("pci0000:5d", "0000:5d:02.0", "0000:5e:00.0", "5f:03.0")),
    PciDevice("0000:03:00.0", 0, path=("pci0000:00", "0000:00:1c.0", "0000:02:00.0")),
    PciDevice("0000:21:00.0", 0, path=(HB, "0000:17:02.0")),
    PciDevice("0000:05:00.0", 0),
)


def test_devices_and_downstream_ports_of_a_switch_name_its_upstream_port() -> None:
    assert switches(DEVICES) == {
        "0000:19:00.0": USP,
        "0000:19:01.0": USP,
        "0000:1a:00.0": USP,
        "0000:1b:00.0": USP,
    }


@pytest.mark.parametrize(
    "address",
    [
        pytest.param(USP, id="the-upstream-port-itself"),
        pytest.param("0000:60:00.1", id="one-slot-alone-below-a-switch"),
        pytest.param("0000:03:00.0", id="behind-a-lone-bridge"),
        pytest.param("0000:21:00.0", id="on-a-root-port"),
        pytest.param("0000:05:00.0", id="no-path"),
    ],
)
def test_no_switch(address: str) -> None:
    topo = Topology((), (), (Package(0, CPUSet()),), (), (), pci_devices=DEVICES)
    device = next(d for d in DEVICES if d.address == address)
    assert switch_of(device, topo) is None


def test_slot() -> None:
    assert slot("0000:60:00.1") == "0000:60:00"


def test_the_recorded_plx_switches() -> None:
    """32intel64-2p8co2t+8ve: a NIC and four vector engines below each of two PLX switches."""
    archive = Path(__file__).resolve().parents[2] / "fixtures/sysfs/32intel64-2p8co2t+8ve.tar.bz2"
    found = switches(discover(ArchiveFS(archive)).pci_devices)
    endpoints = {a: s for a, s in found.items() if not a.startswith(("0000:19:", "0000:3c:"))}
    assert endpoints == {
        **{f"0000:{b}:00.0": "0000:18:00.0" for b in ("1a", "1b", "1c", "1d", "1e")},
        **{f"0000:{b}:00.0": "0000:3b:00.0" for b in ("3d", "3e", "3f", "40", "41")},
    }
