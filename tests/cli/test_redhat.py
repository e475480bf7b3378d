"""`numad -w NCPUS[:MB]`: placement advice as libvirt asks Red Hat's numad for it.

The contract, from libvirt's source (checked against libvirt/libvirt:
src/util/virnuma.c virNumaGetAutoPlacementAdvice, src/qemu/qemu_process.c
qemuProcessPrepareDomainNUMAPlacement, src/util/virbitmap.c
virBitmapParseSeparator): libvirt runs `numad -w VCPUS:MIB` as two arguments,
treats any non-zero exit as a failure to start the guest, and parses standard
output as a node list: optional spaces, then comma-separated N or N-M (or ^N),
spaces and a trailing newline skipped; an empty answer is an error. The other
Red Hat options exit 2 with a message, never a traceback.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from numad.cli.redhat import OTHERS
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
        (["-w", "4:2048"], "0"),  # libvirt's form: two words
        (["-w4:2048"], "0"),  # getopt's glued form
        (["-w", "4"], "0"),  # no memory given
        (["-w", "20:4096"], "0-1"),  # wider than a node (16 CPUs): best-effort advice
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


def test_a_guest_nothing_can_hold_prints_nothing_and_fails(machines: Machines) -> None:
    done = _numad("-w", "64:1024", "--root", str(machines.root(MACHINE)))
    assert done.returncode == 1
    assert done.stdout == ""  # libvirt would parse nothing: it fails the start
    assert done.stderr.startswith("numad: -w 64:1024: ")
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "args", [["-w"], ["-w", "x"], ["-w", "0:10"], ["-w", "4:"], ["-w", "4:2", "5"]]
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
