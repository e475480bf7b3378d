"""In-guest checks: numad on a real kernel, real /sys and a real cgroup hierarchy.

Run by tests/vm/test_vm.py inside a QEMU VM (``VMTEST=1``), once per boot, with
pytest; never collected on the host (the file name does not start with ``test_``).
The tests run in file order and share one daemon: each builds on the state the
previous ones left, as workloads on a host would.

What the VM was asked to be comes from ``$VMTEST_OUT/expected.json``, written by
the host from tests/vm/topologies.py, not from numad.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from numad.cli.client import APIError, request
from numad.cpuset import CPUSet, NodeSet
from numad.errors import CgroupError, NumadError
from numad.host.cgroup import detect_backend

pytestmark = pytest.mark.skipif(not os.environ.get("VMTEST"), reason="runs only inside the VM")

OUT = Path(os.environ.get("VMTEST_OUT", "/nonexistent"))
EXPECT: dict[str, Any] = (
    json.loads((OUT / "expected.json").read_text()) if os.environ.get("VMTEST") else {}
)
V1 = EXPECT.get("cgroup") == "v1"
CGROUP_ROOT = Path("/sys/fs/cgroup/cpuset" if V1 else "/sys/fs/cgroup")
WORK = Path("/tmp/numad")  # noqa: S108 - the guest's own tmpfs, nobody else on it
SOCKET = "/run/numad/numad.sock"
STATE = Path("/var/lib/numad")
NUMAD = [str(Path(sys.executable).parent / "numad")]  # the console script, a new process
RESERVED = CPUSet.parse_list("0")
# How much slower the host was than a quiet one when it booted this VM (tests/vm/pace.py):
# every wait below stretches by it.
SLOWDOWN = max(1.0, float(os.environ.get("VMTEST_SLOWDOWN") or 1))
WAIT = 90.0 * SLOWDOWN  # seconds; emulated CPUs are 10-30x slower than the host's
CALL = 60.0 * SLOWDOWN  # one API call, or a process's exit after a signal
CONFIG = f"""
[topology]
policy = "best-effort"

[cpu]
reserved-cpus = "0"

[memory]
policy = "static"

[devices.rng]
vendor = "{EXPECT.get("pci_vendor", "0x1af4")}"
device = "{EXPECT.get("pci_device", "0x1044")}"

[paths]
cgroup-root = "/sys/fs/cgroup"
state-dir = "{STATE}"
socket = "{SOCKET}"
workloads-dir = "{WORK}/workloads.d"

[daemon]
reconcile-seconds = 2

[metrics]
port = 0

[host]
partitions = false  # the checks read the cgroups written one by one (as on 6.1 and v1)
"""


# -- the machine ---------------------------------------------------------------------------


def sysfs(path: str) -> str:
    return Path("/sys/devices/system", path).read_text().strip()


ONLINE = CPUSet.parse_list(sysfs("cpu/online")) if EXPECT else CPUSet()
MEMORY_NODES = NodeSet.parse_list(sysfs("node/has_memory")) if EXPECT else NodeSet()


def node_cpus(node: int) -> CPUSet:
    return CPUSet.parse_list(sysfs(f"node/node{node}/cpulist"))


def test_topology_json_is_the_machine_qemu_was_asked_for() -> None:
    shown = json.loads(_numad("topology", "--json"))
    assert {str(p["id"]): p["cpus"] for p in shown["packages"]} == EXPECT["packages"]
    cpus = {
        str(c["id"]): {k: c[k] for k in ("package", "die", "core", "node")}
        for c in shown["cpus"]
        if c["online"]
    }
    assert cpus == EXPECT["cpus"]
    assert set(shown["numa_nodes"]) == set(EXPECT["nodes"])
    for node, want in EXPECT["nodes"].items():
        got = shown["numa_nodes"][node]
        assert got["cpus"] == want["cpus"], f"node {node}"
        assert got["distances"] == want["distances"], f"node {node}"
        if want["memory_mib"]:  # the kernel keeps some for itself; never more than asked
            assert 0.5 * want["memory_mib"] * 1024 < got["memory_kb"] <= want["memory_mib"] * 1024
        else:
            assert not got["memory_kb"], f"node {node} should have no memory"
    pci = {d["address"]: d for d in shown["pci"]}
    if EXPECT["pci"] is None:
        assert all(d["numa_node"] is None for d in pci.values())  # the main bus has no node
    else:
        dev = pci[EXPECT["pci"]["address"]]
        assert (dev["numa_node"], dev["vendor"]) == (
            EXPECT["pci"]["numa_node"],
            EXPECT["pci_vendor"],
        )


# -- the daemon ------------------------------------------------------------------------------


class Daemon:
    """`numad serve` on the real machine, as a child process."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = (OUT / "serve.log").open("ab")

    def start(self, crash_at: str = "") -> None:
        env = {**os.environ, "NUMAD_TEST_CRASH_AT": crash_at}
        self.proc = subprocess.Popen(
            [*NUMAD, "serve", "--config", str(WORK / "numad.toml")],
            stdout=self.log,
            stderr=self.log,
            env=env,
        )
        wait_for(self._ready, "numad serve to become ready")

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"numad serve exited {self.proc.returncode}:\n{self.logs()}")
        try:
            return bool(request(SOCKET, "GET", "/v1/health", timeout=5).get("ready"))
        except NumadError:  # no socket yet, or not ready (503)
            return False

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def logs(self) -> str:
        return (OUT / "serve.log").read_text(errors="replace")[-4000:]

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        text = None if body is None else json.dumps(body)
        return request(SOCKET, method, path, text, timeout=CALL)


