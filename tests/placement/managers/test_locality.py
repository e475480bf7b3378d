"""Device picking by PCIe locality (numad.placement.managers.locality): the rule on a
constructed machine with switches (tests/placement/switched.py), what the words say,
and the config key."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from numad.cpuset import NodeSet
from numad.daemon import config
from numad.errors import ConfigError
from numad.hostfs import HostFS
from numad.placement.managers.device import DeviceClass, DeviceInventory, DeviceState, Key, Pick
from numad.placement.managers.locality import wiring
from numad.topology.discover import discover
from tests.conftest import Machines
from tests.placement import switched

KEY: Key = ("w", "c")
NODE0 = NodeSet([0])
# Node 0's devices (switched.py): GPUs 10 16 under root port 0's switch, 13 19 under
# root port 1's, 11 17 under root port 2's, 12 alone; NICs 14 (root port 0's switch),
# 18 (root port 1's), 15 alone; root ports 0-1 on host bridge 00, 2-4 on 40.
A = "0000:{:02x}:00.0".format


def _state(gpu: Pick = Pick.LOCALITY, nic: Pick = Pick.LOCALITY, paths: bool = True) -> DeviceState:
    topo = switched.machine(paths=paths)
    return DeviceState(DeviceInventory.build(topo, switched.classes(gpu, nic)))


def _held(state: DeviceState, *addresses: int) -> DeviceState:
    """``addresses`` (GPUs and NICs of node 0) held by another workload."""
    by_class: dict[str, tuple[str, ...]] = {}
    for a in addresses:
        name = "nic" if a in {0x14, 0x15, 0x18} else "gpu"
        by_class[name] = (*by_class.get(name, ()), A(a))
    return replace(state, held={("other", "c"): by_class})


def _got(state: DeviceState, request: dict[str, int]) -> dict[str, list[str]]:
    after = state.allocate(KEY, request, NODE0)
    return {name: sorted(a) for name, a in after.held[KEY].items()}


@pytest.mark.parametrize(
    ("held", "asked", "picks", "expected"),
    [
        pytest.param((), {"gpu": 2}, {}, {"gpu": [A(0x10), A(0x16)]}, id="pair-one-switch"),
        pytest.param((), {"gpu": 2}, {"gpu": Pick.INDEX}, {"gpu": [A(0x10), A(0x11)]},
                     id="pair-by-index"),
        pytest.param((), {"gpu": 1}, {}, {"gpu": [A(0x10)]}, id="one-device-kubelet"),
        pytest.param((), {"gpu": 4}, {}, {"gpu": [A(0x10), A(0x13), A(0x16), A(0x19)]},
                     id="four-share-a-host-bridge"),
        pytest.param((0x10, 0x16), {"gpu": 2}, {}, {"gpu": [A(0x11), A(0x17)]},
                     id="next-pair-lowest-switch"),
        pytest.param((), {"gpu": 1, "nic": 1}, {}, {"gpu": [A(0x10)], "nic": [A(0x14)]},
                     id="gpu-nic-one-switch"),
        pytest.param((0x10,), {"gpu": 1, "nic": 1}, {}, {"gpu": [A(0x16)], "nic": [A(0x14)]},
                     id="best-fit"),
        pytest.param((0x10,), {"gpu": 1, "nic": 1}, {"gpu": Pick.INDEX},
                     {"gpu": [A(0x11)], "nic": [A(0x15)]}, id="nic-drawn-to-index-gpu"),
        pytest.param((), {"gpu": 2, "nic": 1}, {"nic": Pick.INDEX},
                     {"gpu": [A(0x10), A(0x16)], "nic": [A(0x14)]}, id="gpus-drawn-to-index-nic"),
        pytest.param((0x14,), {"gpu": 2, "nic": 1}, {"nic": Pick.INDEX},
                     {"gpu": [A(0x11), A(0x17)], "nic": [A(0x15)]}, id="gpus-own-pair-first"),
    ],
)  # fmt: skip
def test_locality_picks(
    held: tuple[int, ...],
    asked: dict[str, int],
    picks: dict[str, Pick],
    expected: dict[str, list[str]],
) -> None:
    state = _held(_state(picks.get("gpu", Pick.LOCALITY), picks.get("nic", Pick.LOCALITY)), *held)
    assert _got(state, asked) == expected


@pytest.mark.parametrize("asked", [{"gpu": 2}, {"gpu": 4}, {"gpu": 1, "nic": 2}])
def test_devices_without_a_path_keep_the_kubelets_order(asked: dict[str, int]) -> None:
    index = _got(_state(Pick.INDEX, Pick.INDEX), asked)
    assert _got(_state(paths=False), asked) == index


def test_picks_keep_the_kubelets_count_per_node() -> None:
    """Two nodes chosen for 8 GPUs: the kubelet's 7 of node 0 and 1 of node 1."""
    for pick in Pick:
        after = _state(pick).allocate(KEY, {"gpu": 8}, NodeSet([0, 1]))
        nodes = [int(a[5:7], 16) >= 0x80 for a in after.held[KEY]["gpu"]]
        assert sorted(nodes) == [False] * 7 + [True]


