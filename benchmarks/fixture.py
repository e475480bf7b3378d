"""``numad topology --fixture NAME`` as a user runs it: a whole process, wall time.

Run: .venv/bin/python benchmarks/fixture.py [--runs N] [--fixture NAME]
Prints the first run (a fresh cache: the bundled machine is unpacked) and the
median, best and worst of N more (from the cache), against the 1 s target. The
cache is a temporary $XDG_CACHE_HOME, so the user's own is left alone.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from numad.cli.main import DEFAULT_MACHINE

TARGET_S = 1.0


def _once(name: str, env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(  # noqa: S603 - our own interpreter running numad
        [sys.executable, "-m", "numad", "topology", "--fixture", name],
        check=True,
        stdout=subprocess.DEVNULL,
        env=env,
    )
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--fixture", default=DEFAULT_MACHINE)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "XDG_CACHE_HOME": cache}
        cold = _once(args.fixture, env)
        warm = sorted(_once(args.fixture, env) for _ in range(args.runs))
    median = statistics.median(warm)
    verdict = "meets" if median < TARGET_S else "MISSES"
    print(f"numad topology --fixture {args.fixture}, whole process:")
    print(f"  first run (unpacks into the cache): {cold:.2f} s")
    print(
        f"  cached: median {median:.2f} s, best {warm[0]:.2f} s, worst {warm[-1]:.2f} s"
        f" over {args.runs} runs; {verdict} the target < {TARGET_S:.0f} s"
    )


if __name__ == "__main__":
    main()
