"""The picture of the machine (``numad topology --svg``, ``numad show --svg``, the live
page): packages, dies, NUMA nodes with memory, L3 groups, cores, threads and PCI
devices, every CPU coloured by who holds it, and the node distances as a heat map.

``layout`` places boxes, ``draw`` writes SVG text, ``holders`` says who holds what:
pure, no file, no clock, no dependency beyond the standard library. ``remote`` is
the edge: the running daemon's picture over its API, and writing a picture out.
"""

from numad.topology.picture.draw import svg
from numad.topology.picture.holders import Holders, Kind, Workload, from_api

__all__ = ["Holders", "Kind", "Workload", "from_api", "svg"]
