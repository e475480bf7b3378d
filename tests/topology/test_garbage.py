"""Garbage in any sysfs file discovery reads: a documented fallback or an error naming the file."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from numad.errors import NumadError
from numad.hostfs import HostFS
from numad.topology.discover import discover
from numad.topology.model import Topology
from tests.conftest import Machines

# Small machines that between them meet every kind of file discovery reads:
# caches, node memory and hugepages, PCI devices, cpumap-only old kernels.
GARBAGE_MACHINES = ["32intel64-2p8co2t+8ve", "fakeheteromemtiers", "16em64t-4s2c2t"]

GARBAGE = st.one_of(
    st.binary(max_size=64),
    st.text(max_size=64).map(str.encode),
    st.sampled_from(
        [
            b"",
            b"\x00",
            b"-1",
            b"-",
            b"0-",
            b"5-2",
            b"99999999999",
            b"0x",
            b",",
            b"1,,2",
            b"ffffffff,ffffffff,ffffffff",
            b"0-1048575",
            b"Node 0 MemTotal: x kB",
            b"\xff\xfe",
            "10 \u00b9".encode(),  # a digit to str.isdigit, not to int()
            "\u0663".encode(),  # a digit to int(), not a number any kernel writes
        ]
    ),
)


class Tree:
    """A writable copy of a recorded machine and the host paths discovery reads in it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        fs = HostFS(root, record=True)
        discover(fs)
        assert fs.recording is not None
        self.files = sorted(fs.recording.files)


@pytest.fixture(scope="module", params=GARBAGE_MACHINES)
def tree(
    machines: Machines, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Tree:
    copy = tmp_path_factory.mktemp("garbage") / request.param
    shutil.copytree(machines.root(request.param), copy, symlinks=True)
    return Tree(copy)


@settings(
    max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None
)
@given(data=st.data())
def test_garbage_in_one_file_never_crashes_discovery(tree: Tree, data: st.DataObject) -> None:
    path = data.draw(st.sampled_from(tree.files), label="file")
    garbage = data.draw(GARBAGE, label="content")
    _one_file(tree, path, lambda _: garbage)


@settings(
    max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None
)
@given(data=st.data())
def test_garbage_in_many_files_never_crashes_discovery(tree: Tree, data: st.DataObject) -> None:
    paths = data.draw(st.lists(st.sampled_from(tree.files), min_size=2, max_size=12, unique=True))
    originals = {}
    for path in paths:
        real = tree.root / path.lstrip("/")
        originals[real] = real.read_bytes()
        real.write_bytes(data.draw(GARBAGE))
    try:
        outcome = _discover(tree.root)
    finally:
        for real, content in originals.items():
            real.write_bytes(content)
    if isinstance(outcome, NumadError):
        assert any(p.startswith(outcome.subject) for p in paths), outcome
    else:
        _assert_well_formed(outcome)


@pytest.mark.parametrize("digit", ["\u00b9", "\u0663", "\u00bd"])
def test_a_unicode_digit_in_any_file_is_not_a_number(tree: Tree, digit: str) -> None:
    """Each file in turn holds a Unicode digit among ASCII ones (hypothesis found
    ``int('\u00b9')`` raising in the distance rows): a fallback or an error naming the file."""
    for path in tree.files:
        _one_file(tree, path, lambda text: text.replace(b"1", digit.encode(), 1) or digit.encode())


def _one_file(tree: Tree, path: str, change: Callable[[bytes], bytes]) -> None:
    """Discovery with ``path`` changed (and put back after): a fallback, or an error
    naming that file."""
    real = tree.root / path.lstrip("/")
    original = real.read_bytes()
    real.write_bytes(change(original))
    try:
        outcome = _discover(tree.root)
    finally:
        real.write_bytes(original)
    if isinstance(outcome, NumadError):
        assert path.startswith(outcome.subject), outcome
    else:
        _assert_well_formed(outcome)


def _discover(root: Path) -> Topology | NumadError:
    """Discovery's result, or the project error it raised (any other exception escapes)."""
    try:
        return discover(HostFS(root))
    except NumadError as err:
        return err


def _assert_well_formed(topo: Topology) -> None:
    """What every later stage relies on, whatever the files said."""
    online = topo.online_cpus
    assert online
    covered: set[int] = set()
    for core in topo.cores:
        assert core.cpus
        assert covered.isdisjoint(core.cpus)
        covered |= set(core.cpus)
        assert core.cpus.issubset(topo.package(core.package).cpus)
    assert covered == set(online)
    assert set().union(*(set(p.cpus) for p in topo.packages)) == set(online)
    for node in topo.nodes:
        assert node.cpus.issubset(online)
        for pool in node.hugepages:
            assert 0 <= pool.free <= pool.total
        if node.distances is not None:
            assert set(node.distances).issubset(set(topo.node_ids))
    for device in topo.pci_devices:
        assert device.numa_node is None or device.numa_node in topo.node_ids
