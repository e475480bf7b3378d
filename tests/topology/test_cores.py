"""Cores on AMD family 15h: the two cores of a compute unit are two cores, not two threads.

64amd64-4s2n4ca2co is a Dell PowerEdge C6145 with 4 Opteron 6276 (Interlagos, family
21 = 15h; /proc/cpuinfo). Its kernel lists both cores of a compute unit in
thread_siblings (0-1, 2-3, ...) although their core_ids differ. Before the rule,
numad read 32 cores of 2 threads; hwloc, cAdvisor and so the kubelet's CPU manager
count 64 cores of one thread each.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from numad.hostfs import HostFS
from numad.topology.discover import discover
from tests.topology.conftest import MoreMachines

BULLDOZER = "64amd64-4s2n4ca2co"


def test_compute_unit_siblings_with_their_own_core_ids_are_two_cores(
    more_machines: MoreMachines,
) -> None:
    root = more_machines.root(BULLDOZER)
    topology = root / "sys/devices/system/cpu/cpu0/topology"
    assert (topology / "thread_siblings_list").read_text().strip() == "0-1"
    assert (root / "sys/devices/system/cpu/cpu1/topology/core_id").read_text().strip() == "1"
    topo = discover(HostFS(root))
    assert len(topo.cores) == 64
    assert all(len(core.cpus) == 1 for core in topo.cores)
    assert [(c.id, c.core_id) for c in topo.cores[:4]] == [(0, 0), (1, 1), (2, 2), (3, 3)]
    # core_id repeats inside a package across its two dies (no die_id on this kernel):
    # cpu0 and cpu8 are both core_id 0 of package 0, and stay two cores.
    assert topo.cpu(8).package == topo.cpu(0).package
    assert topo.core_of(8).core_id == topo.core_of(0).core_id == 0
    assert topo.core_of(8) is not topo.core_of(0)


def test_without_core_ids_a_sibling_set_stays_one_core(
    more_machines: MoreMachines, tmp_path: Path
) -> None:
    root = tmp_path / BULLDOZER
    shutil.copytree(more_machines.root(BULLDOZER), root, symlinks=True)
    for core_id in root.glob("sys/devices/system/cpu/cpu*/topology/core_id"):
        core_id.unlink()
    topo = discover(HostFS(root))
    assert len(topo.cores) == 32
    assert [list(c.cpus) for c in topo.cores[:2]] == [[0, 1], [2, 3]]
    assert all(c.core_id is None for c in topo.cores)


def test_one_missing_core_id_keeps_that_sibling_set_whole(
    more_machines: MoreMachines, tmp_path: Path
) -> None:
    root = tmp_path / BULLDOZER
    shutil.copytree(more_machines.root(BULLDOZER), root, symlinks=True)
    (root / "sys/devices/system/cpu/cpu3/topology/core_id").write_text("garbage\n")
    topo = discover(HostFS(root))
    assert len(topo.cores) == 63
    assert list(topo.core_of(2).cpus) == [2, 3]
    assert list(topo.core_of(0).cpus) == [0]
