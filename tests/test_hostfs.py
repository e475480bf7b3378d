"""HostFS: host paths re-rooted under a scratch tree, links resolved inside it.

Every test builds its own tree under a temporary directory; none reads the real
``/sys`` or follows a link out of its root.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from numad.errors import HostFileError
from numad.hostfs import HostFS, Recording
from numad.topology.discover import discover
from tests.conftest import DAEMON_MACHINE, Machines

MiB = 1 << 20  # HostFS refuses files larger than this


@dataclass(frozen=True)
class Link:
    target: str


class Dir:
    """An empty directory in a tree spec."""


DIR = Dir()

Tree = Mapping[str, str | bytes | Link | Dir]


def build(root: Path, tree: Tree) -> None:
    for rel, entry in tree.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(entry, Link):
            path.symlink_to(entry.target)
        elif isinstance(entry, Dir):
            path.mkdir()
        elif isinstance(entry, bytes):
            path.write_bytes(entry)
        else:
            path.write_text(entry)


PCI = "sys/devices/pci0000:00/0000:00:01.0"

# A small machine in the kernel's own shape: relative links from bus and class
# directories into /sys/devices, plus links written to test the seam's edges.
MACHINE: Tree = {
    "sys/devices/system/node/node0/cpulist": "0-3\n",
    "sys/devices/system/node/node1/cpulist": "4-7\n",
    "sys/devices/system/node/node0/cpulist-link": Link("cpulist"),
    "sys/devices/system/node/node1/hostname-link": Link("/etc/hostname"),
    f"{PCI}/numa_node": "1\n",
    f"{PCI}/net/eth0/address": "52:54:00:12:34:56\n",
    "sys/bus/pci/devices/0000:00:01.0": Link("../../../devices/pci0000:00/0000:00:01.0"),
    "sys/class/net/eth0": Link("../../devices/pci0000:00/0000:00:01.0/net/eth0"),
    "sys/nodes": Link("/sys/devices/system/node"),
    "sys/etc": Link("/etc"),
    "sys/escape": Link("../../../../../../../../etc"),
    "sys/root": Link("/"),
    "sys/dangling": Link("/nowhere"),
    "sys/dangling-dir": Link("missing-dir"),
    "sys/loop-a": Link("loop-b"),
    "sys/loop-b": Link("loop-a"),
    "sys/self": Link("self"),
    "sys/plain": "not a directory\n",
    "sys/empty": DIR,
    "sys/order/node10": DIR,
    "sys/order/node2": "",
    "sys/order/Node1": DIR,
    "sys/order/cpu": Link("node2"),
    "etc/hostname": "fixture-host\n",
}


@pytest.fixture(scope="module")
def machine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("machine")
    build(root, MACHINE)
    return root


# -- reads -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        pytest.param("/sys/devices/system/node/node0/cpulist", "0-3\n", id="plain-file"),
        pytest.param("/sys//devices/./system/node/node0/cpulist", "0-3\n", id="slashes-and-dots"),
        pytest.param("/sys/devices/system/node/node1/../node0/cpulist", "0-3\n", id="dot-dot"),
        pytest.param("/../../sys/devices/system/node/node1/cpulist", "4-7\n", id="dot-dot-at-root"),
        pytest.param("/sys/bus/pci/devices/0000:00:01.0/numa_node", "1\n", id="relative-link"),
        pytest.param("/sys/class/net/eth0/../../numa_node", "1\n", id="dot-dot-after-link"),
        pytest.param("/sys/nodes/node1/cpulist", "4-7\n", id="absolute-link"),
        pytest.param("/sys/etc/hostname", "fixture-host\n", id="absolute-link-to-etc"),
        pytest.param("/sys/escape/hostname", "fixture-host\n", id="relative-escape-clamped"),
        pytest.param("/sys/root/sys/root/etc/hostname", "fixture-host\n", id="link-to-root"),
        pytest.param(
            "/sys/devices/system/node/node0/cpulist-link", "0-3\n", id="last-component-link"
        ),
        pytest.param(
            "/sys/devices/system/node/node1/hostname-link",
            "fixture-host\n",
            id="last-component-absolute-link",
        ),
        pytest.param("/sys/devices/system/node/node9/cpulist", None, id="missing-file"),
        pytest.param("/proc/cpuinfo", None, id="missing-top-directory"),
        pytest.param("/sys/plain/child", None, id="file-as-directory"),
        pytest.param("/sys/dangling", None, id="dangling-link"),
        pytest.param("/sys/dangling-dir/cpulist", None, id="dangling-link-on-the-way"),
        pytest.param("/sys/order/node2", "", id="empty-file"),
    ],
)
def test_read_optional(machine: Path, path: str, expected: str | None) -> None:
    fs = HostFS(machine)
    assert fs.read_optional(path) == expected
    assert fs.read_bytes_optional(path) == (None if expected is None else expected.encode())


@pytest.mark.parametrize(
    "path",
    [
        pytest.param("/sys/devices/system/node/node9/cpulist", id="missing-file"),
        pytest.param("/sys/dangling", id="dangling-link"),
    ],
)
def test_read_text_of_missing_file_names_it(machine: Path, path: str) -> None:
    with pytest.raises(HostFileError, match="no such file") as caught:
        HostFS(machine).read_text(path)
    assert caught.value.subject == path


def test_read_text(machine: Path) -> None:
    assert HostFS(machine).read_text("/sys/class/net/eth0/address") == "52:54:00:12:34:56\n"


def test_absolute_link_never_reaches_the_real_root(tmp_path: Path) -> None:
    """The tree has no /etc of its own: a link to /etc must find nothing there."""
    build(tmp_path, {"sys/etc": Link("/etc"), "sys/passwd": Link("/etc/passwd")})
    fs = HostFS(tmp_path)
    assert fs.read_optional("/sys/etc/passwd") is None
    assert fs.read_optional("/sys/passwd") is None
    assert fs.listdir("/sys/etc") == ()
    assert not fs.is_dir("/sys/etc")
    assert fs.real("/sys/etc/passwd") == f"{fs.root}/etc/passwd"


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        pytest.param("/", "/", id="root"),
        pytest.param("/sys/devices", "/sys/devices", id="no-links"),
        pytest.param("/sys/bus/pci/devices/0000:00:01.0", f"/{PCI}", id="relative-link"),
        pytest.param("/sys/class/net/eth0/..", f"/{PCI}/net", id="dot-dot-is-physical"),
        pytest.param("/sys/nodes/node0", "/sys/devices/system/node/node0", id="absolute-link"),
        pytest.param("/sys/etc", "/etc", id="link-to-etc"),
        pytest.param("/sys/escape", "/etc", id="relative-escape"),
        pytest.param("/sys/root", "/", id="link-to-root"),
        pytest.param("/../..", "/", id="above-root"),
        pytest.param("/sys/dangling", "/nowhere", id="dangling"),
        pytest.param("/sys/dangling-dir/x", "/sys/missing-dir/x", id="dangling-on-the-way"),
        pytest.param("/no/such/path", "/no/such/path", id="missing"),
    ],
)
def test_resolve_and_real(machine: Path, path: str, expected: str) -> None:
    fs = HostFS(machine)
    assert fs.resolve(path) == expected
    assert fs.real(path) == f"{os.path.realpath(machine)}{expected}"


def test_root_is_made_real(tmp_path: Path) -> None:
    build(tmp_path, {"real/sys/x": "1\n", "alias": Link("real")})
    fs = HostFS(tmp_path / "alias")
    real = Path(os.path.realpath(tmp_path / "real"))
    assert fs.root == real
    assert fs.read_optional("/sys/x") == "1\n"
    assert repr(fs) == f"HostFS(root={str(real)!r})"


# -- errors ----------------------------------------------------------------

Method = Callable[[HostFS, str], object]
RAISING: list[object] = [
    pytest.param(HostFS.read_bytes_optional, id="read_bytes_optional"),
    pytest.param(HostFS.read_optional, id="read_optional"),
    pytest.param(HostFS.read_text, id="read_text"),
    pytest.param(HostFS.listdir, id="listdir"),
    pytest.param(HostFS.resolve, id="resolve"),
    pytest.param(HostFS.real, id="real"),
]


@pytest.mark.parametrize("method", RAISING)
@pytest.mark.parametrize(
    "path",
    [
        pytest.param("/sys/loop-a", id="two-link-loop"),
        pytest.param("/sys/self", id="self-loop"),
        pytest.param("/sys/loop-b/cpulist", id="loop-on-the-way"),
    ],
)
def test_link_loop_names_the_path(machine: Path, method: Method, path: str) -> None:
    with pytest.raises(HostFileError, match="link loop") as caught:
        method(HostFS(machine), path)
    assert caught.value.subject == path


@pytest.mark.parametrize("path", ["/sys/loop-a", "/sys/loop-b/cpulist"])
def test_link_loop_is_not_a_directory(machine: Path, path: str) -> None:
    assert HostFS(machine).is_dir(path) is False


@pytest.mark.parametrize(
    ("length", "readable"),
    [
        pytest.param(40, True, id="40-links-like-the-kernel"),
        pytest.param(41, False, id="41-links-is-a-loop"),
    ],
)
def test_link_chain_limit(tmp_path: Path, length: int, readable: bool) -> None:
    chain: dict[str, str | bytes | Link | Dir] = {
        f"chain/l{i}": Link(f"l{i + 1}") for i in range(length - 1)
    }
    chain[f"chain/l{length - 1}"] = Link("end")
    chain["chain/end"] = "ok\n"
    build(tmp_path, chain)
    fs = HostFS(tmp_path)
    if readable:
        assert fs.read_text("/chain/l0") == "ok\n"
    else:
        with pytest.raises(HostFileError, match="link loop"):
            fs.read_text("/chain/l0")


@pytest.mark.parametrize("method", RAISING)
@pytest.mark.parametrize(
    "path",
    [
        pytest.param("sys/devices", id="relative"),
        pytest.param("", id="empty"),
        pytest.param("/sys/nodes/node0/cpu\x00list", id="nul-in-last-component"),
        pytest.param("/sys/no\x00des/node0/cpulist", id="nul-on-the-way"),
    ],
)
def test_bad_host_path_names_the_path(machine: Path, method: Method, path: str) -> None:
    with pytest.raises(HostFileError, match="not an absolute host path") as caught:
        method(HostFS(machine), path)
    assert caught.value.subject == path


@pytest.mark.parametrize(
    "path",
    [
        pytest.param("/sys/devices", id="directory"),
        pytest.param("/", id="root"),
        pytest.param("/sys/nodes", id="link-to-directory"),
        pytest.param("/sys/class/net/eth0", id="relative-link-to-directory"),
    ],
)
def test_reading_a_directory_names_it(machine: Path, path: str) -> None:
    with pytest.raises(HostFileError, match="cannot read") as caught:
        HostFS(machine).read_optional(path)
    assert caught.value.subject == path


@pytest.mark.parametrize(
    ("size", "readable"),
    [
        pytest.param(MiB, True, id="exactly-1-MiB"),
        pytest.param(MiB + 1, False, id="1-MiB-and-a-byte"),
        pytest.param(5 * MiB, False, id="5-MiB"),
    ],
)
@pytest.mark.parametrize("path", ["/big", "/big-link"])
def test_file_size_limit(tmp_path: Path, size: int, readable: bool, path: str) -> None:
    build(tmp_path, {"big": b"7" * size, "big-link": Link("big")})
    fs = HostFS(tmp_path, record=True)
    if readable:
        data = fs.read_bytes_optional(path)
        assert data is not None
        assert len(data) == size
    else:
        with pytest.raises(HostFileError, match="too large") as caught:
            fs.read_bytes_optional(path)
        assert caught.value.subject == path
        assert fs.recording == Recording(links={"/big-link": "big"} if "link" in path else {})


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_file_names_it(tmp_path: Path) -> None:
    build(tmp_path, {"secret": "x\n"})
    (tmp_path / "secret").chmod(0)
    with pytest.raises(HostFileError, match="cannot read") as caught:
        HostFS(tmp_path).read_optional("/secret")
    assert caught.value.subject == "/secret"


def _finishes(work: Callable[[], object], seconds: float = 5) -> BaseException | None:
    """What ``work`` raised (None if it returned), failing the test if it is still
    running after ``seconds``: a regression that blocks fails instead of hanging."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            work()
            outcome.append(None)
        except BaseException as err:  # noqa: BLE001 - handed to the test to judge
            outcome.append(err)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"still blocked after {seconds} s"
    return outcome[0]


