"""A socket path longer than a Unix socket may have is an error naming the path, for
the daemon's listener and for every client (the kernel says only "AF_UNIX path too
long", and a deep --root makes one easily)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from numad.cli import main as cli
from numad.daemon.api import Server
from numad.defaults import MAX_SOCKET_PATH
from numad.errors import NumadError


def _long(tmp_path: Path) -> str:
    path = str(tmp_path / ("d" * 40) / ("e" * 40) / "numad.sock")
    assert len(path) > MAX_SOCKET_PATH
    return path


@pytest.mark.parametrize(
    "argv", [["list"], ["show", "db"], ["release", "db"], ["host"]], ids=lambda a: a[0]
)
def test_a_client_names_the_socket_path_too_long(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    path = _long(tmp_path)
    assert cli.main([*argv, "--socket", path]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"numad: {path}: the socket path is {len(path)} bytes;"), err
    assert err.count("\n") == 1
    assert "Traceback" not in err


def test_the_listener_names_the_socket_path_too_long(tmp_path: Path) -> None:
    path = _long(tmp_path)
    backend: Any = object()  # never reached: the path is refused first
    with pytest.raises(NumadError, match=r"the socket path is .* bytes") as caught:
        Server(path, backend)
    assert caught.value.subject == path
    assert not Path(path).parent.exists()  # nothing made for a socket that cannot be


def test_the_longest_path_the_kernel_takes_is_accepted(tmp_path: Path) -> None:
    base = str(tmp_path / "s")
    path = base + "x" * (MAX_SOCKET_PATH - len(base))
    assert len(path) == MAX_SOCKET_PATH
    import socket  # noqa: PLC0415 - only this test binds

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(path)  # the kernel's limit is the same as numad's
