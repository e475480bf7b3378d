"""Crash survival: what a checkpoint write leaves on disk when its process is
SIGKILLed, read back by a fresh reader in another process.

The injected faults of test_state.py check that a failed step is reported; these
check that a write that returned is on disk, and that a write cut anywhere leaves
the old checkpoint or the new one, never garbage. Each child is a new Python
process that kills itself with SIGKILL at its point (no cleanup, no atexit, no
flush of anything numad left in user space); every child is bounded in time.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from numad.cpuset import CPUSet
from numad.daemon import state
from numad.daemon.config import parse
from numad.daemon.service import build
from numad.host import durable
from tests.conftest import DAEMON_MACHINE, Machines

REPO = Path(__file__).resolve().parents[2]
CHILD_SECONDS = 60  # a bound for a hung child, not a speed goal

OLD = state.Checkpoint(
    "0,16",
    {
        "db": state.Record(
            {"name": "db", "cgroup": "numad.slice/db", "cpus": 4}, {"main": "1-2,17-18"}
        )
    },
    reserved_from="count=2",
    grants={"numad.slice/db": "1-2,17-18"},
    seen=("db",),
)
NEW = state.Checkpoint(
    "0,16",
    {
        **OLD.workloads,
        **{
            f"w{i}": state.Record(
                {"name": f"w{i}", "cgroup": f"numad.slice/w{i}", "cpus": 2},
                {"main": f"{3 + i},{19 + i}"},
            )
            for i in range(4)
        },
    },
    ("numad.slice/gone.service",),
    "count=2",
    {"numad.slice/db": "1-2,17-18"},
    ("db", "w0"),
)


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _killing(point: str) -> durable.Syscalls:
    """The real calls, except that the process dies at ``point`` of the write."""
    real = durable.SYSCALLS

    def write(fd: int, data: memoryview) -> int:
        if point.startswith("write-"):  # write-1, write-half, write-all-but-1: then die
            keep = {"write-1": 1, "write-half": len(data) // 2}.get(point, len(data) - 1)
            os.write(fd, data[:keep])
            _die()
        return real.write(fd, data)

    def fsync(fd: int) -> None:
        is_dir = os.path.isdir(f"/proc/self/fd/{fd}")
        if point == ("dir-fsync" if is_dir else "fsync"):
            _die()
        real.fsync(fd)

    def replace(src: Path, dst: Path) -> None:
        if point == "rename":
            _die()
        real.replace(src, dst)
        if point == "after-rename":
            _die()

    return durable.Syscalls(write, fsync, replace)


def child(directory: str, point: str) -> None:
    """In the child: write NEW, dying at ``point`` ("returned": right after the write
    returns)."""
    if point == "returned":
        state.write(Path(directory), NEW)
        _die()
    state.write(Path(directory), NEW, _killing(point))
    raise AssertionError(f"the write went past {point}")


def _run_child(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=CHILD_SECONDS,
        check=False,
        cwd=REPO,
    )
    assert done.returncode == -signal.SIGKILL, done.stdout + done.stderr
    return done


# Where the child dies, and which checkpoint a reader must find then.
POINTS = [
    pytest.param("write-1", "old", id="one-byte-written"),
    pytest.param("write-half", "old", id="half-written"),
    pytest.param("write-all-but-1", "old", id="all-but-one-byte-written"),
    pytest.param("fsync", "old", id="before-the-fsync"),
    pytest.param("rename", "old", id="before-the-rename"),
    pytest.param("after-rename", "new", id="after-the-rename"),
    pytest.param("dir-fsync", "new", id="before-the-directory-fsync"),
    pytest.param("returned", "new", id="after-the-write-returned"),
]


@pytest.mark.parametrize("before", ["old", "none"])
@pytest.mark.parametrize(("point", "after"), POINTS)
def test_a_checkpoint_write_killed_anywhere_leaves_the_old_or_the_new_one(
    tmp_path: Path, point: str, after: str, before: str
) -> None:
    if before == "old":
        state.write(tmp_path, OLD)
    code = "import sys; from tests.daemon.test_crash import child; child(*sys.argv[1:])"
    _run_child(code, str(tmp_path), point)
    found, problem = state.read(tmp_path)  # a fresh reader: this process never wrote NEW
    assert problem is None  # nothing unreadable, nothing kept aside
    expected = {"old": OLD if before == "old" else None, "new": NEW}[after]
    if expected is None:
        assert found is None
        assert not (tmp_path / state.FILE).exists()
    else:
        assert found is not None
        assert state.encode(found) == state.encode(expected)
        assert (tmp_path / state.FILE).read_bytes() == state.encode(expected)
    state.write(tmp_path, OLD)  # what the dead writer left does not block the next write
    assert state.read(tmp_path) == (OLD, None)


ADMIT_AND_DIE = """
import json, os, signal, sys
from pathlib import Path
from numad.daemon.config import parse
from numad.daemon.service import build
from numad.host.scratch import scratch_mkdir
root, raw = sys.argv[1], json.loads(sys.argv[2])
daemon = build(parse(raw), root)
daemon.start()
scratch_mkdir(Path(root) / "sys/fs/cgroup", "numad.slice/db")
spec = {"name": "db", "cgroup": "numad.slice/db", "cpus": 4}
outcome = daemon.admit(daemon.parse(json.dumps(spec), "json"))
print("held", outcome.placements["main"].cpus.format_list(), flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # right after the admission is acknowledged
"""


def test_an_acknowledged_admission_survives_a_sigkill(machines: Machines, tmp_path: Path) -> None:
    """A daemon SIGKILLed right after it answered an admission: a new daemon on the
    same machine and state finds the workload holding exactly those CPUs."""
    root = tmp_path / "machine"
    shutil.copytree(machines.root(DAEMON_MACHINE), root, symlinks=True)
    raw: dict[str, Any] = {
        "topology": {"policy": "single-numa-node"},
        "cpu": {"reserved-count": 2},
        "memory": {"policy": "none"},
    }
    done = _run_child(ADMIT_AND_DIE, str(root), json.dumps(raw))
    (line,) = (x for x in done.stdout.splitlines() if x.startswith("held "))  # after the logs
    held = CPUSet.parse_list(line.removeprefix("held "))
    assert len(held) == 4
    again = build(parse(raw), str(root))
    found, problem = state.read(again.state_dir)
    assert problem is None
    assert found is not None
    assert dict(found.workloads["db"].cpus) == {"main": held.format_list()}
    again.start()
    assert CPUSet.from_bits(again.books.cpu.assignments[("db", "main")]) == held
    cgroup = root / "sys/fs/cgroup/numad.slice/db/cpuset.cpus"
    assert CPUSet.parse_list(cgroup.read_text()) == held
    again.stop()
