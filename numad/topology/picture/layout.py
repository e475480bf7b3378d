"""The picture's layout: the machine as nested boxes, the way lstopo draws it.

Pure: reads the model, computes positions, draws nothing. The tree is
machine > package > die (where a package has several) > NUMA node (the part of it
in the package) > L3 group (the part of it in the node) > core > thread (PU), and
each node's PCI devices inside its (first) box, those of one PCIe switch in a box
of their own; a GPU's memory nodes (see
``gpu_memory``) in one box with the GPU; other memory-only nodes, offline CPUs,
online CPUs in no package and devices on no node follow in boxes of their own.
Every online CPU is one PU box, once. Boxes flow left to right and wrap into rows
within the width, so 2 CPUs and 1,024 CPUs both come out readable: a wide machine
grows downwards, never sideways.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from numad.cpuset import CPUSet, NodeSet
from numad.topology.model import NumaNode, PciDevice, Topology
from numad.topology.switches import switches

WIDTH = 1200  # the picture's width in SVG units; the viewer scales it
GAP = 6
MARGIN = 4
PU_W, PU_H = 30, 18  # room for "1023" at 10 px
DEVICE_W, DEVICE_H = 150, 30
MAX_DEVICES = 12  # per node; the rest are counted in one "+N more" box
CHAR_W = 7.0  # a generous width of one 12 px character, for sizing labels
# (padding, header height) per kind of container
_FRAME = {
    "picture": (MARGIN, MARGIN),
    "machine": (8, 22),
    "package": (6, 22),
    "die": (5, 20),
    "node": (5, 38),
    "l3": (4, 18),
    "core": (3, 0),
    "group": (6, 22),
    "gpu": (5, 20),
    "switch": (5, 20),
    "legend": (0, 0),
}
_BRIDGE_CLASS = 0x06  # PCI base class "bridge": hidden, as lstopo does by default
_DISPLAY_CLASS = 0x03  # PCI base class "display controller": VGA, 3D (0x0302: NVIDIA's)


@dataclass(slots=True)
class Box:
    """One rectangle of the picture; ``x``, ``y`` are absolute once ``place`` ran."""

    kind: str  # machine, package, die, node, l3, core, pu, device, more, group, key...
    label: str = ""
    children: list[Box] = field(default_factory=list)
    stack: bool = False  # children one below the other, never side by side
    w: float = 0
    h: float = 0
    x: float = 0
    y: float = 0
    cpu: int | None = None  # pu
    node: int | None = None  # node, and the distance map
    device: PciDevice | None = None
    switch: str | None = None  # a PCIe switch's box: its upstream port's address
    part: bool = False  # a node or L3 box holding only part of its CPUs
    fill: str = ""  # a legend key's colour

    def walk(self) -> Iterator[Box]:
        yield self
        for child in self.children:
            yield from child.walk()


def machine(topo: Topology, held: frozenset[str] = frozenset()) -> Box:
    """The machine's boxes, not yet placed; the devices at the ``held`` addresses are
    drawn whatever their class and however many devices their node has."""
    root = Box("machine", _summary(topo))
    in_package = CPUSet()
    devices = _Devices(topo, held)
    with_gpu = {n for nodes in devices.gpu_nodes.values() for n in nodes}
    for pkg in sorted(topo.packages, key=lambda p: p.id):
        in_package |= pkg.cpus
        root.children.append(_package(topo, pkg.id, pkg.cpus, devices))
    loose = topo.online_cpus - in_package
    if loose:
        root.children.append(Box("group", "Online CPUs in no package", _pus(loose)))
    memory_only = [
        n for n in sorted(topo.nodes, key=lambda n: n.id) if not n.cpus and n.id not in with_gpu
    ]
    if memory_only:
        boxes = [_node_box(topo, n, n.cpus, [], devices) for n in memory_only]
        root.children.append(Box("group", "Memory-only NUMA nodes", boxes))
    offline = CPUSet(c.id for c in topo.all_cpus if not c.online)
    if offline:
        root.children.append(Box("group", "Offline CPUs", _pus(offline)))
    homeless = devices.rest()
    if homeless:
        root.children.append(Box("group", "PCI devices on no NUMA node", homeless))
    return root


def _summary(topo: Topology) -> str:
    cores = sum(1 for c in topo.cores if c.cpus)
    return (
        f"Machine: {count(len(topo.packages), 'package')}, {count(len(topo.nodes), 'NUMA node')},"
        f" {count(cores, 'core')}, {len(topo.online_cpus)}/{len(topo.all_cpus)} CPUs online"
    )


def count(n: int, noun: str) -> str:
    """``1 core``, ``2 cores``: every count the picture and the page print."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def node_list(nodes: Iterable[int]) -> str:
    """``node 0``, ``nodes 0-1``: node sets as the kernel lists them, one way everywhere."""
    ids = NodeSet(nodes)
    return f"{'node' if len(ids) == 1 else 'nodes'} {ids.format_list()}"


