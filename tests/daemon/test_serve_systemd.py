"""`numad serve` under systemd's notify protocol: READY after the first reconcile,
RELOADING and READY again on SIGHUP (re-reading workloads.d), STOPPING on SIGTERM."""

from __future__ import annotations

import signal
import socket
import time
from pathlib import Path

from tests.daemon.test_daemon_e2e import Numad, numad

__all__ = ["numad"]


def _messages(sock: socket.socket, until: str, timeout: float = 30) -> list[str]:
    got: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            got.append(sock.recv(4096).decode())
        except TimeoutError:
            break
        if any(until in m for m in got):
            break
    return got


def test_notify_protocol_and_reload(numad: Numad, tmp_path: Path) -> None:
    path = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        numad.stop()
        numad.start(env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "400000"})
        ready = _messages(sock, "READY=1")
        assert any(m.startswith("READY=1") and "STATUS=0 workloads" in m for m in ready)
        assert any("WATCHDOG=1" in m for m in _messages(sock, "WATCHDOG=1", timeout=5))
        declared = numad.root / "etc" / "numad" / "workloads.d"
        declared.mkdir(parents=True)
        (declared / "db.toml").write_text('name = "db"\ncgroup = "numad.slice/db"\ncpus = 2\n')
        assert numad.proc is not None
        numad.proc.send_signal(signal.SIGHUP)
        reloaded = _messages(sock, "reloaded")
        assert any(m.startswith("RELOADING=1") and "MONOTONIC_USEC=" in m for m in reloaded)
        assert any(m.startswith("READY=1") and "1 workloads" in m for m in reloaded)
        assert [w["name"] for w in numad.call("GET", "/v1/workloads")["workloads"]] == ["db"]
        numad.proc.send_signal(signal.SIGTERM)
        assert any("STOPPING=1" in m for m in _messages(sock, "STOPPING=1"))
        assert numad.proc.wait(timeout=20) == 0
