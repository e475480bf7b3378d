"""The picture's colours: who holds a CPU, each workload's own colour, and the scale of
node distances.

Pure. A workload's colour comes from its name alone (a stable hash into a palette), never
from its place in a list: a workload keeps its colour from admission to release, and a
picture that refreshes itself does not repaint the others when one leaves. Two names may
share a colour (the palette is finite); the legend, the tooltips and the page's table
name every workload, so a shared colour never hides who holds what.

Distances are coloured on a fixed scale in the kernel's units (ACPI SLIT: 10 is local),
not stretched between the smallest and largest on the machine: 10 is white, ordinary
remote distances (11 to 21: another socket, a sub-NUMA cluster) are pale blues, and only
distances of the far parts of big machines (CPU-less memory, other blades) turn warm.
"""

from __future__ import annotations

import colorsys
import hashlib

from numad.topology.picture.holders import Kind

COLOURS = {
    Kind.RESERVED: "#8d99a6",
    Kind.SHARED: "#dcebd5",
    Kind.OFFLINE: "url(#offline)",
}
PALETTE_SIZE = 24


def _palette_colour(index: int) -> str:
    """Hues a golden angle apart, saturated enough to stand apart from the pale shared
    pool and the grey reserved CPUs, in two lightnesses."""
    hue = (0.58 + index * 0.381966) % 1.0
    lightness = 0.50 if index % 2 == 0 else 0.38
    r, g, b = colorsys.hls_to_rgb(hue, lightness, 0.70)
    return f"#{round(r * 255):02x}{round(g * 255):02x}{round(b * 255):02x}"


PALETTE = tuple(_palette_colour(i) for i in range(PALETTE_SIZE))


def workload_colour(name: str) -> str:
    """The colour of the workload called ``name``: the same for its whole life, whoever
    else is admitted or released."""
    digest = hashlib.blake2b(name.encode(), digest_size=4).digest()
    return PALETTE[int.from_bytes(digest, "big") % PALETTE_SIZE]


# The distance scale: (distance, colour) stops, linear between them, flat beyond the ends.
LOCAL = 10
ORDINARY = 21  # the kernel's default remote distance; SNC and 2-socket machines sit below
SCALE = (
    (10, (255, 255, 255)),
    (21, (189, 215, 238)),
    (32, (140, 180, 220)),
    (40, (255, 237, 160)),
    (80, (253, 141, 60)),
    (120, (189, 0, 38)),
)
UNKNOWN = "#dddddd"


def distance_colour(d: int) -> str:
    """The colour of distance ``d`` on the fixed scale."""
    low_d, low_rgb = SCALE[0]
    if d <= low_d:
        return _hex(low_rgb)
    for high_d, high_rgb in SCALE[1:]:
        if d <= high_d:
            t = (d - low_d) / (high_d - low_d)
            return _hex(
                tuple(round(a + (b - a) * t) for a, b in zip(low_rgb, high_rgb, strict=True))
            )
        low_d, low_rgb = high_d, high_rgb
    return _hex(low_rgb)


def warm(colour: str) -> bool:
    """Whether ``colour`` reads as a warning: more red than blue, and not pale."""
    r, g, b = (int(colour[i : i + 2], 16) for i in (1, 3, 5))
    return r > b + 40 and g < 200


def _hex(rgb: tuple[int, ...]) -> str:
    return "#" + "".join(f"{v:02x}" for v in rgb)


def ink(fill: str) -> str:
    """Dark text on light fills, white on dark ones."""
    if not fill.startswith("#") or len(fill) != 7:
        return "#222"
    r, g, b = (int(fill[i : i + 2], 16) for i in (1, 3, 5))
    return "#222" if 0.299 * r + 0.587 * g + 0.114 * b > 140 else "#ffffff"
