"""Topology: the model of a machine, its discovery from sysfs, its rendering."""
