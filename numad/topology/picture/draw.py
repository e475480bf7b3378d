"""The picture as SVG text: the placed boxes, who holds each CPU and device, the legend
and the node distance matrix as a heat map.

Pure: model and holders in, text out; no file, no clock, no external asset (styles
and the offline hatching are inside the SVG). Colours are attributes, not only CSS,
so any viewer shows them. Every element a reader or a test looks for carries its
facts as ``data-`` attributes: ``data-cpu``/``data-holder`` on each PU,
``data-node`` on each node box, ``data-from``/``data-to``/``data-distance`` on each
heat map cell.
"""

from __future__ import annotations

import colorsys
from html import escape

from numad.topology.model import NumaNode, Topology
from numad.topology.picture.holders import NOBODY, Holders, Kind
from numad.topology.picture.layout import GAP, WIDTH, Box, label_width, machine, place
from numad.topology.render import pci_kind

COLOURS = {
    Kind.RESERVED: "#8d99a6",
    Kind.SHARED: "#dcebd5",
    Kind.OFFLINE: "url(#offline)",
}
_FILLS = {  # container boxes, lstopo's tones
    "machine": "#ffffff",
    "package": "#dedede",
    "die": "#ececec",
    "node": "#f4eedb",
    "l3": "#ffffff",
    "core": "#bebebe",
    "group": "#f7f7f7",
    "device": "#eaf2fb",
    "more": "#f7f7f7",
}
_STYLE = (
    "text{font-family:sans-serif;font-size:12px}.pu text{font-size:10px}"
    ".device text,.more text,.dist text{font-size:10px}.isolated rect{stroke-dasharray:3 2}"
)
_DEFS = (
    '<defs><pattern id="offline" width="6" height="6" patternUnits="userSpaceOnUse"'
    ' patternTransform="rotate(45)"><rect width="6" height="6" fill="#eeeeee"/>'
    '<rect width="2" height="6" fill="#b0b0b0"/></pattern></defs>'
)
HEAT_COLD, HEAT_HOT = (255, 247, 236), (179, 0, 0)
HEAT_TEXT_UP_TO = 32  # nodes; beyond that the cells are too small for their numbers
HEAT_SIDE = 720  # the heat map's side where cells are not at their smallest (12)


def workload_colour(index: int) -> str:
    """A distinct colour per workload: hues a golden angle apart, saturated enough to
    stand apart from the pale shared pool and the grey reserved CPUs."""
    hue = (0.58 + index * 0.381966) % 1.0
    lightness = 0.50 if index % 2 == 0 else 0.40
    r, g, b = colorsys.hls_to_rgb(hue, lightness, 0.70)
    return f"#{round(r * 255):02x}{round(g * 255):02x}{round(b * 255):02x}"


def svg(topo: Topology, holders: Holders = NOBODY, title: str = "") -> str:
    """The whole picture of ``topo`` with ``holders`` as one SVG document."""
    legend = _legend(topo, holders)
    body = machine(topo, frozenset(a for w in holders.workloads for a in w.devices))
    heat = _heat_box(topo)
    root = Box("picture", children=[legend, body, heat], stack=True)
    place(root, WIDTH)
    out: list[str] = []
    _draw(body, topo, holders, out)
    _draw_legend(legend, out)
    _draw_heat(heat, topo, out)
    height = round(root.h + GAP)
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="numad-machine" viewBox="0 0 {WIDTH}'
        f' {height}" width="{WIDTH}" height="{height}" role="img">'
        f"<title>{escape(title or body.label)}</title><style>{_STYLE}</style>{_DEFS}"
    )
    return head + "".join(out) + "</svg>\n"


# -- the machine ----------------------------------------------------------------------


def _draw(box: Box, topo: Topology, holders: Holders, out: list[str]) -> None:
    if box.kind == "pu":
        _draw_pu(box, topo, holders, out)
        return
    if box.kind == "device":
        _draw_device(box, holders, out)
        return
    attrs = f' data-node="{box.node}"' if box.kind == "node" else ""
    out.append(f'<g class="{box.kind}"{attrs}>{_rect(box, _FILLS.get(box.kind, "#fff"))}')
    if box.label and box.kind != "core":
        out.append(_text(box.x + 5, box.y + 15, box.label))
    if box.kind == "node" and box.node is not None:
        out.append(_memory_bar(box, topo.node(box.node)))
    for child in box.children:
        _draw(child, topo, holders, out)
    out.append("</g>")


