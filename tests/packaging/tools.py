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
import sys

from tests import debian

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
    debian.install(packages)


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
