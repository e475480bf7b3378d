"""`numad oci-hook`: a real `numad serve` on the recorded 2-socket machine, the hook run as
a runtime runs it (the OCI state on stdin, a bundle with config.json), its cgroup in a
scratch tree. The 32-CPU machine has 16 CPUs per node, 8 vector engines on node 0, and
runs single-numa-node with 2 reserved CPUs (the demo's config).

A real runtime (runc) running the hook on a real kernel: tests/vm/guest/oci.py.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from numad.cli import journal
from numad.cli.demo import CONFIG, MACHINE
from numad.cli.oci_hook import Container, _from_cgroups_path, _from_proc, read_container
from numad.cpuset import CPUSet
from numad.errors import ConfigError
from numad.host.scratch import scratch_mkdir
from tests.conftest import Machines
from tests.daemon.test_daemon_e2e import Numad

PID = 4242  # the container's process, as the scratch tree's /proc shows it


@pytest.fixture(scope="module")
def numad(machines: Machines, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Numad]:
    base = tmp_path_factory.mktemp("oci")
    root = base / "machine"
    subprocess.run(["cp", "-a", str(machines.root(MACHINE)), str(root)], check=True)
    config = base / "numad.toml"
    config.write_text(CONFIG)
    daemon = Numad(root, config)
    daemon.start()
    yield daemon
    if daemon.proc is not None and daemon.proc.poll() is None:
        daemon.stop()


class Bundle:
    """One container as a runtime would hand it to its hooks."""

    def __init__(self, numad: Numad, tmp_path: Path, cid: str, cgroup: str = "") -> None:
        self.numad = numad
        self.id = cid
        self.cgroup = cgroup or f"numad.slice/ctr-{cid}"
        self.dir = tmp_path / cid
        self.dir.mkdir()
        self.config: dict[str, Any] = {
            "ociVersion": "1.0.2",
            "annotations": {},
            "linux": {"cgroupsPath": f"/{self.cgroup}", "resources": {}},
        }

    def start(self) -> None:
        """The runtime made the cgroup and put the container's process in it."""
        scratch_mkdir(self.numad.cgroups, self.cgroup)
        proc = self.numad.root / "proc" / str(PID)
        proc.mkdir(parents=True, exist_ok=True)
        (proc / "cgroup").write_text(f"0::/{self.cgroup}\n")

    def hook(
        self, *args: str, status: str = "created", socket: str = "", state: str = ""
    ) -> subprocess.CompletedProcess[str]:
        (self.dir / "config.json").write_text(json.dumps(self.config))
        pid = {"pid": PID} if status != "stopped" else {}
        text = state or json.dumps(
            {"ociVersion": "1.0.2", "id": self.id, "status": status, "bundle": str(self.dir)} | pid
        )
        argv = ["oci-hook", "--socket", socket or self.numad.socket, "--root"]
        return subprocess.run(
            [sys.executable, "-m", "numad", *argv, str(self.numad.root), *args],
            input=text,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def workload(self) -> dict[str, Any] | None:
        listed = self.numad.call("GET", "/v1/workloads")["workloads"]
        return next((w for w in listed if w["name"] == f"oci-{self.id}"), None)

    def cpuset(self) -> CPUSet:
        return CPUSet.parse_list((self.numad.cgroups / self.cgroup / "cpuset.cpus").read_text())


def _one_line(done: subprocess.CompletedProcess[str], *parts: str) -> str:
    """The hook's stderr is one line naming the container and each of ``parts``."""
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("numad: container "), lines[0]
    for part in parts:
        assert part in lines[0], lines[0]
    return lines[0]


def _held(workload: dict[str, Any]) -> CPUSet:
    return CPUSet.parse_list(workload["containers"]["main"]["cpus"])


# -- admission ---------------------------------------------------------------------------------


def test_annotations_place_the_container_and_poststop_releases_it(
    numad: Numad, tmp_path: Path
) -> None:
    ctr = Bundle(numad, tmp_path, "annotated")
    ctr.config["annotations"] = {"numad.io/cpus": "4", "numad.io/devices": "vector-engine=2"}
    ctr.start()
    done = ctr.hook()
    assert done.returncode == 0, done.stderr
    _one_line(done, "container annotated", "oci-annotated")
    shown = ctr.workload()
    assert shown is not None
    assert shown["cgroup"] == "numad.slice/ctr-annotated"  # from /proc/PID/cgroup
    cpus = _held(shown)
    assert len(cpus) == 4
    assert ctr.cpuset() == cpus  # what the container's process gets
    assert len(shown["containers"]["main"]["devices"]["vector-engine"]) == 2
    node0 = CPUSet.parse_list("0-7,16-23")  # the vector engines' node
    assert cpus.issubset(node0)

    stopped = ctr.hook(status="stopped")  # the poststop stage, found from the status
    assert stopped.returncode == 0, stopped.stderr
    assert ctr.workload() is None
    again = ctr.hook("--stage", "poststop", status="stopped")  # released twice: fine
    assert (again.returncode, again.stderr) == (0, "")


def test_the_process_cgroup_is_found_without_a_cgroups_path(numad: Numad, tmp_path: Path) -> None:
    ctr = Bundle(numad, tmp_path, "procfs")
    ctr.config["annotations"] = {"numad.io/cpus": "2"}
    del ctr.config["linux"]["cgroupsPath"]
    ctr.start()
    done = ctr.hook()
    assert done.returncode == 0, done.stderr
    shown = ctr.workload()
    assert shown is not None
    assert shown["cgroup"] == "numad.slice/ctr-procfs"
    assert ctr.cpuset() == _held(shown)
    assert ctr.hook(status="stopped").returncode == 0  # released by its name
    assert ctr.workload() is None


def test_state_annotations_count_where_config_has_none(numad: Numad, tmp_path: Path) -> None:
    ctr = Bundle(numad, tmp_path, "fromstate")
    ctr.start()
    state = {
        "ociVersion": "1.0.2",
        "id": ctr.id,
        "status": "creating",
        "pid": PID,
        "bundle": str(ctr.dir),
        "annotations": {"numad.io/cpus": "1"},
    }
    done = ctr.hook(state=json.dumps(state))
    assert done.returncode == 0, done.stderr
    shown = ctr.workload()
    assert shown is not None
    assert len(_held(shown)) == 1
    ctr.hook(status="stopped")
    assert ctr.workload() is None


def test_a_whole_cpu_quota_is_the_request(numad: Numad, tmp_path: Path) -> None:
    ctr = Bundle(numad, tmp_path, "quota")
    ctr.config["linux"]["resources"] = {
        "cpu": {"quota": 300000, "period": 100000},
        "memory": {"limit": 256 << 20},
    }
    ctr.start()
    done = ctr.hook()
    assert done.returncode == 0, done.stderr
    shown = ctr.workload()
    assert shown is not None
    assert len(_held(shown)) == 3
    assert ctr.cpuset() == _held(shown)
    ctr.hook(status="stopped")
    assert ctr.workload() is None


@pytest.mark.parametrize(
    ("cpu", "why"),
    [
        pytest.param({"quota": 150000, "period": 100000}, "1.5 CPUs", id="fractional-quota"),
        pytest.param({"quota": 50000}, "0.5 CPUs", id="half-cpu-default-period"),
        pytest.param({}, "no cpu quota", id="no-quota"),
    ],
)
def test_no_whole_cpus_runs_on_the_shared_pool_unplaced(
    numad: Numad, tmp_path: Path, cpu: dict[str, int], why: str
) -> None:
    ctr = Bundle(numad, tmp_path, "shared")
    ctr.config["linux"]["resources"] = {"cpu": cpu, "memory": {"limit": 1 << 30}}
    ctr.start()
    done = ctr.hook()
    assert done.returncode == 0, done.stderr
    _one_line(done, "not placed", why)
    assert ctr.workload() is None


def test_a_cgroup_outside_the_managed_roots_is_named(numad: Numad, tmp_path: Path) -> None:
    ctr = Bundle(numad, tmp_path, "outside")
    ctr.config["annotations"] = {"numad.io/cpus": "1"}
    ctr.config["linux"]["cgroupsPath"] = "machine.slice:libpod:outside"  # systemd's form
    # A state without a process (as a test can give): the cgroupsPath names the cgroup.
    state = {"ociVersion": "1.0.2", "id": ctr.id, "status": "creating", "bundle": str(ctr.dir)}
    done = ctr.hook(state=json.dumps(state))
    assert done.returncode == 1
    _one_line(
        done, "machine.slice/libpod-outside.scope", "outside the managed roots", "managed-roots"
    )
    assert ctr.workload() is None


def test_a_systemd_cgroups_path_inside_a_managed_root(numad: Numad, tmp_path: Path) -> None:
    ctr = Bundle(numad, tmp_path, "pod", cgroup="numad.slice/numad-pods.slice/crio-pod.scope")
    ctr.config["annotations"] = {"numad.io/cpus": "2"}
    ctr.config["linux"]["cgroupsPath"] = "numad-pods.slice:crio:pod"
    scratch_mkdir(numad.cgroups, ctr.cgroup)
    state = {"ociVersion": "1.0.2", "id": ctr.id, "status": "creating", "bundle": str(ctr.dir)}
    done = ctr.hook(state=json.dumps(state))
    assert done.returncode == 0, done.stderr
    shown = ctr.workload()
    assert shown is not None
    assert shown["cgroup"] == ctr.cgroup
    assert ctr.cpuset() == _held(shown)
    ctr.hook(status="stopped")  # the same expansion finds it to release
    assert ctr.workload() is None


def test_a_create_hook_run_again_replaces_its_stale_admission(numad: Numad, tmp_path: Path) -> None:
    ctr = Bundle(numad, tmp_path, "restarted")
    ctr.config["annotations"] = {"numad.io/cpus": "2"}
    ctr.start()
    assert ctr.hook().returncode == 0
    again = ctr.hook()  # a restart whose poststop never ran
    assert again.returncode == 0, again.stderr
    shown = ctr.workload()
    assert shown is not None
    assert ctr.cpuset() == _held(shown)
    ctr.hook(status="stopped")


def test_a_name_held_by_another_cgroup_is_not_taken(numad: Numad, tmp_path: Path) -> None:
    scratch_mkdir(numad.cgroups, "numad.slice/other")
    numad.call(
        "POST", "/v1/workloads", {"name": "oci-taken", "cgroup": "numad.slice/other", "cpus": 1}
    )
    try:
        ctr = Bundle(numad, tmp_path, "taken")
        ctr.config["annotations"] = {"numad.io/cpus": "1"}
        ctr.start()
        done = ctr.hook()
        assert done.returncode == 1
        _one_line(done, "oci-taken", "held by cgroup numad.slice/other")
        stopped = ctr.hook(status="stopped")  # its poststop leaves the other one alone
        assert stopped.returncode == 0
        shown = ctr.workload()
        assert shown is not None
        assert shown["cgroup"] == "numad.slice/other"
    finally:
        numad.call("DELETE", "/v1/workloads/oci-taken")


# -- rejection ----------------------------------------------------------------------------------


def test_a_rejected_container_fails_with_one_line(numad: Numad, tmp_path: Path) -> None:
    ctr = Bundle(numad, tmp_path, "huge")
    ctr.config["annotations"] = {"numad.io/cpus": "20"}  # more than a node's 16 CPUs
    ctr.start()
    done = ctr.hook()
    assert done.returncode == 1
    _one_line(done, "container huge", "rejected", "failing its start", "on-reject=run")
    assert ctr.workload() is None


def test_the_hooks_lines_reach_the_journal(numad: Numad, tmp_path: Path) -> None:
    # crun drops a hook's stderr (podman's default runtime; tests/vm/guest/podman.py):
    # the lines also go to the journal, here a socket standing in for journald's.
    path = numad.root / "run/systemd/journal/socket"
    path.parent.mkdir(parents=True, exist_ok=True)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as journald:
        journald.bind(str(path))
        journald.settimeout(30)
        try:
            ctr = Bundle(numad, tmp_path, "huge-journal")
            ctr.config["annotations"] = {"numad.io/cpus": "20"}
            ctr.start()
            done = ctr.hook()
            fields = dict(line.split("=", 1) for line in journald.recv(65536).decode().splitlines())
        finally:
            path.unlink()
    assert done.returncode == 1
    assert fields["MESSAGE"] == done.stderr.strip()  # the same one line
    assert fields["SYSLOG_IDENTIFIER"] == "numad-oci-hook"
    assert fields["PRIORITY"] == "3"  # err


def test_a_journal_that_takes_nothing_holds_no_container(tmp_path: Path) -> None:
    # A bound socket nobody reads: its buffer fills, and a line is lost, not waited on.
    path = tmp_path / "socket"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as journald:
        journald.bind(str(path))
        sent = [journal.send("numad-test", "x" * 4000, journal.INFO, path) for _ in range(2000)]
    assert sent[0]
    assert not all(sent)  # some were lost once the buffer was full; none blocked
    assert not journal.send("numad-test", "nobody", journal.INFO, tmp_path / "absent")


@pytest.mark.parametrize(
    ("args", "annotation"),
    [
        pytest.param(("--on-reject", "run"), None, id="hook-argument"),
        pytest.param((), "run", id="annotation"),
        pytest.param(("--on-reject", "run"), "run", id="both"),
    ],
)
def test_a_rejected_container_may_run_unplaced(
    numad: Numad, tmp_path: Path, args: tuple[str, ...], annotation: str | None
) -> None:
    ctr = Bundle(numad, tmp_path, "huge")
    ctr.config["annotations"] = {"numad.io/cpus": "20"}
    if annotation:
        ctr.config["annotations"]["numad.io/on-reject"] = annotation
    ctr.start()
    done = ctr.hook(*args)
    assert done.returncode == 0
    _one_line(done, "rejected", "running it unplaced")
    assert ctr.workload() is None


def test_the_annotation_may_insist_on_failing(numad: Numad, tmp_path: Path) -> None:
    ctr = Bundle(numad, tmp_path, "strict")
    ctr.config["annotations"] = {"numad.io/cpus": "20", "numad.io/on-reject": "fail"}
    ctr.start()
    assert ctr.hook("--on-reject", "run").returncode == 1


@pytest.mark.parametrize(("args", "status"), [((), 1), (("--on-reject", "run"), 0)])
def test_no_daemon_says_the_socket_is_absent(
    numad: Numad, tmp_path: Path, args: tuple[str, ...], status: int
) -> None:
    ctr = Bundle(numad, tmp_path, "nodaemon")
    ctr.config["annotations"] = {"numad.io/cpus": "1"}
    ctr.start()
    socket = str(tmp_path / "absent.sock")
    done = ctr.hook(*args, socket=socket)
    assert done.returncode == status
    _one_line(done, "container nodaemon", f"{socket}: the numad socket is absent")
    stopped = ctr.hook(status="stopped", socket=socket)  # nothing to release: fine
    assert stopped.returncode == 0


@pytest.mark.parametrize(
    ("annotations", "parts"),
    [
        pytest.param({"numad.io/cpus": "two"}, ("numad.io/cpus", "'two'"), id="cpus-two"),
        pytest.param({"numad.io/cpus": "-1"}, ("numad.io/cpus",), id="cpus-negative"),
        pytest.param({"numad.io/cpus": "0"}, ("out of range",), id="cpus-zero"),
        pytest.param({"numad.io/memory": "lots"}, ("numad.io/memory",), id="memory-word"),
        pytest.param({"numad.io/memory": "0.5"}, ("numad.io/memory",), id="memory-fraction"),
        pytest.param({"numad.io/devices": "gpu"}, ("numad.io/devices", "CLASS=COUNT"), id="dev"),
        pytest.param({"numad.io/devices": "gpu=0"}, ("numad.io/devices",), id="devices-zero"),
        pytest.param({"numad.io/devices": "nic=1"}, ("unknown device class",), id="dev-class"),
        pytest.param({"numad.io/policy": "strict"}, ("not a topology policy",), id="policy"),
        pytest.param({"numad.io/cpu": "2"}, ("did you mean numad.io/cpus",), id="typo"),
        pytest.param({"numad.io/on-reject": "maybe"}, ("numad.io/on-reject",), id="on-reject"),
    ],
)
def test_bad_annotations_are_one_line_errors(
    numad: Numad, tmp_path: Path, annotations: dict[str, str], parts: tuple[str, ...]
) -> None:
    ctr = Bundle(numad, tmp_path, "bad")
    ctr.config["annotations"] = {"numad.io/cpus": "1", **annotations}
    ctr.start()
    done = ctr.hook()
    assert done.returncode == 1
    _one_line(done, "container bad", *parts)
    assert ctr.workload() is None


@pytest.mark.parametrize(
    "state",
    [
        pytest.param("not json", id="not-json"),
        pytest.param("[]", id="not-an-object"),
        pytest.param('{"id": "x"}', id="no-bundle"),
        pytest.param('{"id": "x", "bundle": "/nonexistent/bundle"}', id="no-config"),
    ],
)
def test_a_bad_state_is_one_line(numad: Numad, tmp_path: Path, state: str) -> None:
    done = Bundle(numad, tmp_path, "state").hook(state=state)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("numad: "), done.stderr


# -- the cgroup and the name, as text -------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "cgroup"),
    [
        pytest.param("/numad.slice/ctr", "numad.slice/ctr", id="cgroupfs"),
        pytest.param("machine.slice:libpod:abc", "machine.slice/libpod-abc.scope", id="podman"),
        pytest.param(
            "kubepods-burstable.slice:crio:abc",
            "kubepods.slice/kubepods-burstable.slice/crio-abc.scope",
            id="nested-slice",
        ),
        pytest.param(":runc:abc", "system.slice/runc-abc.scope", id="default-slice"),
        pytest.param("-.slice:runc:abc", "runc-abc.scope", id="root-slice"),
        pytest.param("machine.slice::abc", "machine.slice/abc.scope", id="no-prefix"),
        pytest.param("machine.slice:x:pod.slice", "machine.slice/pod.slice", id="a-slice-unit"),
    ],
)
def test_cgroups_path_as_runc_expands_it(path: str, cgroup: str) -> None:
    assert _from_cgroups_path(path) == cgroup


