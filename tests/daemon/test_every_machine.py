"""No node ceiling (issue 14, part 1): `numad plan` works on every recorded and synthetic
machine with the default config, and a real `numad serve` admits on the largest ones.

The machines: every archive of fixtures/sysfs/ (the recorded ones, the 17-node ia64,
the synthetic GB200-like tray of 34 nodes, 32 of them CPU-less, and the SGI-UV-like
machine of 64 nodes) and of fixtures/hwloc-more/. The config file is empty: numad's
defaults, which set no node limit. The request is 2 exclusive CPUs and 1 GiB: it
fits on every machine with 3 or more CPUs, and every answer must be a decision with
its explanation, never a refusal of the machine.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from numad.cli.main import main
from numad.cpuset import CPUSet, NodeSet
from numad.host.scratch import scratch_mkdir
from numad.hostfs import HostFS
from numad.topology.discover import discover
from numad.topology.record import load_fixture
from tests.daemon.test_daemon_e2e import Numad

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
ARCHIVES = sorted(
    p
    for d in ("sysfs", "hwloc-more")
    for p in (FIXTURES / d).iterdir()
    if p.name.endswith((".tar.bz2", ".tar.gz", ".tar.xz"))
)
LARGE = {  # machine: NUMA nodes
    "128ia64-17n4s2c": 17,
    "144arm-2pa72co+32gpumem-gb200like": 34,
    "256intel64-64n2co2t-sgiuvlike": 64,
}
SPEC = 'name = "job"\ncgroup = "numad.slice/job"\ncpus = 2\nmemory = "1Gi"\n'


def _name(archive: Path) -> str:
    return archive.name.split(".tar")[0]


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {}


def _root(unpacked: dict[str, Path], tmp: pytest.TempPathFactory, archive: Path) -> Path:
    name = _name(archive)
    if name not in unpacked:
        unpacked[name] = load_fixture(archive, tmp.mktemp(name))
    return unpacked[name]


@pytest.mark.parametrize("archive", ARCHIVES, ids=_name)
def test_plan_decides_on_every_machine_with_the_default_config(
    archive: Path,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    unpacked: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = _root(unpacked, tmp_path_factory, archive)
    topo = discover(HostFS(root))
    (tmp_path / "numad.toml").write_text("")
    (tmp_path / "job.toml").write_text(SPEC)
    argv = ["plan", str(tmp_path / "job.toml"), "--root", str(root)]
    status = main([*argv, "--config", str(tmp_path / "numad.toml"), "--json"])
    out = capsys.readouterr()
    result = json.loads(out.out)
    assert status in (0, 3), out.err
    assert result["explanation"], result
    if len(topo.online_cpus) >= 3 and _name(archive) in LARGE:
        assert status == 0, result
        assert result["admitted"], result
        (placement,) = result["containers"].values()
        cpus = CPUSet.parse_list(placement["cpus"])
        assert len(cpus) == 2
        assert cpus.issubset(topo.online_cpus)
    if _name(archive) in LARGE:
        assert len(topo.nodes) == LARGE[_name(archive)]


@pytest.mark.parametrize("name", sorted(LARGE))
def test_a_real_daemon_admits_on_the_largest_machines(
    name: str, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, unpacked: dict[str, Path]
) -> None:
    archive = next(a for a in ARCHIVES if _name(a) == name)
    root = tmp_path / "machine"
    subprocess.run(
        ["cp", "-a", str(_root(unpacked, tmp_path_factory, archive)), str(root)], check=True
    )
    config = tmp_path / "numad.toml"
    config.write_text("")
    daemon = Numad(root, config)
    daemon.start()
    try:
        scratch_mkdir(daemon.cgroups, "numad.slice/job")
        answer = daemon.call(
            "POST", "/v1/workloads", {"name": "job", "cgroup": "numad.slice/job", "cpus": 4}
        )
        assert answer["admitted"], answer
        shown = daemon.call("GET", "/v1/workloads/job")
        (container,) = shown["containers"].values()
        cpus = CPUSet.parse_list(container["cpus"])
        assert len(cpus) == 4
        topo = discover(HostFS(root))
        nodes = NodeSet(n.id for n in topo.nodes if not n.cpus.isdisjoint(cpus))
        assert len(nodes) == 1  # 4 CPUs fit one node on each of these machines: aligned
    finally:
        daemon.stop()
