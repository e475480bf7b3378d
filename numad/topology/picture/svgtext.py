"""SVG elements as text: the rectangles and labels every part of the picture draws.

Pure. Colours are attributes, not only CSS, so any viewer shows them.
"""

from __future__ import annotations

from html import escape

from numad.topology.picture.layout import Box


def rect(box: Box, fill: str, extra: str = "") -> str:
    return (
        f'<rect x="{box.x:g}" y="{box.y:g}" width="{box.w:g}" height="{box.h:g}"'
        f' fill="{fill}" stroke="#555"{extra}/>'
    )


def text(x: float, y: float, words: str, fill: str = "", *, size: int = 0, extra: str = "") -> str:
    attrs = f' fill="{fill}"' if fill and fill != "#222" else ""
    if size:
        attrs += f' style="font-size:{size}px"'
    return f'<text x="{x:g}" y="{y:g}"{attrs}{extra}>{escape(words)}</text>'
