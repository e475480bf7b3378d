"""numad on a busy host: admission, release and reconcile with stray cgroups, against targets.

Run from the repository root:

    .venv/bin/python benchmarks/busy.py [--sizes 0,1000,10000] [--cycles N] [--samples N]

The daemon is numad's own (``numad.daemon.service.build``, as ``numad serve --root``
builds it), in this process, on the recorded 2-socket machine 32intel64-2p8co2t+8ve
with a scratch cgroup v2 tree: single-numa-node, 2 reserved CPUs, memory policy none.
The kernel's part of the tree is emulated (numad.host.cgroup.emulation), so a cpuset
write costs more here than on cgroupfs: the figures bound a real host from above.

Scenarios, each on a fresh machine:

- flat N: N stray cgroups directly in ``numad.slice`` (anyone's ``mkdir``);
- pods N: N cgroups three levels deep, ``numad.slice/kubepods/podI/cJ`` (4 per pod);
- chain 200: one chain of 200 nested cgroups.

Per scenario: the first reconcile pass (isolates every stray), a pass with nothing
changed, then cycles of admitting a 4-CPU exclusive workload and releasing it, each
timed in the process (decision, checkpoint, cgroup writes), and every hold of the
daemon's lock meanwhile (``numad_lock_held_seconds``; "pass lock": the longest hold
during the pass with nothing changed, whose reads come before the lock). With many strays a cycle
writes every stray's cpuset (each must lose the exclusive CPUs before they are
granted), so ``--cycles`` is cut to 3 at 5,000 strays and more: the p99 is then the
largest of 3. With partitions it is cut to 10 there (no stray is written, but the
emulated kernel rewrites every effective file at each partition change). Then 3 more
cycles while another thread runs reconcile passes back to back ("beside": numad's own
part of those admissions, the largest; a pass's walk steps aside for a change under
way, but a change waits for the part of a pass that holds the change).

The new-cgroup window: a real ``python -m numad serve --root`` (reconcile every 10 s),
one 6-CPU workload admitted over its socket; then ``mkdir numad.slice/new-I`` and the
time until the new cgroup's ``cpuset.cpus`` holds no exclusive CPU, polled every ms.

With ``--partitions`` (the default: both) every scenario runs again with ``[host]
partitions = true`` on a tree whose emulated kernel offers remote partitions: an
admission writes the workload's cgroup and the levels above it, no stray. There the
emulated kernel rewrites every cgroup's effective file at each partition change (the
real kernel walks its cpusets in memory), so the rows also give numad's own part of
an admission and of each hold of the daemon's lock, the emulated kernel's time taken
out ("own"), and numad's cgroup file writes per admission.

Targets (issue 23, on this 2-core machine class): admission p99 at the largest size
at most 2x the p99 at 0; a pass with nothing changed at most 1 s at the largest
size; the window's median at most 100 ms and its largest at most 1 s; the lock's
p99 at most 10 ms at the largest size; each for the largest flat and pods rows,
against flat 0 in the same mode. Isolating one by one, the admission target is taken
end to end (numad's own part is printed beside it, "info"). Exit status 0 when every
target held, 2 when one failed. With partitions, the admission target is taken on
numad's own part: the kernel's part is measured on a real 6.12 kernel in the VM tier.
The lock target is taken on every hold, the kernel's time in it included: numad lets
go of the lock around its cgroup writes."""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from numad.cli.demo import CONFIG  # noqa: E402
from numad.cpuset import CPUSet  # noqa: E402
from numad.daemon.config import parse  # noqa: E402
from numad.daemon.root import Daemon  # noqa: E402
from numad.daemon.service import build  # noqa: E402
from numad.host.cgroup import emulation, v2  # noqa: E402
from numad.host.scratch import scratch_mkdir  # noqa: E402
from numad.topology.record import load_fixture  # noqa: E402
from tests.daemon.test_daemon_e2e import Numad  # noqa: E402

