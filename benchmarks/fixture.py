"""``numad topology --fixture`` as a user runs it: whole processes, wall and CPU time.

Run: .venv/bin/python benchmarks/fixture.py [--runs N] [--fixture NAME] [--archive FILE]
Prints, each against its target:

- ``topology --fixture NAME``: the first run (a fresh cache: the bundled machine
  is unpacked), then the median of N more (from the cache); target < 1 s.
- ``topology --nrt --fixture NAME`` from the same cache: median; target <= 2x
  the plain command's median (issue 25: it unpacked the archive again, 5.0 s).
- ``topology --fixture FILE`` of the 64-node recording (17,619 members), read
  in memory: median; target <= 2 s (issue 25: 8-13 s unpacking it to disk).

Each line also gives the processes' CPU time (user + system), which a busy
machine does not stretch as it stretches the wall time. The cache is a
temporary $XDG_CACHE_HOME, so the user's own is left alone.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from numad.cli.main import DEFAULT_MACHINE

PLAIN_TARGET_S = 1.0
NRT_TARGET_RATIO = 2.0
ARCHIVE_TARGET_S = 2.0
ARCHIVE = Path(__file__).resolve().parent.parent / (
    "fixtures/sysfs/256intel64-64n2co2t-sgiuvlike.tar.bz2"
)


def _once(args: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds of one ``numad topology ARGS``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(  # noqa: S603 - our own interpreter running numad
        [sys.executable, "-m", "numad", "topology", *args],
        check=True,
        stdout=subprocess.DEVNULL,
        env=env,
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def _median(args: list[str], env: dict[str, str], runs: int) -> tuple[float, float]:
    times = [_once(args, env) for _ in range(runs)]
    return statistics.median(w for w, _ in times), statistics.median(c for _, c in times)


def _verdict(ok: bool) -> str:
    return "meets" if ok else "MISSES"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--fixture", default=DEFAULT_MACHINE)
    parser.add_argument("--archive", type=Path, default=ARCHIVE)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "XDG_CACHE_HOME": cache}
        plain_args = ["--fixture", args.fixture]
        cold, cold_cpu = _once(plain_args, env)
        plain, plain_cpu = _median(plain_args, env, args.runs)
        nrt, nrt_cpu = _median(["--nrt", *plain_args], env, args.runs)
        archive, archive_cpu = _median(["--fixture", str(args.archive)], env, args.runs)
    print(f"numad topology, whole processes, median of {args.runs} runs (wall; CPU):")
    print(f"  --fixture {args.fixture}, first run (unpacks into the cache): {cold:.2f} s;", end="")
    print(f" {cold_cpu:.2f} s CPU")
    print(
        f"  --fixture {args.fixture}, cached: {plain:.2f} s; {plain_cpu:.2f} s CPU;"
        f" {_verdict(plain < PLAIN_TARGET_S)} the target < {PLAIN_TARGET_S:.0f} s"
    )
    print(
        f"  --nrt --fixture {args.fixture}, cached: {nrt:.2f} s; {nrt_cpu:.2f} s CPU;"
        f" {nrt / plain:.1f}x the plain command (CPU {nrt_cpu / plain_cpu:.1f}x);"
        f" {_verdict(nrt <= NRT_TARGET_RATIO * plain)} the target <= {NRT_TARGET_RATIO:.0f}x"
    )
    print(
        f"  --fixture {args.archive.name}: {archive:.2f} s; {archive_cpu:.2f} s CPU;"
        f" {_verdict(archive <= ARCHIVE_TARGET_S)} the target <= {ARCHIVE_TARGET_S:.0f} s"
    )


if __name__ == "__main__":
    main()
