"""End to end: a real `numad serve` process on a recorded 2-socket machine, a real socket,
a scratch cgroup tree; admit, list, show, explain, plan, release, SIGKILL and restart."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from numad.cli.client import APIError, request
from numad.cli.demo import CONFIG, MACHINE
from numad.cpuset import CPUSet
from numad.host.scratch import scratch_mkdir
from tests.conftest import Machines

# The demo's machine and config: 2 nodes x 8 cores x 2 threads, 8 vector engines on
# node 0; single-numa-node, 2 reserved CPUs chosen by count, no memory manager.
ONLINE = CPUSet.parse_list("0-31")
RESERVED = CPUSet.parse_list("0,16")


class Numad:
    """One `numad serve` process and what it works on."""

    def __init__(self, root: Path, config: Path) -> None:
        self.root = root
        self.config = config
        self.socket = str(root / "numad.sock")
        self.cgroups = root / "sys" / "fs" / "cgroup"
        self.proc: subprocess.Popen[bytes] | None = None
        # The daemon's log goes to a file, not a pipe: a pipe nobody reads while the
        # daemon runs fills at 64 KiB and blocks its next log line (and every request).
        self.log = root.parent / "numad.log"

    def start(self, crash_at: str = "", env: dict[str, str] | None = None) -> None:
        env = {**os.environ, **(env or {}), "NUMAD_TEST_CRASH_AT": crash_at}
        self.logged = self.log.stat().st_size if self.log.exists() else 0  # this run's start
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "numad",
                    "serve",
                    "--root",
                    str(self.root),
                    "--config",
                    str(self.config),
                    "--socket",
                    self.socket,
                ],
                stdout=subprocess.DEVNULL,
                stderr=log,
                env=env,
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if request(self.socket, "GET", "/v1/health", timeout=2).get("ready"):
                    return
            except Exception:  # noqa: BLE001 - not up yet
                time.sleep(0.1)
        raise AssertionError(f"numad did not become ready: {self.stop()}")

    def stop(self, sig: int = signal.SIGTERM) -> str:
        assert self.proc is not None
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=20)
        finally:
            self.proc.kill()
        with self.log.open("rb") as log:
            log.seek(self.logged)
            return log.read().decode(errors="replace")

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        return request(
            self.socket, method, path, None if body is None else json.dumps(body), timeout=10
        )

    def cpus_of(self, cgroup: str) -> CPUSet:
        return CPUSet.parse_list((self.cgroups / cgroup / "cpuset.cpus").read_text())


@pytest.fixture
def numad(machines: Machines, tmp_path: Path) -> Iterator[Numad]:
    root = tmp_path / "machine"
    subprocess.run(["cp", "-a", str(machines.root(MACHINE)), str(root)], check=True)
    config = tmp_path / "numad.toml"
    config.write_text(CONFIG)
    daemon = Numad(root, config)
    daemon.start()
    made = {f"numad.slice/{name}" for name in ("db", "web", "batch", "big")}
    for path in sorted(made):
        scratch_mkdir(daemon.cgroups, path)  # what systemd would do
    # numad isolates each as it appears (inotify): the tests start once it has.
    deadline = time.monotonic() + 30  # a bound for a hung daemon, not a speed goal
    while time.monotonic() < deadline:
        isolated = {i["cgroup"] for i in daemon.call("GET", "/v1/host")["isolated"]}
        if made <= isolated:
            break
        time.sleep(0.05)
    yield daemon
    if daemon.proc is not None and daemon.proc.poll() is None:
        daemon.stop()


def _spec(name: str, cpus: int | str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "cgroup": f"numad.slice/{name}", "cpus": cpus, **extra}


def _check_invariants(d: Numad) -> None:
    """DESIGN section 5, invariants 1 and 4, read from the cgroup files."""
    listed = d.call("GET", "/v1/workloads")["workloads"]
    exclusive = [
        CPUSet.parse_list(c["cpus"])
        for w in listed
        for c in w["containers"].values()
        if c["exclusive"]
    ]
    seen = CPUSet()
    for cpus in exclusive:
        assert seen.isdisjoint(cpus)
        assert cpus.isdisjoint(RESERVED)
        assert cpus.issubset(ONLINE)
        seen |= cpus
    pool = ONLINE - seen
    assert pool
    for w in listed:
        for c in w["containers"].values():
            assert d.cpus_of(c["cgroup"]) == CPUSet.parse_list(c["cpus"])
            if not c["exclusive"]:
                assert d.cpus_of(c["cgroup"]) == pool


def test_admit_list_show_explain_release(numad: Numad) -> None:
    web = numad.call("POST", "/v1/workloads", _spec("web", "500m"))
    assert numad.cpus_of("numad.slice/web") == ONLINE  # the whole shared pool
    db = numad.call("POST", "/v1/workloads", _spec("db", 4, devices={"vector-engine": 2}))
    db_cpus = CPUSet.parse_list(db["containers"]["main"]["cpus"])
    assert len(db_cpus) == 4
    assert db_cpus.issubset(CPUSet.parse_list("0-7,16-23"))  # node 0, with the engines
    assert len(db["containers"]["main"]["devices"]["vector-engine"]) == 2
    assert numad.cpus_of("numad.slice/db") == db_cpus
    assert numad.cpus_of("numad.slice/web") == ONLINE - db_cpus  # the pool shrank
    assert web["admitted"]
    _check_invariants(numad)

    shown = numad.call("GET", "/v1/workloads/db")
    assert shown["containers"]["main"]["cpus"] == db_cpus.format_list()
    why = numad.call("GET", "/v1/workloads/db/explain")
    assert "vector-engine fits only on node 0" in why["explanation"]
    plan = numad.call("POST", "/v1/plan", _spec("batch", 6))
    assert plan["admitted"]
    assert [w["name"] for w in numad.call("GET", "/v1/workloads")["workloads"]] == [
        "db",
        "web",
    ]  # plan admits nothing

    numad.call("DELETE", "/v1/workloads/db")
    assert numad.cpus_of("numad.slice/web") == ONLINE  # the pool grew back
    _check_invariants(numad)
    with pytest.raises(APIError) as gone:
        numad.call("GET", "/v1/workloads/db")
    assert gone.value.status == 404


def test_rejection_names_the_conflict_and_leaves_no_trace(numad: Numad) -> None:
    before = (numad.cgroups / "numad.slice" / "big" / "cpuset.cpus").read_text()
    with pytest.raises(APIError) as rejected:
        numad.call("POST", "/v1/workloads", _spec("big", 20))  # more than one node holds
    assert rejected.value.status == 409
    error = rejected.value.body["error"]
    assert error["code"] == "topology_affinity"
    assert error["conflict"] == ["cpu"]
    assert "cpu has no preferred NUMA placement" in error["message"]
    assert numad.call("GET", "/v1/workloads")["workloads"] == []
    assert (numad.cgroups / "numad.slice" / "big" / "cpuset.cpus").read_text() == before


@pytest.mark.parametrize(
    ("body", "status"),
    [
        pytest.param({"name": "../etc", "cgroup": "numad.slice/x", "cpus": 1}, 422, id="bad-name"),
        pytest.param(_spec("esc", 1) | {"cgroup": "numad.slice/../../etc"}, 422, id="traversal"),
        pytest.param(_spec("abs", 1) | {"cgroup": "/sys/fs/cgroup"}, 422, id="absolute"),
        pytest.param(_spec("huge", 10**30), 422, id="huge-number"),
        pytest.param(_spec("dev", 1, devices={"no-such-class": 1}), 422, id="unknown-class"),
        pytest.param(_spec("extra", 1) | {"bogus": True}, 422, id="unknown-field"),
    ],
)
def test_bad_requests_get_4xx_and_change_nothing(
    numad: Numad, body: dict[str, Any], status: int
) -> None:
    with pytest.raises(APIError) as bad:
        numad.call("POST", "/v1/workloads", body)
    assert bad.value.status == status
    assert bad.value.body["error"]["message"]
    assert numad.call("GET", "/v1/workloads")["workloads"] == []
    assert numad.call("GET", "/v1/health")["ready"]


def test_sigkill_and_restart_keep_every_admission(numad: Numad) -> None:
    numad.call("POST", "/v1/workloads", _spec("web", "250m"))
    db = numad.call("POST", "/v1/workloads", _spec("db", 6))
    numad.stop(signal.SIGKILL)
    numad.start()
    listed = {w["name"]: w for w in numad.call("GET", "/v1/workloads")["workloads"]}
    assert set(listed) == {"web", "db"}
    assert listed["db"]["containers"]["main"]["cpus"] == db["containers"]["main"]["cpus"]
    _check_invariants(numad)
    # A cpuset rewritten while numad was down is put right at start.
    (numad.cgroups / "numad.slice" / "db" / "cpuset.cpus").write_text("1-31\n")
    numad.stop(signal.SIGKILL)
    numad.start()
    _check_invariants(numad)


def test_garbage_bytes_on_the_socket_do_not_hurt(numad: Numad) -> None:
    for payload in (
        b"\x00" * 100,
        b"GET / HTTP/1.1\r\n\r\n",
        b"POST /v1/workloads HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n",
        os.urandom(512),
    ):
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(numad.socket)
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)
            s.recv(4096)
    assert numad.call("GET", "/v1/health")["ready"]


@pytest.mark.parametrize(
    "point", ["admit:after-checkpoint", "admit:after-shared", "admit:after-exclusive"]
)
def test_killed_during_an_admission(numad: Numad, point: str) -> None:
    """Killed between the checkpoint and each cgroup write: the admission survives
    (it was checkpointed) and the cgroups are put right at the next start."""
    numad.call("POST", "/v1/workloads", _spec("web", "500m"))
    numad.stop()
    numad.start(crash_at=point)
    with pytest.raises(Exception):  # noqa: B017, PT011 - the daemon dies mid-request
        numad.call("POST", "/v1/workloads", _spec("db", 4))
    assert numad.proc is not None
    assert numad.proc.wait(timeout=20) == 137
    numad.start()
    names = [w["name"] for w in numad.call("GET", "/v1/workloads")["workloads"]]
    assert names == ["db", "web"]
    _check_invariants(numad)


@pytest.mark.parametrize("point", ["release:after-checkpoint", "release:after-exclusive"])
def test_killed_during_a_release(numad: Numad, point: str) -> None:
    numad.call("POST", "/v1/workloads", _spec("web", "500m"))
    db = numad.call("POST", "/v1/workloads", _spec("db", 4))
    db_cpus = CPUSet.parse_list(db["containers"]["main"]["cpus"])
    numad.stop()
    numad.start(crash_at=point)
    with pytest.raises(Exception):  # noqa: B017, PT011 - the daemon dies mid-request
        numad.call("DELETE", "/v1/workloads/db")
    assert numad.proc is not None
    assert numad.proc.wait(timeout=20) == 137
    numad.start()
    assert [w["name"] for w in numad.call("GET", "/v1/workloads")["workloads"]] == ["web"]
    _check_invariants(numad)
    # The released cgroup no longer holds its CPUs exclusively: it has the shared pool.
    assert numad.cpus_of("numad.slice/db") == ONLINE
    # And its CPUs go to the next workload without being in two cgroups' sets.
    big = numad.call("POST", "/v1/workloads", _spec("big", 8))
    big_cpus = CPUSet.parse_list(big["containers"]["main"]["cpus"])
    assert big_cpus & db_cpus  # the packed allocator reuses the freed, partly used node
    assert numad.cpus_of("numad.slice/db").isdisjoint(big_cpus)
    _check_invariants(numad)


def test_a_removed_cgroup_releases_its_workload(numad: Numad) -> None:
    numad.stop()  # again, releasing at once (no grace period) and reconciling often
    numad.config.write_text(CONFIG + "[daemon]\nrelease-grace-seconds = 0\nreconcile-seconds = 1\n")
    numad.start()
    numad.call("POST", "/v1/workloads", _spec("db", 4))
    numad.call("POST", "/v1/workloads", _spec("later", 2))  # its cgroup does not exist yet
    (numad.cgroups / "numad.slice" / "db").rename(numad.cgroups / "gone-db")
    scratch_mkdir(numad.cgroups, "numad.slice/later")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        names = [w["name"] for w in numad.call("GET", "/v1/workloads")["workloads"]]
        if (
            names == ["later"]
            and (numad.cgroups / "numad.slice/later/cpuset.cpus").read_text().strip()
        ):
            break
        time.sleep(0.5)
    assert names == ["later"]
    _check_invariants(numad)  # the new cgroup was applied when it appeared


def test_run_admits_a_transient_workload_runs_the_command_and_releases_it(numad: Numad) -> None:
    scratch_mkdir(numad.cgroups, "numad.slice/job")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "numad",
            "run",
            "--name",
            "job",
            "--cpus",
            "2",
            "--socket",
            numad.socket,
            "--",
            sys.executable,
            "-c",
            "import os, sys; print('child', os.getpid(), sys.argv[1:]); sys.exit(3)",
            "--",
            "x",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 3, done.stderr  # the command's own status
    _, pid, args = done.stdout.split(maxsplit=2)
    assert args.strip() == "['--', 'x']"  # an inner "--" belongs to the command
    # The command ran in the workload's cgroup, on the exclusive CPUs numad gave it.
    assert (numad.cgroups / "numad.slice/job/cgroup.procs").read_text().split() == [pid]
    cpus = done.stderr.split("job: cpus ")[1].split(", memory")[0]
    assert len(CPUSet.parse_list(cpus)) == 2
    # A scratch tree confines nothing, and numad run says so.
    assert "not enforced" in done.stderr.split("job: cpus ")[1].split("\n")[0]
    # ... and was released when the command exited.
    assert "numad: job: released" in done.stderr
    assert [w["name"] for w in numad.call("GET", "/v1/workloads")["workloads"]] == []
    _check_invariants(numad)


def test_a_killed_numad_run_is_released_once_its_cgroup_is_empty(numad: Numad) -> None:
    """Before: ``numad run`` killed with SIGKILL never sent its release, and the
    workload held its CPUs forever. Now a transient workload is released once its
    cgroup has been empty for the grace period; not while its command runs."""
    numad.stop()  # again, with a short grace, reconciling often
    numad.config.write_text(
        CONFIG + "[daemon]\nrelease-grace-seconds = 1\nreconcile-seconds = 0.5\n"
    )
    numad.start()
    run = [sys.executable, "-m", "numad", "run", "--name", "job1", "--cpus", "2"]
    marker = numad.root / "job1.done"
    command = ["sh", "-c", f"sleep 4; touch {marker}"]
    proc = subprocess.Popen(
        [*run, "--socket", numad.socket, "--", *command],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    procs = numad.cgroups / "numad.slice/job1/cgroup.procs"
    deadline = time.monotonic() + 30  # a bound for a hung daemon, not a speed goal
    while not (procs.is_file() and procs.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert procs.read_text().strip(), "the command never joined its cgroup"
    proc.kill()  # numad run dies; its command runs on
    proc.wait(timeout=30)
    names = [w["name"] for w in numad.call("GET", "/v1/workloads")["workloads"]]
    assert names == ["job1"]
    while not marker.exists() and time.monotonic() < deadline + 30:
        assert [w["name"] for w in numad.call("GET", "/v1/workloads")["workloads"]] == ["job1"]
        time.sleep(0.2)
    assert marker.exists(), "the command did not finish"
    deadline = time.monotonic() + 60
    while names and time.monotonic() < deadline:
        time.sleep(0.2)
        names = [w["name"] for w in numad.call("GET", "/v1/workloads")["workloads"]]
    assert names == []
    _check_invariants(numad)


SERVE = [sys.executable, "-m", "numad", "serve"]


def test_a_start_that_cannot_listen_leaves_the_host_as_found(numad: Numad) -> None:
    """Before: numad isolated the host, then failed to bind the metrics port (rc 1,
    `OSError: Address already in use`) and left system.slice narrowed; under
    Restart=on-failure that repeated forever. Now every listener is bound first."""
    numad.stop()
    scratch_mkdir(numad.cgroups, "system.slice")
    before = (numad.cgroups / "system.slice/cpuset.cpus").read_text()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        numad.config.write_text(CONFIG.replace("port = 0", f"port = {port}"))
        done = subprocess.run(
            [
                *SERVE,
                "--root",
                str(numad.root),
                "--config",
                str(numad.config),
                "--socket",
                numad.socket,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert done.returncode == 1
    assert f"numad: 127.0.0.1:{port}: cannot listen for metrics: " in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert (numad.cgroups / "system.slice/cpuset.cpus").read_text() == before
    assert "system.slice" not in (numad.root / "var/lib/numad/isolation.json").read_text()


def test_a_second_numad_with_another_state_dir_is_refused_on_the_same_tree(
    numad: Numad,
) -> None:
    """Before: a second numad given another state directory took its own lock, then
    isolated the first one's workloads as strays (and the first, the second's)."""
    other = numad.root / "other.toml"
    other.write_text(CONFIG + '[paths]\nstate-dir = "/var/lib/numad-other"\n')
    done = subprocess.run(
        [*SERVE, "--root", str(numad.root), "--config", str(other), "--socket", numad.socket],
        capture_output=True,
        text=True,
        timeout=120,  # a bound for a hung test: the refusal comes before any work
        check=False,
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert numad.proc is not None
    assert f"another numad (pid {numad.proc.pid}) manages this cgroup tree" in done.stderr, (
        done.stderr
    )
    assert not (numad.root / "var/lib/numad-other/isolation.json").exists()
    assert numad.call("GET", "/v1/health")["ready"]  # the first one runs on


def test_declared_workloads_are_admitted_at_start(numad: Numad) -> None:
    declared = numad.root / "etc" / "numad" / "workloads.d"
    declared.mkdir(parents=True)
    (declared / "db.toml").write_text('name = "db"\ncgroup = "numad.slice/db"\ncpus = 2\n')
    (declared / "broken.toml").write_text('name = "broken"\ncpus = -1\n')
    numad.stop()
    numad.start()
    assert [w["name"] for w in numad.call("GET", "/v1/workloads")["workloads"]] == ["db"]
    problems = numad.call("GET", "/v1/health")["problems"]
    assert any("broken" in p for p in problems)
    _check_invariants(numad)


def test_a_second_numad_on_the_same_state_exits_naming_the_first(numad: Numad) -> None:
    assert numad.proc is not None
    second = subprocess.run(
        [
            sys.executable,
            "-m",
            "numad",
            "serve",
            "--config",
            str(numad.config),
            "--root",
            str(numad.root),
            "--socket",
            str(numad.root / "second.sock"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert second.returncode != 0
    assert f"another numad (pid {numad.proc.pid}) is running" in second.stderr
    assert "Traceback" not in second.stderr
    assert not (numad.root / "second.sock").exists()  # it stopped before the socket
    numad.call("GET", "/v1/health")  # the first one still answers on its socket


def test_a_stray_cgroup_is_isolated_while_numad_runs_and_freed_when_it_stops(
    numad: Numad,
) -> None:
    numad.stop()  # again, reconciling often
    numad.config.write_text(CONFIG + "[daemon]\nreconcile-seconds = 0.5\n")
    numad.start()
    numad.call("POST", "/v1/workloads", _spec("db", 4))
    scratch_mkdir(numad.cgroups, "numad.slice/stray")
    stray = numad.cgroups / "numad.slice/stray/cpuset.cpus"
    db = CPUSet.parse_list((numad.cgroups / "numad.slice/db/cpuset.cpus").read_text())
    deadline = time.monotonic() + 20
    while not stray.read_text().strip() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert CPUSet.parse_list(stray.read_text())
    assert not CPUSet.parse_list(stray.read_text()) & db
    numad.stop()  # SIGTERM
    assert stray.read_text().strip() == ""  # every CPU of its parent again
