"""The emulated kernel's remote partitions (``numad.host.cgroup.partitions``) and
numad's grants made with them (``numad.host.exclusive``), on scratch v2 trees.

The rules emulated are those of Linux 6.11 and later; the VM tier checks numad's
use of them on a real 6.12 kernel."""

from __future__ import annotations

from pathlib import Path

import pytest

from numad.cpuset import CPUSet, NodeSet
from numad.errors import CgroupError
from numad.host.cgroup.v2 import CgroupV2Backend
from numad.host.exclusive import Partitions, holds_cap_sys_admin, partitions
from numad.host.scratch import make_scratch_v2, scratch_mkdir
from numad.observe import Problems

EVERY = CPUSet(range(8))
CGROUPS = ["numad.slice/pa/a", "numad.slice/pb/b", "numad.slice/stray", "system.slice/x"]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "cgroup"
    make_scratch_v2(root, EVERY, NodeSet([0]), CGROUPS, partitions=True)
    return root


def _backend(root: Path) -> CgroupV2Backend:
    return CgroupV2Backend(root, ["numad.slice", "system.slice"], emulate_kernel=True)


def _effective(backend: CgroupV2Backend, path: str) -> CPUSet:
    return backend.read_effective(path)[0]


def test_a_partition_takes_its_cpus_from_every_other_cgroup(tree: Path) -> None:
    b = _backend(tree)
    b.write_exclusive("numad.slice", CPUSet([2, 3]))
    b.write_exclusive("numad.slice/pa", CPUSet([2, 3]))
    b.write_exclusive("numad.slice/pa/a", CPUSet([2, 3]))
    b.write_partition("numad.slice/pa/a", "root")
    assert b.partition("numad.slice/pa/a") == (CPUSet([2, 3]), "root")
    assert _effective(b, "numad.slice/pa/a") == CPUSet([2, 3])
    for other in ("numad.slice/stray", "numad.slice/pb/b", "system.slice/x", "numad.slice"):
        assert _effective(b, other) == EVERY - CPUSet([2, 3]), other
    # A cgroup's own cpuset.cpus naming them changes nothing: its effective set is masked.
    b.write("numad.slice/stray", CPUSet([1, 2, 3]), None)
    assert _effective(b, "numad.slice/stray") == CPUSet([1])
    b.write_partition("numad.slice/pa/a", "member")
    assert _effective(b, "system.slice/x") == EVERY
    assert _effective(b, "numad.slice/stray") == CPUSet([1, 2, 3])


def test_a_cgroup_beside_naming_its_cpus_leaves_a_partition_invalid(tree: Path) -> None:
    """6.12's rule, met in the VM tier: a partition's sibling with no exclusive CPUs of
    its own may not name its CPUs in cpuset.cpus (the partition is invalid while it
    does, and such a write beside a valid one is refused); one elsewhere may."""
    b = _backend(tree)
    b.write("numad.slice/stray", CPUSet([3, 4]), None)
    b.write_exclusive("numad.slice", CPUSet([2, 3]))
    b.write_exclusive("numad.slice/pa", CPUSet([2, 3]))
    b.write_partition("numad.slice/pa", "root")
    assert b.partition("numad.slice/pa") == (
        CPUSet([2, 3]),
        "root invalid (Cpu list in cpuset.cpus not exclusive)",
    )
    assert _effective(b, "system.slice/x") == EVERY
    b.write("numad.slice/stray", CPUSet([4]), None)
    b.write_partition("numad.slice/pa", "root")
    assert b.partition("numad.slice/pa") == (CPUSet([2, 3]), "root")
    with pytest.raises(CgroupError, match=r"numad\.slice/stray"):
        b.write("numad.slice/stray", CPUSet([2, 4]), None)
    b.write("numad.slice/pb/b", CPUSet([2, 4]), None)  # not beside it: masked, not refused
    assert _effective(b, "numad.slice/pb/b") == CPUSet([4])


