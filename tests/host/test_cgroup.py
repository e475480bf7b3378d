"""cgroup enforcement on scratch hierarchies: path checks, ensure, writes, kernel emulation.

Every tree lives under ``tmp_path``; nothing here reads or writes this machine's own
cgroups. The kernel's errno values are simulated through ``numad.host.cgroup.v2._write_file``.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from cgroupspy import controllers

import numad.host.cgroup.v2 as v2_module
from numad.cpuset import CPUSet, NodeSet
from numad.errors import CgroupError
from numad.host.cgroup import CgroupBackend, CgroupPath, detect_backend
from numad.host.cgroup.hierarchy import SCRATCH_MARKER
from numad.host.cgroup.v1 import CgroupV1Backend
from numad.host.cgroup.v2 import CgroupV2Backend
from numad.host.scratch import make_scratch_v1, make_scratch_v2, scratch_mkdir
from tests.conftest import fails_at_once

BLOCKED = "the backend blocked on a FIFO"  # what fails_at_once says when a call hangs

ALL_CPUS = CPUSet(range(8))
ALL_MEMS = NodeSet([0, 1])


def cpus(text: str) -> CPUSet:
    return CPUSet.parse_list(text)


def mems(text: str) -> NodeSet:
    return NodeSet.parse_list(text)


@dataclass
class Scratch:
    """A backend over a scratch hierarchy (``kind`` v2 or v1), and the hierarchy's root."""

    kind: str
    backend: CgroupBackend
    root: Path


def scratch_v2(tmp_path: Path, managed: tuple[str, ...] = ("numad.slice",)) -> Scratch:
    root = tmp_path / "cgroup"
    make_scratch_v2(root, ALL_CPUS, ALL_MEMS, cgroups=["system.slice"])
    return Scratch("v2", CgroupV2Backend(root, managed, emulate_kernel=True), root)


def scratch_v1(tmp_path: Path, managed: tuple[str, ...] = ("numad.slice",)) -> Scratch:
    make_scratch_v1(tmp_path, ALL_CPUS, ALL_MEMS, cgroups=["system.slice"])
    root = tmp_path / "cpuset"
    return Scratch("v1", CgroupV1Backend(root, managed, emulate_kernel=True), root)


MAKERS: dict[str, Callable[..., Scratch]] = {"v2": scratch_v2, "v1": scratch_v1}


@pytest.fixture(params=sorted(MAKERS))
def scratch(request: pytest.FixtureRequest, tmp_path: Path) -> Scratch:
    return MAKERS[request.param](tmp_path)


@pytest.fixture
def v2(tmp_path: Path) -> Scratch:
    return scratch_v2(tmp_path)


@pytest.fixture
def v1(tmp_path: Path) -> Scratch:
    return scratch_v1(tmp_path)


# -- paths: checked as text, then on disk ---------------------------------------------------

BAD_PATHS = [
    pytest.param("", id="empty"),
    pytest.param("/numad.slice/db", id="absolute"),
    pytest.param("numad.slice/../system.slice", id="dotdot-inside"),
    pytest.param("..", id="dotdot"),
    pytest.param("numad.slice//db", id="empty-component"),
    pytest.param("numad.slice/", id="trailing-slash"),
    pytest.param("./numad.slice", id="dot"),
    pytest.param("numad.slice/a\nb", id="newline"),
    pytest.param("numad.slice/a\x00b", id="nul"),
    pytest.param("numad.slice/" + "x" * 256, id="name-too-long"),
]


@pytest.mark.parametrize("text", BAD_PATHS)
def test_bad_paths_are_refused_before_any_access(text: str, scratch: Scratch) -> None:
    with pytest.raises(CgroupError, match="cgroup path"):
        CgroupPath.parse(text)
    with pytest.raises(CgroupError, match="cgroup path"):
        scratch.backend.ensure(text)
    with pytest.raises(CgroupError, match="cgroup path"):
        scratch.backend.write(text, ALL_CPUS, None)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("system.slice", id="sibling-root"),
        pytest.param("system.slice/numad.slice", id="same-name-elsewhere"),
        pytest.param("numad.slicex/db", id="name-prefix"),
        pytest.param("numad", id="shorter-name"),
    ],
)
def test_paths_outside_the_managed_roots_are_refused(text: str, scratch: Scratch) -> None:
    with pytest.raises(CgroupError, match="outside the managed cgroup roots"):
        scratch.backend.exists(text)
    with pytest.raises(CgroupError, match="outside the managed cgroup roots"):
        scratch.backend.write(text, ALL_CPUS, ALL_MEMS)