@pytest.mark.parametrize("path", ["/attr", "/attr-link"])
def test_a_fifo_is_refused_not_waited_on(tmp_path: Path, path: str) -> None:
    build(tmp_path, {"attr-link": Link("attr")})
    os.mkfifo(tmp_path / "attr")
    fs = HostFS(tmp_path, record=True)
    err = _finishes(lambda: fs.read_optional(path))
    assert isinstance(err, HostFileError)
    assert err.subject == path
    assert "cannot read: a FIFO, not a regular file" in str(err)
    assert fs.recording is not None
    assert fs.recording.files == {}


def test_discovery_stops_at_a_fifo_naming_it(machines: Machines, tmp_path: Path) -> None:
    root = tmp_path / "machine"
    shutil.copytree(machines.root(DAEMON_MACHINE), root, symlinks=True)
    online = root / "sys/devices/system/node/online"
    assert online.is_file()  # discovery reads it: the recording has it
    online.unlink()
    os.mkfifo(online)
    err = _finishes(lambda: discover(HostFS(root)))
    assert isinstance(err, HostFileError)
    assert err.subject == "/sys/devices/system/node/online"
    assert "a FIFO, not a regular file" in str(err)


@pytest.mark.parametrize(
    ("data", "text"),
    [
        pytest.param(b"0-3\x00\x00\n", "0-3\x00\x00\n", id="nul-padding"),
        pytest.param(b"\xff\xfe1\n", "\ufffd\ufffd1\n", id="invalid-utf-8"),
        pytest.param(b"caf\xc3\xa9", "caf\u00e9", id="valid-utf-8"),
        pytest.param(b"\xc3", "\ufffd", id="truncated-utf-8"),
    ],
)
def test_bytes_come_back_as_written(tmp_path: Path, data: bytes, text: str) -> None:
    build(tmp_path, {"attr": data})
    fs = HostFS(tmp_path)
    assert fs.read_bytes_optional("/attr") == data
    assert fs.read_optional("/attr") == text
    assert fs.read_text("/attr") == text