@pytest.mark.parametrize(
    ("path", "cpus", "why"),
    [
        ("numad.slice/pb", CPUSet([3]), "a sibling's"),  # pa names 2-3
        ("numad.slice/pa/a", CPUSet([4]), "outside its parent's"),
        ("numad.slice", CPUSet([2]), "a child names 3"),
    ],
)
def test_exclusive_cpus_that_break_the_rules_are_refused(
    tree: Path, path: str, cpus: CPUSet, why: str
) -> None:
    b = _backend(tree)
    b.write_exclusive("numad.slice", CPUSet([2, 3, 4]))
    b.write_exclusive("numad.slice/pa", CPUSet([2, 3]))
    with pytest.raises(CgroupError) as caught:
        b.write_exclusive(path, cpus)
    assert path in str(caught.value), why
    assert b.partition("numad.slice/pa")[0] == CPUSet([2, 3])


@pytest.mark.parametrize(
    ("setup", "reason"),
    [
        ([], "Empty"),
        ([("numad.slice", "0-7"), ("numad.slice/pa", "0-7")], "no CPU left"),
    ],
)
def test_a_partition_the_kernel_cannot_make_reads_invalid_and_moves_nothing(
    tree: Path, setup: list[tuple[str, str]], reason: str
) -> None:
    b = _backend(tree)
    for path, cpus in setup:
        b.write_exclusive(path, CPUSet.parse_list(cpus))
    if setup:
        b.write_exclusive("numad.slice/pa/a", CPUSet.parse_list(setup[-1][1]))
    b.write_partition("numad.slice/pa/a", "root")
    state = b.partition("numad.slice/pa/a")[1]
    assert state.startswith("root invalid ("), state
    assert reason in state, state
    assert _effective(b, "system.slice/x") == EVERY


def test_a_partition_below_a_partition_is_invalid(tree: Path) -> None:
    b = _backend(tree)
    for path in ("numad.slice", "numad.slice/pa", "numad.slice/pa/a"):
        b.write_exclusive(path, CPUSet([5]))
    b.write_partition("numad.slice/pa", "root")
    b.write_partition("numad.slice/pa/a", "root")
    assert "Parent is a partition root" in b.partition("numad.slice/pa/a")[1]


def test_a_removed_partition_gives_its_cpus_back(tree: Path) -> None:
    b = _backend(tree)
    for path in ("numad.slice", "numad.slice/pb", "numad.slice/pb/b"):
        b.write_exclusive(path, CPUSet([6]))
    b.write_partition("numad.slice/pb/b", "root")
    assert _effective(b, "system.slice/x") == EVERY - CPUSet([6])
    for file in (tree / "numad.slice/pb/b").iterdir():
        file.unlink()
    (tree / "numad.slice/pb/b").rmdir()
    scratch_mkdir(tree, "numad.slice/next")  # the emulation's next operation
    assert _effective(b, "system.slice/x") == EVERY
    assert _effective(b, "numad.slice/next") == EVERY


def test_a_tree_without_partitions_refuses_their_files(tmp_path: Path) -> None:
    root = tmp_path / "old"
    make_scratch_v2(root, EVERY, NodeSet([0]), CGROUPS)
    b = _backend(root)
    assert not b.partitions_offered()
    with pytest.raises(CgroupError, match="does not exist"):
        b.write_partition("numad.slice/pa/a", "root")


def test_grants_move_cpus_between_pods_each_level_giving_up_before_taking(tree: Path) -> None:
    """Partitions.grant/end: a CPU leaves one pod's partition and joins another's; the
    kernel's sibling rule would refuse a level that took it first."""
    b = _backend(tree)
    parts = Partitions(b, "numad.slice/numad-held")
    grants = {"numad.slice/pa/a": CPUSet([2, 3]).bits}
    parts.grant("numad.slice/pa/a", grants["numad.slice/pa/a"], grants)
    grants["numad.slice/pa/a"] = CPUSet([2]).bits
    parts.grant("numad.slice/pa/a", grants["numad.slice/pa/a"], grants)
    grants["numad.slice/pb/b"] = CPUSet([3, 4]).bits
    parts.grant("numad.slice/pb/b", grants["numad.slice/pb/b"], grants)
    assert b.partition("numad.slice/pa") == (CPUSet([2]), "member")
    assert b.partition("numad.slice/pb") == (CPUSet([3, 4]), "member")
    assert b.partition("numad.slice")[0] == CPUSet([2, 3, 4])
    assert _effective(b, "numad.slice/stray") == EVERY - CPUSet([2, 3, 4])
    assert parts.holds("numad.slice/pb/b", CPUSet([3, 4]).bits)
    del grants["numad.slice/pa/a"]
    parts.end("numad.slice/pa/a", grants)
    assert b.partition("numad.slice/pa/a") == (CPUSet(), "member")
    assert b.partition("numad.slice/pa")[0] == CPUSet()
    assert b.partition("numad.slice")[0] == CPUSet([3, 4])
    assert _effective(b, "numad.slice/stray") == EVERY - CPUSet([3, 4])


