"""Recorded machines read back fast: ArchiveFS reads an archive as HostFS reads its
unpacked tree; the cache unpacks once and trusts an entry only while it matches its seal."""

from __future__ import annotations

import json
import os
import tarfile
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from numad.cli.main import main
from numad.errors import FixtureError, HostFileError
from numad.hostfs import HostFS
from numad.topology import archive as archive_module
from numad.topology.archive import ArchiveFS, cached_fixture
from numad.topology.discover import discover
from numad.topology.record import load_fixture, record_fixture
from tests.conftest import CATALOGUE, FIXTURES, Machines
from tests.topology.conftest import MORE, MORE_TREES, MoreMachines
from tests.topology.test_record import UNSAFE, Member, _archive, _file, _special

_SYSFS = {entry["name"]: entry["archive"] for entry in CATALOGUE}


# -- ArchiveFS: the tree in memory ------------------------------------------------


@pytest.mark.parametrize("name", sorted(_SYSFS))
def test_every_recorded_machine_discovers_the_same_from_memory(
    machines: Machines, name: str
) -> None:
    assert discover(ArchiveFS(FIXTURES / _SYSFS[name])) == discover(HostFS(machines.root(name)))


@pytest.mark.parametrize("name", MORE_TREES)
def test_every_further_machine_discovers_the_same_from_memory(
    more_machines: MoreMachines, name: str
) -> None:
    on_disk = discover(HostFS(more_machines.root(name)))
    assert discover(ArchiveFS(MORE / f"{name}.tar.bz2")) == on_disk


@pytest.fixture
def small(tmp_path: Path) -> ArchiveFS:
    """Files, a relative link, an absolute (root-relative) link, a dangling link, a loop."""
    return ArchiveFS(
        _archive(
            tmp_path / "m.tar.bz2",
            _file("m/sys/devices/system/cpu/cpu0/online", b"1\n"),
            _file("m/sys/devices/system/cpu/online", b"0\n"),
            _special("m/sys/devices/system/node/node0/cpu0", tarfile.SYMTYPE, "../../cpu/cpu0"),
            _special("m/sys/abs", tarfile.SYMTYPE, "sys/devices/system/cpu"),
            _special("m/sys/bus/cpu/devices/cpu7", tarfile.SYMTYPE, "../../../devices/cpu7"),
            _special("m/sys/loop", tarfile.SYMTYPE, "loop"),
            mode="w:bz2",
        )
    )


def test_reads_follow_links_inside_the_tree(small: ArchiveFS) -> None:
    assert small.read_text("/sys/devices/system/node/node0/cpu0/online") == "1\n"
    assert small.read_optional("/sys/bus/cpu/devices/cpu7/online") is None  # dangling
    assert small.read_optional("/sys/devices/system/cpu/online/x") is None  # below a file
    assert small.listdir("/sys/devices/system/cpu") == ("cpu0", "online")
    assert small.listdir("/sys/devices/system/node/node0/cpu0") == ("online",)
    assert small.listdir("/nothing") == ()
    assert small.is_dir("/sys/devices/system/node/node0/cpu0")
    assert not small.is_dir("/sys/devices/system/cpu/online")
    assert not small.is_dir("/sys/loop")
    assert small.readlink("/sys/devices/system/node/node0/cpu0") == "../../cpu/cpu0"


def test_a_directory_or_a_loop_is_an_error_naming_the_path(small: ArchiveFS) -> None:
    with pytest.raises(HostFileError, match=r"^/sys/devices: cannot read: a directory"):
        small.read_text("/sys/devices")
    with pytest.raises(HostFileError, match=r"^/sys/loop: too many levels"):
        small.read_optional("/sys/loop")


@pytest.mark.parametrize(("members", "problem"), UNSAFE)
def test_unsafe_archives_are_refused_in_memory_too(
    tmp_path: Path, members: list[Member], problem: str
) -> None:
    with pytest.raises(FixtureError, match=problem):
        ArchiveFS(_archive(tmp_path / "bad.tar.gz", *members))


def test_a_missing_or_garbage_archive_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FixtureError, match=r"nothing\.tar\.gz: cannot read"):
        ArchiveFS(tmp_path / "nothing.tar.gz")
    garbage = tmp_path / "garbage.tar.gz"
    garbage.write_bytes(b"\x1f\x8b not really gzip")
    with pytest.raises(FixtureError, match=r"garbage\.tar\.gz: "):
        ArchiveFS(garbage)


# -- the cache of unpacked machines ----------------------------------------------


@pytest.fixture
def out(machines: Machines, tmp_path: Path) -> Path:
    """A small recording (2arm-2c as discovery reads it)."""
    fs = HostFS(machines.root("2arm-2c"), record=True)
    discover(fs)
    path = tmp_path / "out" / "myhost.tar.gz"
    path.parent.mkdir()
    record_fixture(fs, path)
    return path


