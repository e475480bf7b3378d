"""The picture of the machine (``numad topology --svg``, ``numad show --svg``, the live
page): packages, dies, NUMA nodes with memory, L3 groups, cores, threads and PCI
devices, every CPU coloured by who holds it, and the node distances as a heat map.

``layout`` places boxes, ``draw`` writes SVG text (``heat`` the distance matrix,
``svgtext`` the elements), ``colours`` says which colour is whose, ``holders`` who
holds what:
pure, no file, no clock, no dependency beyond the standard library. ``remote`` is
the edge: the running daemon's picture over its API, and writing a picture out.
"""

from numad.topology.picture.colours import workload_colour
from numad.topology.picture.draw import Key, legend_keys, svg
from numad.topology.picture.holders import Holders, Kind, NodeMemory, Workload, from_api

__all__ = [
    "Holders",
    "Key",
    "Kind",
    "NodeMemory",
    "Workload",
    "from_api",
    "legend_keys",
    "svg",
    "workload_colour",
]