def test_a_grant_the_kernel_leaves_invalid_raises_naming_the_cgroup(tree: Path) -> None:
    b = _backend(tree)
    b.write_exclusive("numad.slice", CPUSet([7]))
    b.write_exclusive("numad.slice/pb", CPUSet([7]))
    b.write_exclusive("numad.slice/pb/b", CPUSet([7]))
    b.write_partition("numad.slice/pb/b", "root")  # someone else's partition of CPU 7
    parts = Partitions(b, "numad.slice/numad-held")
    with pytest.raises(CgroupError) as caught:
        parts.grant("numad.slice/pa/a", CPUSet([7]).bits, {"numad.slice/pa/a": CPUSet([7]).bits})
    assert "numad.slice/pa/a" in str(caught.value)
    assert not parts.holds("numad.slice/pa/a", CPUSet([7]).bits)


# -- where numad makes them ([host] partitions: "auto", true or false) ----------------------


def _real(root: Path) -> CgroupV2Backend:
    """A backend that takes the tree for a real kernel's: numad's own capabilities
    decide "auto" there (an emulated kernel asks for none)."""
    return CgroupV2Backend(root, ["numad.slice", "system.slice"], emulate_kernel=False)


@pytest.mark.parametrize(
    ("asked", "capable", "made", "isolating"),
    [
        (False, True, True, "partitions"),
        (False, False, False, "one by one: numad lacks CAP_SYS_ADMIN"),
        (True, False, True, "partitions"),  # asked for: the kernel's refusal is the word
        (True, True, True, "partitions"),
    ],
)
def test_auto_makes_partitions_only_where_numad_may(
    tree: Path, asked: bool, capable: bool, made: bool, isolating: str
) -> None:
    health = Problems()
    parts, how = partitions(_real(tree), health, asked=asked, capable=lambda: capable)
    assert (parts is not None) == made
    assert how.startswith(isolating), how
    assert health.snapshot() == []


@pytest.mark.parametrize("asked", [False, True])
def test_a_kernel_without_partitions_is_a_problem_only_where_they_were_asked_for(
    tmp_path: Path, asked: bool
) -> None:
    make_scratch_v2(tmp_path, EVERY, NodeSet([0]), CGROUPS)  # a 6.1 kernel's tree
    health = Problems()
    parts, how = partitions(_real(tmp_path), health, asked=asked, capable=lambda: True)
    assert parts is None
    assert how.startswith("one by one: this kernel offers no cpuset partitions"), how
    assert health.has("partitions") == asked


def test_an_emulated_kernel_asks_for_no_capability(tree: Path) -> None:
    parts, how = partitions(_backend(tree), Problems(), asked=False, capable=lambda: False)
    assert parts is not None
    assert how == "partitions"


@pytest.mark.parametrize(
    ("cap_eff", "holds"),
    [
        ("000001ffffffffff", True),  # root's full set
        ("0000000000200000", True),  # CAP_SYS_ADMIN (21) alone
        ("0000000000d00002", False),  # the unit's others: DAC_OVERRIDE, NICE, PTRACE...
        ("0000000000000000", False),
        ("not hex", False),
    ],
)
def test_cap_sys_admin_is_read_from_the_effective_set(
    tmp_path: Path, cap_eff: str, holds: bool
) -> None:
    status = tmp_path / "status"
    status.write_text(f"Name:\tnumad\nCapInh:\t0000000000000000\nCapEff:\t{cap_eff}\n")
    assert holds_cap_sys_admin(status) is holds


def test_no_status_file_means_no_capability(tmp_path: Path) -> None:
    assert not holds_cap_sys_admin(tmp_path / "gone")