MACHINE = "32intel64-2p8co2t+8ve"
ARCHIVE = ROOT / "fixtures" / "sysfs" / f"{MACHINE}.tar.bz2"
SPEC = '{"name": "bench", "cgroup": "numad.slice/bench", "cpus": 4}'
FEW_CYCLES_FROM = 5000
WINDOW_MEDIAN_MS, WINDOW_MAX_MS, PASS_S, LOCK_P99_MS = 100.0, 1000.0, 1.0, 10.0


@dataclass(frozen=True, slots=True)
class Row:
    scenario: str
    first_pass: float
    steady_pass: float
    admit: list[float]
    release: list[float]
    lock: list[float]
    pass_lock: list[float]  # the lock's holds during the pass with nothing changed
    own: list[float]  # each admission less the emulated kernel's time in it
    writes: list[int]  # cgroup files numad wrote per admission
    own_lock: list[float]  # each hold of the lock less the emulated kernel's time in it
    beside: list[float]  # numad's own part of admissions beside reconcile passes in a loop


class Meter:
    """The emulated kernel's time and numad's file writes, counted while installed."""

    def __init__(self) -> None:
        self.kernel = 0.0
        self.locked = 0.0  # the part of ``kernel`` spent with the daemon's lock held
        self.held: Callable[[], bool] = lambda: True  # whether this thread holds it
        self.writes = 0
        self._write, self._kernel = v2.CgroupV2Backend._write, emulation.KernelV2.write

    def __enter__(self) -> Meter:
        meter, write, kernel = self, self._write, self._kernel

        def counted(backend: v2.CgroupV2Backend, cg: object, file: Path, value: str) -> None:
            meter.writes += 1
            write(backend, cg, file, value)  # type: ignore[arg-type]

        def timed_kernel(k: emulation.KernelV2, *args: object) -> None:
            start = time.perf_counter()
            try:
                kernel(k, *args)  # type: ignore[arg-type]
            finally:
                took = time.perf_counter() - start
                meter.kernel += took
                meter.locked += took if meter.held() else 0.0

        v2.CgroupV2Backend._write = counted  # type: ignore[method-assign,assignment]
        emulation.KernelV2.write = timed_kernel  # type: ignore[method-assign,assignment]
        return self

    def __exit__(self, *_: object) -> None:
        v2.CgroupV2Backend._write = self._write  # type: ignore[method-assign]
        emulation.KernelV2.write = self._kernel  # type: ignore[method-assign]


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def machine(base: Path) -> Path:
    root = base / "machine"
    root.mkdir()
    return load_fixture(ARCHIVE, root)


def daemon_on(base: Path, partitions: bool) -> Daemon:
    raw = {
        "topology": {"policy": "single-numa-node"},
        "cpu": {"reserved-count": 2},
        "memory": {"policy": "none"},
        "host": {"partitions": partitions},
    }
    daemon = build(parse(raw), str(machine(base)))
    daemon.start()
    scratch_mkdir(Path(str(daemon.fs.root)) / "sys/fs/cgroup", "numad.slice/bench")
    return daemon


def strays(kind: str, n: int) -> list[str]:
    if kind == "flat":
        return [f"numad.slice/stray{i}" for i in range(n)]
    if kind == "pods":
        return [f"numad.slice/kubepods/pod{i // 4}/c{i % 4}" for i in range(n)]
    return ["numad.slice/" + "/".join(f"d{i}" for i in range(n))]


def timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def scenario(kind: str, n: int, cycles: int, partitions: bool = False) -> Row:
    base = Path(tempfile.mkdtemp(prefix="numad-busy-"))
    try:
        daemon = daemon_on(base, partitions)
        tree = Path(str(daemon.fs.root)) / "sys/fs/cgroup"
        for path in strays(kind, n):
            scratch_mkdir(tree, path)
        first = timed(daemon.reconcile)
        holds: list[float] = []
        pass_holds: list[float] = []
        timed_lock = hasattr(daemon.held.lock, "observe")  # numad before the histogram: none
        if timed_lock:
            daemon.held.lock.observe = pass_holds.append
        steady = timed(daemon.reconcile)
        admits, releases, own, writes, own_lock = [], [], [], [], []
        spec = daemon.parse(SPEC, "json")
        with Meter() as meter:
            seen = [meter.locked]
            # The kernel's time while the lock is held (numad lets go of it around its
            # cgroup writes since 2026-12-05; before, every write was under it).
            meter.held = getattr(daemon.held.lock, "mine", lambda: True)

            def observe(held: float) -> None:  # holds follow each other: one thread
                holds.append(held)
                own_lock.append(held - (meter.locked - seen[0]))
                seen[0] = meter.locked

            if timed_lock:
                daemon.held.lock.observe = observe
            few = 10 if partitions else 3  # with partitions a cycle writes no stray
            for _ in range(cycles if n < FEW_CYCLES_FROM else min(cycles, few)):
                kernel, wrote = meter.kernel, meter.writes
                admits.append(timed(lambda: daemon.admit(spec)))
                own.append(admits[-1] - (meter.kernel - kernel))
                writes.append(meter.writes - wrote)
                releases.append(timed(lambda: daemon.release("bench")))
            beside = beside_passes(daemon, spec, meter)
        daemon.stop()
        label = f"{kind} {n}" if kind != "chain" else f"chain {n} deep"
        label += " +part" if partitions else ""
        return Row(
            label, first, steady, admits, releases, holds, pass_holds, own, writes, own_lock, beside
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)


def beside_passes(daemon: Daemon, spec: object, meter: Meter, cycles: int = 3) -> list[float]:
    """numad's own part of ``cycles`` admissions while another thread runs reconcile
    passes back to back (each walks the tree before it takes the lock, and steps aside
    at its next beat for a change under way)."""
    stop = threading.Event()

    def passes() -> None:
        while not stop.is_set():
            daemon.reconcile()

    thread = threading.Thread(target=passes, daemon=True)
    thread.start()
    own = []
    try:
        for _ in range(cycles):
            kernel = meter.kernel
            took = timed(lambda: daemon.admit(spec))  # type: ignore[arg-type]
            own.append(took - (meter.kernel - kernel))
            daemon.release("bench")
    finally:
        stop.set()
        thread.join()
    return own


def window(samples: int) -> list[float]:
    """Seconds from mkdir until the new cgroup holds no exclusive CPU, per sample."""
    base = Path(tempfile.mkdtemp(prefix="numad-window-"))
    root = machine(base)
    config = base / "numad.toml"
    config.write_text(CONFIG + "\n[daemon]\nreconcile-seconds = 10\n")
    numad = Numad(root, config)
    try:
        numad.start()
        scratch_mkdir(numad.cgroups, "numad.slice/db")
        answer = numad.call(
            "POST", "/v1/workloads", {"name": "db", "cgroup": "numad.slice/db", "cpus": 6}
        )
        exclusive = CPUSet()
        for c in answer["containers"].values():
            exclusive |= CPUSet.parse_list(c["cpus"])
        out = []
        for i in range(samples):
            path = numad.cgroups / f"numad.slice/new-{i}"
            start = time.perf_counter()
            os.mkdir(path)
            cpus = path / "cpuset.cpus"
            deadline = start + 30
            while time.perf_counter() < deadline:
                text = cpus.read_text().strip() if cpus.exists() else ""
                if text and not CPUSet.parse_list(text) & exclusive:
                    break
                time.sleep(0.001)
            out.append(time.perf_counter() - start)
            time.sleep(0.05)
        return out
    finally:
        numad.stop()
        shutil.rmtree(base, ignore_errors=True)


