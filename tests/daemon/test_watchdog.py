"""The systemd watchdog end to end: the loops wired as ``numad serve`` wires them, the
pings read from a notify socket the test owns (DESIGN invariant 9)."""

from __future__ import annotations

import shutil
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from numad.daemon import notify
from numad.daemon.config import parse
from numad.daemon.loops import periods, reconcile_loop, watchdog_loop
from numad.daemon.service import build
from tests.conftest import DAEMON_MACHINE, Machines

QUIET_SECONDS = 1.5  # several stale windows (0.3 s) and ~15 reconcile passes


def _pings(sock: socket.socket, seconds: float, *, first: bool = False) -> list[bytes]:
    """Every WATCHDOG=1 datagram that arrives within ``seconds`` (``first``: up to the
    first one)."""
    got, deadline = [], time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            message = sock.recv(4096)
        except TimeoutError:
            break
        if b"WATCHDOG=1" in message.split(b"\n"):
            got.append(message)
            if first:
                break
    return got


def test_no_watchdog_ping_while_every_reconcile_pass_fails(
    machines: Machines, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass that raises is no progress: systemd hears nothing while reconcile fails
    (from the first pass at start on), and is pinged again once a pass succeeds."""
    root = tmp_path / "machine"
    shutil.copytree(machines.root(DAEMON_MACHINE), root, symlinks=True)
    raw: dict[str, Any] = {"topology": {"policy": "single-numa-node"}, "memory": {"policy": "none"}}
    daemon = build(parse(raw), str(root))
    failing, passes = threading.Event(), [0, 0]  # failed, succeeded
    failing.set()
    real = daemon.reconcile

    def reconcile() -> None:
        if failing.is_set():
            passes[0] += 1
            raise RuntimeError("injected: reconcile fails")
        real()
        passes[1] += 1

    daemon.reconcile = reconcile
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        monkeypatch.setenv("WATCHDOG_USEC", "200000")
        monkeypatch.delenv("WATCHDOG_PID", raising=False)
        daemon.start()  # its first reconcile pass fails too
        assert passes == [1, 0]
        interval = notify.watchdog_interval()
        assert interval == 0.1
        period, stale_after = periods(daemon.config.reconcile_seconds, interval)
        stop = threading.Event()
        threads = [
            threading.Thread(
                target=reconcile_loop, args=(daemon.supervisor, daemon.reconcile, stop, period)
            ),
            threading.Thread(
                target=watchdog_loop, args=(daemon.supervisor, stop, interval, stale_after)
            ),
        ]
        for thread in threads:
            thread.start()
        try:
            assert _pings(sock, QUIET_SECONDS) == []
            assert passes[0] >= 5, "the reconcile loop did not run"
            assert passes[1] == 0
            assert not daemon.ready
            failing.clear()  # passes succeed from now on: systemd is pinged again
            # 30 s: a bound for a hung loop, not a speed goal
            assert _pings(sock, 30, first=True) == [b"WATCHDOG=1"]
            assert passes[1] >= 1
        finally:
            stop.set()
            for thread in threads:
                thread.join(10)
            daemon.stop()