def test_reused_devices_stay_and_the_rest_draws_near() -> None:
    state = _state()
    init = state.allocate(("w", "init"), {"gpu": 1}, NODE0)  # takes 10 (kubelet's)
    app = init.allocate(KEY, {"gpu": 2}, NODE0, reuse_from=[("w", "init")])
    assert app.held[KEY]["gpu"] == (A(0x10), A(0x16))


def test_three_examples_in_words() -> None:
    state = _state()
    assert state.wiring({"gpu": (A(0x10), A(0x16))}) == (
        "gpu 0000:10:00.0 and 0000:16:00.0 share switch 0000:30:00.0"
    )
    assert state.wiring({"gpu": (A(0x13),), "nic": (A(0x18),)}) == (
        "gpu 0000:13:00.0 and nic 0000:18:00.0 share switch 0000:31:00.0"
    )
    assert state.wiring({"gpu": (A(0x10), A(0x13))}) == (
        "gpu 0000:10:00.0 and 0000:13:00.0 share host bridge pci0000:00"
    )
    assert state.wiring({"gpu": (A(0x11), A(0x12))}) == (
        "gpu 0000:11:00.0 and 0000:12:00.0 share host bridge pci0000:40"
    )
    assert state.wiring({"gpu": (A(0x10), A(0x11), A(0x90))}) == (
        "gpu 0000:10:00.0, 0000:11:00.0 and 0000:90:00.0 share no PCIe ancestor (on nodes 0-1)"
    )
    assert state.wiring({"gpu": (A(0x10), A(0x11))}) == (
        "gpu 0000:10:00.0 and 0000:11:00.0 share only node 0"
    )
    assert state.wiring({"gpu": (A(0x10),)}) == ""


@pytest.mark.parametrize(
    ("devices", "expected"),
    [
        pytest.param(
            [("gpu", "0000:1b:00.0", ("pci0000:17", "0000:17:00.0", "0000:18:00.0", "x"), 0),
             ("nic", "0000:1a:00.0", ("pci0000:17", "0000:17:00.0", "0000:18:00.0", "y"), 0)],
            "gpu 0000:1b:00.0 and nic 0000:1a:00.0 share switch 0000:18:00.0", id="switch"),
        pytest.param(
            [("gpu", "0000:1b:00.0", ("pci0000:17", "0000:17:00.0", "0000:18:00.0"), 0),
             ("gpu", "0000:1d:00.0", ("pci0000:17", "0000:17:00.0", "0000:1c:00.0"), 0)],
            "gpu 0000:1b:00.0 and 0000:1d:00.0 share root port 0000:17:00.0", id="root-port"),
        pytest.param(
            [("gpu", "0000:1b:00.0", (), 0), ("nic", "0000:1a:00.0", (), None)],
            "gpu 0000:1b:00.0 and nic 0000:1a:00.0 are on node 0 and no NUMA node"
            " (their place in the PCIe tree is not known)", id="unknown"),
    ],
)  # fmt: skip
def test_wiring_words(
    devices: list[tuple[str, str, tuple[str, ...], int | None]], expected: str
) -> None:
    assert wiring(devices) == expected


def test_config_pick(tmp_path: Path) -> None:
    path = tmp_path / "numad.toml"
    path.write_text(
        '[devices.gpu]\nvendor = "0x10de"\n[devices.nic]\nvendor = "0x15b3"\npick = "index"\n'
    )
    assert config.load(path).device_classes == (
        DeviceClass("gpu", vendor="0x10de", pick=Pick.LOCALITY),
        DeviceClass("nic", vendor="0x15b3", pick=Pick.INDEX),
    )
    path.write_text('[devices.gpu]\nvendor = "0x10de"\npick = "nearest"\n')
    with pytest.raises(ConfigError, match="not one of locality, index"):
        config.load(path)
    path.write_text('[devices.gpu]\npick = "index"\n')
    with pytest.raises(ConfigError, match="selects nothing"):
        config.load(path)


@pytest.mark.slow  # unpacks and discovers a 224-CPU machine: minutes on a loaded host
def test_dgx_like_pairs_stay_under_one_switch(machines: Machines) -> None:
    """The DGX-like machine (fixtures/synthetic): GPU 0000:18:00.0 taken, two more GPUs
    and a NIC go under switch 1 (0000:38:00.0), where by index they spread."""
    topo = discover(HostFS(machines.root("224intel64-2pa56co2t+8gpu8nic-dgxlike")))
    got = {}
    for pick in Pick:
        classes = [
            DeviceClass("gpu", vendor="0x10de", pick=pick),
            DeviceClass("nic", vendor="0x15b3", pick=pick),
        ]
        state = DeviceState(DeviceInventory.build(topo, classes))
        state = state.allocate(("other", "c"), {"gpu": 1}, NODE0)
        after = state.allocate(KEY, {"gpu": 2, "nic": 1}, NODE0)
        got[pick] = after.wiring(after.held[KEY])
    assert got == {
        Pick.LOCALITY: "gpu 0000:3a:00.0, 0000:3c:00.0 and nic 0000:3b:00.0"
        " share switch 0000:38:00.0",
        Pick.INDEX: "gpu 0000:1a:00.0, 0000:3a:00.0 and nic 0000:19:00.0 share only node 0",
    }
