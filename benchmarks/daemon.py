"""Admission latency, idle CPU time and peak memory of a real `numad serve`, against targets.

Run from the repository root:

    .venv/bin/python benchmarks/daemon.py [--cycles N] [--idle-seconds N] [--policy P]

A quick run: ``--cycles 100 --idle-seconds 5`` (the idle share is then coarse:
/proc counts CPU time in 10 ms ticks).

The daemon is a ``python -m numad serve --root DIR --config FILE --socket PATH``
subprocess, as in tests/test_daemon_e2e.py, on the recorded 2-socket machine
32intel64-2p8co2t+8ve (2 NUMA nodes x 8 cores x 2 threads, 8 NEC vector
engines on node 0), unpacked into a temporary directory; the daemon lays out
a scratch cgroup v2 tree under it. Config: the topology policy (default
single-numa-node), 2 reserved CPUs, memory policy none, and the vector-engine
device class (PCI class prefix 0x0b40). Its log goes to a file in the same
directory. The benchmark talks to it only over the Unix socket, as the CLI does.

1. Admission latency. Two resident workloads are admitted first: web (500m,
   in the shared pool) and db (2 exclusive CPUs and a vector engine), so every
   admission shrinks and every release grows a shared cgroup. Then each cycle
   admits a workload of 1-8 exclusive CPUs (one in four also takes 1 or 2
   vector engines) into one of four cgroups made beforehand, checks the
   answer against the cgroup's cpuset.cpus, and releases it. Each request is
   timed in the client, end to end: connect, HTTP over the socket, the
   daemon's decision, checkpoint and cgroup writes, and the parsed answer.
   5 warm-up cycles are not timed. Also shown: the daemon's own CPU time per
   cycle, and how much of the time tasks on the host waited for a CPU
   (/proc/pressure/cpu): on a loaded host the latency grows with the wait,
   and on slow storage with the checkpoint's two fsyncs per change.
2. Idle CPU. With web and db admitted, the daemon is left alone; its
   utime + stime from /proc/PID/stat, as a share of one core. The context
   switches of all its threads (/proc/PID/task/*/status) show how often it wakes.
3. Peak RSS. VmHWM from /proc/PID/status after both (1 MB = 10^6 bytes).

The daemon is stopped with SIGTERM at the end; it is killed if the script
fails, and it gets SIGKILL (PR_SET_PDEATHSIG) if the script itself dies.

Exit status: 0 if every target passed, 1 if the daemon failed (did not start,
answered wrongly, died, did not stop on SIGTERM), 2 if a target failed.
"""

from __future__ import annotations

import argparse
import ctypes
import http.client
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from numad.cli.client import request
from numad.cli.demo import CONFIG as DEMO_CONFIG
from numad.cli.demo import MACHINE
from numad.cpuset import CPUSet
from numad.errors import NumadError
from numad.host.scratch import scratch_mkdir
from numad.topology.record import load_fixture

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "sysfs"
# The demo's machine and config, with the policy to be filled in.
CONFIG = DEMO_CONFIG.replace('policy = "single-numa-node"', 'policy = "{policy}"')
POLICIES = ("single-numa-node", "best-effort")
RESIDENTS: tuple[dict[str, Any], ...] = (
    {"name": "web", "cgroup": "numad.slice/web", "cpus": "500m"},
    {"name": "db", "cgroup": "numad.slice/db", "cpus": 2, "devices": {"vector-engine": 1}},
)
SLOTS = tuple(f"numad.slice/bench-{i}" for i in range(4))  # cgroups the cycles rotate over
MAX_CPUS = 8  # exclusive CPUs per cycle, drawn uniformly from 1 to this
DEVICE_SHARE = 0.25  # share of cycles that also take 1 or 2 vector engines
WARM_UP = 5  # untimed cycles before the timed ones
ADMIT_P99_MS = 20.0  # target: at most
IDLE_CPU_PCT = 0.5  # target: under
PEAK_RSS_MB = 80.0  # target: under
START_SECONDS = 30.0  # until /v1/health says ready
STOP_SECONDS = 20.0  # after SIGTERM, before SIGKILL
REQUEST_SECONDS = 10.0
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
SEED = 20260301


