"""Scratch cgroup trees: the emulated kernel writes only regular files inside the tree."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from numad.cpuset import CPUSet, NodeSet
from numad.errors import CgroupError
from numad.host.cgroup.v1 import CgroupV1Backend
from numad.host.cgroup.v2 import CgroupV2Backend
from numad.host.scratch import make_scratch_v1, make_scratch_v2, scratch_mkdir
from tests.conftest import fails_at_once

BLOCKED = "the emulated kernel blocked on a FIFO"  # what fails_at_once says when a call hangs

ALL_CPUS = CPUSet(range(8))
ALL_MEMS = NodeSet([0, 1])


def _backend(kind: str, tmp_path: Path) -> tuple[CgroupV2Backend | CgroupV1Backend, Path, str]:
    """A backend emulating ``kind``'s kernel over numad.slice/db, that cgroup's
    directory, and the name of its effective-CPUs file (which only the kernel writes)."""
    if kind == "v2":
        root = tmp_path / "cgroup"
        make_scratch_v2(root, ALL_CPUS, ALL_MEMS)
        v2 = CgroupV2Backend(root, ["numad.slice"], emulate_kernel=True)
        v2.ensure("numad.slice/db")
        return v2, root / "numad.slice/db", "cpuset.cpus.effective"
    make_scratch_v1(tmp_path, ALL_CPUS, ALL_MEMS)
    v1 = CgroupV1Backend(tmp_path / "cpuset", ["numad.slice"], emulate_kernel=True)
    v1.ensure("numad.slice/db")
    return v1, tmp_path / "cpuset/numad.slice/db", "cpuset.effective_cpus"


@pytest.mark.parametrize("kind", ["v2", "v1"])
def test_emulation_writes_no_file_through_a_link(tmp_path: Path, kind: str) -> None:
    backend, db, effective = _backend(kind, tmp_path / "tree")
    outside = tmp_path / "outside.txt"
    outside.write_text("not numad's\n")
    (db / effective).unlink()
    (db / effective).symlink_to(outside)
    with pytest.raises(CgroupError, match="not a regular file") as caught:
        backend.write("numad.slice/db", CPUSet([0, 1]), None)
    assert caught.value.subject == str(db / effective)
    assert outside.read_text() == "not numad's\n"
    assert (db / effective).is_symlink()


def test_emulation_writes_no_fifo(tmp_path: Path) -> None:
    """A FIFO where the kernel's file should be fails at once (no reader: no block)."""
    backend, db, effective = _backend("v2", tmp_path)
    (db / effective).unlink()
    os.mkfifo(db / effective)
    err = fails_at_once(lambda: backend.write("numad.slice/db", CPUSet([0, 1]), None), BLOCKED)
    assert "not a regular file" in str(err)


def test_emulation_reads_no_fifo(tmp_path: Path) -> None:
    """A FIFO at a child's cpuset.cpus fails the parent's write at once: the emulated
    kernel reads it to refresh the child's effective set, and waits for no writer."""
    backend, db, _ = _backend("v2", tmp_path)
    (db / "cpuset.cpus").unlink()
    os.mkfifo(db / "cpuset.cpus")
    err = fails_at_once(lambda: backend.write("numad.slice", CPUSet([0, 1, 2]), None), BLOCKED)
    assert err.subject == str(db / "cpuset.cpus")
    assert "not a regular file" in str(err)


def test_scratch_mkdir_writes_no_file_through_a_link(tmp_path: Path) -> None:
    """Enabling cpuset lists it in every child's cgroup.controllers: not through a link."""
    root = tmp_path / "cgroup"
    make_scratch_v2(root, ALL_CPUS, ALL_MEMS)
    (root / "numad.slice").mkdir()
    outside = tmp_path / "outside.txt"
    outside.write_text("not numad's\n")
    (root / "numad.slice/cgroup.controllers").symlink_to(outside)
    with pytest.raises(CgroupError, match="not a regular file"):
        scratch_mkdir(root, "numad.slice/db")
    assert outside.read_text() == "not numad's\n"


def test_scratch_mkdir_refuses_a_tree_without_the_marker(tmp_path: Path) -> None:
    with pytest.raises(CgroupError, match="not a scratch cgroup tree"):
        scratch_mkdir(tmp_path, "numad.slice/db")


def test_a_plain_mkdir_is_a_cgroup_in_a_scratch_tree(tmp_path: Path) -> None:
    """In cgroupfs mkdir alone makes a cgroup; a scratch tree's plain directories
    (``mkdir -p numad.slice/web``, no interface files) get their cpuset all the same."""
    root = tmp_path / "cgroup"
    make_scratch_v2(root, ALL_CPUS, ALL_MEMS)
    (root / "numad.slice/web").mkdir(parents=True)
    backend = CgroupV2Backend(root, ["numad.slice"], emulate_kernel=True)
    backend.ensure("numad.slice/web")
    backend.write("numad.slice/web", CPUSet([2, 3]), NodeSet([1]))
    web = root / "numad.slice/web"
    assert (web / "cpuset.cpus.effective").read_text() == "2-3\n"
    assert (web / "cpuset.mems.effective").read_text() == "1\n"
    assert (root / "numad.slice/cgroup.subtree_control").read_text().split() == ["cpuset"]
    assert backend.read("numad.slice/web") == (CPUSet([2, 3]), NodeSet([1]))
    assert backend.processes("numad.slice/web") == []


def test_adopting_keeps_what_a_plain_directory_already_holds(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    make_scratch_v2(root, ALL_CPUS, ALL_MEMS)
    web = root / "numad.slice/web"
    web.mkdir(parents=True)
    (web / "cgroup.type").write_text("threaded\n")
    backend = CgroupV2Backend(root, ["numad.slice"], emulate_kernel=True)
    assert backend.exists("numad.slice/web")
    assert (web / "cgroup.type").read_text() == "threaded\n"
    assert (web / "cgroup.procs").read_text() == "\n"


@pytest.mark.parametrize("kind", ["v2", "v1"])
def test_a_reaction_to_a_mkdir_waits_for_the_whole_cgroup(tmp_path: Path, kind: str) -> None:
    """The kernel makes a cgroup whole before anyone sees it. numad reacts to a
    test's mkdir at once (inotify), in another process: that reader must never see
    half a cgroup, and its write must not be undone by the rest of the mkdir."""
    backend, _, _ = _backend(kind, tmp_path)
    root = backend.root
    other = type(backend)(root, ["numad.slice"], emulate_kernel=True)  # the daemon's
    pool = CPUSet([2, 3])
    names = [f"numad.slice/c{i}" for i in range(80)]
    errors: list[BaseException] = []
    made = threading.Event()

    def react() -> None:
        done: set[str] = set()
        while len(done) < len(names):
            for child in (root / "numad.slice").iterdir():
                path = f"numad.slice/{child.name}"
                if child.is_dir() and path in names and path not in done:
                    try:
                        other.write(path, pool, None)
                    except (CgroupError, ValueError) as err:
                        errors.append(err)
                    done.add(path)
            if made.is_set() and errors:
                return
            time.sleep(0.0005)  # a watcher's pace, leaving the GIL to the mkdirs

    reactor = threading.Thread(target=react, daemon=True)
    reactor.start()
    for path in names:
        scratch_mkdir(root, path) if kind == "v2" else backend.ensure(path)
    made.set()
    reactor.join(timeout=120)  # a bound for a hang, not a speed goal
    assert not reactor.is_alive()
    assert errors == []
    torn = {p: backend.read(p)[0] for p in names if backend.read(p)[0] != pool}
    assert torn == {}, "a reaction's write was undone by the rest of the mkdir"