def gpu_memory(topo: Topology) -> dict[str, tuple[int, ...]]:
    """The CPU-less NUMA nodes that are a GPU's own memory, by the GPU's PCI address.

    The kernel does not say whose memory a CPU-less node is (on Grace machines the
    firmware hands each GPU a run of consecutive proximity domains; sysfs shows only
    distances, and the GPU's ``numa_node`` is its CPU's node). So: 1. each CPU-less
    node goes with the one CPU node nearest to it (a tie or no distance: with none);
    2. where that CPU node has display-class PCI devices (GPUs) and its CPU-less nodes
    divide evenly among them, each GPU in address order takes the next run of node ids.
    Anything else stays a plain memory-only node.
    """
    near: dict[int, list[int]] = {}
    with_cpus = [n.id for n in topo.nodes if n.cpus]
    for node in sorted(topo.nodes, key=lambda n: n.id):
        if node.cpus or not node.distances:
            continue
        ranked = sorted((node.distances.get(c, 1 << 30), c) for c in with_cpus)
        if ranked and ranked[0][0] < 1 << 30 and (len(ranked) == 1 or ranked[0][0] < ranked[1][0]):
            near.setdefault(ranked[0][1], []).append(node.id)
    found: dict[str, tuple[int, ...]] = {}
    for cpu_node, memory in near.items():
        gpus = sorted(
            d.address
            for d in topo.pci_devices
            if d.numa_node == cpu_node and _base_class(d) == _DISPLAY_CLASS
        )
        if gpus and len(memory) % len(gpus) == 0:
            run = len(memory) // len(gpus)
            found.update({a: tuple(memory[i * run : (i + 1) * run]) for i, a in enumerate(gpus)})
    return found


def _package(topo: Topology, pkg: int, cpus: CPUSet, devices: _Devices) -> Box:
    box = Box("package", f"Package {pkg}")
    dies = _split(topo, cpus, "die")
    if len(dies) > 1:
        for die, part in dies:
            label = "Die" if die is None else f"Die {die}"
            box.children.append(Box("die", label, _nodes(topo, part, devices)))
    else:
        box.children = _nodes(topo, cpus, devices)
    return box


def _nodes(topo: Topology, cpus: CPUSet, devices: _Devices) -> list[Box]:
    boxes = []
    for node_id, part in _split(topo, cpus, "node"):
        inner = _l3s(topo, part)
        if node_id is None or node_id not in topo.node_ids:
            boxes.append(Box("group", "No NUMA node", inner))
        else:
            boxes.append(_node_box(topo, topo.node(node_id), part, inner, devices))
    return boxes


def _node_box(
    topo: Topology, node: NumaNode, part: CPUSet, inner: list[Box], devices: _Devices
) -> Box:
    box = Box("node", f"NUMA node {node.id}", inner, node=node.id, part=part != node.cpus)
    if box.part:
        box.label += " (part)"
    box.children += devices.take(node.id)  # a node's devices go in its first box
    return box


def _l3s(topo: Topology, part: CPUSet) -> list[Box]:
    groups = _split(topo, part, "l3")
    if len(groups) == 1 and groups[0][0] is None:
        return _cores(topo, part)
    boxes = []
    for l3, cpus in groups:
        if l3 is None or l3 >= len(topo.l3_groups):
            boxes.append(Box("l3", "no L3", _cores(topo, cpus)))
            continue
        group = topo.l3_groups[l3]
        size = f" {_size(group.size_kb)}" if group.size_kb else ""
        label = f"L3{size}" + (" (part)" if cpus != group.cpus else "")
        boxes.append(Box("l3", label, _cores(topo, cpus), part=cpus != group.cpus))
    return boxes


def _cores(topo: Topology, part: CPUSet) -> list[Box]:
    """The cores of ``part``, each holding its threads; a CPU of no core stands alone."""
    threads: dict[int, list[int]] = {}
    for c in part:
        core = topo.cpu(c).core
        threads.setdefault(c if core is None else core, []).append(c)
    boxes = []
    for key in sorted(threads):
        if topo.cpu(key).core is None:
            boxes += _pus(CPUSet(threads[key]))
        else:
            boxes.append(Box("core", f"Core {key}", _pus(CPUSet(threads[key]))))
    return boxes


def _pus(cpus: CPUSet) -> list[Box]:
    return [Box("pu", str(c), w=PU_W, h=PU_H, cpu=c) for c in cpus.sorted()]


