"""numad's Debian package, built once and kept while its inputs stay the same.

``deb()`` is the one way tests get the package (these tests, and the VM tier that
installs it in a guest with ``dpkg -i``): it runs ``scripts/package`` under a
file lock, so pytest-xdist's workers build it once between them, and keeps the
result under ``build/package-cache/<digest of the inputs>/``, so a session whose
sources did not change (a CI cache of ``build/``) does not build at all. Where
the tools are missing it skips naming them; in CI (``CI`` set) that is a failure.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests import debian
from tests.packaging import tools

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / "build" / "package-cache"
# What scripts/package reads: the sources it stages, the packaging, itself.
INPUTS = ("pyproject.toml", "README.md", "numad", "systemd", "packaging", "scripts/package")


def version() -> str:
    """numad's version, as pyproject.toml has it."""
    with (REPO / "pyproject.toml").open("rb") as file:
        project: dict[str, str] = tomllib.load(file)["project"]
    return project["version"]


def name() -> str:
    """The package's file name: ``numad_<version>_<arch>.deb``."""
    arch = subprocess.run(
        ["dpkg", "--print-architecture"], capture_output=True, text=True, check=True
    ).stdout.strip()
    return f"numad_{version()}_{arch}.deb"


def missing() -> list[str]:
    """What building and inspecting the package needs and this machine lacks."""
    absent = tools.missing()
    dev = Path(sys.prefix, "bin")
    absent += [tool for tool in ("argparse-manpage", "shtab") if not (dev / tool).exists()]
    return absent


def require_tools() -> None:
    """Skip (fail in CI) where a tool is missing."""
    absent = missing()
    if absent:
        reason = (
            f"packaging tools missing: {', '.join(absent)}; as root:"
            " .venv/bin/python -m tests.packaging.tools --prepare"
        )
        debian.missing(reason, "building the package")


def digest() -> str:
    """A digest of every input file's path and contents (the work tree's, as staged)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *INPUTS],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    hasher = hashlib.sha256()
    for path in sorted(p for p in listed if p):
        file = REPO / os.fsdecode(path)
        if file.is_file():
            hasher.update(path + b"\0" + file.read_bytes() + b"\0")
    return hasher.hexdigest()[:16]


def deb() -> Path:
    """The package built from the current sources (built here if not cached yet)."""
    require_tools()
    CACHE.mkdir(parents=True, exist_ok=True)
    key = digest()
    target = CACHE / key / name()
    with (CACHE / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the other workers wait for this build
        if not target.exists():
            _build(CACHE / key)
    return target


def _build(out: Path) -> None:
    """scripts/package into ``out``; older builds are dropped (one is kept)."""
    for old in CACHE.iterdir():
        if old.is_dir():
            shutil.rmtree(old)
    env = dict(os.environ, NUMAD_DEV_VENV=sys.prefix)
    proc = subprocess.run(
        [str(REPO / "scripts" / "package"), "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    if proc.returncode != 0:
        shutil.rmtree(out, ignore_errors=True)
        pytest.fail(f"scripts/package: exit {proc.returncode}:\n{proc.stderr[-4000:]}")
