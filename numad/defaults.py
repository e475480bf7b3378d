"""Default paths, shared by the config and the light client commands (which must not
import the config: it brings the managers and numpy), and the check of the one path
both the API server and its clients use: the socket's."""

from __future__ import annotations

import os

from numad.errors import NumadError

CGROUP_ROOT = "/sys/fs/cgroup"
MANAGED_ROOT = "numad.slice"
STATE_DIR = "/var/lib/numad"
SOCKET = "/run/numad/numad.sock"
WORKLOADS_DIR = "/etc/numad/workloads.d"

MAX_SOCKET_PATH = 107  # bytes: sun_path holds 108 with the closing NUL (unix(7))


def check_socket_path(path: str) -> None:
    """A socket path the kernel can bind or connect to; else an error naming it (the
    kernel's own is "AF_UNIX path too long", which names nothing)."""
    size = len(os.fsencode(path))
    if size > MAX_SOCKET_PATH:
        raise NumadError(
            path,
            f"the socket path is {size} bytes; a Unix socket's may have {MAX_SOCKET_PATH} at most",
            "give a shorter --socket (or a --root DIR with a shorter path)",
        )
