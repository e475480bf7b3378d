"""Admission latency through the API while numad moves a large workload's memory.

Run from the repository root (needs what the VM tier needs: QEMU, the cached
Debian kernel; ``scripts/check`` installs them as root):

    .venv/bin/python benchmarks/migration.py [--mib 400] [--kernel 6.12]

Page migration needs a kernel with two NUMA nodes holding memory, so the
measurement runs in a QEMU guest (2 nodes x 2 CPUs x 768 MiB, TCG where KVM is
not usable), booted by tests/vm/harness.py, which runs this script again inside
with ``--in-guest``. There:

1. a process in cgroup ``numad.slice/hog`` (cpuset.mems 1) allocates and touches
   ``--mib`` MiB: its anonymous memory sits on node 1 (memory.numa_stat);
2. ``numad serve`` starts on the guest's real /sys and cgroup v2 tree (memory
   policy static, single-numa-node);
3. baseline: admit and release a 1-CPU workload (``numad.slice/w0..w3``) through
   the API socket, each request timed in the client, end to end;
4. ``hog`` is admitted for 1 CPU and ``--mib`` MiB: numad places it on node 0,
   answers, and its background mover narrows cpuset.mems to 0, which makes the
   kernel move the pages inside that write; the same admit/release cycle runs
   meanwhile, and the requests that start while ``numad show hog`` says
   ``migrating`` are the "during" sample;
5. printed: both samples' p50/p99, the bytes moved and the time the move took
   (numad's own report), the hog's locality before and after.

Target: the p99 of admissions during the move is at most twice the baseline
p99 measured in the same guest, so the move does not stall numad (the host
target of benchmarks/daemon.py, 20 ms, is for a host, not for emulated CPUs
10-30x slower), and at least 95% of the pages end on node 0.

Exit status: 0 if the targets passed, 1 if the run failed, 2 if a target failed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CG = Path("/sys/fs/cgroup")
WORK = Path("/tmp/numad-bench")  # noqa: S108 - the guest's own tmpfs
SOCKET = str(WORK / "numad.sock")
HOG = """
import os, sys, time
open(sys.argv[1], "w").write(str(os.getpid()))
block = bytearray(int(sys.argv[2]) << 20)
for i in range(0, len(block), 4096):
    block[i] = 1
