"""Rendering the PCI devices of a ``Topology``: JSON entries and the text section.

Pure, like ``numad.topology.render`` (which it serves): reads only the model. Within
a node, the devices under one PCIe switch (``numad.topology.switches``) are listed
together under the switch's address, the switch's own ports with them; a device on a
root port, or where sysfs showed no tree, stands alone as before.
"""

from __future__ import annotations

from collections.abc import Mapping

from numad.topology.model import PciDevice, Topology
from numad.topology.switches import switches

# -- JSON ---------------------------------------------------------------------


def pci_json(topo: Topology) -> list[dict[str, object]]:
    """Every device, in address order, with its PCIe path and its switch (or None)."""
    switch = switches(topo.pci_devices)
    return [
        _device_json(d, switch.get(d.address))
        for d in sorted(topo.pci_devices, key=lambda d: d.address)
    ]


def _device_json(dev: PciDevice, switch: str | None) -> dict[str, object]:
    return {
        "address": dev.address,
        "numa_node": dev.numa_node,
        "class": dev.pci_class,
        "vendor": dev.vendor,
        "device": dev.device,
        "driver": dev.driver,
        "local_cpus": None if dev.local_cpus is None else list(dev.local_cpus.sorted()),
        "path": list(dev.path),
        "switch": switch,
    }


# -- text ---------------------------------------------------------------------


def pci_section(topo: Topology) -> list[str]:
    """``PCI devices:``, then per node its devices, those of one switch grouped."""
    if not topo.pci_devices:
        return ["PCI devices: none"]
    lines = ["PCI devices:"]
    known = topo.node_ids
    keys = sorted({d.numa_node for d in topo.pci_devices}, key=lambda n: (n is None, n or 0))
    width = max(len(pci_kind(d.pci_class)) for d in topo.pci_devices)
    switch = switches(topo.pci_devices)
    for node in keys:
        if node is None:
            lines.append("  no NUMA node:")
        else:
            lines.append(f"  NUMA node {node}:" if node in known else f"  node {node} (offline):")
        lines += _node_lines(topo, node, switch, width)
    return lines


def _node_lines(
    topo: Topology, node: int | None, switch: Mapping[str, str], width: int
) -> list[str]:
    """The node's devices in address order; a switch's devices (and its upstream port,
    named by the switch) under one ``switch ADDR:`` line where the first of them is."""
    devices = sorted(topo.devices_of_node(node), key=lambda d: d.address)
    heads = set(switch.values())
    groups: dict[str, list[PciDevice]] = {}
    order: list[str | PciDevice] = []
    for d in devices:
        key = switch.get(d.address, d.address if d.address in heads else None)
        if key is None:
            order.append(d)
            continue
        if key not in groups:
            order.append(key)
        groups.setdefault(key, []).append(d)
    lines = []
    for item in order:
        if isinstance(item, PciDevice):
            lines.append(f"    {_pci_line(topo, item, width)}")
            continue
        members = [d for d in groups[item] if d.address != item and not _is_bridge(d)]
        named = ", ".join(f"{_short_kind(d)} {d.address}" for d in members)
        lines.append(f"    switch {item}: {named or 'no device but its ports'}")
        lines += [f"      {_pci_line(topo, d, width)}" for d in groups[item]]
    return lines


def _pci_line(topo: Topology, dev: PciDevice, width: int) -> str:
    ids = f"{_bare_hex(dev.vendor)}:{_bare_hex(dev.device)}"
    driver = f"  driver {dev.driver}" if dev.driver else ""
    return f"{dev.address}  {pci_kind(dev.pci_class):<{width}}  {ids}{driver}{_narrower(topo, dev)}"


def _narrower(topo: Topology, dev: PciDevice) -> str:
    """Where the device's local_cpulist is narrower than its node's CPUs, say so."""
    local = dev.local_cpus
    if local is None or not local or dev.numa_node not in topo.node_ids:
        return ""
    assert dev.numa_node is not None  # in node_ids
    node_cpus = topo.cpus_of_node(dev.numa_node)
    if local == node_cpus or not local.issubset(node_cpus):
        return ""
    return f"  local cpus {local} (node {dev.numa_node}: {node_cpus})"


def _is_bridge(dev: PciDevice) -> bool:
    return _base_class(dev.pci_class) == 0x06


def _short_kind(dev: PciDevice) -> str:
    return pci_kind(dev.pci_class).split(" [")[0]


# Base class names from the PCI Code and ID Assignment Specification.
_PCI_BASE_CLASSES = {
    0x00: "unclassified",
    0x01: "storage",
    0x02: "network",
    0x03: "display",
    0x04: "multimedia",
    0x05: "memory controller",
    0x06: "bridge",
    0x07: "communication",
    0x08: "system peripheral",
    0x09: "input",
    0x0A: "docking station",
    0x0B: "processor",
    0x0C: "serial bus",
    0x0D: "wireless",
    0x0E: "intelligent I/O",
    0x0F: "satellite",
    0x10: "encryption",
    0x11: "signal processing",
    0x12: "processing accelerator",
    0x13: "instrumentation",
    0x40: "coprocessor",
    0xFF: "unassigned",
}


def _base_class(pci_class: str | None) -> int | None:
    try:
        return int(pci_class or "", 16) >> 16
    except ValueError:
        return None


def pci_kind(pci_class: str | None) -> str:
    if pci_class is None:
        return "class unknown"
    base = _base_class(pci_class)
    if base is None:
        return f"class {pci_class}"
    return f"{_PCI_BASE_CLASSES.get(base, 'other')} [{pci_class}]"


def _bare_hex(value: str | None) -> str:
    if value is None:
        return "?"
    return value[2:] if value.lower().startswith("0x") else value