@pytest.mark.parametrize(
    ("text", "cgroup"),
    [
        pytest.param("0::/numad.slice/ctr\n", "numad.slice/ctr", id="v2"),
        pytest.param(
            "12:memory:/m\n4:cpuset:/numad.slice/ctr\n1:name=systemd:/s\n0::/u\n",
            "numad.slice/ctr",
            id="hybrid-v1-cpuset",
        ),
        pytest.param("0::/\n", None, id="root"),
        pytest.param("", None, id="empty"),
    ],
)
def test_proc_cgroup(text: str, cgroup: str | None) -> None:
    assert (_from_proc(text) or None) == cgroup


@pytest.mark.parametrize(
    ("cid", "name"),
    [
        pytest.param("a" * 64, r"oci-a{12}-[0-9a-f]{10}", id="hex-id-shortened"),
        pytest.param("My:Ctr_1", r"oci-my-ctr_1-[0-9a-f]{10}", id="upper-and-colon"),
        pytest.param("x" * 59, "oci-" + "x" * 59, id="longest-whole"),
        pytest.param("web", "oci-web", id="a-name-as-it-stands"),
        pytest.param("::", r"oci-[0-9a-f]{10}", id="nothing-left"),
    ],
)
def test_workload_names(cid: str, name: str) -> None:
    got = Container(cid, "created", 1, "/b", {}, {}).workload
    assert re.fullmatch(name, got)
    assert re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,62}", got)  # a workload name


