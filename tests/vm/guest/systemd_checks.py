"""In-guest checks: numad installed from its Debian package and run as its real unit,
under the host's own systemd as PID 1.

Run by tests/vm/test_systemd_vm.py inside a QEMU VM booted with init-systemd.sh
(``VMTEST=1``), from the unit numad-vm-checks.service; never collected on the host.
numad comes from ``dpkg -i`` of the package ``scripts/package`` built (its path in
/vmctl/deb): its maintainer scripts enable and start numad.service with the shipped
/etc/numad/numad.toml, as on a host; the checks then write their own config there, as
an operator edits it, and numad runs as the package's unit, unmodified, with no drop-in.

The checks run in file order in one boot and build on each other, as a host would:
install, start, reload with a declared workload, the hardened daemon's writes, podman
containers (one boot), the watchdog restarting a hung daemon, stop. The helpers of the
first section (``systemctl``, ``show``, ``run_transient``, ``journal``, ``wait_for``)
are for further checks too.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from numad.cli.client import request
from numad.cpuset import CPUSet, NodeSet
from numad.errors import NumadError

pytestmark = pytest.mark.skipif(not os.environ.get("VMTEST"), reason="runs only inside the VM")

UNIT = "numad.service"
# The package's conffile, which the checks rewrite as an operator would.
CONFIG_DIR = Path("/etc/numad")
DEB = Path("/vmctl/deb")  # holds the package's path (a read-only share of the host's)
PODMAN = Path("/vmctl/podman")  # present in the one boot that runs podman's checks
WORKLOADS = CONFIG_DIR / "workloads.d"
# The unit's own directories: RuntimeDirectory=numad, StateDirectory=numad.
SOCKET = "/run/numad/numad.sock"
STATE = Path("/var/lib/numad")
CGROUP_ROOT = Path("/sys/fs/cgroup")
NUMAD = ["/usr/bin/numad"]  # the package's
KERNEL = os.environ.get("VMTEST_KERNEL", "")  # "6.1", "6.12"
# How much slower the host was than a quiet one when it booted this VM (tests/vm/pace.py):
# every wait below stretches by it.
SLOWDOWN = max(1.0, float(os.environ.get("VMTEST_SLOWDOWN") or 1))
WAIT = 90.0 * SLOWDOWN  # seconds; emulated CPUs are 10-30x slower than the host's
CALL = 60.0 * SLOWDOWN  # one API call
# Outside /tmp: PrivateTmp=yes gives numad a /tmp of its own.
BASE = f"""
[topology]
policy = "best-effort"

[cpu]
reserved-cpus = "0"

[memory]
policy = "static"

[paths]
cgroup-root = "{CGROUP_ROOT}"
managed-roots = ["numad.slice", "db.slice"]
state-dir = "{STATE}"
socket = "{SOCKET}"
workloads-dir = "{WORKLOADS}"

[daemon]
reconcile-seconds = 2
release-grace-seconds = 5

