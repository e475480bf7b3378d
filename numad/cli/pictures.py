"""The picture of the running daemon, over its API, and writing a picture to a file.

Edge, for the CLI (``numad show --svg``, ``numad topology --svg``): the machine comes
from ``GET /v1/topology``, the holders from ``GET /v1/workloads`` and ``GET /v1/host``,
the same views the live page draws in process.
"""

from __future__ import annotations

from pathlib import Path

from numad.cli.client import request
from numad.errors import NumadError
from numad.topology.fromjson import from_json
from numad.topology.picture.draw import svg
from numad.topology.picture.holders import from_api


def from_daemon(socket: str, title: str = "") -> str:
    """The SVG of the machine the daemon on ``socket`` runs, with what it holds now."""
    topo = from_json(request(socket, "GET", "/v1/topology"))
    workloads = request(socket, "GET", "/v1/workloads")["workloads"]
    holders = from_api(workloads, request(socket, "GET", "/v1/host"))
    return svg(topo, holders, title)


def write(path: Path, text: str) -> None:
    """``text`` into ``path``, whole; an error names the file."""
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as err:
        raise NumadError(str(path), f"cannot write the picture: {err.strerror}") from err
