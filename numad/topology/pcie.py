"""Where PCI devices sit in the PCIe tree, and what two of them share.

A device's ``PciDevice.path`` lists what is above it, from the top, as its sysfs
path under ``/sys/devices`` shows it: the host bridge (``pci0000:17``), the root
port (``0000:17:00.0``), then the ports of any PCIe switches on the way down
(``0000:18:00.0``, a switch's upstream port; ``0000:19:01.0``, one of its downstream
ports). Two devices are as close as the deepest entry their paths share: a switch
(both behind one switch's upstream port: peer-to-peer traffic stays in the switch),
else a root port, else a host bridge; paths that share nothing meet only in the
CPU's fabric (same node) or across nodes.

Pure functions of the model; the positions are the levels: 0 the host bridge, 1 the
root port, 2 and below switch ports.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from numad.topology.model import PciDevice

HOST_BRIDGE, ROOT_PORT, SWITCH = "host bridge", "root port", "switch"


@dataclass(frozen=True, slots=True, order=True)
class Shared:
    """The deepest point of the PCIe tree two devices have in common."""

    depth: int  # 1 host bridge, 2 root port, 3 and more a switch: deeper is closer
    kind: str  # HOST_BRIDGE, ROOT_PORT or SWITCH
    address: str  # its name in sysfs: pci0000:17, 0000:17:00.0, ...


def kind_at(index: int) -> str:
    """What the entry at ``index`` of a path is."""
    return HOST_BRIDGE if index == 0 else ROOT_PORT if index == 1 else SWITCH


def shared(a: PciDevice, b: PciDevice) -> Shared | None:
    """The deepest entry two paths have in common, or None (nothing shared, or a
    device whose place sysfs did not show)."""
    return common([a, b])


def common(devices: list[PciDevice]) -> Shared | None:
    """The deepest entry every one of ``devices`` has in common (None for fewer than
    two devices, or where their paths share nothing)."""
    if len(devices) < 2:
        return None
    return common_path([d.path for d in devices])


def common_path(paths: Sequence[tuple[str, ...]]) -> Shared | None:
    """The deepest entry every one of ``paths`` has in common (None where they share
    nothing, or for no path at all)."""
    depth = 0
    for entries in zip(*paths, strict=False):
        if len(set(entries)) != 1:
            break
        depth += 1
    if depth == 0:
        return None
    return Shared(depth, kind_at(depth - 1), paths[0][depth - 1])
