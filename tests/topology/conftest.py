"""The 24 further recorded machines of fixtures/hwloc-more, unpacked once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest

from numad.topology.record import load_fixture

MORE = Path(__file__).resolve().parents[2] / "fixtures" / "hwloc-more"
MORE_TREES = sorted(p.name.removesuffix(".tar.bz2") for p in MORE.glob("*.tar.bz2"))


class MoreMachines:
    """Unpacks a tree of fixtures/hwloc-more on first use (its top directory may be
    named otherwise than the archive: 8em64t-2s4c-asymcaches holds 8em64t-2s4c-heterogeneous)."""

    def __init__(self, base: Path) -> None:
        self._base = base
        self._roots: dict[str, Path] = {}

    def root(self, name: str) -> Path:
        if name not in self._roots:
            dest = self._base / name
            dest.mkdir()
            self._roots[name] = load_fixture(MORE / f"{name}.tar.bz2", dest)
        return self._roots[name]


@pytest.fixture(scope="session")
def more_machines(tmp_path_factory: pytest.TempPathFactory) -> MoreMachines:
    return MoreMachines(tmp_path_factory.mktemp("hwloc-more"))