def _draw_pu(box: Box, topo: Topology, holders: Holders, out: list[str]) -> None:
    assert box.cpu is not None
    cpu = topo.cpu(box.cpu)
    if cpu.online:
        kind, index = holders.holder(cpu.id)
    else:
        kind, index = Kind.OFFLINE, None
    name = kind.value if index is None else holders.workloads[index].name
    fill = COLOURS[kind] if index is None else workload_colour(index)
    classes = f"pu {kind.value}" + ("" if index is None else f" w{index}")
    if cpu.id in topo.isolated:
        classes += " isolated"
    where = "" if cpu.node is None else f", node {cpu.node}"
    out.append(
        f'<g class="{classes}" data-cpu="{cpu.id}" data-holder="{escape(name)}">'
        f"<title>CPU {cpu.id}{where}: {escape(name)}</title>{_rect(box, fill)}"
        f'<text x="{box.x + 3:g}" y="{box.y + 13:g}" fill="{_ink(fill)}">{cpu.id}</text></g>'
    )


def _draw_device(box: Box, holders: Holders, out: list[str]) -> None:
    d = box.device
    assert d is not None
    index = holders.device_holder(d.address)
    fill = _FILLS["device"] if index is None else workload_colour(index)
    held = "" if index is None else f' data-holder="{escape(holders.workloads[index].name)}"'
    ids = f"{(d.vendor or '?').removeprefix('0x')}:{(d.device or '?').removeprefix('0x')}"
    kind = f"{pci_kind(d.pci_class).split(' [')[0]} {ids}"
    out.append(
        f'<g class="device" data-address="{escape(d.address)}"{held}>'
        f"<title>{escape(d.address)}: {escape(pci_kind(d.pci_class))} {ids}</title>"
        f"{_rect(box, fill)}"
        f"{_text(box.x + 4, box.y + 12, d.address, _ink(fill))}"
        f"{_text(box.x + 4, box.y + 25, kind[:24], _ink(fill))}</g>"
    )


def _memory_bar(box: Box, node: NumaNode) -> str:
    """Used over total memory of the node (as discovery read it), where known."""
    total, free = node.memory_total_kb, node.memory_free_kb
    x, y, width = box.x + 5, box.y + 21, 160
    if not total:
        return _text(x, y + 10, "memory unknown")
    used = None if free is None else max(0, total - free)
    text = f"{_gib(total)} GiB" if used is None else f"{_gib(used)} / {_gib(total)} GiB used"
    share = 0.0 if used is None else min(1.0, used / total)
    return (
        f'<g class="memory" data-used-kb="{"" if used is None else used}" data-total-kb="{total}">'
        f'<rect x="{x:g}" y="{y:g}" width="{width}" height="12" fill="#ffffff" stroke="#777"/>'
        f'<rect x="{x:g}" y="{y:g}" width="{width * share:.1f}" height="12" fill="#7aa6d6"/>'
        f"{_text(x + 4, y + 10, text)}</g>"
    )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _gib(kb: int) -> str:
    return f"{kb / 1048576:.1f}"


# -- the legend -----------------------------------------------------------------------


def _legend(topo: Topology, holders: Holders) -> Box:
    online = topo.online_cpus
    reserved = holders.reserved & online
    held = [w.cpus & online for w in holders.workloads]
    shared = len(online) - len(reserved) - sum(len(h - reserved) for h in held)
    keys = [
        (COLOURS[Kind.RESERVED], f"reserved ({len(reserved)})"),
        (COLOURS[Kind.SHARED], f"shared pool ({shared})"),
    ]
    offline = len(topo.all_cpus) - len(online)
    if offline:
        keys.append((COLOURS[Kind.OFFLINE], f"offline ({offline})"))
    for index, w in enumerate(holders.workloads):
        devices = f", {_count(len(w.devices), 'device')}" if w.devices else ""
        if w.cpus or w.devices:
            what = f"{_count(len(w.cpus), 'CPU')}{devices}"
            keys.append((workload_colour(index), f"{w.name} ({what})"))
        else:  # a shared workload holds nothing of its own: it runs in the pool
            keys.append((COLOURS[Kind.SHARED], f"{w.name} (in the shared pool)"))
    boxes = [Box("key", text, w=label_width(text) + 26, h=18, fill=fill) for fill, text in keys]
    return Box("legend", children=boxes)