@pytest.fixture(scope="module")
def numad() -> Iterator[Daemon]:
    (WORK / "workloads.d").mkdir(parents=True, exist_ok=True)
    (WORK / "numad.toml").write_text(CONFIG)
    if V1:  # new v1 cpusets copy their parent's cpus/mems (else they cannot hold tasks)
        (CGROUP_ROOT / "cgroup.clone_children").write_text("1")
    daemon = Daemon()
    daemon.start()
    yield daemon
    if daemon.proc is not None and daemon.proc.poll() is None:
        daemon.proc.terminate()
        daemon.proc.wait(timeout=CALL)
    print(daemon.logs())


# -- helpers ------------------------------------------------------------------------------


def wait_for(condition: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.5)


def _numad(*args: str, check: bool = True) -> str:
    proc = subprocess.run([*NUMAD, *args], capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"numad {' '.join(args)}: exit {proc.returncode}\n{proc.stderr}")
    return proc.stdout + proc.stderr


def _spec(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "cgroup": f"numad.slice/{name}", **fields}


def _spec_file(name: str, **fields: Any) -> str:
    spec = WORK / f"{name}.json"
    spec.write_text(json.dumps(_spec(name, **fields)))
    return str(spec)


def admit(name: str, **fields: Any) -> dict[str, Any]:
    """Admit a spec through the CLI (``numad admit --json FILE``); the decision it printed."""
    out: dict[str, Any] = json.loads(
        _numad("admit", "--json", _spec_file(name, **fields), "--socket", SOCKET)
    )
    return out


def cgroup(name: str) -> Path:
    return CGROUP_ROOT / "numad.slice" / name


def make_cgroup(name: str) -> Path:
    """What systemd would do before admission: the workload's cgroup exists."""
    path = cgroup(name)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _removed(path: Path) -> bool:
    """rmdir, where the kernel lets it: a cgroup whose last task just exited may be busy
    a moment longer."""
    try:
        path.rmdir()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


PROCS: dict[str, subprocess.Popen[bytes]] = {}


def start_in(name: str) -> int:
    """A process in the workload's cgroup, as its container would be."""
    proc = subprocess.Popen(["sleep", "3600"])
    (cgroup(name) / "cgroup.procs").write_text(f"{proc.pid}\n")
    PROCS[name] = proc
    return proc.pid


