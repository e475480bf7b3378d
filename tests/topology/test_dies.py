"""die: the die's index within its package, on kernels that number die_id per package
(up to 6.8) and on those that number it across the machine (6.9 and later)."""

from __future__ import annotations

from pathlib import Path

from numad.hostfs import HostFS
from numad.topology.discover import discover
from tests.conftest import Machines

MACHINE = "32intel64-2p8co2t+8ve"  # 2 packages, one die each


def test_machine_wide_die_ids_are_numbered_within_each_package(
    machines: Machines, tmp_path: Path
) -> None:
    root = machines.root(MACHINE)
    before = discover(HostFS(root))
    assert {c.die for c in before.all_cpus if c.online} == {0}
    second = {c.id for c in before.all_cpus if c.package == 1}
    # What a 6.12 kernel writes: the second package's die is die 1.
    for cpu in second:
        (root / f"sys/devices/system/cpu/cpu{cpu}/topology/die_id").write_text("1\n")
    try:
        after = discover(HostFS(root))
    finally:
        for cpu in second:
            (root / f"sys/devices/system/cpu/cpu{cpu}/topology/die_id").write_text("0\n")
    assert [(c.id, c.package, c.die) for c in after.all_cpus] == [
        (c.id, c.package, c.die) for c in before.all_cpus
    ]
