"""The picture as SVG text: the placed boxes, who holds each CPU and device, the legend
and the node distance matrix as a heat map (``heat``).

Pure: model and holders in, text out; no file, no clock, no external asset (styles
and the offline hatching are inside the SVG). Colours are attributes, not only CSS,
so any viewer shows them; a workload's colour comes from its name (``colours``).
Every element a reader or a test looks for carries its facts as ``data-`` attributes:
``data-cpu``/``data-holder`` on each PU, ``data-node`` on each node box,
``data-switch`` on each PCIe switch's box (its devices inside),
``data-held-bytes``/``data-free-bytes`` on each memory bar, ``data-from``/``data-to``/
``data-distance`` on each heat map cell, ``data-highlight`` on the picture when one
workload is singled out (its CPUs and devices outlined, the other workloads' dimmed).
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

from numad.topology.model import NumaNode, Topology
from numad.topology.pcirender import pci_kind
from numad.topology.picture.colours import COLOURS, ink, workload_colour
from numad.topology.picture.heat import draw_heat, heat_box
from numad.topology.picture.holders import NOBODY, Holders, Kind, NodeMemory
from numad.topology.picture.layout import GAP, WIDTH, Box, count, label_width, machine, place
from numad.topology.picture.svgtext import rect, text

_FILLS = {  # container boxes, lstopo's tones
    "machine": "#ffffff",
    "package": "#dedede",
    "die": "#ececec",
    "node": "#f4eedb",
    "l3": "#ffffff",
    "core": "#bebebe",
    "group": "#f7f7f7",
    "gpu": "#e3ecf7",
    "device": "#eaf2fb",
    "switch": "#f2f6ee",
    "more": "#f7f7f7",
}
_STYLE = (
    "text{font-family:sans-serif;font-size:12px}.pu text{font-size:10px}"
    ".device text,.more text,.dist text{font-size:10px}.isolated rect{stroke-dasharray:3 2}"
    ".dim rect{fill-opacity:0.3}.dim text{fill-opacity:0.5}"
    ".highlight rect{stroke:#000;stroke-width:3}"
)
_DEFS = (
    '<defs><pattern id="offline" width="6" height="6" patternUnits="userSpaceOnUse"'
    ' patternTransform="rotate(45)"><rect width="6" height="6" fill="#eeeeee"/>'
    '<rect width="2" height="6" fill="#b0b0b0"/></pattern></defs>'
)


BAR_W = 200  # a node's memory bar; layout leaves room for it


@dataclass(frozen=True, slots=True)
class Key:
    """One entry of the legend: its colour, its words, and the workload it names."""

    fill: str
    label: str
    workload: str | None = None


def svg(
    topo: Topology,
    holders: Holders = NOBODY,
    title: str = "",
    *,
    highlight: str | None = None,
    legend: bool = True,
) -> str:
    """The whole picture of ``topo`` with ``holders`` as one SVG document; the workload
    named ``highlight`` singled out; without the ``legend`` where the page draws its own."""
    keys = legend_keys(topo, holders, highlight) if legend else []
    legend_box = _legend(keys)
    body = machine(topo, frozenset(a for w in holders.workloads for a in w.devices))
    heat = heat_box(topo)
    root = Box("picture", children=[legend_box, body, heat], stack=True)
    place(root, WIDTH)
    out: list[str] = []
    _draw(body, topo, _Paint(holders, highlight), out)
    _draw_legend(legend_box, keys, out)
    draw_heat(heat, topo, out)
    height = round(root.h + GAP)
    marked = "" if highlight is None else f' data-highlight="{escape(highlight)}"'
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="numad-machine" viewBox="0 0 {WIDTH}'
        f' {height}" width="{WIDTH}" height="{height}" role="img"{marked}>'
        f"<title>{escape(title or body.label)}</title><style>{_STYLE}</style>{_DEFS}"
    )
    return head + "".join(out) + "</svg>\n"


@dataclass(frozen=True, slots=True)
class _Paint:
    holders: Holders
    highlight: str | None

    def mark(self, name: str | None) -> str:
        """The class that singles out the highlighted workload and dims the others."""
        if self.highlight is None or name is None:
            return ""
        return " highlight" if name == self.highlight else " dim"


# -- the machine ----------------------------------------------------------------------


def _draw(box: Box, topo: Topology, paint: _Paint, out: list[str]) -> None:
    if box.kind == "pu":
        _draw_pu(box, topo, paint, out)
        return
    if box.kind == "device":
        _draw_device(box, paint, out)
        return
    attrs = f' data-node="{box.node}"' if box.kind == "node" else ""
    if box.switch is not None:
        attrs = f' data-switch="{escape(box.switch)}"'
    out.append(f'<g class="{box.kind}"{attrs}>{rect(box, _FILLS.get(box.kind, "#fff"))}')
    if box.label and box.kind != "core":
        out.append(text(box.x + 5, box.y + 15, box.label))
    if box.kind == "node" and box.node is not None:
        node = topo.node(box.node)
        out.append(_memory_bar(box, node, paint.holders.memory_of(node.id)))
    for child in box.children:
        _draw(child, topo, paint, out)
    out.append("</g>")


def _draw_pu(box: Box, topo: Topology, paint: _Paint, out: list[str]) -> None:
    assert box.cpu is not None
    cpu = topo.cpu(box.cpu)
    holders = paint.holders
    if cpu.online:
        kind, index = holders.holder(cpu.id)
    else:
        kind, index = Kind.OFFLINE, None
    name = kind.value if index is None else holders.workloads[index].name
    fill = COLOURS[kind] if index is None else workload_colour(name)
    classes = f"pu {kind.value}" + ("" if index is None else f" w{index}")
    classes += paint.mark(None if index is None else name)
    if cpu.id in topo.isolated:
        classes += " isolated"
    where = "" if cpu.node is None else f", node {cpu.node}"
    out.append(
        f'<g class="{classes}" data-cpu="{cpu.id}" data-holder="{escape(name)}">'
        f"<title>CPU {cpu.id}{where}: {escape(name)}</title>{rect(box, fill)}"
        f'<text x="{box.x + 3:g}" y="{box.y + 13:g}" fill="{ink(fill)}">{cpu.id}</text></g>'
    )


def _draw_device(box: Box, paint: _Paint, out: list[str]) -> None:
    d = box.device
    assert d is not None
    index = paint.holders.device_holder(d.address)
    name = None if index is None else paint.holders.workloads[index].name
    fill = _FILLS["device"] if name is None else workload_colour(name)
    held = "" if name is None else f' data-holder="{escape(name)}"'
    ids = f"{(d.vendor or '?').removeprefix('0x')}:{(d.device or '?').removeprefix('0x')}"
    kind = f"{pci_kind(d.pci_class).split(' [')[0]} {ids}"
    out.append(
        f'<g class="device{paint.mark(name)}" data-address="{escape(d.address)}"{held}>'
        f"<title>{escape(d.address)}: {escape(pci_kind(d.pci_class))} {ids}</title>"
        f"{rect(box, fill)}"
        f"{text(box.x + 4, box.y + 12, d.address, ink(fill))}"
        f"{text(box.x + 4, box.y + 25, kind[:24], ink(fill))}</g>"
    )


def _memory_bar(box: Box, node: NumaNode, books: NodeMemory | None) -> str:
    """The node's memory as numad's books have it: held by workloads, free to admit.
    Without the books (no daemon) nothing is held: the total, as discovery read it."""
    x, y, width = box.x + 5, box.y + 21, BAR_W
    if books is None:
        total = (node.memory_total_kb or 0) * 1024
        if not total:
            return text(x, y + 10, "memory unknown")
        held, free, words = 0, total, f"{_gib(total)} GiB, none held"
    else:
        held, free = books.held, books.free
        words = f"{_gib(held)} held / {_gib(free)} GiB free"
    share = 0.0 if held + free == 0 else held / (held + free)
    return (
        f'<g class="memory" data-held-bytes="{held}" data-free-bytes="{free}">'
        f"<title>NUMA node {node.id}: {words} (numad's accounting)</title>"
        f'<rect x="{x:g}" y="{y:g}" width="{width}" height="12" fill="#ffffff" stroke="#777"/>'
        f'<rect x="{x:g}" y="{y:g}" width="{width * share:.1f}" height="12" fill="#7aa6d6"/>'
        f"{text(x + 4, y + 10, words)}</g>"
    )


def _gib(size: int) -> str:
    return f"{size / (1 << 30):.1f}"


# -- the legend -----------------------------------------------------------------------


def legend_keys(topo: Topology, holders: Holders, highlight: str | None = None) -> list[Key]:
    """What each colour means, with counts: the picture's legend and the page's."""
    online = topo.online_cpus
    reserved = holders.reserved & online
    held = [w.cpus & online for w in holders.workloads]
    shared = len(online) - len(reserved) - sum(len(h - reserved) for h in held)
    keys = [
        Key(COLOURS[Kind.RESERVED], f"reserved ({count(len(reserved), 'CPU')})"),
        Key(COLOURS[Kind.SHARED], f"shared pool ({count(shared, 'CPU')})"),
    ]
    offline = len(topo.all_cpus) - len(online)
    if offline:
        keys.append(Key(COLOURS[Kind.OFFLINE], f"offline ({count(offline, 'CPU')})"))
    for w in holders.workloads:
        devices = f", {count(len(w.devices), 'device')}" if w.devices else ""
        shown = " - shown" if w.name == highlight else ""
        if w.cpus or w.devices:
            what = f"{count(len(w.cpus), 'CPU')}{devices}"
            keys.append(Key(workload_colour(w.name), f"{w.name} ({what}){shown}", w.name))
        else:  # a shared workload holds nothing of its own: it runs in the pool
            keys.append(Key(COLOURS[Kind.SHARED], f"{w.name} (in the shared pool){shown}", w.name))
    return keys


def _legend(keys: list[Key]) -> Box:
    boxes = [Box("key", k.label, w=label_width(k.label) + 26, h=18, fill=k.fill) for k in keys]
    return Box("legend", children=boxes)


def _draw_legend(legend: Box, keys: list[Key], out: list[str]) -> None:
    if not keys:
        return
    out.append('<g class="legend">')
    for box, key in zip(legend.children, keys, strict=True):
        named = "" if key.workload is None else f' data-workload="{escape(key.workload)}"'
        out.append(
            f'<g class="key"{named}><rect x="{box.x:g}" y="{box.y + 2:g}" width="14"'
            f' height="14" fill="{key.fill}" stroke="#555"/>'
            f"{text(box.x + 19, box.y + 14, box.label)}</g>"
        )
    out.append("</g>")
