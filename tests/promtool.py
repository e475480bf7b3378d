"""Prometheus' own linter for the metrics test (tests/test_promtool.py).

``promtool`` ships in Debian's ``prometheus`` package, which also brings a
Prometheus server with a service. ``python -m tests.promtool --prepare``
(scripts/check, as root, beside the VM tier's tools) installs the package where
promtool is missing, with no recommends and with services kept from starting, and
then makes sure no Prometheus service is enabled or running: the test needs the
binary, the host needs no new daemon.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from tests import debian

PACKAGE = "prometheus"
SERVICE = "prometheus"
# invoke-rc.d asks this program before it starts a service; 101 means "not now".


def promtool() -> str | None:
    """The path of promtool, or None."""
    return shutil.which("promtool")


def install() -> None:
    """Install Debian's ``prometheus`` where promtool is missing (root only)."""
    if promtool() is not None:
        return
    debian.install([PACKAGE])
    quiet_service()
    running = subprocess.run(["pgrep", "-x", SERVICE], capture_output=True, check=False)
    if running.returncode == 0:
        raise SystemExit(
            f"{SERVICE}: a server is running after the install (pid {running.stdout.split()});"
            " stop it: the tests need only promtool"
        )


def quiet_service() -> None:
    """Disable (and stop, where systemd runs) the service the package enabled.

    Debian's maintainer scripts enable the unit for the next boot even when
    policy-rc.d keeps it from starting now.
    """
    if shutil.which("systemctl") is not None:
        subprocess.run(
            ["systemctl", "disable", "--now", f"{SERVICE}.service"],
            capture_output=True,
            check=False,
        )
    if shutil.which("update-rc.d") is not None and Path(f"/etc/init.d/{SERVICE}").exists():
        subprocess.run(
            ["update-rc.d", SERVICE, "disable"],
            capture_output=True,
            check=False,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.promtool", description=__doc__)
    parser.add_argument("--prepare", action="store_true", help="install promtool where missing")
    args = parser.parse_args(argv)
    if args.prepare:
        install()
        print(f"promtool: {promtool()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