def test_a_path_belongs_to_its_innermost_managed_root() -> None:
    roots = [CgroupPath.parse("a.slice"), CgroupPath.parse("a.slice/b.slice")]
    assert CgroupPath.parse("a.slice/b.slice/w").managed_by(roots) == roots[1]
    assert CgroupPath.parse("a.slice/c").managed_by(roots) == roots[0]
    assert str(CgroupPath.parse("a.slice/b.slice").parent) == "a.slice"


@pytest.mark.parametrize("managed", [(), ("../escape",), ("/abs",)])
def test_bad_managed_roots_are_refused(managed: tuple[str, ...], tmp_path: Path) -> None:
    make_scratch_v2(tmp_path, ALL_CPUS, ALL_MEMS)
    with pytest.raises(CgroupError):
        CgroupV2Backend(tmp_path, managed)


def test_a_managed_root_linked_outside_the_hierarchy_is_refused(
    scratch: Scratch, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (scratch.root / "numad.slice").symlink_to(outside)
    with pytest.raises(CgroupError, match="symbolic link"):
        scratch.backend.exists("numad.slice")
    with pytest.raises(CgroupError, match="symbolic link"):
        scratch.backend.ensure("numad.slice/db")
    assert list(outside.iterdir()) == []


def test_a_workload_linked_out_of_the_managed_root_is_refused(scratch: Scratch) -> None:
    scratch.backend.ensure("numad.slice")
    (scratch.root / "numad.slice" / "db").symlink_to("../system.slice")
    # system.slice is outside the managed roots, so it is read through another backend.
    other = type(scratch.backend)(scratch.root, ["system.slice"])
    before = other.read("system.slice")
    with pytest.raises(CgroupError, match=r"outside the managed root numad\.slice"):
        scratch.backend.write("numad.slice/db", cpus("0"), mems("0"))
    with pytest.raises(CgroupError, match=r"outside the managed root numad\.slice"):
        scratch.backend.ensure("numad.slice/db/main")
    assert other.read("system.slice") == before
    assert not (scratch.root / "system.slice" / "main").exists()


def test_a_link_inside_the_managed_root_is_followed(scratch: Scratch) -> None:
    scratch.backend.ensure("numad.slice/db")
    (scratch.root / "numad.slice" / "alias").symlink_to("db")
    assert scratch.backend.exists("numad.slice/alias")
    scratch.backend.write("numad.slice/alias", cpus("2-3"), mems("1"))
    assert scratch.backend.read("numad.slice/db") == (cpus("2-3"), mems("1"))


def test_a_linked_level_above_the_managed_root_is_refused(tmp_path: Path) -> None:
    s = scratch_v2(tmp_path, managed=("outer.slice/numad.slice",))
    (s.root / "outer.slice").symlink_to("system.slice")
    with pytest.raises(CgroupError, match="symbolic link"):
        s.backend.ensure("outer.slice/numad.slice/db")
    assert not (s.root / "system.slice" / "numad.slice").exists()


# -- listing the cgroups below one -----------------------------------------------------------


def _tree_for_listing(root: Path) -> list[str]:
    """Cgroups at several depths below numad.slice, each with its control files."""
    made = ["numad.slice/a", "numad.slice/a/x", "numad.slice/a/x/deep", "numad.slice/a/y"]
    made += ["numad.slice/b", "numad.slice/c", "numad.slice/c/z"]
    for path in made:
        scratch_mkdir(root, path)
    assert (root / "numad.slice/a/x/deep/cpuset.cpus").is_file()
    return made


def _listed_by_os_walk(root: Path, top: str) -> list[str]:
    """Every directory below ``top``, parents first, each level sorted: the reference."""
    found: list[str] = []
    for directory, children, _ in os.walk(root / top):
        below = Path(directory).relative_to(root).as_posix()
        children.sort()  # and walked in that order
        found += [f"{below}/{child}" for child in children]
    return found


def test_descendants_lists_every_cgroup_parents_first_and_opens_no_leaf(
    v2: Scratch, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = _tree_for_listing(v2.root)
    opened: list[str] = []
    scandir = os.scandir

    def counting(path: str) -> object:
        opened.append(os.path.relpath(path, v2.root))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", counting)
    listed = v2.backend.descendants("numad.slice")
    monkeypatch.undo()
    assert listed == _listed_by_os_walk(v2.root, "numad.slice")
    assert sorted(listed) == sorted(made)
    # Only the cgroups with cgroups below them are listed: the leaves' link count says so.
    assert sorted(opened) == ["numad.slice", "numad.slice/a", "numad.slice/a/x", "numad.slice/c"]


def test_descendants_lists_every_directory_where_link_counts_say_nothing(
    v2: Scratch, monkeypatch: pytest.MonkeyPatch
) -> None:
    """btrfs, and overlayfs' merged directories, give every directory a link count of 1."""
    made = _tree_for_listing(v2.root)
    lstat = os.lstat

    def uncounted(path: str) -> os.stat_result:
        st = lstat(path)
        fields = list(st)
        fields[3] = 1 if os.path.isdir(path) else st.st_nlink  # st_nlink
        return os.stat_result(fields)

    monkeypatch.setattr(os, "lstat", uncounted)
    listed = v2.backend.descendants("numad.slice")
    monkeypatch.undo()
    assert sorted(listed) == sorted(made)
    assert listed == _listed_by_os_walk(v2.root, "numad.slice")


def test_descendants_leaves_out_links_and_skips_a_cgroup_removed_meanwhile(
    v2: Scratch, monkeypatch: pytest.MonkeyPatch
) -> None:
    _tree_for_listing(v2.root)
    (v2.root / "numad.slice/alias").symlink_to("a")
    scandir = os.scandir

    def removing(path: str) -> object:
        if path.endswith("/a/x"):  # rmdir'd between its parent's listing and its own
            raise FileNotFoundError(errno.ENOENT, "gone", path)
        return scandir(path)

    monkeypatch.setattr(os, "scandir", removing)
    listed = v2.backend.descendants("numad.slice")
    monkeypatch.undo()
    assert "numad.slice/alias" not in listed
    assert "numad.slice/a/x" in listed
    assert "numad.slice/a/x/deep" not in listed
    assert "numad.slice/a/y" in listed
    assert "numad.slice/c/z" in listed


# -- ensure ----------------------------------------------------------------------------------


def test_v2_ensure_enables_cpuset_down_to_the_parent(v2: Scratch) -> None:
    v2.backend.ensure("numad.slice/db/main")
    for level in ("", "numad.slice", "numad.slice/db"):
        assert (v2.root / level / "cgroup.subtree_control").read_text().split() == ["cpuset"]
    main = v2.root / "numad.slice/db/main"
    assert (main / "cgroup.subtree_control").read_text().strip() == ""
    assert "cpuset" in (main / "cgroup.controllers").read_text().split()
    assert v2.backend.read("numad.slice/db/main") == (CPUSet(), NodeSet())
    assert v2.backend.read_effective("numad.slice/db/main") == (ALL_CPUS, ALL_MEMS)


def test_v2_ensure_writes_plus_cpuset_only_where_missing(
    v2: Scratch, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes: list[tuple[str, str]] = []
    real_write = v2_module._write_file

    def spy(path: Path, value: str) -> None:
        writes.append((str(path.relative_to(v2.root)), value))
        real_write(path, value)

    monkeypatch.setattr(v2_module, "_write_file", spy)
    v2.backend.ensure("numad.slice/db")
    # The scratch root already had cpuset enabled for system.slice.
    assert writes == [("numad.slice/cgroup.subtree_control", "cpuset")]
    writes.clear()
    v2.backend.ensure("numad.slice/db")
    v2.backend.ensure("numad.slice/other")
    assert writes == []


def test_ensure_creates_nothing_above_the_managed_root(scratch: Scratch, tmp_path: Path) -> None:
    s = MAKERS[scratch.kind](tmp_path / "again", managed=("outer.slice/numad.slice",))
    before = sorted(str(p.relative_to(s.root)) for p in s.root.rglob("*"))
    contents = {p: p.read_bytes() for p in s.root.rglob("*") if p.is_file()}
    with pytest.raises(CgroupError, match="numad creates nothing above its managed root"):
        s.backend.ensure("outer.slice/numad.slice/db")
    assert sorted(str(p.relative_to(s.root)) for p in s.root.rglob("*")) == before
    assert {p: p.read_bytes() for p in contents} == contents  # not even a "+cpuset"


def test_ensure_creates_the_managed_root_and_below(scratch: Scratch) -> None:
    assert not scratch.backend.exists("numad.slice")
    scratch.backend.ensure("numad.slice/db/main")
    assert scratch.backend.exists("numad.slice/db/main")
    assert scratch.backend.read_effective("numad.slice/db/main") == (ALL_CPUS, ALL_MEMS)


def test_v2_ensure_needs_cpuset_in_the_parents_controllers(v2: Scratch) -> None:
    (v2.root / "cgroup.controllers").write_text("cpu io memory pids\n")
    (v2.root / "cgroup.subtree_control").write_text("\n")
    with pytest.raises(CgroupError, match="cpuset controller is not available"):
        v2.backend.ensure("numad.slice")
    assert not (v2.root / "numad.slice").exists()


def test_v2_ensure_refuses_cpuset_in_a_populated_cgroup(v2: Scratch) -> None:
    v2.backend.ensure("numad.slice")
    (v2.root / "numad.slice" / "cgroup.procs").write_text("4242\n")
    with pytest.raises(CgroupError, match="has processes"):
        v2.backend.ensure("numad.slice/db")
    assert not (v2.root / "numad.slice" / "db").exists()


def test_v2_without_emulation_writes_only_cpuset_and_subtree_control(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "cgroup"
    make_scratch_v2(root, ALL_CPUS, ALL_MEMS)
    backend = CgroupV2Backend(root, ["numad.slice"])
    written: list[str] = []
    real_write = v2_module._write_file

    def spy(path: Path, value: str) -> None:
        written.append(path.name)
        real_write(path, value)

    monkeypatch.setattr(v2_module, "_write_file", spy)
    backend.ensure("numad.slice")
    assert (root / "cgroup.subtree_control").read_text() == "+cpuset\n"  # no kernel to list it
    assert list((root / "numad.slice").iterdir()) == []  # nor to populate it
    # A cgroup without its cpuset files: the write fails rather than creating them.
    with pytest.raises(CgroupError, match=r"file does not exist.*ensure"):
        backend.write("numad.slice", cpus("0-1"), None)
    assert list((root / "numad.slice").iterdir()) == []
    for name in ("cpuset.cpus", "cpuset.mems", "cpuset.cpus.effective"):
        (root / "numad.slice" / name).write_text("\n")
    backend.write("numad.slice", cpus("0-1"), mems("0"))
    assert (root / "numad.slice" / "cpuset.cpus.effective").read_text() == "\n"
    assert written == ["cgroup.subtree_control", "cpuset.cpus", "cpuset.cpus", "cpuset.mems"]


def test_emulation_is_refused_on_a_tree_that_is_not_scratch(tmp_path: Path) -> None:
    make_scratch_v2(tmp_path, ALL_CPUS, ALL_MEMS)
    (tmp_path / SCRATCH_MARKER).unlink()
    with pytest.raises(CgroupError, match="only for scratch trees"):
        CgroupV2Backend(tmp_path, ["numad.slice"], emulate_kernel=True)


# -- write, read, read_effective --------------------------------------------------------------


def test_write_read_round_trip(scratch: Scratch) -> None:
    scratch.backend.ensure("numad.slice/db")
    scratch.backend.write("numad.slice/db", cpus("2-3,6"), mems("1"))
    assert scratch.backend.read("numad.slice/db") == (cpus("2-3,6"), mems("1"))
    assert scratch.backend.read_effective("numad.slice/db") == (cpus("2-3,6"), mems("1"))


def test_none_leaves_a_file_alone(scratch: Scratch) -> None:
    scratch.backend.ensure("numad.slice/db")
    scratch.backend.write("numad.slice/db", cpus("4-5"), mems("0"))
    scratch.backend.write("numad.slice/db", None, mems("1"))
    scratch.backend.write("numad.slice/db", cpus("6"), None)
    assert scratch.backend.read("numad.slice/db") == (cpus("6"), mems("1"))


def test_v2_empty_set_is_an_empty_line_and_inherits(v2: Scratch) -> None:
    v2.backend.ensure("numad.slice/db")
    v2.backend.write("numad.slice", cpus("0-3"), mems("0"))
    v2.backend.write("numad.slice/db", cpus("2"), mems("0"))
    v2.backend.write("numad.slice/db", CPUSet(), NodeSet())
    assert (v2.root / "numad.slice/db/cpuset.cpus").read_bytes() == b"\n"
    assert (v2.root / "numad.slice/db/cpuset.mems").read_bytes() == b"\n"
    assert v2.backend.read("numad.slice/db") == (CPUSet(), NodeSet())
    assert v2.backend.read_effective("numad.slice/db") == (cpus("0-3"), mems("0"))


@pytest.mark.parametrize(
    ("parent", "child", "expected"),
    [
        pytest.param("0-3", "2-5", "2-3", id="masked-by-parent"),
        pytest.param("0-3", "", "0-3", id="empty-inherits"),
        pytest.param("0-3", "4-5", "0-3", id="disjoint-inherits"),
        pytest.param("", "6-7", "6-7", id="parent-inherits-root"),
        pytest.param("0-3", "3", "3", id="inside"),
    ],
)
def test_v2_emulated_effective_cpus(v2: Scratch, parent: str, child: str, expected: str) -> None:
    v2.backend.ensure("numad.slice/db")
    v2.backend.write("numad.slice", cpus(parent), None)
    v2.backend.write("numad.slice/db", cpus(child), None)
    assert v2.backend.read_effective("numad.slice/db")[0] == cpus(expected)


def test_v2_emulated_effective_mems_and_descendants_follow_the_parent(v2: Scratch) -> None:
    v2.backend.ensure("numad.slice/db/main")
    v2.backend.write("numad.slice/db", cpus("2-3"), mems("1"))
    assert v2.backend.read_effective("numad.slice/db/main") == (cpus("2-3"), mems("1"))
    v2.backend.write("numad.slice", cpus("0-1"), mems("0"))
    # db's own sets are now disjoint from the parent's, so db and main inherit 0-1 / 0.
    assert v2.backend.read("numad.slice/db") == (cpus("2-3"), mems("1"))
    assert v2.backend.read_effective("numad.slice/db") == (cpus("0-1"), mems("0"))
    assert v2.backend.read_effective("numad.slice/db/main") == (cpus("0-1"), mems("0"))


def test_v2_missing_or_empty_effective_files_read_as_empty(v2: Scratch) -> None:
    v2.backend.ensure("numad.slice/db")
    (v2.root / "numad.slice/db/cpuset.cpus.effective").unlink()
    (v2.root / "numad.slice/db/cpuset.mems.effective").write_text("\n")
    assert v2.backend.read_effective("numad.slice/db") == (CPUSet(), NodeSet())


def test_processes(scratch: Scratch) -> None:
    scratch.backend.ensure("numad.slice/db")
    assert scratch.backend.processes("numad.slice/db") == []
    (scratch.root / "numad.slice/db/cgroup.procs").write_text("12\n34\n")
    assert scratch.backend.processes("numad.slice/db") == [12, 34]


@pytest.mark.parametrize(
    ("name", "text", "reader"),
    [
        ("cgroup.procs", "12\nnot-a-pid\n", "processes"),
        ("cpuset.cpus", "3-1\n", "read"),
        ("cpuset.mems", "zero\n", "read"),
        ("cpuset.cpus", "0-99999999\n", "read"),
    ],
)
def test_unusable_content_names_the_cgroup(
    scratch: Scratch, name: str, text: str, reader: str
) -> None:
    scratch.backend.ensure("numad.slice/db")
    (scratch.root / "numad.slice/db" / name).write_text(text)
    with pytest.raises(CgroupError, match="unusable content") as caught:
        getattr(scratch.backend, reader)("numad.slice/db")
    assert caught.value.subject == str(scratch.root / "numad.slice/db")


# -- errors from the kernel ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "meaning"),
    [
        pytest.param(errno.EINVAL, "outside the parent's effective set", id="EINVAL"),
        pytest.param(errno.ERANGE, "beyond the machine's possible CPUs", id="ERANGE"),
        pytest.param(errno.ENOSPC, "cannot become empty", id="ENOSPC"),
        pytest.param(errno.EBUSY, "exclusive cpuset", id="EBUSY"),
        pytest.param(errno.EACCES, "permission denied; run numad as root", id="EACCES"),
        pytest.param(errno.EPERM, "delegate the subtree", id="EPERM"),
        pytest.param(errno.ELOOP, "symbolic link", id="ELOOP"),
        pytest.param(errno.EIO, os.strerror(errno.EIO), id="unmapped"),
    ],
)
def test_v2_errno_becomes_a_cgroup_error(
    v2: Scratch, monkeypatch: pytest.MonkeyPatch, code: int, meaning: str
) -> None:
    v2.backend.ensure("numad.slice/db")

    def refuse(path: Path, value: str) -> None:
        raise OSError(code, os.strerror(code), str(path))

    monkeypatch.setattr(v2_module, "_write_file", refuse)
    with pytest.raises(CgroupError) as caught:
        v2.backend.write("numad.slice/db", cpus("0-1"), None)
    err = caught.value
    assert err.subject == str(v2.root / "numad.slice/db")
    assert "writing '0-1' to cpuset.cpus" in str(err)
    assert meaning in str(err)
    assert isinstance(err.__cause__, OSError)


@pytest.mark.parametrize("reader", [False, True], ids=["no-reader", "a-reader"])
def test_v2_write_refuses_a_fifo_at_once(v2: Scratch, reader: bool) -> None:
    """A FIFO planted at cpuset.cpus in a scratch tree fails the write instead of
    blocking it (no reader: the open would wait) or feeding it (a reader waiting)."""
    v2.backend.ensure("numad.slice/db")
    fifo = v2.root / "numad.slice/db/cpuset.cpus"
    fifo.unlink()
    os.mkfifo(fifo)
    listening = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK) if reader else None
    try:
        err = fails_at_once(lambda: v2.backend.write("numad.slice/db", cpus("0-1"), None), BLOCKED)
        if listening is not None:
            assert os.read(listening, 64) == b""  # nothing went into the pipe
    finally:
        if listening is not None:
            os.close(listening)
    assert err.subject == str(v2.root / "numad.slice/db")
    assert "writing '0-1' to cpuset.cpus: " in str(err)
    assert "not a regular file" in str(err)


@pytest.mark.parametrize(
    ("name", "action", "reading"),
    [
        pytest.param(
            "cpuset.cpus", CgroupV2Backend.read, "reading cpuset.cpus and cpuset.mems", id="read"
        ),
        pytest.param(
            "cpuset.mems.effective",
            CgroupV2Backend.read_effective,
            "reading the effective cpuset",
            id="read_effective",
        ),
        pytest.param(
            "cgroup.procs", CgroupV2Backend.processes, "reading cgroup.procs", id="processes"
        ),
    ],
)
def test_v2_reads_refuse_a_fifo_at_once(
    v2: Scratch, name: str, action: Callable[[CgroupV2Backend, str], object], reading: str
) -> None:
    """Reads fail at once on a FIFO too (the drift check reads every managed cgroup),
    instead of waiting for a writer that never comes."""
    v2.backend.ensure("numad.slice/db")
    (v2.root / "numad.slice/db" / name).unlink()
    os.mkfifo(v2.root / "numad.slice/db" / name)
    backend = v2.backend
    assert isinstance(backend, CgroupV2Backend)
    err = fails_at_once(lambda: action(backend, "numad.slice/db"), BLOCKED)
    assert err.subject == str(v2.root / "numad.slice/db")
    assert f"{reading}: " in str(err)
    assert "not a regular file" in str(err)


def test_v2_short_write_is_a_cgroup_error(v2: Scratch) -> None:
    """A write() the kernel cuts short fails, naming the file. The cut is real: a
    child process whose file size limit (RLIMIT_FSIZE) leaves room for 2 bytes."""
    v2.backend.ensure("numad.slice/db")
    script = textwrap.dedent(
        f"""
        import resource, signal
        from numad.host.cgroup.v2 import CgroupV2Backend
        from numad.cpuset import CPUSet
        from numad.errors import CgroupError

        backend = CgroupV2Backend({str(v2.root)!r}, ["numad.slice"])
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (2, hard))
        try:
            backend.write("numad.slice/db", CPUSet([0, 1]), None)
            outcome = "written"
        except CgroupError as err:
            outcome = str(err)
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        print(outcome)
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert (v2.root / "numad.slice/db/cpuset.cpus").read_text() == "0-"  # the kernel's cut
    assert run.stdout.startswith(f"{v2.root / 'numad.slice/db'}: writing '0-1' to cpuset.cpus: ")
    assert "short write: 2 of 4 bytes" in run.stdout


def test_writing_a_removed_cgroup_says_it_is_gone(scratch: Scratch) -> None:
    scratch.backend.ensure("numad.slice/db")
    shutil.rmtree(scratch.root / "numad.slice/db")
    with pytest.raises(CgroupError, match="the cgroup is gone"):
        scratch.backend.write("numad.slice/db", cpus("1"), mems("0"))
    with pytest.raises(CgroupError, match="the cgroup is gone"):
        scratch.backend.read("numad.slice/db")
    assert not (scratch.root / "numad.slice/db").exists()


def test_v2_emptying_a_populated_cpuset_is_enospc(v2: Scratch) -> None:
    v2.backend.ensure("numad.slice/db")
    v2.backend.write("numad.slice/db", cpus("1"), None)
    (v2.root / "numad.slice/db/cgroup.procs").write_text("77\n")
    with pytest.raises(CgroupError, match="cannot become empty"):
        v2.backend.write("numad.slice/db", CPUSet(), None)
    v2.backend.write("numad.slice/db", None, NodeSet())  # emptying mems is allowed


def test_a_linked_cpuset_file_is_not_followed(scratch: Scratch, tmp_path: Path) -> None:
    scratch.backend.ensure("numad.slice/db")
    target = tmp_path / "elsewhere"
    target.write_text("untouched\n")
    link = scratch.root / "numad.slice/db/cpuset.cpus"
    link.unlink()
    link.symlink_to(target)
    with pytest.raises(CgroupError, match="symbolic link"):
        scratch.backend.write("numad.slice/db", cpus("1"), None)
    assert target.read_text() == "untouched\n"


# -- v1 through cgroupspy --------------------------------------------------------------------


def test_v1_ensure_gives_new_cgroups_their_parents_sets(v1: Scratch) -> None:
    v1.backend.ensure("numad.slice")
    v1.backend.write("numad.slice", cpus("2-5"), mems("1"))
    v1.backend.ensure("numad.slice/db/main")
    for level in ("numad.slice/db", "numad.slice/db/main"):
        assert v1.backend.read(level) == (cpus("2-5"), mems("1"))
        for name in ("tasks", "cgroup.procs", "cpuset.effective_cpus"):
            assert (v1.root / level / name).is_file()


def test_v1_ensure_fills_a_level_left_empty(v1: Scratch) -> None:
    v1.backend.ensure("numad.slice/db")
    (v1.root / "numad.slice/db/cpuset.mems").write_text("\n")  # as after a crash
    v1.backend.ensure("numad.slice/db")
    assert v1.backend.read("numad.slice/db") == (ALL_CPUS, ALL_MEMS)


def test_v1_writes_go_through_cgroupspy(v1: Scratch, monkeypatch: pytest.MonkeyPatch) -> None:
    v1.backend.ensure("numad.slice/db")
    seen: list[tuple[bytes, str]] = []
    real = controllers.Controller.set_property

    def spy(self: controllers.Controller, filename: bytes, value: str) -> None:
        seen.append((filename, value))
        real(self, filename, value)

    monkeypatch.setattr(controllers.Controller, "set_property", spy)
    v1.backend.write("numad.slice/db", cpus("1-3,5"), mems("0"))
    assert seen == [(b"cpuset.cpus", "1-3,5"), (b"cpuset.mems", "0")]


def test_v1_empty_set_takes_the_parents(v1: Scratch) -> None:
    v1.backend.ensure("numad.slice/db")
    v1.backend.write("numad.slice", cpus("0-3"), mems("0"))
    v1.backend.write("numad.slice/db", cpus("1"), mems("0"))
    v1.backend.write("numad.slice/db", CPUSet(), NodeSet())
    assert v1.backend.read("numad.slice/db") == (cpus("0-3"), mems("0"))


def test_v1_emulated_kernel_keeps_a_child_inside_its_parent(v1: Scratch) -> None:
    v1.backend.ensure("numad.slice/db")
    (v1.root / "numad.slice/cpuset.cpus").write_text("0-3\n")
    with pytest.raises(CgroupError, match="outside the parent's effective set"):
        v1.backend.write("numad.slice/db", cpus("4"), None)


def test_v1_read_effective_prefers_the_effective_files(v1: Scratch) -> None:
    v1.backend.ensure("numad.slice/db")
    v1.backend.write("numad.slice/db", cpus("2-3"), mems("1"))
    assert v1.backend.read_effective("numad.slice/db") == (cpus("2-3"), mems("1"))
    (v1.root / "numad.slice/db/cpuset.effective_cpus").write_text("3\n")  # a CPU went offline
    assert v1.backend.read_effective("numad.slice/db") == (cpus("3"), mems("1"))


def test_v1_read_effective_falls_back_on_older_kernels(tmp_path: Path) -> None:
    make_scratch_v1(tmp_path, ALL_CPUS, ALL_MEMS, effective_files=False)
    backend = CgroupV1Backend(tmp_path / "cpuset", ["numad.slice"], emulate_kernel=True)
    backend.ensure("numad.slice/db")
    backend.write("numad.slice/db", cpus("4-7"), mems("1"))
    assert not (tmp_path / "cpuset/numad.slice/db/cpuset.effective_cpus").exists()
    assert backend.read_effective("numad.slice/db") == (cpus("4-7"), mems("1"))


# -- detection and scratch trees -------------------------------------------------------------


def test_detect_v2(tmp_path: Path) -> None:
    make_scratch_v2(tmp_path, ALL_CPUS, ALL_MEMS)
    backend = detect_backend(tmp_path, ["numad.slice"])
    assert isinstance(backend, CgroupV2Backend)
    assert backend.emulate_kernel  # the scratch marker turns emulation on
    assert not detect_backend(tmp_path, ["numad.slice"], emulate_kernel=False).emulate_kernel


def test_detect_v1(tmp_path: Path) -> None:
    make_scratch_v1(tmp_path, ALL_CPUS, ALL_MEMS)
    backend = detect_backend(tmp_path, ["numad.slice"])
    assert isinstance(backend, CgroupV1Backend)
    assert backend.root == tmp_path / "cpuset"
    assert backend.emulate_kernel


def test_detect_v1_on_a_hybrid_host(tmp_path: Path) -> None:
    make_scratch_v1(tmp_path, ALL_CPUS, ALL_MEMS)
    (tmp_path / "cgroup.controllers").write_text("cpu io memory pids\n")  # cpuset is on v1
    assert isinstance(detect_backend(tmp_path, ["numad.slice"]), CgroupV1Backend)


def test_detect_without_a_marker_does_not_emulate(tmp_path: Path) -> None:
    make_scratch_v2(tmp_path, ALL_CPUS, ALL_MEMS)
    (tmp_path / SCRATCH_MARKER).unlink()
    assert not detect_backend(tmp_path, ["numad.slice"]).emulate_kernel


@pytest.mark.parametrize("where", ["empty", "missing"])
def test_detect_without_cpuset(tmp_path: Path, where: str) -> None:
    root = tmp_path if where == "empty" else tmp_path / "missing"
    with pytest.raises(CgroupError, match="no cpuset controller is available"):
        detect_backend(root, ["numad.slice"])


def test_make_scratch_v2_lays_out_a_root_like_the_kernels(tmp_path: Path) -> None:
    make_scratch_v2(tmp_path, cpus("0-3"), mems("0"), cgroups=["system.slice/sshd.service"])
    assert not (tmp_path / "cpuset.cpus").exists()  # the root cgroup has none
    assert (tmp_path / "cpuset.cpus.effective").read_text() == "0-3\n"
    assert (tmp_path / "system.slice/cgroup.subtree_control").read_text() == "cpuset\n"
    service = CgroupV2Backend(tmp_path, ["system.slice"])
    assert service.read_effective("system.slice/sshd.service") == (cpus("0-3"), mems("0"))


def test_v1_cpus_back_online_return_to_the_managed_levels_not_the_leaves(v1: Scratch) -> None:
    v1.backend.ensure("numad.slice/pod/main")
    v1.backend.write("numad.slice/pod/main", cpus("4-5"), None)
    for level in ("numad.slice", "numad.slice/pod", "numad.slice/pod/main"):
        have = v1.backend.read(level)[0]  # CPU 5 went offline: v1 drops it everywhere
        (v1.root / level / "cpuset.cpus").write_text((have - cpus("5")).format_list() + "\n")
    v1.backend.restore_cpus(cpus("5"))
    assert cpus("5").issubset(v1.backend.read("numad.slice")[0])
    assert cpus("5").issubset(v1.backend.read("numad.slice/pod")[0])
    assert v1.backend.read("numad.slice/pod/main")[0] == cpus("4")  # numad's write decides
    v1.backend.write("numad.slice/pod/main", cpus("4-5"), None)  # and now may name it again
    assert v1.backend.read("numad.slice/pod/main")[0] == cpus("4-5")


def test_v1_sets_memory_migrate_before_the_mems_so_pages_move_with_them(v1: Scratch) -> None:
    v1.backend.ensure("numad.slice/db")
    migrate = v1.root / "numad.slice/db/cpuset.memory_migrate"
    assert migrate.read_text().strip() == "1"  # set with the mems ensure copied down
    migrate.write_text("0\n")  # as a cgroup some runtime made has it (the kernel's default)
    v1.backend.write("numad.slice/db", cpus("1-3"), None)
    assert migrate.read_text().strip() == "0"  # CPUs alone move no memory
    v1.backend.write("numad.slice/db", None, mems("0"))
    assert migrate.read_text().strip() == "1"