[metrics]
port = 0
"""
# The checks before the partitions section isolate one by one, as numad does on 6.1 and
# without CAP_SYS_ADMIN: that mode's writes (systemd's AllowedCPUs=) are what they look
# at. The partitions section runs the default, "auto".
CONFIG = BASE + "\n[host]\npartitions = false\n"


# -- helpers: systemd, numad, the kernel's files --------------------------------------------


def systemctl(*args: str, check: bool = True, timeout: float = WAIT) -> str:
    """``systemctl ARGS`` (through PID 1's private socket, as root needs no D-Bus)."""
    proc = subprocess.run(
        ["systemctl", "--no-pager", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"systemctl {' '.join(args)}: exit {proc.returncode}\n{proc.stdout}{proc.stderr}"
            f"\n{journal(UNIT)[-3000:]}"
        )
    return proc.stdout.strip()


def show(unit: str, *props: str) -> dict[str, str]:
    """Properties of ``unit`` as ``systemctl show`` has them (every value a string)."""
    out = systemctl("show", unit, *(f"--property={p}" for p in props))
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def prop(unit: str, name: str) -> str:
    return show(unit, name)[name]


def main_pid(unit: str = UNIT) -> int:
    return int(prop(unit, "MainPID"))


def run_transient(name: str, *command: str, slice_: str = "numad.slice", **props: str) -> str:
    """Start ``command`` as the transient service ``NAME.service`` in ``slice_`` (each
    keyword a unit property, ``Delegate="cpuset"``); its cgroup is ``slice_/NAME.service``.
    Returns once the process runs (Type=exec)."""
    unit = f"{name}.service"
    argv = ["systemd-run", f"--unit={unit}", f"--slice={slice_}", "--property=Type=exec"]
    argv += [f"--property={k}={v}" for k, v in props.items()]
    proc = subprocess.run([*argv, *command], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise AssertionError(f"systemd-run {unit}: exit {proc.returncode}\n{proc.stderr}")
    return unit


def journal(unit: str) -> str:
    """The unit's journal lines of this boot, messages only."""
    return subprocess.run(
        ["journalctl", "--no-pager", "-b", "-o", "cat", "-u", unit],
        capture_output=True,
        text=True,
        check=False,
    ).stdout


def events(unit: str = UNIT) -> list[dict[str, Any]]:
    """numad's structured log lines (JSON under journald) from the unit's journal."""
    found = []
    for line in journal(unit).splitlines():
        if line.startswith("{"):
            try:
                found.append(json.loads(line))
            except ValueError:
                continue
    return found


def wait_for(condition: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.5)


def api(method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    text = None if body is None else json.dumps(body)
    return request(SOCKET, method, path, text, timeout=CALL)


def answers() -> bool:
    """The API answers and says numad is ready."""
    try:
        return bool(api("GET", "/v1/health").get("ready"))
    except (NumadError, OSError):
        return False


def numad_cli(*args: str) -> str:
    proc = subprocess.run([*NUMAD, *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise AssertionError(f"numad {' '.join(args)}: exit {proc.returncode}\n{proc.stderr}")
    return proc.stdout


def workloads() -> dict[str, dict[str, Any]]:
    return {w["name"]: w for w in api("GET", "/v1/workloads")["workloads"]}


def cpuset(cgroup: str, what: str) -> str:
    """``cpuset.WHAT`` of ``cgroup`` (relative to the cgroup root)."""
    return (CGROUP_ROOT / cgroup / f"cpuset.{what}").read_text().strip()


def allowed(pid: int) -> tuple[CPUSet, NodeSet]:
    status = dict(
        line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return (
        CPUSet.parse_list(status["Cpus_allowed_list"].strip()),
        NodeSet.parse_list(status["Mems_allowed_list"].strip()),
    )


def declare(name: str, cgroup: str, **fields: Any) -> Path:
    """A workload spec in the workloads directory (numad reads it on start and reload)."""
    spec = WORKLOADS / f"{name}.json"
    spec.write_text(json.dumps({"name": name, "cgroup": cgroup, **fields}))
    return spec


INSTALLED: dict[str, str] = {}  # what dpkg -i did, for the first check


@pytest.fixture(scope="module", autouse=True)
def guest_config() -> Iterator[None]:
    install_package()
    WORKLOADS.mkdir(parents=True, exist_ok=True)
    (CONFIG_DIR / "numad.toml").write_text(CONFIG)
    yield
    print(journal(UNIT)[-6000:])


def install_package() -> None:
    """``dpkg -i`` the package, note what the install left running, then stop numad
    (the checks start it with their config)."""
    started = time.monotonic()
    proc = subprocess.run(
        ["dpkg", "-i", DEB.read_text().strip()],
        capture_output=True,
        text=True,
        timeout=5 * WAIT,
        check=False,
    )
    INSTALLED.update(
        rc=str(proc.returncode),
        output=proc.stdout + proc.stderr,
        seconds=f"{time.monotonic() - started:.1f}",
        active=systemctl("is-active", UNIT, check=False),
        enabled=systemctl("is-enabled", UNIT, check=False),
        ready=str(answers()),
    )
    systemctl("stop", UNIT, check=False)


# -- the checks ---------------------------------------------------------------------------

# The workload the checks share: a transient unit in numad.slice, declared in
# workloads.d, one exclusive CPU and memory pinned to its nodes.
WORKLOAD = "wl1"
WORKLOAD_CGROUP = f"numad.slice/{WORKLOAD}.service"
PLACED: dict[str, str] = {}  # what numad decided for it: cpus, mems


def test_the_package_installs_enables_and_starts_numad() -> None:
    assert INSTALLED["rc"] == "0", INSTALLED["output"]
    figure(check="dpkg -i", seconds=float(INSTALLED["seconds"]))
    # Its maintainer scripts enabled and started it, with the shipped config.
    assert INSTALLED["enabled"] == "enabled", INSTALLED
    assert INSTALLED["active"] == "active", INSTALLED
    assert INSTALLED["ready"] == "True", INSTALLED
    status = subprocess.run(["dpkg", "-s", "numad"], capture_output=True, text=True, check=True)
    assert "Status: install ok installed" in status.stdout, status.stdout
    assert Path("/usr/bin/numad").resolve().is_relative_to("/usr/lib/numad")
    assert "node 0" in numad_cli("topology")  # the package's own Python environment runs
    shipped = {
        "/usr/share/man/man8/numad.8.gz",
        "/usr/share/bash-completion/completions/numad",
        "/usr/share/containers/oci/hooks.d/numad.json",
    }
    assert {p for p in shipped if not Path(p).is_file()} == set()


def test_start_returns_once_numad_is_ready() -> None:
    loaded = show(UNIT, "FragmentPath", "DropInPaths", "ExecStart")
    fragment = Path(loaded["FragmentPath"])  # the package's unit: the project's, byte for byte
    assert fragment.read_bytes() == Path("systemd", fragment.name).read_bytes(), loaded
    assert fragment.parent in (Path("/lib/systemd/system"), Path("/usr/lib/systemd/system"))
    assert loaded["DropInPaths"] == "", loaded  # nothing changed for the VM
    assert "path=/usr/bin/numad" in loaded["ExecStart"], loaded
    systemctl("start", UNIT)  # Type=notify: returns on READY=1
    # No waiting from here on: READY=1 promised a listening, ready API.
    assert systemctl("is-active", UNIT, check=False) == "active"
    assert api("GET", "/v1/health")["ready"]
    assert json.loads(numad_cli("list", "--json", "--socket", SOCKET)) == {"workloads": []}
    state = show(UNIT, "NRestarts", "StatusText", "WatchdogUSec", "Result", "SubState")
    assert state["NRestarts"] == "0", state
    assert state["Result"] == "success", state
    assert state["SubState"] == "running", state
    assert state["WatchdogUSec"] == "30s", state  # the unit's WatchdogSec=30
    assert state["StatusText"], state  # numad's STATUS= reached systemd
    started = [e["event"] for e in events()]
    assert "api_listening" in started, started


def test_reload_admits_a_workload_declared_in_workloads_d() -> None:
    unit = run_transient(WORKLOAD, "sleep", "infinity")
    assert (CGROUP_ROOT / WORKLOAD_CGROUP).is_dir()  # systemd made the workload's cgroup
    declare(WORKLOAD, WORKLOAD_CGROUP, cpus=1, memory="32Mi")
    assert WORKLOAD not in workloads()  # declared, not read yet
    systemctl("reload", UNIT)
    # ExecReload= only sends SIGHUP: numad answers RELOADING=1 ... READY=1, which
    # systemd 252 may see after `systemctl reload` has returned.
    wait_for(lambda: WORKLOAD in workloads(), "numad to admit the declared workload")
    main = workloads()[WORKLOAD]["containers"]["main"]
    PLACED.update(cpus=main["cpus"], mems=main["mems"])
    cpus = CPUSet.parse_list(PLACED["cpus"])
    assert len(cpus) == 1, PLACED
    assert NodeSet.parse_list(PLACED["mems"]), "a memory request pins memory to NUMA nodes"
    assert systemctl("is-active", UNIT, check=False) == "active"
    assert cpuset_enabled(""), "numad enables cpuset at the root"
    assert cpuset_enabled("numad.slice"), "and in numad.slice"
    wait_for(lambda: allowed(main_pid(unit))[0] == cpus, "the workload's process on its CPU")


def cpuset_enabled(cgroup: str) -> bool:
    """cpuset is on for the children of ``cgroup`` (its cgroup.subtree_control)."""
    return "cpuset" in (CGROUP_ROOT / cgroup / "cgroup.subtree_control").read_text().split()


def test_the_hardened_unit_still_writes_cgroups_and_checkpoint() -> None:
    """ProtectSystem=strict with ReadWritePaths=, PrivateTmp=, the system call filter and
    the bounded capabilities leave numad its three writable places."""
    cpus, mems = CPUSet.parse_list(PLACED["cpus"]), NodeSet.parse_list(PLACED["mems"])
    assert CPUSet.parse_list(cpuset(WORKLOAD_CGROUP, "cpus")) == cpus
    assert NodeSet.parse_list(cpuset(WORKLOAD_CGROUP, "mems")) == mems
    assert CPUSet.parse_list(cpuset(WORKLOAD_CGROUP, "cpus.effective")) == cpus
    assert NodeSet.parse_list(cpuset(WORKLOAD_CGROUP, "mems.effective")) == mems
    assert allowed(main_pid(f"{WORKLOAD}.service")) == (cpus, mems)
    checkpoint = STATE / "checkpoint.json"
    assert checkpoint.is_file(), sorted(p.name for p in STATE.iterdir())
    assert f'"{WORKLOAD}"'.encode() in checkpoint.read_bytes()
    assert Path(SOCKET).is_socket()


# -- host isolation: a CPU hog in system.slice -------------------------------------------

HOG = "hog"
FIGURES = Path(os.environ.get("VMTEST_OUT", "/vmctl")) / "figures.jsonl"


def figure(**values: Any) -> None:
    """A measured figure for the host to print (and the issue's note to quote)."""
    with FIGURES.open("a") as out:
        out.write(json.dumps({"kernel": KERNEL, **values}) + "\n")


def systemd_cpus(text: str) -> CPUSet:
    """A CPU list as ``systemctl show`` prints it: ranges separated by spaces."""
    return CPUSet.parse_list(",".join(text.split()))


def processor(pid: int) -> int:
    """The CPU ``pid`` last ran on: field 39 of /proc/PID/stat (proc(5))."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[36])


def host_sets() -> tuple[CPUSet, CPUSet]:
    view = api("GET", "/v1/host")
    return CPUSet.parse_list(view["exclusive"]), CPUSet.parse_list(view["shared"])


@contextlib.contextmanager
def hog_running() -> Iterator[int]:
    """The hog runs (its pid) only while it is sampled, and is stopped (SIGSTOP) the rest
    of the boot: under TCG every guest CPU shares one host thread, and a busy loop left
    running took 470 s of a 590 s boot's emulation, timing it rather than numad. Its
    cgroup, and so what the kernel allows it, are the same stopped or running."""
    systemctl("kill", "--signal=SIGCONT", f"{HOG}.service")
    try:
        time.sleep(0.2)  # scheduled again before the first sample
        yield main_pid(f"{HOG}.service")
    finally:
        systemctl("kill", "--signal=SIGSTOP", f"{HOG}.service")


def hog_stays_off(exclusive: CPUSet, shared: CPUSet, when: str, samples: int = 300) -> None:
    """systemd agrees with numad on system.slice, and the hog never runs on an
    exclusive CPU: neither allowed to nor seen there over ``samples`` samples."""
    assert exclusive, "nothing exclusive: the check would prove nothing"
    assert systemd_cpus(prop("system.slice", "AllowedCPUs")) == shared, when
    assert CPUSet.parse_list(cpuset("system.slice", "cpus")) == shared, when
    seen = []
    with hog_running() as pid:
        assert not allowed(pid)[0] & exclusive, (when, allowed(pid))
        for _ in range(samples):
            seen.append(processor(pid))
            time.sleep(0.002)
    on_exclusive = [cpu for cpu in seen if cpu in exclusive]
    figure(
        check=f"hog {when}",
        samples=samples,
        on_exclusive=len(on_exclusive),
        cpus_seen=str(CPUSet(seen)),
        exclusive=str(exclusive),
    )
    assert not on_exclusive, f"{when}: the hog ran on {sorted(set(on_exclusive))}"


def test_a_cpu_hog_in_system_slice_never_runs_on_exclusive_cpus() -> None:
    run_transient(HOG, "sh", "-c", "while :; do :; done", slice_="system.slice")
    systemctl("kill", "--signal=SIGSTOP", f"{HOG}.service")  # runs while sampled (hog_running)
    exclusive, shared = host_sets()
    assert not CPUSet.parse_list(cpuset("system.slice", "cpus")) & exclusive  # numad's own write

    def told() -> bool:  # numad's unit loop tells systemd after writing, off its lock
        view = api("GET", "/v1/host")
        via = {i["cgroup"]: i["via"] for i in view["isolated"]}
        agrees = systemd_cpus(prop("system.slice", "AllowedCPUs")) == shared
        return via.get("system.slice") == "systemd system.slice" and agrees

    wait_for(told, "systemd to hold numad's AllowedCPUs= for system.slice")
    hog_stays_off(exclusive, shared, "after admission")
    systemctl("daemon-reload")  # systemd rewrites the cpusets of units with AllowedCPUs=
    time.sleep(1)
    hog_stays_off(exclusive, shared, "after daemon-reload")


def test_a_unit_started_after_the_admissions_is_off_exclusive_cpus_at_once() -> None:
    """Issue 23: a unit's cgroup made in numad.slice is isolated when it appears (inotify),
    not at the next pass; one in system.slice is bounded by its slice. Two figures,
    sampled every 5 ms: from the cgroup's appearance until its cpuset.cpus.effective
    excludes the exclusive CPUs (numad's part), and from before systemd-run until the
    process's Cpus_allowed_list does (systemd-run's part too); printed by the host."""
    exclusive, _ = host_sets()
    assert exclusive, "nothing exclusive: the check would prove nothing"
    for slice_, name in (("numad.slice", "late-numad"), ("system.slice", "late-system")):
        directory = CGROUP_ROOT / slice_ / f"{name}.service"
        effective = directory / "cpuset.cpus.effective"
        start = time.monotonic()
        runner = threading.Thread(
            target=run_transient, args=(name, "sleep", "600"), kwargs={"slice_": slice_}
        )
        runner.start()
        while not directory.is_dir() and time.monotonic() - start < WAIT:
            time.sleep(0.005)
        appeared = time.monotonic()
        while time.monotonic() - start < WAIT:
            # Without cpuset in its slice's subtree_control a cgroup has no cpuset files
            # and runs on its slice's CPUs: the nearest effective set is the one applied.
            here = effective if effective.exists() else directory.parent / effective.name
            with contextlib.suppress(OSError, ValueError):  # made, not yet complete
                if not CPUSet.parse_list(here.read_text()) & exclusive:
                    break
            time.sleep(0.005)
        from_cgroup = time.monotonic() - appeared
        runner.join(WAIT)
        pid = main_pid(f"{name}.service")
        while allowed(pid)[0] & exclusive and time.monotonic() - start < WAIT:
            time.sleep(0.005)
        from_run = time.monotonic() - start
        assert not allowed(pid)[0] & exclusive, (slice_, allowed(pid), exclusive)
        figure(
            check=f"new unit in {slice_}",
            seconds=round(from_run, 3),
            from_cgroup=round(from_cgroup, 3),
            exclusive=str(exclusive),
        )
        systemctl("stop", f"{name}.service")
    isolated = [e for e in events() if e.get("event") == "cgroups_isolated_on_creation"]
    assert any("numad.slice/late-numad.service" in e.get("cgroups", []) for e in isolated), isolated


def test_a_workload_below_a_slice_numad_isolated_has_its_cpus_at_the_answer() -> None:
    """Issue 23: a slice numad isolated one by one (told AllowedCPUs= the shared pool)
    that becomes the parent of a workload's unit gets its own AllowedCPUs= back, after
    numad's lock, and the workload holds its CPUs when the admission answers: systemd
    does not narrow the slice again under it. Its own is none; the kernel keeps a
    cpuset with tasks below it from emptying, so it is left on every CPU. Stopped at
    the end, the slice stays gone: numad sends nothing to a unit that does not run
    (systemd would make a slice's cgroup again for the call)."""
    exclusive, shared = host_sets()
    assert exclusive, "nothing exclusive: the slice would be told every CPU"
    slice_, side, unit = "numad-pod.slice", "pod-side.service", "pod-wl.service"
    directory = CGROUP_ROOT / "numad.slice" / slice_
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())  # as numad's log timestamps
    try:
        run_transient(side.removesuffix(".service"), "sleep", "600", slice_=slice_)
        wait_for(lambda: unit_allowed(slice_)[0] == shared, f"numad to tell {slice_} the pool")
        run_transient(unit.removesuffix(".service"), "sleep", "600", slice_=slice_)
        start = time.monotonic()
        api("POST", "/v1/workloads", {"name": "pod-wl", "unit": unit, "cpus": 1})
        answer = time.monotonic() - start
        placed = CPUSet.parse_list(workloads()["pod-wl"]["containers"]["main"]["cpus"])
        told, every = unit_allowed(slice_)[0], CPUSet.parse_list(cpuset("", "cpus.effective"))
        assert told in (CPUSet(), every), (told, "the slice keeps the pool numad told it")
        assert allowed(main_pid(unit))[0] == placed, (allowed(main_pid(unit)), placed)
        assert not allowed(main_pid(side))[0] & placed
        api("DELETE", "/v1/workloads/pod-wl")
    finally:
        systemctl("stop", unit, side, slice_, check=False)
    stopped = time.monotonic()
    wait_for(lambda: not directory.exists(), f"{directory} to go")
    gone_for = 0.0
    while time.monotonic() - stopped < 5 * SLOWDOWN:  # a pass (2 s) and a unit-loop round
        assert not directory.exists(), f"{slice_} was made again after its stop"
        time.sleep(0.05)
        gone_for = time.monotonic() - stopped
    failed = [
        e
        for e in events()
        if e.get("event") == "unit_record_failed"
        and e.get("timestamp", "") >= since
        and slice_ in json.dumps(e)
    ]
    assert not failed, failed  # before: one a second, for a slice systemd had unloaded
    figure(
        check="workload below an isolated slice",
        answer_s=round(answer, 3),
        cpus=str(placed),
        slice_gone_for_s=round(gone_for, 1),
    )


# -- memory follows placement ---------------------------------------------------------------

MIB = 1 << 20
ALLOCATE = """
import ctypes, sys, time
node = int(sys.argv[1])
mask = ctypes.c_ulong(1 << node)
libc = ctypes.CDLL(None, use_errno=True)
if libc.syscall(238, 1, ctypes.byref(mask), 64) != 0:  # set_mempolicy(MPOL_PREFERRED)
    raise SystemExit(f"set_mempolicy: errno {ctypes.get_errno()}")
block = bytearray(64 << 20)
for i in range(0, len(block), 4096):
    block[i] = 1
time.sleep(3600)
"""


def node_of_cpus(cpus: CPUSet) -> NodeSet:
    nodes = []
    for node in Path("/sys/devices/system/node").glob("node[0-9]*"):
        if CPUSet.parse_list((node / "cpulist").read_text()) & cpus:
            nodes.append(int(node.name[4:]))
    return NodeSet(nodes)


def anon(cgroup: str) -> dict[int, int]:
    from numad.host.pages import read_anon_by_node  # noqa: PLC0415

    return read_anon_by_node(CGROUP_ROOT / cgroup) or {}


def memory_follows(name: str, memory: str | None) -> None:
    """A service touches 64 MiB on a node numad will not place it on; admitted, at
    least 95% of it is on its own node within 10 s, and the API answers meanwhile
    (both bounds stretched by the host's measured slowdown: a busy CI host once took
    1.42 s for one answer during a move that passed alone; the answers' bound has the
    tier's 2x margin for load that grows after the slowdown was measured)."""
    cgroup = f"numad.slice/{name}.service"
    spec: dict[str, Any] = {"name": name, "cgroup": cgroup, "cpus": 1}
    if memory:
        spec["memory"] = memory
    plan = api("POST", "/v1/plan", spec)["containers"]["main"]
    target = NodeSet.parse_list(plan["mems"]) or node_of_cpus(CPUSet.parse_list(plan["cpus"]))
    with_memory = [
        int(n.name[4:])
        for n in Path("/sys/devices/system/node").glob("node[0-9]*")
        if int(n.name[4:]) not in target and _has_memory(n)
    ]
    away = min(with_memory)
    run_transient(name, sys.executable, "-c", ALLOCATE, str(away), MemoryAccounting="yes")
    wait_for(lambda: anon(cgroup).get(away, 0) >= 60 * MIB, f"64 MiB on node {away}")
    before = anon(cgroup)
    share_before = sum(before.get(n, 0) for n in target) / sum(before.values())
    baseline = [_timed_show(WORKLOAD) for _ in range(10)]
    started = time.monotonic()
    api("POST", "/v1/workloads", spec)
    answered = time.monotonic() - started
    during = []
    while True:
        now = anon(cgroup)
        share = sum(now.get(n, 0) for n in target) / (sum(now.values()) or 1)
        if share >= 0.95 or time.monotonic() - started > 10 * SLOWDOWN:
            break
        during.append(_timed_show(name))  # takes numad's lock, as an admission does
    took = time.monotonic() - started
    wait_for(lambda: api("GET", f"/v1/workloads/{name}")["state"] != "migrating", "the move")
    shown = api("GET", f"/v1/workloads/{name}")
    figure(
        check=f"memory {'static' if memory else 'pull'}",
        target=str(target),
        away=away,
        locality_before=round(share_before, 3),
        locality_after=round(share, 3),
        seconds_to_95=round(took, 2),
        admission_answered_s=round(answered, 3),
        moves=shown["memory"]["moves"],
        numad_locality=shown["memory"]["locality"],
        api_max_ms_before=round(max(baseline) * 1000),
        api_max_ms_during=round(max(during, default=0) * 1000),
        api_requests_during=len(during),
    )
    assert share >= 0.95, (f"{share:.0%} on {target} after {took:.1f} s", now, shown["memory"])
    assert shown["memory"]["locality"] >= 0.95, shown["memory"]
    assert shown["memory"]["moves"], shown["memory"]
    # 2x, as the tier's deadlines: load that grows mid-tier (a fresh-clone CI run with
    # another test beside it: 1.40 s against 1.29 s, in a move that took 8.4 s).
    bound = 2 * max(SLOWDOWN, 3 * max(baseline))
    assert max(during, default=0) <= bound, (bound, baseline, during)
    systemctl("stop", f"{name}.service")


def _has_memory(node: Path) -> bool:
    meminfo = (node / "meminfo").read_text()
    return " MemTotal:" in meminfo and not meminfo.split("MemTotal:")[1].strip().startswith("0 ")


def _timed_show(name: str) -> float:
    start = time.monotonic()
    api("GET", f"/v1/workloads/{name}")
    return time.monotonic() - start


def test_memory_follows_a_workload_whose_mems_numad_narrows() -> None:
    """Memory policy static: numad pins the memory to the placement's node."""
    memory_follows("mem-static", "32Mi")


def test_memory_is_pulled_for_a_workload_whose_mems_numad_leaves_alone() -> None:
    """No memory request, so numad restricts no mems (as under memory policy none):
    the pages are pulled onto the CPUs' node with migrate_pages(2)."""
    memory_follows("mem-pull", None)


def test_a_workload_unit_keeps_its_cpuset_across_a_restart() -> None:
    unit = f"{WORKLOAD}.service"
    before = main_pid(unit)
    systemctl("restart", unit)
    assert main_pid(unit) != before
    cpus = CPUSet.parse_list(PLACED["cpus"])
    wait_for(lambda: allowed(main_pid(unit))[0] == cpus, "the restarted unit on its CPU")
    assert WORKLOAD in workloads()
    assert cpuset(WORKLOAD_CGROUP, "cpus") == PLACED["cpus"]


def test_a_cgroup_workload_rewritten_by_daemon_reload_is_repaired_at_once() -> None:
    """Issue 23: ``daemon-reload`` makes systemd write its own cpuset into the cgroup of
    a workload declared by ``cgroup`` (systemd was told nothing of it). numad sees the
    write (inotify) and a pass woken by it repairs the cgroup, not the period's end.
    Sampled every 5 ms from before the reload: how long the cgroup's effective CPUs
    differed from numad's placement, and whether its cpuset files were there."""
    placed = PLACED["cpus"]
    directory = CGROUP_ROOT / WORKLOAD_CGROUP
    samples: list[tuple[float, str, bool]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            try:
                effective = (directory / "cpuset.cpus.effective").read_text().strip()
            except OSError:
                effective = "absent"  # the cpuset controller taken from it
            samples.append((time.monotonic(), effective, (directory / "cpuset.cpus").exists()))
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    seen = len(events())
    try:
        systemctl("daemon-reload")
        reloaded = time.monotonic()
        while time.monotonic() - reloaded < 1.0 * SLOWDOWN or samples[-1][1] != placed:
            assert time.monotonic() - reloaded < WAIT, f"not repaired: {samples[-5:]}"
            time.sleep(0.05)
    finally:
        done.set()
        sampler.join(5)
    off = [t for t, effective, _ in samples if effective != placed]
    figure(
        check="daemon-reload of a cgroup workload",
        differed_ms=round((off[-1] - off[0]) * 1e3 + 5) if off else 0,
        samples=len(samples),
        files_gone=sum(1 for *_, there in samples if not there),
        seen=sorted({e for _, e, _ in samples}),
    )
    assert cpuset(WORKLOAD_CGROUP, "cpus") == placed
    if off:  # systemd wrote it: numad saw another's write, and repaired it
        # Through journald, which may lag: waited for. Its inotify event names it
        # (``cpuset_written_elsewhere``), unless a pass that was due anyway repaired
        # it first (``cpuset_drift_repaired``; in a CI run of 2026-12-06 at 6.1 the
        # event named nothing, repaired within 284 ms all the same).
        def told() -> list[str]:
            found = []
            for e in events()[seen:]:
                if WORKLOAD_CGROUP in e.get("cgroups", []) or e.get("cgroup") == WORKLOAD_CGROUP:
                    found.append(e.get("event", ""))
            return [e for e in found if e in ("cpuset_written_elsewhere", "cpuset_drift_repaired")]

        wait_for(lambda: bool(told()), "numad to log the cgroup as written by another")
        figure(check="daemon-reload of a cgroup workload: told", events=told())


# A unit with a file of its own in db.slice (a managed root), admitted by its name.
DB_UNIT = "numad-db.service"
DB_CGROUP = f"db.slice/{DB_UNIT}"


def unit_allowed(unit: str) -> tuple[CPUSet, NodeSet]:
    """The unit's AllowedCPUs= and AllowedMemoryNodes= as ``systemctl show`` has them."""
    found = show(unit, "AllowedCPUs", "AllowedMemoryNodes")
    mems = NodeSet.parse_list(",".join(found["AllowedMemoryNodes"].split()))
    return systemd_cpus(found["AllowedCPUs"]), mems


def test_a_unit_admitted_by_name_is_followed_across_restart_stop_and_start() -> None:
    Path(f"/run/systemd/system/{DB_UNIT}").write_text(
        "[Unit]\nDescription=a database stand-in numad places by name\n"
        "[Service]\nType=exec\nSlice=db.slice\nExecStart=/bin/sleep infinity\n"
    )
    systemctl("daemon-reload")
    systemctl("start", DB_UNIT)
    numad_cli("admit", "--unit", DB_UNIT, "--cpus", "1", "--memory", "16Mi")
    found = {w.get("unit"): w for w in workloads().values()}[DB_UNIT]
    assert found["cgroup"] == DB_CGROUP, found
    main = found["containers"]["main"]
    placed = CPUSet.parse_list(main["cpus"]), NodeSet.parse_list(main["mems"])
    assert main["exclusive"], main
    assert len(placed[0]) == 1, main
    wait_for(lambda: unit_allowed(DB_UNIT) == placed, "systemctl show to give numad's placement")
    assert allowed(main_pid(DB_UNIT)) == placed
    assert (cpuset(DB_CGROUP, "cpus"), cpuset(DB_CGROUP, "mems")) == (main["cpus"], main["mems"])

    before = main_pid(DB_UNIT)
    systemctl("restart", DB_UNIT)
    assert main_pid(DB_UNIT) != before
    assert allowed(main_pid(DB_UNIT)) == placed  # at once: systemd applied it at start

    systemctl("stop", DB_UNIT)
    # (the kernel may keep the stopped unit's directory a while, busy with exiting
    # tasks: systemd no longer calls it the unit's, and numad must not wait on it)
    assert prop(DB_UNIT, "ControlGroup") == ""
    time.sleep(5 + 2 * 2 + 1)  # past release-grace-seconds and two reconcile passes
    assert found["name"] in workloads(), "a stopped unit is still the workload"
    assert unit_allowed(DB_UNIT) == placed
    assert not [p for p in api("GET", "/v1/health")["problems"] if DB_UNIT in p]

    systemctl("start", DB_UNIT)
    assert allowed(main_pid(DB_UNIT)) == placed
    figure(check="unit by name", placed=str(placed[0]), mems=str(placed[1]))
    resize_a_running_unit(found["name"], placed)

    numad_cli("release", "--unit", DB_UNIT)
    assert found["name"] not in workloads()
    shared = host_sets()[1]
    wait_for(lambda: unit_allowed(DB_UNIT)[0] == shared, "the released unit on the shared pool")
    systemctl("stop", DB_UNIT)
    wait_for(lambda: unit_allowed(DB_UNIT) == (CPUSet(), NodeSet()), "its settings reset")


def resize_a_running_unit(name: str, placed: tuple[CPUSet, NodeSet]) -> None:
    """Issue 28 item 3 on a real systemd: the running unit grown to 2 CPUs keeps its own
    and gets a second, then shrunk back to 1 of those; each time systemd's
    AllowedCPUs= and the process's allowed CPUs follow, and its process keeps running."""
    pid = main_pid(DB_UNIT)
    started = time.monotonic()
    grown = json.loads(numad_cli("resize", name, "--cpus", "2", "--json"))
    cpus = CPUSet.parse_list(grown["containers"]["main"]["cpus"])
    assert placed[0].issubset(cpus), (placed, grown)  # keeps the CPU it had
    assert len(cpus) == 2, grown
    wait_for(lambda: unit_allowed(DB_UNIT)[0] == cpus, "systemd to give the unit its 2 CPUs")
    wait_for(lambda: allowed(pid)[0] == cpus, "the unit's process on its 2 CPUs")
    grew = time.monotonic() - started
    started = time.monotonic()
    shrunk = json.loads(numad_cli("resize", name, "--cpus", "1", "--json"))
    kept = CPUSet.parse_list(shrunk["containers"]["main"]["cpus"])
    assert kept.issubset(cpus), (cpus, shrunk)
    assert len(kept) == 1, shrunk
    wait_for(lambda: unit_allowed(DB_UNIT)[0] == kept, "systemd to give the unit 1 CPU")
    wait_for(lambda: allowed(pid)[0] == kept, "the unit's process on 1 CPU")
    assert main_pid(DB_UNIT) == pid  # resized in place, never restarted
    assert CPUSet.parse_list(cpuset(DB_CGROUP, "cpus")) == kept
    figure(
        check="resize a running unit",
        grown=str(cpus),
        grow_seconds=round(grew, 2),
        shrunk=str(kept),
        shrink_seconds=round(time.monotonic() - started, 2),
    )


# -- a movable workload moved to admit another (issue 28 item 5) ---------------------------

RESERVED = CPUSet.parse_list("0")  # [cpu] reserved-cpus of CONFIG
SAMPLE = 0.05  # seconds between two samples of the processes' allowed CPUs


def free_by_node() -> dict[int, CPUSet]:
    """Each node's CPUs that no workload holds exclusively (and numad does not reserve)."""
    held = CPUSet()
    for found in workloads().values():
        for c in found["containers"].values():
            if c["exclusive"]:
                held |= CPUSet.parse_list(c["cpus"])
    out = {}
    for node in Path("/sys/devices/system/node").glob("node[0-9]*"):
        cpus = CPUSet.parse_list((node / "cpulist").read_text())
        if cpus:
            out[int(node.name[4:])] = cpus - held - RESERVED
    return out


def _hold(name: str, cpus: int) -> None:
    """A workload without a process holding ``cpus`` CPUs of one node (the lowest with room)."""
    spec = {"name": name, "cgroup": f"numad.slice/{name}.service", "cpus": cpus}
    api("POST", "/v1/workloads", {**spec, "policy": "single-numa-node"})


def test_a_movable_workload_is_moved_to_admit_another() -> None:
    """The mover (1 CPU, single-numa-node, movable) touches 64 MiB on its node; another
    node is filled to one free CPU and every other node wholly; a newcomer asking all
    of the mover's node's room fits only once the mover moves.
    Sampled every 50 ms, the newcomer's process before the mover's: the two are never
    allowed a common CPU; the mover keeps running, follows to its new CPU, and its
    memory is >= 95% on its new node within 10 s. numad places a single-numa-node
    workload on the lowest node with room: the holders steer each where it goes."""
    free = free_by_node()
    low = min(n for n in free if free[n])  # the mover's next node, one CPU free there
    high = min(n for n in free if n > low and len(free[n]) >= 2)  # the mover's first
    held = []
    for node in sorted(free):  # every node full: each hold lands on the lowest with room
        if free[node]:
            _hold(f"block{node}", len(free[node]))
            held.append(f"block{node}")
    api("DELETE", f"/v1/workloads/block{high}")
    mover: dict[str, Any] = {"name": "mover", "cgroup": "numad.slice/mover.service", "cpus": 1}
    mover |= {"memory": "80Mi", "policy": "single-numa-node", "movable": True}
    placed = CPUSet.parse_list(api("POST", "/v1/workloads", mover)["containers"]["main"]["cpus"])
    assert node_of_cpus(placed) == NodeSet([high]), placed
    api("DELETE", f"/v1/workloads/block{low}")
    if len(free[low]) > 1:  # one CPU left there (low < high: the hold lands on low)
        _hold("fill", len(free[low]) - 1)
        held.append("fill")
    run_transient("mover", sys.executable, "-c", ALLOCATE, str(high), MemoryAccounting="yes")
    cgroup = "numad.slice/mover.service"
    wait_for(lambda: anon(cgroup).get(high, 0) >= 60 * MIB, f"64 MiB on node {high}")
    free = free_by_node()
    assert len(free[low]) == 1, free
    assert not any(cpus for n, cpus in free.items() if n not in (low, high)), free
    newcomer: dict[str, Any] = {"name": "newcomer", "cgroup": "numad.slice/newcomer.service"}
    newcomer |= {"cpus": len(free[high]) + 1, "policy": "single-numa-node"}
    planned = api("POST", "/v1/plan", newcomer)
    assert [m["workload"] for m in planned["moves"]] == ["mover"], planned
    assert planned["moves"][0]["bytes"] >= 60 * MIB, planned  # from memory.numa_stat
    assert "would move mover from node" in planned["explanation"], planned
    run_transient("newcomer", "/bin/sleep", "infinity")
    pids = main_pid("newcomer.service"), main_pid("mover.service")
    # Starting a unit in the slice can reset its siblings' cpusets (systemd realizes the
    # slice's children): numad repairs the mover's at its next pass. Seen once in CI
    # (2node-6.12: the first two samples had the mover on the whole pool); the move's
    # samples start once the mover is back on its CPU.
    wait_for(lambda: allowed(pids[1])[0] == placed, "the mover's process on its CPU")
    samples: list[tuple[float, CPUSet, CPUSet]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():  # the newcomer first: granted, the mover has left already
            ours, theirs = allowed(pids[0])[0], allowed(pids[1])[0]
            samples.append((time.monotonic(), ours, theirs))
            time.sleep(SAMPLE)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    time.sleep(0.5)
    started = time.monotonic()
    answer = api("POST", "/v1/workloads", newcomer)
    granted = CPUSet.parse_list(answer["containers"]["main"]["cpus"])
    moved_to = CPUSet.parse_list(answer["moves"][0]["to"]["cpus"])
    assert placed.issubset(granted), answer  # the newcomer has the CPU the mover left
    assert moved_to.issubset(free[low]), answer
    wait_for(lambda: allowed(pids[1])[0] == moved_to, "the mover's process on its new CPU")
    wait_for(lambda: allowed(pids[0])[0] == granted, "the newcomer's process on its CPUs")
    share = 0.0
    while time.monotonic() - started < 10 * SLOWDOWN:
        now = anon(cgroup)
        share = now.get(low, 0) / (sum(now.values()) or 1)
        if share >= 0.95:
            break
        time.sleep(0.2)
    took = time.monotonic() - started
    time.sleep(1)
    done.set()
    sampler.join(timeout=WAIT)
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(samples)]
    shared = [(t, ours & theirs) for t, ours, theirs in samples if ours & theirs]
    assert not shared, shared[:5]  # never a CPU allowed to both
    after = [theirs for _, ours, theirs in samples if ours == granted]
    assert after, samples[-5:]
    assert all(not theirs & granted for theirs in after), after[:5]
    assert main_pid("mover.service") == pids[1]  # the same process, moved while running
    explained = api("GET", "/v1/workloads/newcomer/explain")["explanation"]
    assert f"moved mover from node {high} to node {low}" in explained, explained
    figure(
        check="move to admit",
        mover_from=str(placed),
        mover_to=str(moved_to),
        newcomer=str(granted),
        samples=len(samples),
        sample_gap_ms_max=round(max(gaps, default=0) * 1000),
        sample_gap_ms_median=round(sorted(gaps)[len(gaps) // 2] * 1000) if gaps else 0,
        seconds_to_95=round(took, 2),
        locality_after=round(share, 3),
        bytes_planned=planned["moves"][0]["bytes"],
    )
    assert share >= 0.95, (f"{share:.0%} on node {low} after {took:.1f} s", anon(cgroup))
    for unit in ("mover.service", "newcomer.service"):
        systemctl("stop", unit)
    for name in ("newcomer", "mover", *held):
        if name in workloads():
            api("DELETE", f"/v1/workloads/{name}")


# -- containers started with podman, numad's hook loaded from the package (one boot) -------


def _podman() -> Any:
    if not PODMAN.exists():
        pytest.skip("podman runs in one boot only (tests/vm/test_systemd_vm.py PODMAN_CASE)")
    from tests.vm.guest import podman  # noqa: PLC0415 - only in the boot that runs podman

    return podman


def _held_by(cgroup_part: str) -> dict[str, Any] | None:
    found = [w for w in workloads().values() if cgroup_part in w["cgroup"]]
    return found[0] if found else None


def test_a_podman_container_runs_on_exactly_numads_cpus_and_is_released() -> None:
    podman = _podman()
    assert (podman.HOOKS_DIR / "numad.json").is_file()  # where the package put it
    work = Path("/run/numad-vmtest/podman")
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    podman.image(work, timeout=WAIT)
    argv = podman.run_argv("vmpod", {"numad.io/cpus": "2"}, detach=True)
    cid = podman.podman(*argv, timeout=WAIT).stdout.strip()
    scope = f"libpod-{cid}.scope"

    def logged() -> str:
        return str(podman.podman("logs", "vmpod", timeout=WAIT).stdout)

    wait_for(lambda: "Cpus_allowed_list" in logged(), "the container's first line")
    held = _held_by(scope)  # while it runs
    assert held is not None, workloads()
    seen = CPUSet.parse_list(logged().split(":", 1)[1].strip())
    decided = CPUSet.parse_list(held["containers"]["main"]["cpus"])
    assert len(decided) == 2
    assert seen == decided  # what the container's process may run on: numad's CPUs
    # From the process's cgroup: crun on cgroup v2 runs it in a "container" subgroup of
    # the scope systemd made for it.
    assert held["cgroup"] == f"numad.slice/{scope}/container", held
    podman.podman("exec", "vmpod", "touch", "/done", timeout=WAIT)
    assert podman.podman("wait", "vmpod", timeout=WAIT).stdout.strip() == "0"
    wait_for(lambda: _held_by(scope) is None, "the poststop hook to release it")
    podman.podman("rm", "vmpod", timeout=WAIT)
    figure(
        check="podman",
        podman=podman.version(WAIT),
        decided=decided.format_list(),
        cpus_allowed_list=seen.format_list(),
        seconds=round(time.monotonic() - started, 1),
    )


def test_a_podman_container_numad_rejects_fails_with_numads_reason() -> None:
    podman = _podman()
    seen = {}
    for runtime in ("crun", "runc"):
        argv = podman.run_argv("vmhuge", {"numad.io/cpus": "64"}, detach=False, runtime=runtime)
        done = podman.podman(*argv, timeout=WAIT, check=False)
        seen[runtime] = done.stderr.strip()
        assert done.returncode != 0, done.stdout
        assert "Cpus_allowed_list" not in done.stdout  # its process never ran
        assert "Traceback" not in done.stderr
        assert _held_by("numad.slice/libpod-") is None
        podman.podman("rm", "--force", "vmhuge", timeout=WAIT, check=False)
    figure(check="podman rejection", **seen)
    # runc carries the hook's line in its error; crun (podman's default) drops a hook's
    # output and names only the hook, so the hook's line is also in the journal.
    assert "numad: container " in seen["runc"], seen
    assert "not placed:" in seen["runc"], seen
    assert "rejected" in seen["runc"], seen
    assert "error executing hook `/usr/bin/numad`" in seen["crun"], seen
    logged = subprocess.run(
        ["journalctl", "--no-pager", "-b", "-o", "cat", "-t", "numad-oci-hook"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    refused = [line for line in logged.splitlines() if "not placed:" in line]
    assert len(refused) == 2, logged  # one per runtime, each one line
    assert all("rejected" in line and "failing its start" in line for line in refused), logged


# -- exclusive sets as cgroup v2 remote partitions ([host] partitions, issue 23) -----------


def restart_with(config: str) -> None:
    (CONFIG_DIR / "numad.toml").write_text(config)
    systemctl("restart", UNIT)
    wait_for(answers, "numad to answer after its restart")


def first_allowed(slice_: str, name: str) -> CPUSet:
    """The CPUs a unit started now in ``slice_`` may run on at the first sample of its
    process (taken as soon as systemd names it)."""
    runner = threading.Thread(
        target=run_transient, args=(name, "sleep", "600"), kwargs={"slice_": slice_}
    )
    runner.start()
    first = None
    deadline = time.monotonic() + WAIT
    while first is None and time.monotonic() < deadline:
        with contextlib.suppress(AssertionError, ValueError, OSError):
            pid = main_pid(f"{name}.service")
            if pid:
                first = allowed(pid)[0]
        time.sleep(0.005)
    runner.join(WAIT)
    systemctl("stop", f"{name}.service")
    assert first is not None, f"{name}.service never ran"
    return first


def test_by_default_partitions_where_offered_and_permitted() -> None:
    """``[host] partitions`` left to its default, "auto". Where the kernel offers remote
    partitions (6.12), under the package's unit as shipped (it grants CAP_SYS_ADMIN),
    each exclusive grant is a partition: numad writes no other cgroup (system.slice gets
    its own setting back), the root's effective CPUs leave the exclusive ones out, the
    hog never runs there, a unit started now in numad.slice or system.slice may not run
    there from the first sample of its process, and an admission beside 1,000 and (in
    the 4-node guest) 10,000 stray cgroups is timed against one beside none (the real
    kernel's part; each stray seen by numad's inotify watch as it is made). A drop-in that
    takes CAP_SYS_ADMIN away: numad isolates one by one with no problem, and says why;
    asked for (``true``) there, the kernel's refusal is a problem naming CAP_SYS_ADMIN.
    Where the kernel offers none (6.1), numad isolates one by one and says why. Then
    back to the config without partitions: numad's stop dissolved them and it
    isolates cgroup by cgroup."""
    try:
        restart_with(BASE)
        exclusive, shared = host_sets()
        assert exclusive, "nothing exclusive: the check would prove nothing"
        if not (CGROUP_ROOT / "cpuset.cpus.isolated").is_file():
            assert api("GET", "/v1/host")["isolating"].startswith("one by one: this kernel")
            isolated_one_by_one(exclusive, shared, "auto, no partitions offered")
            assert not [p for p in api("GET", "/v1/health")["problems"] if "partition" in p]
            figure(check="partitions", offered=False)
            return
        partitioned(exclusive)
        DROP_IN.parent.mkdir(parents=True, exist_ok=True)
        DROP_IN.write_text("[Service]\nCapabilityBoundingSet=~CAP_SYS_ADMIN\n")
        systemctl("daemon-reload")
        restart_with(BASE)
        assert "lacks CAP_SYS_ADMIN" in api("GET", "/v1/host")["isolating"]
        assert not [p for p in api("GET", "/v1/health")["problems"] if "partition" in p]
        assert cpuset(WORKLOAD_CGROUP, "cpus.partition") == "member"
        exclusive, shared = host_sets()
        isolated_one_by_one(exclusive, shared, "auto without CAP_SYS_ADMIN")
        costs = {n: admission_seconds(n, partition=False) for n in (0, 1000)}
        figure(
            check="admissions isolating one by one",
            **{f"admission_ms_{n}_strays": [round(t * 1e3) for t in c] for n, c in costs.items()},
            **{f"lock_p99_within_s_{n}_strays": LOCK_P99[n] for n in costs},
            **{f"lock_wait_p99_within_s_{n}_strays": LOCK_WAIT_P99[n] for n in costs},
            **{f"reads_n_median_max_ms_{n}_strays": READS_MS[n] for n in costs},
            **{f"passes_n_mean_s_p99_within_s_{n}_strays": PASSES[n] for n in costs},
            **{f"write_ms_per_cycle_{n}_strays": WRITES_MS[n] for n in costs},
        )
        restart_with(BASE + PARTITIONS_ON)  # asked for: the kernel's own refusal
        problems = api("GET", "/v1/health")["problems"]
        assert any("CAP_SYS_ADMIN" in p for p in problems), problems
        assert cpuset(WORKLOAD_CGROUP, "cpus.partition") == "member"
        isolated_one_by_one(*host_sets(), "partitions refused: no CAP_SYS_ADMIN")
    finally:
        DROP_IN.unlink(missing_ok=True)
        systemctl("daemon-reload")
        restart_with(CONFIG)
    # numad stopped: its partitions dissolved; started without them: isolation as before.
    assert cpuset(WORKLOAD_CGROUP, "cpus.partition") == "member"
    isolated_one_by_one(*host_sets(), "after partitions were turned off")


PARTITIONS_ON = "\n[host]\npartitions = true\n"
DROP_IN = Path("/etc/systemd/system/numad.service.d/partitions.conf")


def isolated_one_by_one(exclusive: CPUSet, shared: CPUSet, when: str) -> None:
    def told() -> bool:
        return systemd_cpus(prop("system.slice", "AllowedCPUs")) == shared

    wait_for(told, f"systemd to hold numad's AllowedCPUs= for system.slice ({when})")
    hog_stays_off(exclusive, shared, when)


def partitioned(booked: CPUSet) -> None:
    """The partitions numad made, as the kernel holds them: every booked exclusive CPU
    is in one (a workload's cgroup's, or numad's holding cgroup's for a workload not
    running)."""
    problems = api("GET", "/v1/health")["problems"]
    assert not [p for p in problems if "partition" in p], problems
    assert cpuset(WORKLOAD_CGROUP, "cpus.partition") == "root"
    assert cpuset(WORKLOAD_CGROUP, "cpus.exclusive") == PLACED["cpus"]
    assert allowed(main_pid(f"{WORKLOAD}.service"))[0] == CPUSet.parse_list(PLACED["cpus"])
    view = api("GET", "/v1/host")
    assert view["isolating"] == "partitions", view["isolating"]
    assert view["isolated"] == [], view["isolated"]  # no cgroup written one by one
    exclusive = CPUSet()
    for made in view["partitions"]:
        assert made["state"] == "root", made
        exclusive |= CPUSet.parse_list(made["exclusive"])
    assert exclusive == booked, (exclusive, booked)
    assert CPUSet.parse_list(PLACED["cpus"]).issubset(exclusive)
    root = CPUSet.parse_list(cpuset("", "cpus.effective"))
    assert not root & exclusive, (root, exclusive)
    assert not CPUSet.parse_list(cpuset("system.slice", "cpus.effective")) & exclusive
    seen = []
    with hog_running() as pid:
        assert not allowed(pid)[0] & exclusive, allowed(pid)
        for _ in range(300):
            seen.append(processor(pid))
            time.sleep(0.002)
    assert not CPUSet(seen) & exclusive, (seen, exclusive)
    firsts = {s: first_allowed(s, f"part-{s.split('.')[0]}") for s in SLICES}
    for slice_, first in firsts.items():
        assert not first & exclusive, (slice_, first, exclusive)
    costs = {n: admission_seconds(n) for n in stray_counts()}
    figure(
        check="partitions",
        offered=True,
        exclusive=str(exclusive),
        booked=str(booked),
        root_effective=str(root),
        hog_samples=len(seen),
        hog_seen=str(CPUSet(seen)),
        **{f"first_allowed_{s}": str(c) for s, c in firsts.items()},
        **{f"admission_ms_{n}_strays": [round(t * 1e3) for t in c] for n, c in costs.items()},
        **{f"lock_p99_within_s_{n}_strays": LOCK_P99[n] for n in costs},
        **{f"lock_wait_p99_within_s_{n}_strays": LOCK_WAIT_P99[n] for n in costs},
        **{f"reads_n_median_max_ms_{n}_strays": READS_MS[n] for n in costs},
        **{f"passes_n_mean_s_p99_within_s_{n}_strays": PASSES[n] for n in costs},
        **{f"write_ms_per_cycle_{n}_strays": WRITES_MS[n] for n in costs},
    )


SLICES = ("numad.slice", "system.slice")
# 10,000 strays only in a guest of 1.5 GiB (the 4-node one). The 768 MiB 2-node guest
# runs out of memory with them, the kernel's own: each stray in numad.slice gets the
# cpuset, memory and pids controllers systemd enables there, about 43 KiB of unreclaimable
# slab and per-CPU memory each (measured 2026-12-04, 6.12: MemAvailable 389 MB -> 0 at
# 9,204 cgroups, while numad's RSS stayed 41-50 MB; the guest then thrashed and
# numad.service failed to start again).
MANY_STRAYS_FROM_KIB = 1_400_000


def stray_counts() -> tuple[int, ...]:
    total = Path("/proc/meminfo").read_text().split("MemTotal:")[1].split()[0]
    return (0, 1000, 10000) if int(total) >= MANY_STRAYS_FROM_KIB else (0, 1000)


def admission_seconds(strays: int, cycles: int = 5, *, partition: bool = True) -> list[float]:
    """Each of ``cycles`` admissions of a 1-CPU workload (the API's answer, with its
    partition made, or every stray written) beside ``strays`` empty cgroups made in
    numad.slice first: with partitions, the real kernel's part of a partition change,
    which walks every cpuset. A client reads the workloads every 10 ms meanwhile: each
    read is answered (``Reader``); its times and the lock's waits are recorded."""
    slice_ = CGROUP_ROOT / "numad.slice"
    made = [slice_ / f"stray{i}" for i in range(strays)]
    for d in [*made, slice_ / "pt"]:
        d.mkdir(exist_ok=True)
    if not partition:  # each isolated on its appearance (the event path) first

        def isolated() -> bool:
            return all((d / "cpuset.cpus").read_text().strip() for d in made)

        wait_for(isolated, f"numad to isolate {strays} new cgroups")
    out = []
    before = histogram("numad_lock_held_seconds")
    waits_before = histogram("numad_lock_wait_seconds")
    passes_before = histogram("numad_reconcile_duration_seconds")
    writes_before = {k: histogram(WRITE_SECONDS, f'kind="{k}"')[2] for k in WRITE_KINDS}
    reader = Reader()
    try:
        for _ in range(cycles):
            start = time.monotonic()
            api("POST", "/v1/workloads", {"name": "pt", "cgroup": "numad.slice/pt", "cpus": 1})
            out.append(time.monotonic() - start)
            state = "root" if partition else "member"
            assert cpuset("numad.slice/pt", "cpus.partition") == state
            granted = CPUSet.parse_list(cpuset("numad.slice/pt", "cpus.effective"))
            for d in made[:: max(1, strays // 20)]:
                assert not CPUSet.parse_list((d / "cpuset.cpus.effective").read_text()) & granted
            api("DELETE", "/v1/workloads/pt")
        # The daemon's lock over these admissions and releases (and any pass meanwhile):
        # numad lets go of it around its cgroup writes, the kernel's walk included.
        LOCK_P99[strays] = p99_since("numad_lock_held_seconds", before)
        reads = reader.stop()
        # What takers of the lock waited (the reader's requests, the changes, any pass):
        # a reader waits at most 50 ms for a change's writes, then gets in beside them.
        LOCK_WAIT_P99[strays] = p99_since("numad_lock_wait_seconds", waits_before)
        # The reconcile passes meanwhile, each a walk of the managed roots: count, mean
        # seconds, p99 bucket.
        passes = histogram("numad_reconcile_duration_seconds")
        count = passes[1] - passes_before[1]
        PASSES[strays] = [
            count,
            round((passes[2] - passes_before[2]) / count, 3) if count else 0.0,
            p99_since("numad_reconcile_duration_seconds", passes_before, passes),
        ]
        # The cpuset writes' own time (the kernel's part: with partitions, its walk at
        # each partition change), per cycle: the grants (one per admission), and the
        # shared writes (the strays shrunk and grown again one by one; a release's).
        WRITES_MS[strays] = {
            k: round((histogram(WRITE_SECONDS, f'kind="{k}"')[2] - writes_before[k]) / cycles * 1e3)
            for k in WRITE_KINDS
        }
        READS_MS[strays] = [
            len(reads),
            round(sorted(reads)[len(reads) // 2] * 1e3),
            round(max(reads) * 1e3),
        ]
    finally:
        reader.halt()
        for d in [*made, slice_ / "pt"]:
            with contextlib.suppress(OSError):
                d.rmdir()
    return out


LOCK_P99: dict[int, float] = {}  # strays -> the lock's p99 bucket over admission_seconds
LOCK_WAIT_P99: dict[int, float] = {}  # strays -> the p99 bucket of the waits for it
READS_MS: dict[int, list[int]] = {}  # strays -> the reader's reads: count, median, max (ms)
PASSES: dict[int, list[float]] = {}  # strays -> passes during admission_seconds (see there)
WRITES_MS: dict[int, dict[str, int]] = {}  # strays -> cpuset writes' ms per cycle, by kind
WRITE_SECONDS, WRITE_KINDS = "numad_cgroup_write_seconds", ("grant", "shared")


class Reader:
    """A client reading ``/v1/workloads`` every 10 ms meanwhile (a dashboard): every
    read must be answered, whatever the changes beside it write."""

    def __init__(self) -> None:
        self.took: list[float] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            start = time.monotonic()
            try:
                api("GET", "/v1/workloads")
            except (NumadError, OSError) as err:
                self.errors.append(str(err))
                continue
            self.took.append(time.monotonic() - start)

    def halt(self) -> None:
        self._stop.set()
        self._thread.join(CALL + 5)

    def stop(self) -> list[float]:
        """The reads' times, once the reader has stopped; every read was answered."""
        self.halt()
        assert not self._thread.is_alive(), "a read beside the changes never ended"
        assert not self.errors, self.errors[:3]
        assert self.took, "no read was made beside the changes"
        return self.took


def test_a_hung_numad_is_restarted_by_the_watchdog() -> None:
    before = show(UNIT, "MainPID", "NRestarts")
    hung = int(before["MainPID"])
    os.kill(hung, signal.SIGSTOP)  # alive, pinging nobody

    def restarted() -> bool:
        now = show(UNIT, "MainPID", "NRestarts", "ActiveState")
        return (
            int(now["NRestarts"]) > int(before["NRestarts"])
            and now["ActiveState"] == "active"
            and int(now["MainPID"]) not in (0, hung)
        )

    # WatchdogSec=30, SIGABRT, RestartSec=2s, then a start under emulation.
    wait_for(restarted, "systemd to restart the hung numad", timeout=150 * SLOWDOWN)
    assert "Watchdog timeout" in journal(UNIT), journal(UNIT)[-3000:]
    assert not Path(f"/proc/{hung}").exists()
    assert answers(), "active means READY=1: the new numad answers at once"
    main = workloads()[WORKLOAD]["containers"]["main"]
    assert (main["cpus"], main["mems"]) == (PLACED["cpus"], PLACED["mems"])
    assert cpuset(WORKLOAD_CGROUP, "cpus") == PLACED["cpus"]
    assert allowed(main_pid(f"{WORKLOAD}.service"))[0] == CPUSet.parse_list(PLACED["cpus"])
    hog_stays_off(*host_sets(), "after numad restarted")


def test_a_workload_unit_stopped_for_good_is_released() -> None:
    systemctl("stop", f"{WORKLOAD}.service")
    # release-grace-seconds = 5: a restart keeps it, a stop for good does not.
    wait_for(lambda: WORKLOAD not in workloads(), "numad to release the stopped unit's workload")


def histogram(metric: str, where: str = "") -> tuple[dict[float, float], float, float]:
    """One of numad's histograms as scraped now, summed over labels (those of series
    naming ``where``, e.g. ``kind="grant"``): the cumulative count per bucket bound,
    the count, the sum."""
    address = api("GET", "/v1/health")["metrics"]
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=30) as answer:
        text = answer.read().decode()
    buckets: dict[float, float] = {}
    count = total = 0.0
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if where not in name:
            continue
        if name.startswith(f"{metric}_bucket"):
            bound = name.split('le="', 1)[1].split('"', 1)[0]
            buckets[float(bound)] = buckets.get(float(bound), 0.0) + float(value)
        elif name.startswith(f"{metric}_count"):
            count += float(value)
        elif name.startswith(f"{metric}_sum"):
            total += float(value)
    return buckets, count, total


Scrape = tuple[dict[float, float], float, float]  # ``histogram``'s: buckets, count, sum


def p99_since(metric: str, before: Scrape, after: Scrape | None = None) -> float:
    """The p99 bucket of the observations ``metric`` made since ``before`` was scraped,
    up to ``after`` (scraped now where not given)."""
    after = histogram(metric) if after is None else after
    grown = {b: n - before[0].get(b, 0.0) for b, n in after[0].items()}
    return p99_within(grown, after[1] - before[1])


def p99_within(buckets: dict[float, float], count: float) -> float:
    """The bucket bound 99% of the observations came within."""
    return min((b for b, n in buckets.items() if n >= 0.99 * count), default=float("inf"))


def systemd_reply_times() -> dict[str, float]:
    """numad's histogram of systemd's reply times (issue 24 item 15: slow or lost?),
    summed over members: calls answered, seconds in all, and the bucket bound 99%
    of replies came within."""
    buckets, count, total = histogram("numad_systemd_reply_seconds")
    return {"answered": count, "seconds": round(total, 3), "p99_within": p99_within(buckets, count)}


def test_stop_is_clean() -> None:
    replies = systemd_reply_times()
    figure(check="systemd reply times", **replies)
    assert replies["answered"] > 0, replies  # numad asked systemd, and timed each answer
    systemctl("stop", UNIT)
    state = show(UNIT, "ActiveState", "Result", "ExecMainStatus", "MainPID")
    assert state == {
        "ActiveState": "inactive",
        "Result": "success",
        "ExecMainStatus": "0",
        "MainPID": "0",
    }, state
    assert "daemon_stopped" in [e["event"] for e in events()]
    assert not Path(SOCKET).parent.exists()  # RuntimeDirectory= removed with the unit
    assert "Traceback" not in journal(UNIT)
    # numad gave system.slice every CPU back: the hog may use every CPU again. It had
    # no AllowedCPUs=, but v2 refuses an empty cpuset.cpus to a cgroup with tasks, and
    # systemd's reset failed and was logged on every stop: the property now says what
    # the cgroup holds, and systemd has nothing to fail at.
    online = CPUSet.parse_list(Path("/sys/devices/system/cpu/online").read_text())
    assert CPUSet.parse_list(prop("system.slice", "AllowedCPUs")) == online
    for unit in ("system.slice", "init.scope"):  # its own cgroup's (not its units')
        failed = [
            line
            for line in journal(unit).splitlines()
            if f"on '/{unit}'" in line and "No space left on device" in line
        ]
        assert not failed, failed
    with hog_running() as hog:
        assert allowed(hog)[0] == online
        seen = CPUSet(processor(hog) for _ in range(100))
    figure(check="hog after numad stopped", cpus_seen=str(seen), online=str(online))
    systemctl("stop", f"{HOG}.service")