@pytest.fixture
def unpacks(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every archive the cache unpacks, in order."""
    seen: list[Path] = []

    def counted(archive: Path, dest: Path) -> Path:
        seen.append(archive)
        return load_fixture(archive, dest)

    monkeypatch.setattr(archive_module, "load_fixture", counted)
    return seen


ONLINE = "sys/devices/system/cpu/online"


def test_the_cache_unpacks_once(out: Path, tmp_path: Path, unpacks: list[Path]) -> None:
    cache = tmp_path / "cache"
    root = cached_fixture(out, cache)
    assert root.name == "myhost"
    inode = (root / ONLINE).stat().st_ino
    assert cached_fixture(out, cache) == root
    assert unpacks == [out]  # the second call found the entry whole
    assert (root / ONLINE).stat().st_ino == inode
    assert [p.name for p in cache.iterdir()] == [root.parent.name]  # no temporary left


def _edit(root: Path) -> None:
    online = root / ONLINE
    online.write_text("9" * len(online.read_text()))  # the same size, a new time


def _remove(root: Path) -> None:
    (root / ONLINE).unlink()


def _add(root: Path) -> None:
    (root / "sys/stray").write_text("")


def _unseal(root: Path) -> None:
    (root.parent / ".numad-entry.json").unlink()


def _garble(root: Path) -> None:
    (root.parent / ".numad-entry.json").write_text("{not json")


def _climb(root: Path) -> None:
    seal = root.parent / ".numad-entry.json"
    seal.write_text(json.dumps({**json.loads(seal.read_text()), "top": ".."}))


@pytest.mark.parametrize("spoil", [_edit, _remove, _add, _unseal, _garble, _climb])
def test_a_spoilt_entry_is_unpacked_again_not_trusted(
    out: Path, tmp_path: Path, unpacks: list[Path], spoil: Callable[[Path], None]
) -> None:
    cache = tmp_path / "cache"
    root = cached_fixture(out, cache)
    recorded = (root / ONLINE).read_text()
    spoil(root)
    assert cached_fixture(out, cache) == root
    assert unpacks == [out, out]
    assert (root / ONLINE).read_text() == recorded
    assert not (root / "sys/stray").exists()
    assert [p.name for p in cache.iterdir()] == [root.parent.name]  # the spoilt one removed


def test_a_changed_archive_gets_its_own_entry(
    out: Path, machines: Machines, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    first = cached_fixture(out, cache)
    fs = HostFS(machines.root("16em64t-4s2c2t"), record=True)
    discover(fs)
    other = out.with_name("other.tar.gz")
    record_fixture(fs, other)
    assert cached_fixture(other, cache).parent != first.parent
    assert len(list(cache.iterdir())) == 2


def test_concurrent_callers_share_one_whole_entry(out: Path, tmp_path: Path) -> None:
    """Each caller unpacks into its own temporary directory and renames it into place;
    the losers of the race take the winner's tree and leave nothing behind."""
    cache = tmp_path / "cache"
    start = threading.Barrier(8)

    def unpack() -> Path:
        start.wait()
        return cached_fixture(out, cache)

    with ThreadPoolExecutor(8) as pool:
        roots = set(pool.map(lambda _: unpack(), range(8)))
    assert len(roots) == 1
    (root,) = roots
    assert [p.name for p in cache.iterdir()] == [root.parent.name]
    assert (root / ONLINE).is_file()


def test_a_bad_archive_leaves_no_entry(tmp_path: Path) -> None:
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(b"not an archive")
    cache = tmp_path / "cache"
    with pytest.raises(FixtureError, match=r"bad\.tar\.gz: "):
        cached_fixture(bad, cache)
    assert list(cache.iterdir()) == []


# -- the command line ------------------------------------------------------------


def test_nrt_of_a_bundled_machine_unpacks_it_once(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    unpacks: list[Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Before: every `topology --nrt --fixture NAME` unpacked the archive again (5 s)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    argv = ["topology", "--nrt", "--fixture", "32intel64-2p8co2t+8ve"]
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert main(argv) == 0
    assert capsys.readouterr().out == first
    assert len(unpacks) == 1
    plain = ["topology", "--fixture", "32intel64-2p8co2t+8ve"]
    assert main(plain) == 0  # the same cache entry
    assert len(unpacks) == 1


def test_an_archive_by_path_is_read_without_writing_it_out(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    machines: Machines,
    unpacks: list[Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Before: `topology --fixture FILE` unpacked its 17,619 members to a scratch
    directory and removed them again on every call (8-13 s for the 64-node one)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    name = "256intel64-64n2co2t-sgiuvlike"
    assert main(["topology", "--json", "--fixture", str(FIXTURES / _SYSFS[name])]) == 0
    from_archive = capsys.readouterr().out
    assert main(["topology", "--json", "--root", str(machines.root(name))]) == 0
    assert from_archive == capsys.readouterr().out
    assert unpacks == []
    assert not (tmp_path / "cache").exists()
    assert os.listdir(tmp_path / "tmp") == []
