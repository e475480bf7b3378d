"""Shared fixtures: the recorded machines, unpacked once per test session."""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from numad.daemon.config import parse
from numad.daemon.root import Daemon
from numad.daemon.service import build
from numad.errors import CgroupError
from numad.host.scratch import scratch_mkdir
from numad.topology.record import load_fixture
from tests.vm import progress, schedule


def pytest_configure(config: pytest.Config) -> None:
    progress.install(config)  # a line per VM as it finishes (tests/vm/progress.py)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    schedule.vm_first(items)  # the boots start at once (tests/vm/schedule.py)


FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "sysfs"
CATALOGUE: list[dict[str, Any]] = json.loads((FIXTURES / "catalogue.json").read_text())
MACHINES = {entry["name"]: entry for entry in CATALOGUE}


class Machines:
    """Unpacks recorded machines on first use into one session directory."""

    def __init__(self, base: Path) -> None:
        self._base = base
        self._roots: dict[str, Path] = {}

    def root(self, name: str) -> Path:
        if name not in self._roots:
            archive = MACHINES[name]["archive"] if name in MACHINES else f"{name}.tar.gz"
            dest = self._base / name
            dest.mkdir()
            self._roots[name] = load_fixture(FIXTURES / archive, dest)
        return self._roots[name]


@pytest.fixture(scope="session")
def machines(tmp_path_factory: pytest.TempPathFactory) -> Machines:
    return Machines(tmp_path_factory.mktemp("machines"))


@pytest.fixture(autouse=True)
def _fresh_logging() -> Iterator[None]:
    """A test that runs numad's CLI configures logging onto pytest's captured stderr,
    which is closed after that test: later tests must not write to it."""
    yield
    structlog.reset_defaults()


DAEMON_MACHINE = "32intel64-2p8co2t+8ve"  # node 0: CPUs 0-7,16-23, the vector engines


def recorded_daemon(
    machines: Machines, tmp_path: Path, extra: dict[str, Any] | None = None
) -> Daemon:
    """A started daemon on a copy of the 2-socket recording with a scratch cgroup v2
    tree: single-numa-node, 2 reserved CPUs chosen by count, no memory manager; its
    workload cgroup numad.slice/db exists, as systemd would have made it."""
    root = tmp_path / "machine"
    shutil.copytree(machines.root(DAEMON_MACHINE), root, symlinks=True)
    raw: dict[str, Any] = {
        "topology": {"policy": "single-numa-node"},
        "cpu": {"reserved-count": 2},
        "memory": {"policy": "none"},
        **(extra or {}),
    }
    daemon = build(parse(raw), str(root))
    daemon.start()
    scratch_mkdir(root / "sys/fs/cgroup", "numad.slice/db")
    return daemon


def restarted_daemon(daemon: Daemon, extra: dict[str, Any] | None = None) -> Daemon:
    """A new daemon on ``recorded_daemon``'s machine, state and cgroups, as after a stop
    or SIGKILL (``extra``: config sections that differ now)."""
    raw: dict[str, Any] = {
        "topology": {"policy": "single-numa-node"},
        "cpu": {"reserved-count": 2},
        "memory": {"policy": "none"},
        **(extra or {}),
    }
    new = build(parse(raw), str(daemon.fs.root))
    new.start()
    return new


def fails_at_once(action: Callable[[], object], blocked: str) -> CgroupError:
    """The CgroupError ``action`` raises, run in a thread joined within 5 s, so that
    code blocked on a FIFO fails the test (``blocked`` says what blocked) instead of
    hanging it."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            action()
            outcome.append(None)
        except CgroupError as err:
            outcome.append(err)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(5)
    assert not worker.is_alive(), blocked
    assert isinstance(outcome[0], CgroupError), "no CgroupError"
    return outcome[0]