@dataclass(frozen=True, slots=True)
class Latency:
    runs: int
    p50_ms: float
    p99_ms: float
    mean_ms: float
    max_ms: float

    @classmethod
    def of(cls, seconds: Sequence[float]) -> Latency:
        ms = sorted(s * 1000 for s in seconds)
        p50, p99 = (ms[math.ceil(q * len(ms)) - 1] for q in (0.5, 0.99))  # nearest rank
        return cls(len(ms), p50, p99, statistics.fmean(ms), ms[-1])

    def line(self) -> str:
        return (
            f"p50 {self.p50_ms:7.2f} ms  p99 {self.p99_ms:7.2f} ms  "
            f"mean {self.mean_ms:7.2f} ms  max {self.max_ms:7.2f} ms  ({self.runs} requests)"
        )


@dataclass(frozen=True, slots=True)
class Idle:
    seconds: float
    cpu_seconds: float
    switches: int  # context switches, voluntary or not, of the daemon's threads

    @property
    def percent(self) -> float:
        return 100 * self.cpu_seconds / self.seconds


@dataclass(frozen=True, slots=True)
class Cycles:
    admit: Latency
    release: Latency
    daemon_cpu_ms: float  # the daemon's utime + stime per timed cycle
    stalled: float | None  # share of the time some task waited for a CPU (PSI); None: no PSI


def _die_with_parent(parent: int) -> Callable[[], None]:
    """A preexec_fn: the child gets SIGKILL when this script dies, however it dies."""

    def arm() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL) != 0 or os.getppid() != parent:
            os._exit(111)  # cannot be tied to the parent, or the parent is already gone

    return arm


def _exit_on_signal(signum: int, _frame: object) -> None:
    """SIGTERM ends the script through its finally clauses: daemon killed, temp dir removed."""
    raise SystemExit(128 + signum)


class Numad:
    """One `numad serve` process on the machine under ``root``, logging to ``log``."""

    def __init__(self, root: Path, config: Path, log: Path) -> None:
        self.root = root
        self.config = config
        self.log = log
        self.socket = str(root / "numad.sock")
        self.cgroups = root / "sys" / "fs" / "cgroup"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is not None:
            self.fail(f"exited with status {self.proc.returncode}")
        return self.proc.pid

    def start(self) -> None:
        command = [sys.executable, "-m", "numad", "serve", "--root", str(self.root)]
        command += ["--config", str(self.config), "--socket", self.socket]
        with self.log.open("ab") as log:
            # S603: our own interpreter and arguments.
            self.proc = subprocess.Popen(  # noqa: S603
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                # PLW1509: this script starts no threads, so the child cannot deadlock.
                preexec_fn=_die_with_parent(os.getpid()),  # noqa: PLW1509
            )
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            self.pid  # noqa: B018 - fails at once if the daemon exited
            try:
                if request(self.socket, "GET", "/v1/health", timeout=2).get("ready"):
                    return
            except (NumadError, OSError, http.client.HTTPException, ValueError):
                pass  # not listening yet
            time.sleep(0.05)
        self.fail(f"not ready after {START_SECONDS:g} s")

    def call(self, method: str, path: str, body: str | None = None) -> dict[str, Any]:
        try:
            return request(self.socket, method, path, body, timeout=REQUEST_SECONDS)
        except (NumadError, OSError, http.client.HTTPException, ValueError) as err:
            self.fail(f"{method} {path}: {err}")

    def fail(self, problem: str) -> NoReturn:
        tail = self.log.read_text(errors="replace").splitlines()[-10:]
        raise SystemExit("numad serve: " + problem + "\nlast log lines:\n" + "\n".join(tail))

    def stop(self) -> tuple[int | None, float]:
        """SIGTERM; the exit status (None: killed after STOP_SECONDS) and the time it took."""
        assert self.proc is not None
        start = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            status: int | None = self.proc.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            status = None
            self.kill()
        return status, time.monotonic() - start

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of ``pid``: fields 14 and 15 of /proc/PID/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # after the command name, which may hold ")"
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def status_field(path: Path, key: str) -> int:
    """The number of ``key`` in a /proc status file (``VmHWM:  51200 kB`` -> 51200)."""
    for line in path.read_text().splitlines():
        name, _, value = line.partition(":")
        if name == key:
            return int(value.split()[0])
    raise SystemExit(f"{path}: no {key} line")