class _Devices:
    """The PCI devices to draw, handed out per node, once."""

    def __init__(self, topo: Topology, held: frozenset[str]) -> None:
        self.topo = topo
        self.held = held
        self.gpu_nodes = gpu_memory(topo)
        self.switch = switches(topo.pci_devices)
        self.left: dict[int | None, list[PciDevice]] = {}
        for d in sorted(topo.pci_devices, key=lambda d: d.address):
            if d.address in held or _base_class(d) != _BRIDGE_CLASS:
                self.left.setdefault(d.numa_node, []).append(d)

    def take(self, node: int | None) -> list[Box]:
        devices = self.left.pop(node, [])
        # Held devices first, so the cap never hides one.
        devices.sort(key=lambda d: d.address not in self.held)
        room = max(MAX_DEVICES, sum(1 for d in devices if d.address in self.held))
        return self._by_switch([self._with_memory(box) for box in _device_boxes(devices, room)])

    def _by_switch(self, boxes: list[Box]) -> list[Box]:
        """The devices of one PCIe switch in one box, where the first of them is."""
        out: list[Box] = []
        grouped: dict[str, Box] = {}
        for box in boxes:
            device = box.device or next((c.device for c in box.children if c.device), None)
            switch = None if device is None else self.switch.get(device.address)
            if switch is None:
                out.append(box)
            elif switch in grouped:
                grouped[switch].children.append(box)
            else:
                grouped[switch] = Box("switch", f"PCIe switch {switch}", [box], switch=switch)
                out.append(grouped[switch])
        return out

    def _with_memory(self, box: Box) -> Box:
        """A GPU's box, in one box with its memory nodes where it has any."""
        address = box.device.address if box.device is not None else ""
        nodes = self.gpu_nodes.get(address, ())
        if not nodes:
            return box
        memory = [_node_box(self.topo, self.topo.node(n), CPUSet(), [], self) for n in nodes]
        return Box("gpu", f"GPU {address}, its memory: {node_list(nodes)}", [box, *memory])

    def rest(self) -> list[Box]:
        """The devices of no node, or of a node that is not drawn (offline)."""
        return [box for node in sorted(self.left, key=str) for box in self.take(node)]


def _base_class(d: PciDevice) -> int | None:
    try:
        return int(d.pci_class or "", 16) >> 16
    except ValueError:
        return None


def _device_boxes(devices: list[PciDevice], room: int) -> list[Box]:
    boxes = [Box("device", d.address, w=DEVICE_W, h=DEVICE_H, device=d) for d in devices[:room]]
    if len(devices) > room:
        more = f"+{len(devices) - room} more PCI devices"
        boxes.append(Box("more", more, w=DEVICE_W, h=DEVICE_H))
    return boxes


def _split(topo: Topology, cpus: CPUSet, level: str) -> list[tuple[int | None, CPUSet]]:
    """``cpus`` grouped by one attribute of each CPU, in order, None last."""
    groups: dict[int | None, list[int]] = {}
    for c in cpus:
        groups.setdefault(getattr(topo.cpu(c), level), []).append(c)
    order = sorted(groups, key=lambda k: (k is None, k or 0))
    return [(k, CPUSet(groups[k])) for k in order]


def _size(kb: int) -> str:
    for unit in ("KiB", "MiB", "GiB"):
        if kb < 1024 or kb % 1024:
            return f"{kb} {unit}"
        kb //= 1024
    return f"{kb} TiB"


# -- placing ------------------------------------------------------------------------


def label_width(text: str, size: float = 12) -> float:
    return len(text) * CHAR_W * size / 12


def place(box: Box, max_w: float = WIDTH) -> None:
    """Size ``box`` within ``max_w`` and give every box its absolute position."""
    _measure(box, max_w)
    _shift(box, 0, 0)


def _measure(box: Box, max_w: float) -> None:
    if box.kind not in _FRAME:  # a leaf: its size is set where it is made
        return
    pad, head = _FRAME[box.kind]
    inner = max_w - 2 * pad
    x = y = row_h = widest = 0.0
    for child in box.children:
        _measure(child, inner)
        if x > 0 and (box.stack or x + child.w > inner):
            y += row_h + GAP
            x = row_h = 0
        child.x, child.y = pad + x, head + y
        x += child.w + GAP
        row_h = max(row_h, child.h)
        widest = max(widest, x - GAP)
    label = 0 if box.kind == "core" else label_width(box.label) + 8  # a core's is a tooltip
    box.w = min(max_w, max(widest, label, _least_width(box)) + 2 * pad)
    box.h = head + y + row_h + (pad if box.children else 0)


def _least_width(box: Box) -> float:
    return 210 if box.kind == "node" else 0  # room for the memory bar (draw.BAR_W)


def _shift(box: Box, dx: float, dy: float) -> None:
    box.x += dx
    box.y += dy
    for child in box.children:
        _shift(child, box.x, box.y)
