"""The picture of the running daemon, over its API, and writing a picture to a file.

Edge, for the CLI (``numad show --svg``, ``numad topology --svg``): the machine comes
from ``GET /v1/topology``, the holders from ``GET /v1/workloads`` and ``GET /v1/host``,
each node's memory held and free from ``GET /v1/nrt`` (numad's books), the same views
the live page draws in process.
"""

from __future__ import annotations

from pathlib import Path

from numad.cli.client import request
from numad.errors import NumadError
from numad.topology.fromjson import from_json
from numad.topology.picture.draw import svg
from numad.topology.picture.holders import from_api


def from_daemon(socket: str, title: str = "", highlight: str | None = None) -> str:
    """The SVG of the machine the daemon on ``socket`` runs, with what it holds now; the
    workload named ``highlight`` singled out (``numad show NAME --svg``)."""
    topo = from_json(request(socket, "GET", "/v1/topology"))
    workloads = request(socket, "GET", "/v1/workloads")["workloads"]
    host = request(socket, "GET", "/v1/host")
    holders = from_api(workloads, host, request(socket, "GET", "/v1/nrt"))
    return svg(topo, holders, title, highlight=highlight)


def write(path: Path, text: str) -> None:
    """``text`` into ``path``, whole; an error names the file."""
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as err:
        raise NumadError(str(path), f"cannot write the picture: {err.strerror}") from err
