"""Which PCIe switch each PCI device sits under, from the paths discovery found.

Pure functions of the model (``numad.topology.pcie`` says what two devices share;
this names the switch a device belongs to, for ``topology`` and device picking).

A device's switch is the nearest bridge above it, below its root port, that it
shares with a device of another slot: a switch's upstream port (``0000:18:00.0``)
is above every device of the switch and above its downstream ports, while each
downstream port (``0000:19:01.0``) is above one slot only. The functions of one
slot (a dual-port NIC's ``.0`` and ``.1``) are one device here, so a slot alone
below a switch, with none of the switch's ports recorded, has no switch; neither
has a device right on a root port, or behind a lone PCI-to-PCI bridge (a BMC's VGA).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from numad.topology.model import PciDevice, Topology

_BELOW_ROOT_PORT = 2  # path[0] is the host bridge, path[1] the root port


def slot(address: str) -> str:
    """The address without its function: ``0000:1a:00.1`` -> ``0000:1a:00``."""
    return address.rsplit(".", 1)[0]


def switches(devices: Iterable[PciDevice]) -> Mapping[str, str]:
    """Each device's switch (its upstream port's address), by device address; devices
    under no switch are left out."""
    devices = list(devices)
    slots_below: dict[str, set[str]] = {}
    for d in devices:
        for entry in d.path[_BELOW_ROOT_PORT:]:
            slots_below.setdefault(entry, set()).add(slot(d.address))
    found: dict[str, str] = {}
    for d in devices:
        own = slot(d.address)
        for entry in reversed(d.path[_BELOW_ROOT_PORT:]):
            if slots_below[entry] - {own}:
                found[d.address] = entry
                break
    return found


def switch_of(device: PciDevice, topology: Topology) -> str | None:
    """The address of the switch ``device`` sits under in ``topology``, or None."""
    return switches(topology.pci_devices).get(device.address)