print("ready", flush=True)
time.sleep(3600)
"""
CONFIG = f"""
[topology]
policy = "single-numa-node"
[cpu]
reserved-cpus = "0"
[memory]
policy = "static"
[paths]
state-dir = "{WORK}/state"
socket = "{SOCKET}"
workloads-dir = "{WORK}/workloads.d"
[daemon]
reconcile-seconds = 2
[metrics]
port = 0
"""


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]


def anon(path: Path) -> dict[int, int]:
    from numad.host.pages import read_anon_by_node  # noqa: PLC0415 - guest only

    return read_anon_by_node(path) or {}


def guest(mib: int) -> int:
    from numad.cli.client import request  # noqa: PLC0415 - guest only

    WORK.mkdir(parents=True, exist_ok=True)
    (WORK / "numad.toml").write_text(CONFIG)
    (CG / "cgroup.subtree_control").write_text("+cpuset +memory")
    slice_ = CG / "numad.slice"
    slice_.mkdir(exist_ok=True)
    (slice_ / "cgroup.subtree_control").write_text("+cpuset +memory")
    for name in ("hog", "w0", "w1", "w2", "w3"):
        (slice_ / name).mkdir(exist_ok=True)
    (slice_ / "hog/cpuset.mems").write_text("1")
    hog = subprocess.Popen(  # noqa: S603 - our own interpreter and script
        [sys.executable, "-c", HOG, str(slice_ / "hog/cgroup.procs"), str(mib)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert hog.stdout is not None
    if hog.stdout.readline().strip() != "ready":
        print("the hog did not start")
        return 1
    before = anon(slice_ / "hog")
    log = (WORK / "serve.log").open("wb")
    numad = subprocess.Popen(  # noqa: S603 - numad itself
        [sys.executable, "-m", "numad", "serve", "--config", str(WORK / "numad.toml")],
        stdout=log,
        stderr=log,
    )
    try:
        return measure(request, mib, before, slice_)
    finally:
        numad.terminate()
        numad.wait(60)
        hog.kill()
        print((WORK / "serve.log").read_text(errors="replace")[-1500:], file=sys.stderr)


def wait_ready(request: Any) -> bool:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if request(SOCKET, "GET", "/v1/health", timeout=5).get("ready"):
                return True
        except Exception:  # noqa: BLE001, S110 - not up yet
            pass
        time.sleep(0.5)
    return False


class Load:
    """Admit and release a 1-CPU workload in a loop on its own thread; each request's
    start time and duration (ms), client end to end."""

    def __init__(self, request: Any) -> None:
        self.request = request
        self.samples: list[tuple[float, float]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run)

    def one(self, i: int) -> None:
        name = f"w{i % 4}"
        spec = json.dumps({"name": name, "cgroup": f"numad.slice/{name}", "cpus": 1})
        for method, path, body in (
            ("POST", "/v1/workloads", spec),
            ("DELETE", f"/v1/workloads/{name}", None),
        ):
            start = time.monotonic()
            self.request(SOCKET, method, path, body, timeout=120)
            self.samples.append((start, (time.monotonic() - start) * 1000))

    def _run(self) -> None:
        i = 0
        while not self.stop.is_set():
            self.one(i)
            i += 1

    def between(self, begin: float, end: float) -> list[float]:
        return [ms for start, ms in self.samples if begin <= start < end]


def measure(request: Any, mib: int, before: dict[int, int], slice_: Path) -> int:
    if not wait_ready(request):
        print("numad serve did not become ready")
        return 1
    load = Load(request)
    for i in range(20):
        load.one(i)
    baseline = [ms for _, ms in load.samples]
    load.samples.clear()
    spec = {"name": "hog", "cgroup": "numad.slice/hog", "cpus": 1, "memory": f"{mib}Mi"}
    begin = time.monotonic()
    request(SOCKET, "POST", "/v1/workloads", json.dumps(spec), timeout=120)
    answered_ms = (time.monotonic() - begin) * 1000
    load.thread.start()
    while request(SOCKET, "GET", "/v1/workloads/hog", timeout=120)["state"] == "migrating":
        time.sleep(0.05)
    end = time.monotonic()
    load.stop.set()
    load.thread.join()
    during = load.between(begin, end)
    hog = request(SOCKET, "GET", "/v1/workloads/hog", timeout=120)
    after = anon(slice_ / "hog")
    share_after = after.get(0, 0) / (sum(after.values()) or 1)
    mems = hog["containers"]["main"]["mems"]
    print(f"hog: {mib} MiB touched on node 1, admitted to node(s) {mems}")
    print(f"  admission answered in {answered_ms:.1f} ms (the move runs after the answer)")
    for move in hog["memory"]["moves"]:
        print(
            f"  moved {move['bytes_moved'] / 2**20:.1f} MiB in {move['seconds']:.2f} s"
            f" ({move['outcome']}: {move['detail']})"
        )
    share_before = before.get(0, 0) / (sum(before.values()) or 1)
    print(f"  on node 0: {share_before:.0%} before, {share_after:.0%} after")
    print(f"  numad's locality after: {hog['memory']['locality']}")
    return report(baseline, during, mems == "0" and share_after >= 0.95, share_after)


def report(baseline: list[float], during: list[float], pages_ok: bool, share: float) -> int:
    b50, b99 = percentile(baseline, 0.5), percentile(baseline, 0.99)
    print(f"baseline: {len(baseline)} requests  p50 {b50:.1f} ms  p99 {b99:.1f} ms")
    if not during:
        print("during the move: no request started while it ran")
        return 2
    d50, d99 = percentile(during, 0.5), percentile(during, 0.99)
    print(f"during the move: {len(during)} requests  p50 {d50:.1f} ms  p99 {d99:.1f} ms")
    latency_ok = d99 <= 2 * b99
    print(f"  p99 during / baseline {d99 / b99:.2f} (target at most 2.00): {_verdict(latency_ok)}")
    print(f"  pages on node 0 after {share:.0%} (target at least 95%): {_verdict(pages_ok)}")
    return 0 if latency_ok and pages_ok else 2


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def host(mib: int, line: str) -> int:
    from tests.vm import harness  # noqa: PLC0415
    from tests.vm.topologies import Machine, Node  # noqa: PLC0415

    machine = Machine(
        "bench", 2, 1, 2, 1, (Node(0, (0, 1), 768), Node(1, (2, 3), 768)), {(0, 1): 21}
    )
    with tempfile.TemporaryDirectory(prefix="numad-bench-") as tmp:
        command = [sys.executable, "benchmarks/migration.py", "--in-guest", "--mib", str(mib)]
        result = harness.boot(
            harness.kernel(line),
            machine.qemu_args(),
            command,
            Path(tmp),
            memory_mib=machine.memory_mib,
            timeout=900,
            tcg_threads="multi",  # vCPUs in parallel, as a host's CPUs are
        )
        print(result.stdout, end="")
        if result.rc == 1:
            print(result.stderr[-3000:], file=sys.stderr)
        print(f"(guest: kernel {line}, {harness.accelerator()}, {result.seconds:.0f} s in the VM)")
        return result.rc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=400, help="the hog's memory (default 400)")
    parser.add_argument("--kernel", default="6.12", help="the guest kernel line (6.1, 6.12)")
    parser.add_argument("--in-guest", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.in_guest or os.environ.get("VMTEST"):
        return guest(args.mib)
    return host(args.mib, args.kernel)


if __name__ == "__main__":
    sys.exit(main())
