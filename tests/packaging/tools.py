"""Debian's packaging tools for the package tests (tests/packaging).

``python -m tests.packaging.tools --prepare`` (scripts/check, as root) installs
what is missing, with no recommends and with services kept from starting
(tests/debian.py): debhelper builds the package, lintian judges it, groff renders
its man page, bash completes with its completion file.
Without root the tests skip naming the missing tool; in CI (CI set) they fail.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys

from tests.debian import no_services_started

# command -> the Debian package that brings it
TOOLS = {
    "dpkg-buildpackage": "dpkg-dev",
    "dh": "debhelper",
    "fakeroot": "fakeroot",
    "lintian": "lintian",
    "groff": "groff-base",
    "bash": "bash",
}
# The package's venv is made with Debian's own Python and its venv module.
VENV_PACKAGE = "python3-venv"


def missing() -> list[str]:
    """The commands of TOOLS not on PATH, and python3-venv when venv cannot bootstrap pip."""
    absent = [command for command in TOOLS if shutil.which(command) is None]
    if not os.path.exists("/usr/lib/python3.11/ensurepip/__init__.py"):
        absent.append(VENV_PACKAGE)
    return absent


def install() -> None:
    """Install the Debian packages of the missing tools (root only)."""
    absent = missing()
    if not absent:
        return
    packages = sorted({TOOLS.get(command, command) for command in absent})
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    with no_services_started():
        _run(["apt-get", "update", "-qq"], env)
        _run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages], env)


def _run(argv: list[str], env: dict[str, str]) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.strip()}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.packaging.tools", description=__doc__)
    parser.add_argument("--prepare", action="store_true", help="install the tools where missing")
    args = parser.parse_args(argv)
    if args.prepare:
        install()
    absent = missing()
    print(f"packaging tools: {'missing ' + ', '.join(absent) if absent else 'all present'}")
    return 0 if not absent else 1


if __name__ == "__main__":
    sys.exit(main())
