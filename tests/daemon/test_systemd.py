"""systemd integration: the sd_notify protocol against a socket the test binds,
and the unit files checked by ``systemd-analyze verify`` and scored by
``systemd-analyze security`` where it is installed (in CI it must be)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from numad.daemon import notify
from tests import debian

REPO = Path(__file__).resolve().parents[2]
UNITS = REPO / "systemd"


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[tuple[socket.socket, dict[str, str]]]:
    """A datagram socket standing in for systemd's, and the environment naming it."""
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(5)
        yield sock, {"NOTIFY_SOCKET": str(path)}


def _lines(sock: socket.socket) -> list[str]:
    return sock.recv(4096).decode().split("\n")


def test_ready_with_status(listener: tuple[socket.socket, dict[str, str]]) -> None:
    sock, env = listener
    assert notify.ready("3 workloads", env=env)
    assert _lines(sock) == ["READY=1", "STATUS=3 workloads"]


def test_ready_without_status(listener: tuple[socket.socket, dict[str, str]]) -> None:
    sock, env = listener
    assert notify.ready(env=env)
    assert _lines(sock) == ["READY=1"]


def test_status_stays_one_line(listener: tuple[socket.socket, dict[str, str]]) -> None:
    sock, env = listener
    assert notify.status("reconciling\nREADY=1", env=env)
    assert _lines(sock) == ["STATUS=reconciling READY=1"]


@pytest.mark.parametrize(
    ("send", "expected"),
    [
        pytest.param(notify.watchdog, ["WATCHDOG=1"], id="watchdog"),
        pytest.param(notify.stopping, ["STOPPING=1"], id="stopping"),
    ],
)
def test_keyword_messages(
    listener: tuple[socket.socket, dict[str, str]],
    send: Callable[..., bool],
    expected: list[str],
) -> None:
    sock, env = listener
    assert send(env=env)
    assert _lines(sock) == expected


def test_reloading_carries_monotonic_usec(
    listener: tuple[socket.socket, dict[str, str]],
) -> None:
    sock, env = listener
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    assert notify.reloading(env=env)
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    first, second = _lines(sock)
    assert first == "RELOADING=1"
    key, _, value = second.partition("=")
    assert key == "MONOTONIC_USEC"
    assert before <= int(value) <= after


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract sockets are Linux's")
def test_abstract_socket() -> None:
    name = f"numad-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(b"\0" + name.encode())
        sock.settimeout(5)
        assert notify.notify("READY=1", env={"NOTIFY_SOCKET": "@" + name})
        assert _lines(sock) == ["READY=1"]


def test_unset_socket_returns_false() -> None:
    assert not notify.notify("READY=1", env={})
    assert not notify.ready("x", env={"NOTIFY_SOCKET": ""})


def test_dead_socket_returns_false(tmp_path: Path) -> None:
    path = tmp_path / "gone.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))  # bound, then closed: the file stays, nobody listens
    assert not notify.watchdog(env={"NOTIFY_SOCKET": str(path)})
    assert not notify.watchdog(env={"NOTIFY_SOCKET": str(tmp_path / "never.sock")})


def test_default_environment(
    listener: tuple[socket.socket, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    sock, env = listener
    monkeypatch.setenv("NOTIFY_SOCKET", env["NOTIFY_SOCKET"])
    assert notify.notify("WATCHDOG=1")
    assert _lines(sock) == ["WATCHDOG=1"]


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        pytest.param({}, None, id="unset"),
        pytest.param({"WATCHDOG_USEC": "30000000"}, 15.0, id="half-of-30s"),
        pytest.param({"WATCHDOG_USEC": "1000"}, 0.0005, id="sub-millisecond"),
        pytest.param({"WATCHDOG_USEC": "0"}, None, id="zero-disarmed"),
        pytest.param({"WATCHDOG_USEC": "-5"}, None, id="negative"),
        pytest.param({"WATCHDOG_USEC": "30s"}, None, id="not-a-number"),
        pytest.param({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}, None, id="other-pid"),
        pytest.param({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "x"}, None, id="bad-pid"),
        pytest.param({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": ""}, 15.0, id="empty-pid"),
    ],
)
def test_watchdog_interval(env: dict[str, str], expected: float | None) -> None:
    assert notify.watchdog_interval(env) == expected


def test_watchdog_interval_for_this_pid() -> None:
    env = {"WATCHDOG_USEC": "10000000", "WATCHDOG_PID": str(os.getpid())}
    assert notify.watchdog_interval(env) == 5.0


def _systemd_analyze() -> str:
    """systemd-analyze, or a skip where it is not installed, except in CI (``CI`` set),
    where a skip would hide an unchecked unit."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        debian.missing("systemd-analyze is not installed", "the units' check")
    return analyze


def test_units_verify(tmp_path: Path) -> None:
    analyze = _systemd_analyze()
    # verify insists that ExecStart= names an existing executable: point a copy of
    # the unit at this environment's numad script (or, failing that, Python).
    numad = shutil.which("numad") or str(Path(sys.executable).with_name("numad"))
    executable = numad if os.access(numad, os.X_OK) else sys.executable
    text = (UNITS / "numad.service").read_text(encoding="utf-8")
    assert "ExecStart=/usr/bin/numad serve" in text
    (tmp_path / "numad.service").write_text(
        text.replace("ExecStart=/usr/bin/numad", f"ExecStart={executable}"), encoding="utf-8"
    )
    shutil.copy(UNITS / "numad.slice", tmp_path / "numad.slice")
    result = subprocess.run(
        [analyze, "verify", str(tmp_path / "numad.service"), str(tmp_path / "numad.slice")],
        capture_output=True,
        text=True,
        env={**os.environ, "SYSTEMD_LOG_LEVEL": "err"},
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# systemd-analyze's scale: 0.0 (locked down) to 10.0 (unprotected). 1.9 before numad
# pulled memory; migrate_pages (in @resources) and CAP_SYS_PTRACE, which it needs on
# root workloads, cost 0.2 + 0.3 (the unit's comments say how to drop both), and
# CAP_SYS_NICE, which Linux 6.1 asks to enable cpuset above root services, 0.1;
# CAP_SYS_ADMIN, which the kernel asks to make a cpuset partition ([host] partitions
# = "auto", issue 23), 0.3.
MAX_EXPOSURE = 2.6


def test_unit_exposure() -> None:
    """The hardening of numad.service, as systemd scores it offline (systemd >= 252)."""
    analyze = _systemd_analyze()
    result = subprocess.run(
        [
            analyze,
            "security",
            "--offline=true",
            f"--threshold={round(MAX_EXPOSURE * 10)}",  # in tenths: fail above MAX_EXPOSURE
            "--no-pager",
            str(UNITS / "numad.service"),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "SYSTEMD_LOG_LEVEL": "err", "SYSTEMD_COLORS": "0"},
        check=False,
        timeout=60,
    )
    found = re.search(r"Overall exposure level for numad\.service: (\d+\.\d)", result.stdout)
    assert found is not None, result.stdout + result.stderr
    exposure = float(found.group(1))
    assert exposure <= MAX_EXPOSURE, result.stdout
    assert result.returncode == 0, result.stdout + result.stderr