# -- directories -----------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        pytest.param("/sys/order", ("Node1", "cpu", "node10", "node2"), id="sorted-by-name"),
        pytest.param("/sys/nodes", ("node0", "node1"), id="through-absolute-link"),
        pytest.param("/sys/class/net/eth0", ("address",), id="through-relative-link"),
        pytest.param("/", ("etc", "sys"), id="root"),
        pytest.param("/sys/empty", (), id="empty"),
        pytest.param("/sys/missing", (), id="missing"),
        pytest.param("/sys/plain", (), id="a-file"),
        pytest.param("/sys/dangling", (), id="dangling-link"),
        pytest.param("/sys/etc/..", ("etc", "sys"), id="dot-dot-after-link"),
    ],
)
def test_listdir(machine: Path, path: str, expected: tuple[str, ...]) -> None:
    assert HostFS(machine).listdir(path) == expected


def test_listdir_shows_links_unfollowed(machine: Path) -> None:
    names = HostFS(machine).listdir("/sys")
    assert {"loop-a", "loop-b", "self", "dangling", "etc", "nodes"} <= set(names)
    assert list(names) == sorted(names)


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        pytest.param("/sys/devices", True, id="directory"),
        pytest.param("/", True, id="root"),
        pytest.param("/sys/nodes", True, id="link-to-directory"),
        pytest.param("/sys/plain", False, id="file"),
        pytest.param("/sys/devices/system/node/node0/cpulist-link", False, id="link-to-file"),
        pytest.param("/sys/missing", False, id="missing"),
        pytest.param("/sys/dangling", False, id="dangling-link"),
        pytest.param("/sys/self", False, id="loop"),
        pytest.param("relative", False, id="relative-path"),
    ],
)
def test_is_dir(machine: Path, path: str, expected: bool) -> None:
    assert HostFS(machine).is_dir(path) is expected