def report(rows: list[Row], win: list[float]) -> bool:
    print(
        f"{'scenario':<18}{'1st pass':>10}{'pass':>9}{'admit p50':>11}{'admit p99':>11}"
        f"{'release':>9}{'lock p99':>10}{'pass lock':>11}{'cycles':>8}"
        f"{'own p99':>10}{'own lock':>10}{'writes':>8}{'beside':>9}"
    )
    for r in rows:
        lock = f"{p(r.lock, 0.99) * 1e3:.1f}ms" if r.lock else "n/a"
        pass_lock = f"{max(r.pass_lock) * 1e3:.1f}ms" if r.pass_lock else "n/a"
        print(
            f"{r.scenario:<18}{r.first_pass:>9.3f}s{r.steady_pass:>8.3f}s"
            f"{p(r.admit, 0.5) * 1e3:>9.1f}ms{p(r.admit, 0.99) * 1e3:>9.1f}ms"
            f"{p(r.release, 0.5) * 1e3:>7.0f}ms{lock:>10}{pass_lock:>11}{len(r.admit):>8}"
            f"{p(r.own, 0.99) * 1e3:>8.1f}ms{p(r.own_lock, 0.99) * 1e3:>8.1f}ms"
            f"{max(r.writes, default=0):>8}{max(r.beside, default=0) * 1e3:>7.1f}ms"
        )
    ok = True
    for part in (False, True):
        mode = [r for r in rows if r.scenario.endswith(" +part") == part]
        zero = next((r for r in mode if r.scenario.split()[:2] == ["flat", "0"]), None)
        for shape in ("flat", "pods"):  # the largest size of each shape against no stray
            sized = [r for r in mode if r.scenario.split()[0] == shape and r is not zero]
            if zero is not None and sized:
                ok &= targets(zero, sized[-1], part)
    ok &= window_targets(win)
    return ok


def targets(zero: Row, big: Row, partitions: bool) -> bool:
    ok = True
    own = p(big.own, 0.99) / p(zero.own, 0.99)
    what = f"admission p99, numad's own part, at {big.scenario} / at {zero.scenario}"
    beside = max(big.beside) / p(zero.own, 0.99)
    print(f"  info numad's own part beside passes in a loop, largest: {beside:.2f} x")
    if partitions:
        ok &= target(what, own, "x", 2.0)
    else:  # end to end: every write it waits for is numad's own (with the kernel's part)
        ratio = p(big.admit, 0.99) / p(zero.admit, 0.99)
        ok &= target(f"admission p99 at {big.scenario} / at {zero.scenario}", ratio, "x", 2.0)
        print(f"  info {what}: {own:.2f} x")
    ok &= target(f"a pass with nothing changed at {big.scenario}", big.steady_pass, "s", PASS_S)
    if big.lock:  # the kernel's part is not under the lock (2026-12-05): both modes
        ok &= target(f"lock p99 at {big.scenario}", p(big.lock, 0.99) * 1e3, "ms", LOCK_P99_MS)
    else:
        print("  lock p99: not measured (this numad has no lock histogram)")
    return ok


def window_targets(win: list[float]) -> bool:
    ok = True
    if win:
        ms = [w * 1e3 for w in win]
        print(
            f"new-cgroup window over {len(ms)} mkdirs: median {statistics.median(ms):.1f} ms,"
            f" max {max(ms):.1f} ms"
        )
        ok &= target("window median", statistics.median(ms), "ms", WINDOW_MEDIAN_MS)
        ok &= target("window max", max(ms), "ms", WINDOW_MAX_MS)
    return ok


def target(label: str, value: float, unit: str, limit: float) -> bool:
    passed = value <= limit
    print(f"  {'PASS' if passed else 'FAIL'} {label}: {value:.2f} {unit} (target <= {limit:g})")
    return passed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", default="0,1000,10000", help="stray counts (flat and pods)")
    parser.add_argument("--cycles", type=int, default=20, help="admit+release cycles per size")
    parser.add_argument("--samples", type=int, default=20, help="mkdirs timed for the window")
    parser.add_argument("--chain", type=int, default=200, help="depth of the chain (0: none)")
    parser.add_argument(
        "--modes", default="cgroups,partitions", help="isolation modes: cgroups, partitions"
    )
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    for mode in args.modes.split(","):
        part = mode == "partitions"
        rows += [scenario("flat", n, args.cycles, part) for n in sizes]
        rows += [scenario("pods", n, args.cycles, part) for n in sizes if n]
        if args.chain:
            rows.append(scenario("chain", args.chain, args.cycles, part))
    win = window(args.samples) if args.samples else []
    sys.exit(0 if report(rows, win) else 2)


if __name__ == "__main__":
    main()