def context_switches(pid: int) -> dict[int, int]:
    """Context switches, voluntary or not, of each thread of ``pid`` (by thread id)."""
    counts = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        status = task / "status"
        try:
            voluntary = status_field(status, "voluntary_ctxt_switches")
            counts[int(task.name)] = voluntary + status_field(status, "nonvoluntary_ctxt_switches")
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended meanwhile (ENOENT, or ESRCH once opened)
    return counts


def cycle_spec(name: str, cgroup: str, rng: random.Random) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": name, "cgroup": cgroup, "cpus": rng.randint(1, MAX_CPUS)}
    if rng.random() < DEVICE_SHARE:
        spec["devices"] = {"vector-engine": rng.randint(1, 2)}
    return spec


def check_admitted(numad: Numad, spec: dict[str, Any], answer: dict[str, Any]) -> None:
    """The CPUs and engines asked for, and the same CPUs in the cgroup's cpuset.cpus."""
    main = answer["containers"]["main"]
    cpus = CPUSet.parse_list(main["cpus"])
    engines = len(main["devices"].get("vector-engine", ()))
    wanted = spec.get("devices", {}).get("vector-engine", 0)
    written = CPUSet.parse_list((numad.cgroups / spec["cgroup"] / "cpuset.cpus").read_text())
    if answer["admitted"] and len(cpus) == spec["cpus"] and engines == wanted and written == cpus:
        return
    numad.fail(
        f"{spec['name']}: asked for {spec['cpus']} CPUs and {wanted} engines, got "
        f"{cpus.format_list() or 'no CPUs'} and {engines} engines; "
        f"{spec['cgroup']} has {written.format_list()}"
    )


def cpu_stall_us() -> int | None:
    """Microseconds in which some runnable task waited for a CPU, since boot (PSI)."""
    try:
        some = Path("/proc/pressure/cpu").read_text().splitlines()[0]
    except (OSError, IndexError):
        return None
    return int(some.rpartition("total=")[2])


def cycle(numad: Numad, spec: dict[str, Any]) -> tuple[float, float]:
    """Admit ``spec``, check the answer, release it; the two request times."""
    body = json.dumps(spec)
    start = time.perf_counter()
    answer = numad.call("POST", "/v1/workloads", body)
    admitted = time.perf_counter()
    check_admitted(numad, spec, answer)
    start_release = time.perf_counter()
    numad.call("DELETE", f"/v1/workloads/{spec['name']}")
    return admitted - start, time.perf_counter() - start_release


def run_cycles(numad: Numad, cycles: int, rng: random.Random) -> Cycles:
    """``cycles`` timed admit/release cycles after the warm-up."""
    for i in range(WARM_UP):
        cycle(numad, cycle_spec(f"warm-{i}", SLOTS[i % len(SLOTS)], rng))
    cpu, stall, start = cpu_seconds(numad.pid), cpu_stall_us(), time.monotonic()
    times = [
        cycle(numad, cycle_spec(f"cycle-{i}", SLOTS[i % len(SLOTS)], rng)) for i in range(cycles)
    ]
    wall, stall_after = time.monotonic() - start, cpu_stall_us()
    cpu_ms = (cpu_seconds(numad.pid) - cpu) * 1000 / cycles
    stalled = None if stall is None or stall_after is None else (stall_after - stall) / 1e6 / wall
    admits, releases = zip(*times, strict=True)
    return Cycles(Latency.of(admits), Latency.of(releases), cpu_ms, stalled)


def measure_idle(numad: Numad, seconds: float) -> Idle:
    """CPU time and context switches over ``seconds`` of no requests.

    Switches count for the threads alive at both ends (the API's handler
    threads of the last requests may still be ending at the start).
    """
    pid = numad.pid
    cpu, switches, start = cpu_seconds(pid), context_switches(pid), time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - start
    pid = numad.pid  # fails if the daemon died meanwhile
    cpu, after = cpu_seconds(pid) - cpu, context_switches(pid)
    return Idle(wall, cpu, sum(after[t] - switches[t] for t in after.keys() & switches.keys()))