# -- recording -------------------------------------------------------------


def test_no_recording_by_default(machine: Path) -> None:
    fs = HostFS(machine)
    fs.read_optional("/sys/nodes/node0/cpulist")
    assert fs.recording is None


def test_recording_after_a_sequence_of_reads(machine: Path) -> None:
    fs = HostFS(machine, record=True)
    fs.read_optional("/sys/devices/system/node/node0/cpulist")
    fs.read_optional("/sys/bus/pci/devices/0000:00:01.0/numa_node")
    fs.read_optional("/sys/devices/system/node/node0/cpulist-link")  # same file again
    fs.read_optional("/sys/devices/system/node/node1/hostname-link")
    fs.read_optional("/sys/dangling")  # missing: its link is kept, no file
    fs.read_optional("/sys/devices/system/node/node9/cpulist")  # missing: nothing kept
    fs.listdir("/sys/nodes")
    fs.listdir("/sys/missing")  # missing: nothing kept
    fs.is_dir("/sys/class/net/eth0")
    fs.is_dir("/sys/plain")  # not a directory: nothing kept
    with pytest.raises(HostFileError):
        fs.read_optional("/sys/devices")  # a directory read fails: no file kept
    with pytest.raises(HostFileError):
        fs.read_optional("/sys/loop-a")  # the links of a loop are kept

    assert fs.recording == Recording(
        files={
            "/sys/devices/system/node/node0/cpulist": b"0-3\n",
            f"/{PCI}/numa_node": b"1\n",
            "/etc/hostname": b"fixture-host\n",
        },
        dirs={"/sys/devices/system/node", f"/{PCI}/net/eth0"},
        links={
            "/sys/bus/pci/devices/0000:00:01.0": "../../../devices/pci0000:00/0000:00:01.0",
            "/sys/devices/system/node/node0/cpulist-link": "cpulist",
            "/sys/devices/system/node/node1/hostname-link": "/etc/hostname",
            "/sys/dangling": "/nowhere",
            "/sys/nodes": "/sys/devices/system/node",
            "/sys/class/net/eth0": "../../devices/pci0000:00/0000:00:01.0/net/eth0",
            "/sys/loop-a": "loop-b",
            "/sys/loop-b": "loop-a",
        },
    )


