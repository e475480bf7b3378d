"""Topology: the model of a machine, its discovery from sysfs, its rendering and picture.

May import only the shared vocabulary (``numad.cpuset``, ``numad.errors``, ``numad.hostfs``).
"""
