"""numad: a NUMA resource manager for Linux hosts."""

__version__ = "0.1.0"