def allowed(pid: int) -> tuple[CPUSet, NodeSet]:
    status = dict(
        line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return (
        CPUSet.parse_list(status["Cpus_allowed_list"].strip()),
        NodeSet.parse_list(status["Mems_allowed_list"].strip()),
    )


def cpuset_file(name: str, what: str) -> str:
    v1_names = {"cpus.effective": "effective_cpus", "mems.effective": "effective_mems"}
    file = f"cpuset.{v1_names.get(what, what) if V1 else what}"
    return (cgroup(name) / file).read_text().strip()


def decision(out: dict[str, Any]) -> tuple[CPUSet, NodeSet]:
    main = out["containers"]["main"]
    return CPUSet.parse_list(main["cpus"]), NodeSet.parse_list(main["mems"])


def exclusive_sets(numad: Daemon) -> dict[str, CPUSet]:
    return {
        w["name"]: CPUSet.parse_list(c["cpus"])
        for w in numad.call("GET", "/v1/workloads")["workloads"]
        for c in w["containers"].values()
        if c["exclusive"]
    }


def exclusive_cpus(numad: Daemon) -> CPUSet:
    taken = CPUSet()
    for cpus in exclusive_sets(numad).values():
        taken |= cpus
    return taken


def check_invariants(numad: Daemon) -> None:
    """Exclusive sets disjoint, never reserved or offline; every cgroup and every process
    in it holds exactly what numad decided; shared containers hold the whole pool."""
    seen = CPUSet()
    for cpus in exclusive_sets(numad).values():
        assert seen.isdisjoint(cpus), f"{cpus} is in two exclusive sets"
        assert cpus.isdisjoint(RESERVED)
        assert cpus.issubset(ONLINE)
        seen |= cpus
    for w in numad.call("GET", "/v1/workloads")["workloads"]:
        for c in w["containers"].values():
            want = CPUSet.parse_list(c["cpus"]) if c["exclusive"] else ONLINE - seen
            assert CPUSet.parse_list(cpuset_file(w["name"], "cpus")) == want, w["name"]
            assert CPUSet.parse_list(cpuset_file(w["name"], "cpus.effective")) == want
            if w["name"] in PROCS:
                assert allowed(PROCS[w["name"]].pid)[0] == want, w["name"]


# -- admissions -----------------------------------------------------------------------------


def test_shared_workload_gets_the_whole_pool(numad: Daemon) -> None:
    make_cgroup("web")
    pid = start_in("web")
    out = admit("web", cpus="500m")
    assert out["admitted"]
    assert allowed(pid) == (ONLINE, MEMORY_NODES)  # the pool: every online CPU, reserved too
    assert CPUSet.parse_list(cpuset_file("web", "cpus.effective")) == ONLINE


def test_exclusive_workload_pins_its_process_and_the_pool_shrinks(numad: Daemon) -> None:
    make_cgroup("excl")
    pid = start_in("excl")  # already running when numad decides: the kernel moves it
    out = admit("excl", cpus=2)
    cpus, mems = decision(out)
    assert len(cpus) == 2
    assert cpus.isdisjoint(RESERVED)
    assert allowed(pid) == (cpus, mems or MEMORY_NODES)
    assert CPUSet.parse_list(cpuset_file("excl", "cpus.effective")) == cpus
    assert allowed(PROCS["web"].pid)[0] == ONLINE - cpus  # the shared pool shrank
    check_invariants(numad)


def test_memory_workload_gets_nodes_with_memory(numad: Daemon) -> None:
    make_cgroup("mem")
    pid = start_in("mem")
    out = admit("mem", cpus=1, memory="64Mi")
    cpus, mems = decision(out)
    assert mems, "a memory request pins memory to NUMA nodes"
    assert mems.issubset(MEMORY_NODES)
    assert allowed(pid) == (cpus, mems)
    assert NodeSet.parse_list(cpuset_file("mem", "mems.effective")) == mems
    check_invariants(numad)
    _numad("release", "mem", "--socket", SOCKET)  # small machines need the CPU back


def test_pci_device_class_goes_with_its_node(numad: Daemon) -> None:
    make_cgroup("dev")
    pid = start_in("dev")
    if EXPECT["pci"] is None:
        spec = _spec_file("dev", cpus=1, devices={"rng": 1})
        out = _numad("admit", "--json", spec, "--socket", SOCKET, check=False)
        assert "rng" in out  # no such device on this machine: rejected, naming the class
        assert "dev" not in {w["name"] for w in numad.call("GET", "/v1/workloads")["workloads"]}
        return
    placed = admit("dev", cpus=1, devices={"rng": 1})
    cpus, _ = decision(placed)
    assert placed["containers"]["main"]["devices"] == {"rng": [EXPECT["pci"]["address"]]}
    assert cpus.issubset(node_cpus(EXPECT["pci"]["numa_node"]))  # aligned with the device
    assert allowed(pid)[0] == cpus
    check_invariants(numad)


def test_rejected_workload_leaves_no_trace(numad: Daemon) -> None:
    before_pool = cpuset_file("web", "cpus")
    before_state = (STATE / "checkpoint.json").read_bytes()
    widest = max(len(node_cpus(int(n))) for n in EXPECT["nodes"])
    out = _numad(
        "admit",
        "--json",
        _spec_file("huge", cpus=widest + 1, policy="single-numa-node"),
        "--socket",
        SOCKET,
        check=False,
    )
    assert "huge" in out, out
    assert "rejected" in out, out
    assert "huge" not in {w["name"] for w in numad.call("GET", "/v1/workloads")["workloads"]}
    assert not cgroup("huge").exists()  # numad created nothing
    assert cpuset_file("web", "cpus") == before_pool  # nobody's CPUs moved
    assert (STATE / "checkpoint.json").read_bytes() == before_state
    check_invariants(numad)


def test_a_cgroup_that_is_no_workloads_stays_off_exclusive_cpus(numad: Daemon) -> None:
    taken = exclusive_cpus(numad)
    assert taken  # an exclusive workload is admitted by now
    pool = ONLINE - taken
    make_cgroup("stray")  # under numad.slice, never admitted
    # The next reconcile pass isolates it (v1 takes no process before it has CPUs).
    isolated = lambda: CPUSet.parse_list(cpuset_file("stray", "cpus")) == pool  # noqa: E731
    wait_for(isolated, "numad to isolate the cgroup")
    pid = start_in("stray")
    assert allowed(pid)[0] == pool
    # numad's walk lists a cgroup only where its link count shows cgroups below it: the
    # kernel's cgroupfs (kernfs) counts 2 plus one per child cgroup, on v1 as on v2.
    make_cgroup("stray/inner/leaf")
    for name, below in (("stray", 1), ("stray/inner", 1), ("stray/inner/leaf", 0)):
        assert os.lstat(cgroup(name)).st_nlink == 2 + below, name
    children = [e for e in os.scandir(cgroup("")) if e.is_dir(follow_symlinks=False)]
    assert os.lstat(cgroup("")).st_nlink == 2 + len(children)
    # Below an isolated cgroup: on v2 bounded by it from its mkdir (numad writes nothing
    # there, and with cpuset not enabled below "stray" there is nothing to write: the
    # kernel applies stray's CPUs); on v1 numad writes each level (a v1 cgroup without
    # CPUs of its own takes no task).
    leaf = "stray/inner/leaf"
    if V1:
        wait_for(lambda: bool(cpuset_file(leaf, "cpus")), "numad to isolate the cgroup below")
    pid = start_in(leaf)
    assert not allowed(pid)[0] & taken, allowed(pid)
    assert allowed(pid)[0] == pool, (allowed(pid), pool)
    proc = PROCS.pop(leaf)
    proc.kill()
    proc.wait()
    for name in (leaf, "stray/inner"):
        wait_for(partial(_removed, cgroup(name)), f"{name} removed")


# -- crashes, drift, the kernel's own changes ----------------------------------------------


def test_sigkill_in_the_middle_of_admissions_keeps_every_invariant(numad: Daemon) -> None:
    if not EXPECT.get("crash"):
        # Three numad starts, 45-50 s of a 150 s boot under emulation: what a crash may
        # leave depends on the kernel line and the cgroup version, not on the machine.
        pytest.skip("the crash check runs in the 2node boots only (test_vm.py CRASH_CASES)")
    # A deterministic point first: after the checkpoint and the shared pool's write,
    # before the exclusive set's.
    numad.kill()
    numad.start(crash_at="admit:after-shared")
    make_cgroup("crash1")
    # numad isolates a new cgroup as it appears (inotify): "created with" is after that.
    isolated = lambda: cpuset_file("crash1", "cpus") == cpuset_file("web", "cpus")  # noqa: E731
    wait_for(isolated, "numad to isolate the new cgroup")
    start_in("crash1")
    created_with = CPUSet.parse_list(cpuset_file("crash1", "cpus"))
    with pytest.raises((OSError, APIError)):
        numad.call("POST", "/v1/workloads", _spec("crash1", cpus=1))
    assert numad.proc is not None
    numad.proc.wait(timeout=CALL)
    # Killed between its two writes: the shared pool has shrunk, the exclusive set is
    # not written yet. In no order of writes may a CPU be in both at once.
    half_written = CPUSet.parse_list(cpuset_file("crash1", "cpus"))
    pool_then = CPUSet.parse_list(cpuset_file("web", "cpus"))
    numad.start()  # first, so that a failure here leaves a daemon for the next checks
    if half_written != created_with:
        assert half_written.isdisjoint(pool_then)
    check_invariants(numad)
    # Then a real SIGKILL while admissions are in flight.
    names = [f"burst{i}" for i in range(3)]
    for name in names:
        make_cgroup(name)
        start_in(name)
    killed_mid_admissions(numad, names, "100m")
    check_invariants(numad)
    for name in {w["name"] for w in numad.call("GET", "/v1/workloads")["workloads"]}:
        if name.startswith(("crash", "burst")):
            numad.call("DELETE", f"/v1/workloads/{name}")
    check_invariants(numad)


def test_sigkill_with_partitions_keeps_every_exclusive_set_a_partition(numad: Daemon) -> None:
    """numad's default where the kernel offers partitions (6.12; numad runs as root, so
    it holds CAP_SYS_ADMIN): every exclusive set is a valid partition, through a SIGKILL
    in the middle of admissions and a restart; killed again and started with
    ``partitions = false``, it dissolves what the killed one left."""
    if not EXPECT.get("crash") or not (CGROUP_ROOT / "cpuset.cpus.isolated").is_file():
        pytest.skip("a crash boot whose kernel offers cpuset partitions (6.12 v2) only")
    numad.kill()
    (WORK / "numad.toml").write_text(CONFIG.replace("partitions = false", 'partitions = "auto"'))
    numad.start()
    names = [f"part{i}" for i in range(3)]
    try:
        assert numad.call("GET", "/v1/host")["isolating"] == "partitions"
        partitioned(numad)
        for name in names:
            make_cgroup(name)
            start_in(name)
        killed_mid_admissions(numad, names, 1)
        partitioned(numad)
        check_invariants(numad)
        for name in {w["name"] for w in numad.call("GET", "/v1/workloads")["workloads"]}:
            if name.startswith("part"):
                numad.call("DELETE", f"/v1/workloads/{name}")
        partitioned(numad)
    finally:
        numad.kill()  # its partitions left behind, for the next start to dissolve
        (WORK / "numad.toml").write_text(CONFIG)
        numad.start()
    made = list((CGROUP_ROOT / "numad.slice").rglob("cpuset.cpus.partition"))
    assert len(made) > 1 + len(names), made  # numad.slice's, the workloads', the holder's
    left = [f.parent.name for f in made if f.read_text().strip() != "member"]
    assert not left, f"partitions left behind: {left}"
    root = CPUSet.parse_list((CGROUP_ROOT / "cpuset.cpus.effective").read_text())
    assert root == ONLINE, root  # every CPU is the root cgroup's again
    check_invariants(numad)


def partitioned(numad: Daemon) -> None:
    """Every exclusive set is its cgroup's valid partition, and no CPU of one is in the
    root cgroup's effective set, so none in any cgroup outside the partitions."""
    sets = exclusive_sets(numad)
    assert sets, "nothing exclusive: the check would prove nothing"
    for name, cpus in sets.items():
        assert cpuset_file(name, "cpus.partition") == "root", name
        assert CPUSet.parse_list(cpuset_file(name, "cpus.exclusive")) == cpus, name
    root = CPUSet.parse_list((CGROUP_ROOT / "cpuset.cpus.effective").read_text())
    assert root.isdisjoint(exclusive_cpus(numad)), root
    health = numad.call("GET", "/v1/health")["problems"]
    assert not [p for p in health if "partition" in p], health


def killed_mid_admissions(numad: Daemon, names: list[str], cpus: int | str) -> None:
    """A real SIGKILL while ``names`` are being admitted (``cpus`` each), then a start."""
    threads = [
        threading.Thread(target=_try_admit, args=(numad, name, cpus), daemon=True) for name in names
    ]
    for t in threads:
        t.start()
    time.sleep(1.0)
    numad.kill()
    for t in threads:
        t.join(timeout=CALL)
    numad.start()


def _try_admit(numad: Daemon, name: str, cpus: int | str) -> None:
    with contextlib.suppress(OSError, APIError):  # killed mid-request
        numad.call("POST", "/v1/workloads", _spec(name, cpus=cpus))


def test_cpuset_rewritten_behind_numads_back_is_repaired(numad: Daemon) -> None:
    want = cpuset_file("excl", "cpus")
    (cgroup("excl") / ("cpuset.cpus")).write_text(ONLINE.format_list())
    assert allowed(PROCS["excl"].pid)[0] == ONLINE  # the other writer got through
    wait_for(lambda: cpuset_file("excl", "cpus") == want, "the drift repair")
    assert allowed(PROCS["excl"].pid)[0] == CPUSet.parse_list(want)


def test_cpus_outside_the_parent_are_caught_from_the_effective_files(numad: Daemon) -> None:
    """The kernel accepts a child's CPUs outside its parent's and silently applies
    the parent's; numad must notice from cpuset.cpus.effective and say so."""
    if V1:
        pytest.skip("v1 refuses CPUs outside the parent (EACCES) instead of masking them")
    free = ONLINE - RESERVED - exclusive_cpus(numad)
    # Restored below to what it applied: a populated parent's cpuset.cpus cannot go
    # back to empty (ENOSPC).
    slice_cpus = (CGROUP_ROOT / "numad.slice" / "cpuset.cpus.effective").read_text().strip()
    # Another writer narrows numad.slice to the reserved CPU and the shared pool's
    # remainder: a new exclusive set lands outside it.
    narrowed = ONLINE - free if ONLINE - free else RESERVED
    (CGROUP_ROOT / "numad.slice" / "cpuset.cpus").write_text(narrowed.format_list())
    try:
        make_cgroup("outside")
        start_in("outside")
        out = admit("outside", cpus=1)
        cpus, _ = decision(out)
        assert cpus.isdisjoint(narrowed)
        assert allowed(PROCS["outside"].pid)[0] != cpus  # the kernel's silent fallback
        wait_for(lambda: _problem_about("numad.slice/outside", numad), "the reported problem")
    finally:
        (CGROUP_ROOT / "numad.slice" / "cpuset.cpus").write_text(slice_cpus)
    wait_for(lambda: allowed(PROCS["outside"].pid)[0] == cpus, "numad to re-apply")
    wait_for(lambda: not _problem_about("numad.slice/outside", numad), "the problem to clear")


def _problem_about(subject: str, numad: Daemon) -> bool:
    return any(subject in p for p in numad.call("GET", "/v1/health")["problems"])


def test_mems_naming_a_node_without_memory_are_caught(numad: Daemon) -> None:
    memless = [int(n) for n in EXPECT["nodes"] if int(n) not in MEMORY_NODES]
    if not memless:
        pytest.skip("every node of this machine has memory")
    # Written by numad's own backend, as the daemon writes: the kernel says yes...
    backend = detect_backend(Path("/sys/fs/cgroup"), ["numad.slice"])
    make_cgroup("nomem")
    start_in("nomem")
    if V1:  # v1 checks the node against the memory nodes and says no
        with pytest.raises(CgroupError, match="nomem"):
            backend.write("numad.slice/nomem", None, NodeSet([memless[0]]))
        return
    backend.write("numad.slice/nomem", None, NodeSet([memless[0]]))
    # ...and applies another node, which only the effective file tells.
    _, effective = backend.read_effective("numad.slice/nomem")
    assert memless[0] not in effective
    assert allowed(PROCS["nomem"].pid)[1] == effective


def test_hot_unplug_of_an_exclusive_cpu(numad: Daemon) -> None:
    """README: a CPU that goes offline under an exclusive assignment is replaced by a
    free CPU of the same NUMA nodes, or the container is flagged when none is free."""
    before = CPUSet.parse_list(cpuset_file("excl", "cpus"))
    victim = max(before)
    nodes = {n for n in map(int, EXPECT["nodes"]) if victim in node_cpus(n)}
    online_file = Path(f"/sys/devices/system/cpu/cpu{victim}/online")
    online_file.write_text("0")
    try:
        flagged = f"excl/main: cpus {victim} went offline; none free to replace them; flagged"

        def settled() -> bool:  # v1's kernel drops the CPU itself: wait for numad's answer
            now = CPUSet.parse_list(cpuset_file("excl", "cpus"))
            replaced = victim not in now and len(now) == len(before)
            return replaced or _problem_about(flagged, numad)

        wait_for(settled, "numad to replace the unplugged CPU or flag its container")
        wait_for(
            lambda: victim not in CPUSet.parse_list(cpuset_file("excl", "cpus")),
            "the unplugged CPU out of the exclusive set",
        )
        after = CPUSet.parse_list(cpuset_file("excl", "cpus"))
        if _problem_about(flagged, numad):  # none free on its nodes: keeps the rest
            assert after == before - CPUSet([victim])
        else:  # replaced from its own nodes, never from another
            assert len(after) == len(before)
            replacement = next(iter(after - before))
            assert any(replacement in node_cpus(n) for n in nodes)
        assert allowed(PROCS["excl"].pid)[0] == after
        check_invariants_online(numad)
    finally:
        online_file.write_text("1")
    # Back online: to the shared pool if it was replaced, to its container if flagged.
    wait_for(
        lambda: any(victim in CPUSet.parse_list(cpuset_file(w, "cpus")) for w in ("web", "excl")),
        "the CPU back in use",
    )


def check_invariants_online(numad: Daemon) -> None:
    online = CPUSet.parse_list(sysfs("cpu/online"))
    for name, cpus in exclusive_sets(numad).items():
        assert cpus.issubset(online) or _problem_about(f"numad.slice/{name}", numad)


def test_release_gives_the_cpus_back_to_the_pool(numad: Daemon) -> None:
    cpus = CPUSet.parse_list(cpuset_file("excl", "cpus"))
    _numad("release", "excl", "--socket", SOCKET)
    wait_for(lambda: cpus.issubset(allowed(PROCS["web"].pid)[0]), "the pool to grow back")
    check_invariants(numad)


def _holds(name: str, cpus: CPUSet) -> bool:
    """The cgroup's cpuset.cpus names ``cpus`` (False while it has no cpuset files yet:
    cgroup v2 adds them once numad enables the controller in its parent)."""
    try:
        return CPUSet.parse_list(cpuset_file(name, "cpus")) == cpus
    except FileNotFoundError:
        return False


def _emptied(name: str) -> bool:
    """The process started in the cgroup has been killed, and the kernel lists no task."""
    proc = PROCS.pop(name, None)
    if proc is not None:
        proc.kill()
        proc.wait()
    return not (cgroup(name) / "cgroup.procs").read_text().strip()


def test_a_cgroup_above_a_workloads_cgroup_that_went_is_isolated_until_it_is_back(
    numad: Daemon,
) -> None:
    """The workload in "holder/w" holds one exclusive CPU; its cgroup and "holder" go
    (the workload is held through the release grace), and "holder" is made again with
    a process in it: that process runs on the pool, off every exclusive CPU, from the
    mkdir (inotify). Made again, "holder/w" gets its CPU back: "holder" its own
    setting, then "w" its grant, at the mkdir's event (before 2026-12-06 at the next
    pass; before 2026-12-05 the process in "holder" ran on every CPU). Without the
    forget of what numad enabled for the old "holder/w" (de5921d), "holder" stayed
    isolated here on 6.1: its new "holder/w" had no cpuset files to write."""
    out = admit("holder-w", cpus=1, cgroup="numad.slice/holder/w")
    grant = decision(out)[0]
    make_cgroup("holder/w")
    wait_for(partial(_holds, "holder/w", grant), "the grant")
    start_in("holder/w")
    wait_for(partial(_emptied, "holder/w"), "holder/w to empty")
    for name in ("holder/w", "holder"):
        wait_for(partial(_removed, cgroup(name)), f"{name} removed")
    make_cgroup("holder")
    taken = exclusive_cpus(numad)
    assert grant.issubset(taken), (grant, taken)  # exclusive
    pool = ONLINE - taken
    wait_for(partial(_holds, "holder", pool), "holder isolated")
    pid = start_in("holder")
    assert allowed(pid)[0] == pool, (allowed(pid), pool)
    wait_for(partial(_emptied, "holder"), "holder to empty")
    make_cgroup("holder/w")
    wait_for(partial(_holds, "holder/w", grant), "the grant")
    assert grant.issubset(CPUSet.parse_list(cpuset_file("holder", "cpus.effective")))
    pid = start_in("holder/w")
    assert allowed(pid)[0] == grant, (allowed(pid), grant)
    wait_for(partial(_emptied, "holder/w"), "holder/w to empty")
    _numad("release", "holder-w", "--socket", SOCKET)
    for name in ("holder/w", "holder"):
        wait_for(partial(_removed, cgroup(name)), f"{name} removed")
    check_invariants(numad)


# -- a container through numad's OCI hook (one boot: test_vm.py's OCI_CASE) ------------------


def _oci() -> Any:
    if not EXPECT.get("oci"):
        pytest.skip("a real OCI runtime runs in one boot only (test_vm.py OCI_CASE)")
    from tests.vm.guest import oci  # noqa: PLC0415 - only in the boot that runs runc

    return oci


def _workloads(numad: Daemon) -> set[str]:
    return {w["name"] for w in numad.call("GET", "/v1/workloads")["workloads"]}


def test_a_runc_container_runs_on_the_cpuset_numad_decided(numad: Daemon) -> None:
    oci = _oci()
    annotations = {"numad.io/cpus": "2"}
    assert oci.matches_when(annotations)  # the shipped hooks.d file would select it
    made = oci.bundle(WORK / "oci", "vmtest", "numad.slice/ctr-vmtest", annotations)
    started = time.monotonic()
    proc = oci.start(made)
    watchdog = threading.Timer(WAIT, proc.kill)
    watchdog.start()
    try:
        allowed_line, effective_line = proc.stdout.readline(), proc.stdout.readline()
        assert effective_line.startswith("effective:"), f"{allowed_line}{proc.communicate()}"
        shown = numad.call("GET", "/v1/workloads/oci-vmtest")  # while it runs
        status, err = oci.finish(made, proc, WAIT)
    finally:
        watchdog.cancel()
    decided = CPUSet.parse_list(shown["containers"]["main"]["cpus"])
    seen = CPUSet.parse_list(allowed_line.split(":", 1)[1].strip())
    effective = CPUSet.parse_list(effective_line.removeprefix("effective:").strip())
    (OUT / "oci.json").write_text(
        json.dumps(
            {
                "runc": oci.version(),
                "decided": decided.format_list(),
                "cpus_allowed_list": seen.format_list(),
                "cpuset_cpus_effective": effective.format_list(),
                "seconds": round(time.monotonic() - started, 1),
            }
        )
    )
    assert status == 0, err
    assert shown["cgroup"] == "numad.slice/ctr-vmtest"  # found from the process's cgroup
    assert len(decided) == 2
    assert decided.isdisjoint(RESERVED)
    assert seen == decided  # what the container's process may run on
    assert effective == decided  # what its own cgroup (namespaced) holds
    assert "oci-vmtest" not in _workloads(numad)  # the poststop hook released it
    check_invariants(numad)


def test_a_runc_container_numad_rejects_fails_with_numads_reason(numad: Daemon) -> None:
    oci = _oci()
    made = oci.bundle(WORK / "oci", "vmhuge", "numad.slice/ctr-vmhuge", {"numad.io/cpus": "64"})
    done = oci.run(made, WAIT)
    assert done.returncode != 0, done.stdout
    assert "Cpus_allowed_list" not in done.stdout  # its process never ran
    assert "numad: container vmhuge: not placed:" in done.stderr, done.stderr  # runc shows it
    assert "rejected" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert "oci-vmhuge" not in _workloads(numad)
    assert not cgroup("ctr-vmhuge").exists()  # runc tore its cgroup down
    check_invariants(numad)


def test_daemon_reported_no_errors(numad: Daemon) -> None:
    text = numad.logs()
    assert "Traceback" not in text, text
    if not V1:  # (v1's kernel itself rewrites every cpuset when a CPU goes offline)
        repaired = {
            json.loads(line)["cgroup"]
            for line in (OUT / "serve.log").read_text(errors="replace").splitlines()
            if '"cpuset_drift_repaired"' in line
        }
        assert repaired == {"numad.slice/excl"}, "only the cgroup rewritten behind its back"
    for proc in PROCS.values():
        proc.send_signal(signal.SIGKILL)
