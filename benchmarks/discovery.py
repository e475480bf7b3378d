"""Discovery time on the largest recorded machine (256 CPUs), warm page cache.

Run: .venv/bin/python benchmarks/discovery.py [--runs N]
Prints the median, best and worst time of a whole `discover()` over N runs,
each on a fresh HostFS (nothing cached between runs but the kernel's page cache).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from numad.hostfs import HostFS
from numad.topology.discover import discover
from numad.topology.record import load_fixture

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "sysfs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--fixture", default="256ppc-8n8s4t")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = load_fixture(FIXTURES / f"{args.fixture}.tar.bz2", Path(tmp))
        discover(HostFS(root))  # warm the page cache
        times = []
        for _ in range(args.runs):
            start = time.perf_counter()
            topo = discover(HostFS(root))
            times.append(time.perf_counter() - start)
    ms = sorted(t * 1000 for t in times)
    print(f"fixture {args.fixture}: {len(topo.online_cpus)} CPUs, {len(topo.nodes)} nodes")
    print(
        f"discover(): median {statistics.median(ms):.1f} ms, best {ms[0]:.1f} ms, "
        f"worst {ms[-1]:.1f} ms over {args.runs} runs (target < 100 ms)"
    )


if __name__ == "__main__":
    main()
