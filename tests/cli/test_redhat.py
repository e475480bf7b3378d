"""`numad -w NCPUS[:MB]`: placement advice as libvirt asks Red Hat's numad for it.

The contract, from libvirt's source (checked against libvirt/libvirt:
src/util/virnuma.c virNumaGetAutoPlacementAdvice, src/qemu/qemu_process.c
qemuProcessPrepareDomainNUMAPlacement, src/util/virbitmap.c
virBitmapParseSeparator): libvirt runs `numad -w VCPUS:MIB` as two arguments,
treats any non-zero exit as a failure to start the guest, and parses standard
output as a node list: optional spaces, then comma-separated N or N-M (or ^N),
spaces and a trailing newline skipped; an empty answer is an error. The other
Red Hat options exit 2 with a message, never a traceback.

The answer is Red Hat numad's: advice, not admission. A guest gets the best
nodes for its size even where its vCPUs cannot have CPUs of their own (before:
a 2-CPU host answered `-w 2:1024` with nothing and exit 1, and libvirt refused
the guest); only a machine with no node with CPUs gets no answer.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from numad.cli import redhat
from numad.cli.main import main as numad_main
from numad.cli.redhat import OTHERS, Zone, best_nodes
from numad.cpuset import CPUSet, NodeSet
from numad.host.scratch import scratch_mkdir
from tests.conftest import Machines
from tests.daemon.test_daemon_e2e import Numad

MACHINE = "32intel64-2p8co2t+8ve"  # 2 nodes of 16 CPUs (8 cores x 2 threads)
# virBitmapParse's grammar, as its comment and code state it (whitespace is skipped).
LIBVIRT_NODESET = re.compile(r"\s*\^?\d+\s*(-\s*\d+\s*)?(,\s*\^?\d+\s*(-\s*\d+\s*)?)*\s*")


def _numad(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "numad", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _nodes_of(root: Path, nodes: NodeSet) -> CPUSet:
    cpus = CPUSet()
    for n in nodes:
        cpus |= CPUSet.parse_list((root / f"sys/devices/system/node/node{n}/cpulist").read_text())
    return cpus


@pytest.mark.parametrize(
    ("args", "nodes"),
    [
        # node 0 gives a CPU to the reserved ones: node 1 has the most free
        (["-w", "4:2048"], "1"),  # libvirt's form: two words
        (["-w4:2048"], "1"),  # getopt's glued form
        (["-w", "4"], "1"),  # no memory given
        (["-w", "20:4096"], "0-1"),  # wider than a node (16 CPUs): both
        (["-w", "99999:1"], "0-1"),  # more CPUs than the machine has: every node
        (["-w", "8:99999999"], "0-1"),  # more memory than the machine has: every node
    ],
)
def test_offline_advice_is_one_line_libvirt_parses(
    machines: Machines, args: list[str], nodes: str
) -> None:
    done = _numad(*args, "--root", str(machines.root(MACHINE)))
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{nodes}\n"
    assert LIBVIRT_NODESET.fullmatch(done.stdout)
    assert done.stderr == ""  # no start-up log lines


def test_advice_from_the_running_daemon_admits_nothing(machines: Machines, tmp_path: Path) -> None:
    root = tmp_path / "machine"
    subprocess.run(["cp", "-a", str(machines.root(MACHINE)), str(root)], check=True)
    config = tmp_path / "numad.toml"
    config.write_text("")
    daemon = Numad(root, config)
    daemon.start()
    try:
        scratch_mkdir(daemon.cgroups, "numad.slice/db")
        daemon.call("POST", "/v1/workloads", {"name": "db", "cgroup": "numad.slice/db", "cpus": 14})
        done = _numad("-w", "6:1024", "--socket", daemon.socket)
        assert done.returncode == 0, done.stderr
        assert LIBVIRT_NODESET.fullmatch(done.stdout)
        advised = NodeSet.parse_list(done.stdout.strip())
        held = CPUSet.parse_list(
            daemon.call("GET", "/v1/workloads/db")["containers"]["main"]["cpus"]
        )
        # db's 14 CPUs fill most of one node: 6 more fit only on the other one
        assert len(advised) == 1
        assert _nodes_of(root, advised).isdisjoint(held)
        names = [w["name"] for w in daemon.call("GET", "/v1/workloads")["workloads"]]
        assert names == ["db"]  # the advice admitted nothing
    finally:
        daemon.stop()


def test_advice_needs_no_numad_slice(machines: Machines, tmp_path: Path) -> None:
    """Before: the advice's spec named numad.slice, so a daemon managing only
    libvirt's own machine.slice refused every guest with placement='auto'."""
    root = tmp_path / "machine"
    subprocess.run(["cp", "-a", str(machines.root(MACHINE)), str(root)], check=True)
    config = tmp_path / "numad.toml"
    config.write_text('[paths]\nmanaged-roots = ["machine.slice"]\n')
    daemon = Numad(root, config)
    daemon.start()
    try:
        done = _numad("-w", "6:1024", "--socket", daemon.socket)
        assert done.returncode == 0, done.stderr
        assert LIBVIRT_NODESET.fullmatch(done.stdout)
        assert daemon.call("GET", "/v1/workloads")["workloads"] == []
    finally:
        daemon.stop()