def test_ids_that_fold_alike_are_different_workloads() -> None:
    """Before: ``Web`` and ``web`` folded to one name, and ``web``'s poststop released
    ``Web``'s placement."""
    ids = ["Web", "web", "WEB", "w:eb", "w.eb", "a" * 64, "a" * 63 + "b", "x" * 60, "x" * 61]
    names = {Container(cid, "created", 1, "/b", {}, {}).workload for cid in ids}
    assert len(names) == len(ids)


def test_a_config_json_that_is_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    """Before: the hook opened the FIFO and waited for a writer that never came,
    holding the container's start (a hook has no deadline of its own in runc)."""
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    os.mkfifo(bundle / "config.json")
    state = json.dumps({"id": "ctr", "bundle": str(bundle), "pid": 1})
    answer: list[BaseException] = []
    reader = threading.Thread(target=lambda: _catch(answer, state), daemon=True)
    reader.start()
    reader.join(30)  # a bound for a hung test: the blocking open waits forever
    if reader.is_alive():  # let it go (a writer ends the open) before failing
        os.close(os.open(bundle / "config.json", os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("the hook waits on the FIFO")
    assert len(answer) == 1
    assert isinstance(answer[0], ConfigError)
    assert "a FIFO, not a regular file" in str(answer[0])


def _catch(into: list[BaseException], state: str) -> None:
    try:
        read_container(state)
    except ConfigError as err:
        into.append(err)