def measure(numad: Numad, args: argparse.Namespace) -> tuple[Latency, Idle, float]:
    """Start the daemon, run the three measurements, stop it; print as it goes."""
    numad.start()
    for cgroup in (*SLOTS, *(spec["cgroup"] for spec in RESIDENTS)):
        scratch_mkdir(numad.cgroups, cgroup)  # what systemd would do
    for spec in RESIDENTS:
        numad.call("POST", "/v1/workloads", json.dumps(spec))
    rng = random.Random(args.seed)  # noqa: S311 (a reproducible workload, not a secret)
    cycles = run_cycles(numad, args.cycles, rng)
    print(f"admit    {cycles.admit.line()}")
    print(f"release  {cycles.release.line()}")
    stalled = "no PSI" if cycles.stalled is None else f"{cycles.stalled:.0%} of the time"
    print(
        f"load     daemon CPU {cycles.daemon_cpu_ms:.2f} ms per cycle (admit + release); "
        f"tasks waiting for a CPU meanwhile (PSI cpu some): {stalled}"
    )
    idle = measure_idle(numad, args.idle_seconds)
    print(
        f"idle     {idle.cpu_seconds:.2f} s CPU in {idle.seconds:.1f} s = {idle.percent:.3f} % "
        f"of a core; {idle.switches / idle.seconds:.1f} context switches/s"
    )
    status = Path(f"/proc/{numad.pid}/status")
    peak_mb, rss_mb = (status_field(status, key) * 1024 / 1e6 for key in ("VmHWM", "VmRSS"))
    print(f"memory   VmHWM {peak_mb:.1f} MB, VmRSS {rss_mb:.1f} MB")
    code, took = numad.stop()
    if code != 0:
        numad.fail(f"SIGTERM: {'still running' if code is None else f'exit status {code}'}")
    print(f"stopped  on SIGTERM in {took:.2f} s, exit status 0\n")
    return cycles.admit, idle, peak_mb


def target(label: str, value: float, unit: str, limit: float, *, at_most: bool = False) -> bool:
    """Print one target line; ``at_most``: the limit itself passes."""
    passed = value <= limit if at_most else value < limit
    verdict = f"{'<=' if at_most else '<'} {limit:g} {unit}: {'PASS' if passed else 'FAIL'}"
    print(f"  {label:<40}{value:8.2f} {unit:<3} target {verdict}")
    return passed


def report(admit: Latency, idle: Idle, peak_mb: float) -> bool:
    """One line per target; True if all pass."""
    print("targets:")
    idle_label = f"idle CPU over {idle.seconds:.0f} s, share of a core"
    passed = [
        target("admission p99, client end to end", admit.p99_ms, "ms", ADMIT_P99_MS, at_most=True),
        target(idle_label, idle.percent, "%", IDLE_CPU_PCT),
        target("peak RSS (VmHWM)", peak_mb, "MB", PEAK_RSS_MB),
    ]
    return all(passed)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cycles", type=int, default=1000, help="timed admit/release cycles")
    parser.add_argument("--idle-seconds", type=float, default=60.0, help="idle measurement")
    parser.add_argument("--policy", choices=POLICIES, default=POLICIES[0])
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args()
    if args.cycles < 1 or args.idle_seconds <= 0:
        parser.error("--cycles and --idle-seconds must be positive")
    print(
        f"numad daemon benchmark (seed {args.seed}): {MACHINE}, policy {args.policy}, "
        f"{args.cycles} admit/release cycles, {args.idle_seconds:g} s idle\n"
    )
    signal.signal(signal.SIGTERM, _exit_on_signal)
    with tempfile.TemporaryDirectory(prefix="numad-bench-") as tmp:
        root = load_fixture(FIXTURES / f"{MACHINE}.tar.bz2", Path(tmp))
        config = Path(tmp) / "numad.toml"
        config.write_text(CONFIG.format(policy=args.policy))
        numad = Numad(root, config, Path(tmp) / "numad.log")
        try:
            results = measure(numad, args)
        finally:
            numad.kill()  # never outlive the script
    if not report(*results):
        sys.exit(2)


if __name__ == "__main__":
    main()
