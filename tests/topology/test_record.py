"""Recorded machines: record_fixture writes what discovery read; load_fixture reads it safely."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from numad.errors import FixtureError
from numad.hostfs import HostFS
from numad.topology.discover import discover
from numad.topology.record import load_fixture, record_fixture
from numad.topology.render import to_json
from tests.conftest import CATALOGUE, FIXTURES, Machines

# -- a small tree, read by hand ----------------------------------------------------


def _host_tree(root: Path) -> None:
    """A fake host: files, a relative link, an absolute link, a dangling link."""
    cpu = root / "sys/devices/system/cpu"
    (cpu / "cpu0/topology").mkdir(parents=True)
    (cpu / "cpu1").mkdir()
    (cpu / "online").write_text("0\n")
    (cpu / "possible").write_text("0-1\n")
    (cpu / "cpu0/topology/core_id").write_text("0\n")
    (cpu / "cpu0/topology/secret").write_text("never read\n")
    node = root / "sys/devices/system/node/node0"
    node.mkdir(parents=True)
    (node / "cpu0").symlink_to("../../cpu/cpu0")
    (node / "cpu1").symlink_to("/sys/devices/system/cpu/cpu1")  # absolute: root-relative
    (node / "cpu9").symlink_to("../../cpu/cpu9")  # dangling
    (root / "etc").mkdir()
    (root / "etc/shadow").write_text("not for recordings\n")


def _read_some(fs: HostFS) -> None:
    assert fs.listdir("/sys/devices/system/cpu") == ("cpu0", "cpu1", "online", "possible")
    assert fs.read_text("/sys/devices/system/node/node0/cpu0/topology/core_id") == "0\n"
    assert fs.read_text("/sys/devices/system/cpu/online") == "0\n"
    assert fs.is_dir("/sys/devices/system/node/node0/cpu1")
    assert fs.read_optional("/sys/devices/system/node/node0/cpu9/online") is None


@pytest.fixture
def recorded(tmp_path: Path) -> tuple[HostFS, Path]:
    host = tmp_path / "host"
    _host_tree(host)
    fs = HostFS(host, record=True)
    _read_some(fs)
    out = tmp_path / "out" / "myhost.tar.gz"
    out.parent.mkdir()
    return fs, out


def _members(archive: Path) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(archive) as tar:
        return {m.name: m for m in tar.getmembers()}


def test_archive_holds_exactly_what_was_touched(recorded: tuple[HostFS, Path]) -> None:
    fs, out = recorded
    count = record_fixture(fs, out)
    members = _members(out)
    assert count == len(members)
    kinds = {name: ("d" if m.isdir() else "l" if m.issym() else "f") for name, m in members.items()}
    assert kinds == {
        "myhost": "d",
        "myhost/sys": "d",
        "myhost/sys/devices": "d",
        "myhost/sys/devices/system": "d",
        "myhost/sys/devices/system/cpu": "d",  # listed
        "myhost/sys/devices/system/cpu/cpu0": "d",  # a parent
        "myhost/sys/devices/system/cpu/cpu0/topology": "d",
        "myhost/sys/devices/system/cpu/cpu0/topology/core_id": "f",  # read
        "myhost/sys/devices/system/cpu/cpu1": "d",  # is_dir, and in the listing
        "myhost/sys/devices/system/cpu/online": "f",  # read
        "myhost/sys/devices/system/cpu/possible": "f",  # listed, never read: empty
        "myhost/sys/devices/system/node": "d",
        "myhost/sys/devices/system/node/node0": "d",
        "myhost/sys/devices/system/node/node0/cpu0": "l",  # followed
        "myhost/sys/devices/system/node/node0/cpu1": "l",
        "myhost/sys/devices/system/node/node0/cpu9": "l",  # dangling, followed
    }
    assert members["myhost/sys/devices/system/node/node0/cpu0"].linkname == "../../cpu/cpu0"
    # An absolute target is read relative to the root: written relative, it means the same.
    assert members["myhost/sys/devices/system/node/node0/cpu1"].linkname == "../../cpu/cpu1"
    assert members["myhost/sys/devices/system/node/node0/cpu9"].linkname == "../../cpu/cpu9"
    assert members["myhost/sys/devices/system/cpu/possible"].size == 0


def test_round_trip_reads_the_same(recorded: tuple[HostFS, Path], tmp_path: Path) -> None:
    fs, out = recorded
    record_fixture(fs, out)
    root = load_fixture(out, tmp_path / "loaded")
    assert root == tmp_path / "loaded" / "myhost"
    replay = HostFS(root, record=True)
    _read_some(replay)
    assert replay.recording is not None
    assert fs.recording is not None
    assert replay.recording.files == fs.recording.files
    assert replay.recording.dirs == fs.recording.dirs
    assert replay.recording.links.keys() == fs.recording.links.keys()


def test_recording_is_deterministic(recorded: tuple[HostFS, Path]) -> None:
    fs, out = recorded
    record_fixture(fs, out)
    first = out.read_bytes()
    record_fixture(fs, out)  # replaces the file
    assert out.read_bytes() == first
    assert sorted(os.listdir(out.parent)) == ["myhost.tar.gz"]  # no temp file left over


def test_top_level_name_comes_from_the_file_name(recorded: tuple[HostFS, Path]) -> None:
    fs, out = recorded
    record_fixture(fs, out.with_name("other.tgz"))
    assert {n.split("/")[0] for n in _members(out.with_name("other.tgz"))} == {"other"}


@pytest.mark.parametrize("name", [".tar.gz", "-x.tar.gz"])
def test_unusable_archive_names_are_refused(recorded: tuple[HostFS, Path], name: str) -> None:
    fs, out = recorded
    with pytest.raises(FixtureError, match="cannot name a machine"):
        record_fixture(fs, out.with_name(name))


def test_a_missing_directory_is_an_error(recorded: tuple[HostFS, Path]) -> None:
    fs, out = recorded
    with pytest.raises(FixtureError, match=r"missing/myhost\.tar\.gz: cannot create"):
        record_fixture(fs, out.parent / "missing" / "myhost.tar.gz")


def test_a_hostfs_that_did_not_record_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FixtureError, match="record=True"):
        record_fixture(HostFS(tmp_path), tmp_path / "x.tar.gz")


# -- unsafe archives -------------------------------------------------------------

Member = Callable[[tarfile.TarFile], None]


def _file(name: str, data: bytes = b"x") -> Member:
    def add(tar: tarfile.TarFile) -> None:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))

    return add


def _special(name: str, kind: bytes, linkname: str = "") -> Member:
    def add(tar: tarfile.TarFile) -> None:
        info = tarfile.TarInfo(name)
        info.type = kind
        info.linkname = linkname
        tar.addfile(info)

    return add


def _archive(path: Path, *members: Member, mode: str = "w:gz") -> Path:
    with tarfile.open(path, mode) as tar:  # type: ignore[call-overload]
        for add in members:
            add(tar)
    return path


UNSAFE = [
    pytest.param([_file("/m/sys/x")], "absolute", id="absolute-name"),
    pytest.param([_file("m/../../x")], "leaves the archive", id="dotdot-name"),
    pytest.param([_file("m/a/../../../x")], "leaves the archive", id="dotdot-deep"),
    pytest.param([_special("m/dev/sda", tarfile.CHRTYPE)], "not a directory", id="char-device"),
    pytest.param([_special("m/dev/sda", tarfile.BLKTYPE)], "not a directory", id="block-device"),
    pytest.param([_special("m/fifo", tarfile.FIFOTYPE)], "not a directory", id="fifo"),
    pytest.param(
        [_file("m/a"), _special("m/b", tarfile.LNKTYPE, "m/a")], "not a directory", id="hardlink"
    ),
    pytest.param([_special("m/l", tarfile.SYMTYPE, "/etc/shadow")], "outside", id="abs-symlink"),
    pytest.param([_special("m/a/l", tarfile.SYMTYPE, "../../x")], "outside", id="climbing-link"),
    pytest.param([_special("m/l", tarfile.SYMTYPE, "a/../../x")], "outside", id="sneaky-link"),
    pytest.param([_file("m/a"), _file("n/b")], "2 top-level entries", id="two-tops"),
    pytest.param([], "is empty", id="empty"),
]


@pytest.mark.parametrize(("members", "problem"), UNSAFE)
def test_unsafe_archives_are_refused_before_writing(
    tmp_path: Path, members: list[Member], problem: str
) -> None:
    archive = _archive(tmp_path / "bad.tar.gz", *members)
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(FixtureError, match=problem):
        load_fixture(archive, dest)
    assert list(dest.iterdir()) == []


def test_links_climbing_within_the_tree_survive(tmp_path: Path) -> None:
    archive = _archive(
        tmp_path / "ok.tar.bz2",
        _file("m/sys/devices/system/cpu/cpu0/online", b"1\n"),
        _special("m/sys/bus/cpu/devices/cpu0", tarfile.SYMTYPE, "../../../devices/system/cpu/cpu0"),
        _special("m/sys/bus/cpu/devices/cpu7", tarfile.SYMTYPE, "../../../devices/system/cpu/cpu7"),
        mode="w:bz2",
    )
    root = load_fixture(archive, tmp_path / "dest")
    assert (root / "sys/bus/cpu/devices/cpu0/online").read_text() == "1\n"
    assert os.readlink(root / "sys/bus/cpu/devices/cpu7") == "../../../devices/system/cpu/cpu7"


def test_garbage_is_not_an_archive(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.tar.gz"
    garbage.write_bytes(b"\x1f\x8b not really gzip")
    with pytest.raises(FixtureError, match=r"garbage\.tar\.gz: "):
        load_fixture(garbage, tmp_path)


def test_a_missing_archive_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FixtureError, match=r"nothing\.tar\.gz: cannot extract"):
        load_fixture(tmp_path / "nothing.tar.gz", tmp_path)


def test_loading_over_an_existing_tree_is_refused(tmp_path: Path) -> None:
    archive = _archive(tmp_path / "m.tar.gz", _file("m/a"))
    load_fixture(archive, tmp_path / "dest")
    with pytest.raises(FixtureError, match="already exists"):
        load_fixture(archive, tmp_path / "dest")


# -- the recorded machines ---------------------------------------------------------

NAMES = [entry["name"] for entry in CATALOGUE]


@pytest.mark.parametrize("name", NAMES)
def test_hwloc_archives_extract_with_their_links(machines: Machines, name: str) -> None:
    root = machines.root(name)
    entry = next(e for e in CATALOGUE if e["name"] == name)
    assert root.name == entry["sysfs_root"]
    assert (root / "sys").is_dir()
    with tarfile.open(FIXTURES / entry["archive"]) as tar:
        links = [m for m in tar.getmembers() if m.issym()]
    for link in links:
        assert os.readlink(root.parent / link.name) == link.linkname


@pytest.mark.parametrize("name", NAMES)
def test_recording_a_machine_reproduces_its_topology(
    machines: Machines, tmp_path: Path, name: str
) -> None:
    fs = HostFS(machines.root(name), record=True)
    topo = discover(fs)
    archive = tmp_path / f"{name}.tar.gz"
    count = record_fixture(fs, archive)
    assert count == len(_members(archive))
    replayed = discover(HostFS(load_fixture(archive, tmp_path / "replay")))
    assert to_json(replayed) == to_json(topo)
    assert replayed == topo


@pytest.mark.parametrize("name", ["host.zip", "host.tar", "host.tar.bz2", "host"])
def test_a_name_that_is_no_tar_gz_is_refused(recorded: tuple[HostFS, Path], name: str) -> None:
    """What is written is a gzip-compressed tar: a name saying otherwise is refused,
    and nothing is written."""
    fs, out = recorded
    with pytest.raises(FixtureError, match=r"gzip-compressed tar.*name it host\.tar\.gz"):
        record_fixture(fs, out.with_name(name))
    assert os.listdir(out.parent) == []