def _draw_legend(legend: Box, out: list[str]) -> None:
    out.append('<g class="legend">')
    for key in legend.children:
        out.append(
            f'<g class="key"><rect x="{key.x:g}" y="{key.y + 2:g}" width="14" height="14"'
            f' fill="{key.fill}" stroke="#555"/>{_text(key.x + 19, key.y + 14, key.label)}</g>'
        )
    out.append("</g>")


# -- the distance matrix ----------------------------------------------------------------


def _heat_box(topo: Topology) -> Box:
    n = len(topo.nodes)
    cell = max(12, min(40, HEAT_SIDE // (n + 1)))
    return Box("distances", "Node distances", w=60 + cell * n, h=40 + cell * n)


def _draw_heat(box: Box, topo: Topology, out: list[str]) -> None:
    nodes = sorted(topo.nodes, key=lambda n: n.id)
    n = len(nodes)
    cell = (box.h - 40) / n if n else 0
    known = [d for a in nodes for d in (a.distances or {}).values()]
    low, high = (min(known), max(known)) if known else (0, 0)
    x0, y0 = box.x + 60, box.y + 40
    out.append(f'<g class="distances" data-nodes="{n}">{_text(box.x, box.y + 14, box.label)}')
    for i, node in enumerate(nodes):
        out.append(_text(x0 + i * cell + 2, y0 - 6, str(node.id), size=9))
        out.append(_text(x0 - 30, y0 + i * cell + cell / 2 + 4, str(node.id), size=9))
    for i, a in enumerate(nodes):
        for j, b in enumerate(nodes):
            d = topo.distance(a.id, b.id)
            fill = "#dddddd" if d is None else _heat(d, low, high)
            value = "" if d is None else str(d)
            x, y = x0 + j * cell, y0 + i * cell
            out.append(
                f'<rect class="dist" data-from="{a.id}" data-to="{b.id}" data-distance="{value}"'
                f' x="{x:g}" y="{y:g}" width="{cell:g}" height="{cell:g}" fill="{fill}"/>'
            )
            if n <= HEAT_TEXT_UP_TO:
                out.append(_text(x + 2, y + cell / 2 + 4, value or "-", _ink(fill), size=9))
    out.append("</g>")


def _heat(d: int, low: int, high: int) -> str:
    t = 0.0 if high == low else (d - low) / (high - low)
    rgb = (round(c + (h - c) * t) for c, h in zip(HEAT_COLD, HEAT_HOT, strict=True))
    return "#" + "".join(f"{v:02x}" for v in rgb)


# -- primitives -------------------------------------------------------------------------


def _rect(box: Box, fill: str) -> str:
    return (
        f'<rect x="{box.x:g}" y="{box.y:g}" width="{box.w:g}" height="{box.h:g}"'
        f' fill="{fill}" stroke="#555"/>'
    )


def _text(x: float, y: float, text: str, fill: str = "", size: int = 0) -> str:
    attrs = f' fill="{fill}"' if fill and fill != "#222" else ""
    if size:
        attrs += f' style="font-size:{size}px"'
    return f'<text x="{x:g}" y="{y:g}"{attrs}>{escape(text)}</text>'


def _ink(fill: str) -> str:
    """Dark text on light fills, white on dark ones."""
    if not fill.startswith("#") or len(fill) != 7:
        return "#222"
    r, g, b = (int(fill[i : i + 2], 16) for i in (1, 3, 5))
    return "#222" if 0.299 * r + 0.587 * g + 0.114 * b > 140 else "#ffffff"