@pytest.mark.parametrize(
    ("machine", "size", "nodes"),
    [
        # 2 CPUs, one reserved: before, all three printed nothing and exited 1
        pytest.param("2arm-2c", "1:64", "0", id="2cpu-fits"),
        pytest.param("2arm-2c", "2:1024", "0", id="2cpu-more-than-free"),
        pytest.param("2arm-2c", "4:1024", "0", id="2cpu-more-than-online"),
        pytest.param("2arm-2c", "99999:1", "0", id="2cpu-oversized"),
        # 8 nodes of 2 CPUs (node 0 has 1 free): the fewest nodes that hold it
        pytest.param("16amd64-8n2c", "2:256", "1", id="8node-one-node"),
        pytest.param("16amd64-8n2c", "5:256", "1-3", id="8node-three-nodes"),
        pytest.param("16amd64-8n2c", "64:256", "0-7", id="8node-oversized"),
        # nodes 4, 6, 8 and 9 are memory without CPUs: never advised
        pytest.param("fakeheteromemtiers", "1:2048", "0", id="memory-decides"),
        pytest.param("fakeheteromemtiers", "64:99999999", "0-2", id="cpuless-never"),
        # 32 nodes of GPU memory beside 2 CPU nodes
        pytest.param("144arm-2pa72co+32gpumem-gb200like", "200:1", "0-1", id="gpumem-never"),
    ],
)
def test_advice_is_the_best_nodes_even_where_the_guest_cannot_be_exclusive(
    machines: Machines, machine: str, size: str, nodes: str
) -> None:
    done = _numad("-w", size, "--root", str(machines.root(machine)))
    assert (done.returncode, done.stdout, done.stderr) == (0, f"{nodes}\n", "")
    assert LIBVIRT_NODESET.fullmatch(done.stdout)


def _zone(node: int, free_cpus: int, free_mib: int, cpus: int = 4) -> Zone:
    return Zone(node=node, cpus=cpus, free_cpus=free_cpus, free_mib=free_mib)


@pytest.mark.parametrize(
    ("zones", "cpus", "mib", "nodes"),
    [
        pytest.param([_zone(0, 2, 100), _zone(1, 3, 50)], 2, 10, "1", id="most-free-cpus"),
        pytest.param([_zone(0, 3, 100), _zone(1, 3, 200)], 2, 10, "1", id="then-most-memory"),
        pytest.param([_zone(0, 4, 10), _zone(1, 1, 500)], 1, 100, "1", id="memory-must-fit"),
        pytest.param(
            [_zone(0, 4, 100), _zone(1, 4, 100), _zone(2, 2, 900)], 2, 800, "2", id="one-node-wins"
        ),
        pytest.param(
            [_zone(0, 4, 10), _zone(1, 3, 10), _zone(2, 1, 900), _zone(3, 1, 800)],
            2,
            1500,
            "2-3",
            id="fewest-by-memory",
        ),
        pytest.param([_zone(0, 0, 0), _zone(1, 0, 0)], 1, 1, "0-1", id="nothing-free-every-node"),
        pytest.param([_zone(0, 0, 900, cpus=0)], 1, 1, "", id="no-cpus-no-advice"),
        pytest.param([], 1, 1, "", id="no-nodes-no-advice"),
    ],
)
def test_best_nodes(zones: list[Zone], cpus: int, mib: int, nodes: str) -> None:
    assert best_nodes(zones, cpus, mib) == NodeSet.parse_list(nodes)


def test_a_machine_without_cpus_gets_no_advice_and_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(redhat, "zones", lambda socket, root: (_zone(0, 0, 900, cpus=0),))
    assert redhat.main(["-w", "4:1024"]) == 1
    out, err = capsys.readouterr()
    assert out == ""  # libvirt would parse nothing: it fails the start
    assert err == (
        "numad: -w 4:1024: this machine: no NUMA node has online CPUs; there is nothing to advise\n"
    )


def test_help_lists_w(capsys: pytest.CaptureFixture[str]) -> None:
    assert numad_main(["--help"]) == 0
    assert "numad -w NCPUS[:MB]" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize(
    "args",
    [["-w"], ["-w", "x"], ["-w", "0:10"], ["-w", "4:"], ["-w", "4:2", "5"], ["-w", "9" * 5000]],
)
def test_malformed_requests_exit_2_with_one_line(args: list[str]) -> None:
    done = _numad(*args)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith("numad: ")
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("option", sorted(OTHERS))
def test_other_red_hat_options_say_what_they_did_and_exit_2(option: str) -> None:
    done = _numad(option, "1")
    assert done.returncode == 2
    assert done.stdout == ""
    assert f"{option} " in done.stderr
    assert "this numad does not do that" in done.stderr
    assert "Traceback" not in done.stderr
