"""The numad command line: output, exit codes, bundled machines."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from importlib import resources
from pathlib import Path

import pytest

from numad.cli.main import DEFAULT_MACHINE, bundled_machines, main
from numad.hostfs import HostFS
from numad.topology.discover import discover
from numad.topology.render import to_json, to_text
from tests.conftest import FIXTURES, Machines

Capture = pytest.CaptureFixture[str]


def _run(capsys: Capture, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# -- topology -------------------------------------------------------------------


def test_topology_of_the_bundled_machine(capsys: Capture) -> None:
    code, out, err = _run(capsys, "topology", "--fixture", DEFAULT_MACHINE)
    assert (code, err) == (0, "")
    assert out.startswith("Machine: 2 packages, 2 NUMA nodes, 16 cores, CPUs 32/32 online\n")
    assert "      core 0: cpus 0,16\n" in out
    assert "processor [0x0b4000]" in out  # the VectorEngine cards


def test_topology_json_of_a_recorded_tree(capsys: Capture, machines: Machines) -> None:
    root = machines.root("16amd64-8n2c")
    code, out, err = _run(capsys, "topology", "--root", str(root), "--json")
    assert (code, err) == (0, "")
    assert json.loads(out) == to_json(discover(HostFS(root)))
    assert out.startswith('{\n  "packages": [')  # indent=2, keys in contract order


def test_topology_text_of_a_recorded_tree(capsys: Capture, machines: Machines) -> None:
    root = machines.root("fakeheteromemtiers")
    code, out, _ = _run(capsys, "topology", "--root", str(root))
    assert code == 0
    assert out == to_text(discover(HostFS(root)))


def test_auto_shows_a_numa_host_as_it_is(capsys: Capture, machines: Machines) -> None:
    root = machines.root("16amd64-8n2c")
    code, out, err = _run(capsys, "topology", "--auto", "--root", str(root))
    assert (code, err) == (0, "")
    assert out.startswith("Machine: 8 packages, 8 NUMA nodes")


@pytest.mark.parametrize(
    ("name", "why"),
    [
        pytest.param("2arm-2c", "has no /sys/devices/system/node", id="no-node-dir"),
        pytest.param("offline-cpu0-node0", "has 1 NUMA node", id="one-node"),
    ],
)
def test_auto_falls_back_to_the_bundled_machine(
    capsys: Capture, machines: Machines, name: str, why: str
) -> None:
    code, out, err = _run(capsys, "topology", "--auto", "--root", str(machines.root(name)))
    assert code == 0
    assert out.startswith("Machine: 2 packages, 2 NUMA nodes, 16 cores, CPUs 32/32 online\n")
    assert err.count("\n") == 1
    assert why in err
    assert f"showing the recorded machine {DEFAULT_MACHINE} instead" in err


def test_fixture_may_name_a_recorded_archive(
    capsys: Capture, machines: Machines, tmp_path: Path
) -> None:
    archive = tmp_path / "box.tar.gz"
    assert (
        main(["record-fixture", str(archive), "--root", str(machines.root("16em64t-4s2c2t"))]) == 0
    )
    capsys.readouterr()
    code, out, _ = _run(capsys, "topology", "--fixture", str(archive))
    assert code == 0
    assert out == to_text(discover(HostFS(machines.root("16em64t-4s2c2t"))))


# -- record-fixture ---------------------------------------------------------------


def test_record_fixture_writes_the_archive(
    capsys: Capture, machines: Machines, tmp_path: Path
) -> None:
    out_path = tmp_path / "host.tar.gz"
    root = machines.root("32intel64-2p8co2t+8ve")
    code, out, err = _run(capsys, "record-fixture", str(out_path), "--root", str(root))
    assert (code, err) == (0, "")
    with tarfile.open(out_path) as tar:
        count = len(tar.getmembers())
    assert out == f"{out_path}: {count} entries\n"


def test_record_fixture_into_a_missing_directory_fails(
    capsys: Capture, machines: Machines, tmp_path: Path
) -> None:
    target = tmp_path / "no" / "host.tar.gz"
    root = machines.root("2arm-2c")
    code, out, err = _run(capsys, "record-fixture", str(target), "--root", str(root))
    assert (code, out) == (1, "")
    assert err.startswith(f"numad: {target}: cannot create a file beside it")


# -- errors -------------------------------------------------------------------------


def test_unknown_fixture_names_the_bundled_ones(capsys: Capture) -> None:
    code, out, err = _run(capsys, "topology", "--fixture", "nope")
    assert (code, out) == (1, "")
    assert err == f"numad: nope: no such recorded machine; bundled machines: {DEFAULT_MACHINE}\n"


def test_root_that_is_not_a_directory(capsys: Capture, tmp_path: Path) -> None:
    code, _, err = _run(capsys, "topology", "--root", str(tmp_path / "missing"))
    assert code == 1
    assert err.startswith(f"numad: {tmp_path / 'missing'}: is not a directory")


def test_root_without_a_machine(capsys: Capture, tmp_path: Path) -> None:
    code, out, err = _run(capsys, "topology", "--root", str(tmp_path))
    assert (code, out) == (1, "")
    assert err.startswith("numad: /sys/devices/system/cpu: no online CPU found")


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param([], id="no-command"),
        pytest.param(["frobnicate"], id="unknown-command"),
        pytest.param(["topology", "--bogus"], id="unknown-option"),
        pytest.param(["topology", "--fixture", DEFAULT_MACHINE, "--auto"], id="fixture-auto"),
        pytest.param(["topology", "--fixture", DEFAULT_MACHINE, "--root", "/"], id="fixture-root"),
        pytest.param(["record-fixture"], id="record-without-out"),
    ],
)
def test_usage_errors_exit_2(capsys: Capture, argv: list[str]) -> None:
    code, out, err = _run(capsys, *argv)
    assert (code, out) == (2, "")
    assert "usage: numad" in err


def test_help_exits_0(capsys: Capture) -> None:
    code, out, _ = _run(capsys, "topology", "--help")
    assert code == 0
    assert "--fixture NAME" in out


# -- bundled data and the module entry point ------------------------------------------


def test_bundled_machines_ship_with_their_licence() -> None:
    data = resources.files("numad").joinpath("data")
    assert bundled_machines() == (DEFAULT_MACHINE,)
    archive = data.joinpath(f"{DEFAULT_MACHINE}.tar.bz2")
    assert archive.read_bytes() == (FIXTURES / f"{DEFAULT_MACHINE}.tar.bz2").read_bytes()
    assert data.joinpath("COPYING.hwloc").read_text() == (FIXTURES / "COPYING.hwloc").read_text()


def test_python_dash_m_numad_runs_the_cli() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "numad", "topology", "--fixture", DEFAULT_MACHINE, "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)["cpus"]) == 32


# -- the bundled machine's cache ---------------------------------------------------


def test_the_bundled_machine_is_unpacked_once_into_the_cache(
    capsys: Capture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    first = _run(capsys, "topology", "--fixture", DEFAULT_MACHINE)
    machines = tmp_path / "cache" / "numad" / "machines"
    (entry,) = machines.iterdir()
    (root,) = [p for p in entry.iterdir() if p.is_dir()]  # beside it, the entry's seal
    assert root.name == DEFAULT_MACHINE
    online = root / "sys/devices/system/cpu/online"
    inode = online.stat().st_ino
    code, out, _ = _run(capsys, "topology", "--fixture", DEFAULT_MACHINE)
    assert first[0] == code == 0
    assert online.stat().st_ino == inode  # the entry was used, not unpacked again
    online.write_text("0-15\n")  # an edited entry is not trusted: it is unpacked again
    code, out, _ = _run(capsys, "topology", "--fixture", DEFAULT_MACHINE)
    assert "CPUs 32/32 online" in out
    assert [p.name for p in machines.iterdir()] == [entry.name]


def test_an_unusable_cache_costs_time_not_the_answer(
    capsys: Capture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache's folder would go\n")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    code, out, err = _run(capsys, "topology", "--fixture", DEFAULT_MACHINE)
    assert (code, err) == (0, "")
    assert out.startswith("Machine: 2 packages, 2 NUMA nodes, 16 cores, CPUs 32/32 online\n")
