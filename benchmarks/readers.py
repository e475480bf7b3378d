"""Readers beside changes: what a reader waits for the daemon's lock, and what readers
cost the changes, against targets.

Run from the repository root:

    .venv/bin/python benchmarks/readers.py [--sizes 40,1000,10000] [--cycles N] [--readers N]

The daemon of ``benchmarks/busy.py`` (numad's own, in this process, on the recorded
2-socket machine with a scratch cgroup v2 tree and an emulated kernel), with N stray
cgroups in ``numad.slice``, isolated one by one and with partitions. Per size and mode:
admit+release cycles of a 4-CPU workload quiet, then the same cycles beside R reader
threads, each listing the workloads (``list_all``, what ``GET /v1/workloads`` does
under the lock) in a loop with no pause: the worst a reader can do.

A change lets go of the lock around its cgroup writes; each reader that comes waits for
the writes at the lock's gate for at most 50 ms (``numad.daemon.holdings.GRACE``), then
gets in beside them, once: a reader in a loop runs once per 50 ms beside the writes,
not all along (all along, it shared the interpreter with the writes and every system
call of theirs waited for it: 6x slower cycles at 1,000 strays, measured 2026-12-05).
Reported: the cycles' time beside the readers over their time quiet, and each reader's
wait for the lock (from asking to having it, the gate included:
``numad_lock_wait_seconds``).

Targets: a reader's wait p99 at most the grace plus the lock's p99 target (50 + 10 ms);
the cycles beside readers at most 2x their time quiet. Exit 0 when every target held, 2
when one failed."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import structlog

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from busy import daemon_on, p, strays, target

from numad.daemon.holdings import GRACE
from numad.daemon.root import Daemon
from numad.host.scratch import scratch_mkdir

SPEC = '{"name": "bench", "cgroup": "numad.slice/bench", "cpus": 4}'
WAIT_P99_MS = GRACE * 1e3 + 10
SLOWDOWN_MAX = 2.0


def cycles(daemon: Daemon, n: int) -> float:
    spec = daemon.parse(SPEC, "json")
    start = time.perf_counter()
    for _ in range(n):
        daemon.admit(spec)
        daemon.release("bench")
    return time.perf_counter() - start


def beside_readers(daemon: Daemon, n: int, readers: int) -> tuple[float, list[float], int]:
    """The cycles' time beside ``readers`` threads reading in a loop, each reader's
    waits for the lock, and how many reads they made."""
    lock = daemon.held.lock
    waits: list[float] = []
    mine: set[int] = set()
    stop = threading.Event()
    reads = [0]

    def waited(seconds: float) -> None:  # the lock's hook: keep the readers' waits only
        if threading.get_ident() in mine:
            waits.append(seconds)

    def read() -> None:
        mine.add(threading.get_ident())
        while not stop.is_set():
            daemon.list_all()
            reads[0] += 1

    lock.waited = waited
    threads = [threading.Thread(target=read, daemon=True) for _ in range(readers)]
    for t in threads:
        t.start()
    try:
        took = cycles(daemon, n)
    finally:
        stop.set()
        for t in threads:
            t.join()
    return took, waits, reads[0]


def measure(n: int, partitions: bool, n_cycles: int, readers: int) -> bool:
    base = Path(tempfile.mkdtemp(prefix="numad-readers-"))
    try:
        daemon = daemon_on(base, partitions)
        tree = Path(str(daemon.fs.root)) / "sys/fs/cgroup"
        for path in strays("flat", n):
            scratch_mkdir(tree, path)
        daemon.reconcile()
        quiet = cycles(daemon, n_cycles)
        busy, waits, reads = beside_readers(daemon, n_cycles, readers)
        daemon.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    label = f"flat {n}" + (" +part" if partitions else "")
    ms = [w * 1e3 for w in waits]
    print(
        f"{label:<16}{n_cycles:>7}{quiet:>9.2f}s{busy:>9.2f}s{busy / quiet:>8.2f}x"
        f"{reads:>9}{p(ms, 0.5):>9.2f}ms{p(ms, 0.99):>9.1f}ms{max(ms, default=0):>9.1f}ms"
    )
    ok = target(f"reader wait p99 at {label}", p(ms, 0.99), "ms", WAIT_P99_MS)
    ok &= target(f"cycles beside readers / quiet at {label}", busy / quiet, "x", SLOWDOWN_MAX)
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", default="40,1000,10000", help="stray counts")
    parser.add_argument("--cycles", type=int, default=5, help="admit+release cycles per row")
    parser.add_argument("--readers", type=int, default=2, help="reader threads")
    parser.add_argument("--modes", default="cgroups,partitions", help="cgroups, partitions")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    print(
        f"{'scenario':<16}{'cycles':>7}{'quiet':>10}{'readers':>10}{'ratio':>9}"
        f"{'reads':>9}{'wait p50':>11}{'wait p99':>11}{'wait max':>11}"
    )
    ok = True
    for mode in args.modes.split(","):
        for n in (int(s) for s in args.sizes.split(",")):
            ok &= measure(n, mode == "partitions", args.cycles, args.readers)
    sys.exit(0 if ok else 2)


if __name__ == "__main__":
    main()
