"""The node distance matrix as a heat map, with its scale.

Pure: the model in, SVG text out. Cells are coloured on the fixed scale of
``colours.distance_colour`` (10 local and white, ordinary remote distances pale blue,
only far ones warm), and a row of keys under the matrix says which colour is which
distance. Labels name every node while there is room; past that every k-th node
(``label_step``), so 64 node numbers never run into each other.
"""

from __future__ import annotations

from numad.topology.model import Topology
from numad.topology.picture.colours import (
    LOCAL,
    ORDINARY,
    SCALE,
    UNKNOWN,
    distance_colour,
    ink,
)
from numad.topology.picture.layout import Box, label_width
from numad.topology.picture.svgtext import text

TEXT_UP_TO = 32  # nodes; beyond that the cells are too small for their numbers
SIDE = 960  # the matrix's side where cells are not at their largest (40) or smallest (12)
LABEL_ROOM = 22  # the least distance between two node labels' starts, in SVG units
LABEL_SIZE = 10  # px
LEFT, TOP = 40, 40  # room for the row labels, and for the title and the column labels
SCALE_H = 44  # the keys and their caption under the matrix
MAX_KEYS = 10  # distinct distances shown one by one; more: the scale's own stops


def cell_size(n: int) -> int:
    return max(12, min(40, SIDE // (n + 1))) if n else 0


def label_step(cell: float) -> int:
    """Label every ``step``-th node: 1, 2, 4, 8... the first that leaves room."""
    step = 1
    while step * cell < LABEL_ROOM:
        step *= 2
    return step


def heat_box(topo: Topology) -> Box:
    n = len(topo.nodes)
    cell = cell_size(n)
    keys = _keys(topo)
    keys_w = 60 + sum(_key_width(d) for d in keys)
    width = max(LEFT + cell * n, keys_w, label_width(_CAPTION, 10))
    return Box("distances", "Node distances", w=width, h=TOP + cell * n + SCALE_H)


def draw_heat(box: Box, topo: Topology, out: list[str]) -> None:
    nodes = sorted(topo.nodes, key=lambda n: n.id)
    n = len(nodes)
    cell = cell_size(n)
    step = label_step(cell)
    x0, y0 = box.x + LEFT, box.y + TOP
    out.append(
        f'<g class="distances" data-nodes="{n}" data-label-step="{step}">'
        + text(box.x, box.y + 14, box.label)
    )
    for i, node in enumerate(nodes):
        if i % step == 0:
            at = f' data-node-label="{node.id}"'
            out.append(text(x0 + i * cell + 2, y0 - 6, str(node.id), size=LABEL_SIZE, extra=at))
            row = text(x0 - 30, y0 + i * cell + cell / 2 + 4, str(node.id), size=LABEL_SIZE)
            out.append(row)
    for i, a in enumerate(nodes):
        for j, b in enumerate(nodes):
            d = topo.distance(a.id, b.id)
            fill = UNKNOWN if d is None else distance_colour(d)
            value = "" if d is None else str(d)
            x, y = x0 + j * cell, y0 + i * cell
            out.append(
                f'<rect class="dist" data-from="{a.id}" data-to="{b.id}" data-distance="{value}"'
                f' x="{x:g}" y="{y:g}" width="{cell:g}" height="{cell:g}" fill="{fill}"/>'
            )
            if n <= TEXT_UP_TO:
                out.append(text(x + 2, y + cell / 2 + 4, value or "-", ink(fill), size=9))
    _draw_scale(box.x, y0 + n * cell + 8, _keys(topo), out)
    out.append("</g>")


_CAPTION = f"{LOCAL} is local; up to {ORDINARY} ordinary remote; larger is farther (ACPI SLIT)"


def _keys(topo: Topology) -> list[int]:
    """The distances the scale shows: each one on the machine, or the scale's stops
    within the machine's range where there are too many."""
    known = sorted({d for a in topo.nodes for d in (a.distances or {}).values()})
    if len(known) <= MAX_KEYS:
        return known or [LOCAL]
    low, high = known[0], known[-1]
    return [low, *(d for d, _ in SCALE if low < d < high), high]


def _key_width(d: int) -> float:
    return 24 + label_width(_key_label(d), 10)


def _key_label(d: int) -> str:
    return f"{d} local" if d == LOCAL else str(d)


def _draw_scale(x: float, y: float, keys: list[int], out: list[str]) -> None:
    out.append(f'<g class="scale">{text(x, y + 12, "Scale:", size=LABEL_SIZE)}')
    at = x + 40
    for d in keys:
        fill = distance_colour(d)
        out.append(
            f'<g class="step" data-distance="{d}"><rect x="{at:g}" y="{y + 2:g}" width="14"'
            f' height="14" fill="{fill}" stroke="#555"/>'
            f"{text(at + 18, y + 13, _key_label(d), size=LABEL_SIZE)}</g>"
        )
        at += _key_width(d)
    out.append(f"{text(x, y + 32, _CAPTION, size=LABEL_SIZE)}</g>")