def test_recording_keeps_bytes_as_read(tmp_path: Path) -> None:
    build(tmp_path, {"sys/attr": b"\xff\x00raw", "sys/alias": Link("attr")})
    fs = HostFS(tmp_path, record=True)
    assert fs.read_optional("/sys/alias") == "\ufffd\x00raw"
    assert fs.recording == Recording(
        files={"/sys/attr": b"\xff\x00raw"}, links={"/sys/alias": "attr"}
    )


# -- properties ------------------------------------------------------------

# Only relative links that stay inside the tree and no loops: here the seam
# must agree with the operating system's own resolution.
PLAIN_TREE: Tree = {
    "a/b/c": "c\n",
    "a/f": "f\n",
    "a/up": Link(".."),
    "a/b/to-f": Link("../f"),
    "a/b/here": Link("."),
    "top": Link("a/b"),
    "dangle": Link("zz/q"),
}
NAMES = ["a", "b", "c", "f", "up", "to-f", "here", "top", "dangle", "zz", "..", ".", ""]

# Links out of the tree, absolute and relative: resolution must stay inside.
HOSTILE_TREE: Tree = {
    "a/b": DIR,
    "a/abs": Link("/"),
    "a/etc": Link("/etc/passwd"),
    "a/out": Link("../../../../.."),
    "a/deep": Link("/a/out/a/abs/a"),
}
HOSTILE_NAMES = ["a", "b", "abs", "etc", "out", "deep", "..", ".", ""]


@pytest.fixture(scope="module")
def plain_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = Path(os.path.realpath(tmp_path_factory.mktemp("plain")))
    build(root, PLAIN_TREE)
    return root


@pytest.fixture(scope="module")
def hostile_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = Path(os.path.realpath(tmp_path_factory.mktemp("hostile")))
    build(root, HOSTILE_TREE)
    return root


@given(parts=st.lists(st.sampled_from(NAMES), max_size=7))
def test_resolution_agrees_with_the_os(plain_tree: Path, parts: list[str]) -> None:
    path = "/" + "/".join(parts)
    expected = os.path.realpath(f"{plain_tree}{path}")
    # The OS climbs out of the tree on a leading "..", the seam stays at its root.
    assume(expected == str(plain_tree) or expected.startswith(f"{plain_tree}/"))
    fs = HostFS(plain_tree)
    assert fs.real(path).rstrip("/") == expected
    on_disk = Path(expected)
    assert fs.is_dir(path) == on_disk.is_dir()
    # A trailing "", "." or ".." names a directory: opening it as a file is an
    # error whatever it resolves to, so contents are compared for names only.
    if parts and parts[-1] not in ("", ".", "..") and not on_disk.is_dir():
        assert fs.read_optional(path) == (on_disk.read_text() if on_disk.is_file() else None)


@given(parts=st.lists(st.sampled_from(HOSTILE_NAMES), max_size=8))
def test_resolution_never_leaves_the_root(hostile_tree: Path, parts: list[str]) -> None:
    path = "/" + "/".join(parts)
    fs = HostFS(hostile_tree)
    resolved = fs.resolve(path)
    assert resolved.startswith("/")
    assert posixpath.normpath(resolved) == resolved
    assert ".." not in resolved.split("/")
    assert fs.real(path) == f"{hostile_tree}{resolved}"
    # The tree holds no files at all: whatever the path, nothing is read.
    if not fs.is_dir(path):
        assert fs.read_optional(path) is None
