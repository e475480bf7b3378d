"""The package and its unpacked tree, once per session (per xdist worker: the build
itself is shared, tests/packaging/build.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.packaging.build import deb


@pytest.fixture(scope="session")
def package() -> Path:
    return deb()


@pytest.fixture(scope="session")
def unpacked(package: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package's files, as ``dpkg-deb -x`` lays them out."""
    root = tmp_path_factory.mktemp("numad-deb")
    subprocess.run(["dpkg-deb", "-x", str(package), str(root)], check=True)
    return root


@pytest.fixture(scope="session")
def control(package: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package's control files (control, conffiles, maintainer scripts)."""
    root = tmp_path_factory.mktemp("numad-deb-control")
    subprocess.run(["dpkg-deb", "-e", str(package), str(root / "DEBIAN")], check=True)
    return root / "DEBIAN"
