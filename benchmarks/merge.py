"""Merge time on worst-case hint lists, 4 to 16 NUMA nodes, against the targets.

Run from the repository root (``tests`` is imported from the checkout for the
plain enumeration):

    .venv/bin/python benchmarks/merge.py [--max-nodes N] [--quick]

The inputs are those of reference/topology-manager.md section 8, with the
memory provider's hugepages list added: a device provider, a CPU provider and
a memory provider (``memory`` and ``hugepages-1Gi``), each answering with every
node mask that can hold its request on an empty machine — every subset at
least as wide as the request, by width then lexicographically, preferred when
exactly as wide. Shape A: every request needs half the machine (a preferred
answer exists). Shape B: device, cpu and memory need half - 1, half and
half + 1 nodes (no preferred answer). Both run under best-effort and restricted.

Only ``numad.policy.merge`` is timed (the hint lists are built beforehand);
each point runs until it has enough runs and enough total time, or hits its
time cap. At 4 and 6 nodes the plain enumeration of tests/plain_merge.py runs
on the same inputs: its time, the ratio, and a check that both give the same
(affinity, preferred, score, admit).

Exit status: 0 if every target passed, 1 if numad and the plain enumeration
disagree (stops at once), 2 if a target failed.
"""

from __future__ import annotations

import argparse
import functools
import gc
import itertools
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from numad.cpuset import NodeSet
from numad.hints import Hint, ProviderHints
from numad.policy import Decision, Machine, Policy, PolicyOptions, merge

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # tests/ is not installed: take it from the checkout

from tests.plain_merge import plain_merge  # noqa: E402 (needs ROOT on sys.path, set just above)

SIZES = (4, 6, 8, 10, 12, 14, 16)
PLAIN_SIZES = (4, 6)
TARGETS_MS = {8: 5.0, 12: 50.0, 16: 500.0}
POLICIES = (Policy.BEST_EFFORT, Policy.RESTRICTED)
RESOURCES = ("example.com/dev", "cpu", "memory", "hugepages-1Gi")


@dataclass(frozen=True, slots=True)
class Shape:
    """Requests as offsets from half the machine: device, cpu, memory (and hugepages)."""

    name: str
    offsets: tuple[int, int, int]
    about: str

    def needs(self, nodes: int) -> tuple[int, int, int]:
        half = nodes // 2
        dev, cpu, mem = self.offsets
        return half + dev, half + cpu, half + mem


SHAPES = (
    Shape("A", (0, 0, 0), "every request needs half the machine (a preferred answer exists)"),
    Shape("B", (-1, 0, 1), "device/cpu/memory need half-1/half/half+1 (no preferred answer)"),
)


@dataclass(frozen=True, slots=True)
class Budget:
    """How long one point runs: until min_runs and min_seconds, but never past max_seconds."""

    min_runs: int
    min_seconds: float
    max_seconds: float


@dataclass(frozen=True, slots=True)
class Plan:
    numad: Budget
    plain: Budget  # the plain walk takes seconds a run at 6 nodes


FULL = Plan(numad=Budget(5, 0.5, 3.0), plain=Budget(3, 0.5, 8.0))
QUICK = Plan(numad=Budget(3, 0.05, 0.6), plain=Budget(1, 0.05, 1.0))


@dataclass(frozen=True, slots=True)
class Timing:
    runs: int
    median_ms: float
    best_ms: float


@dataclass(frozen=True, slots=True)
class Point:
    nodes: int
    shape: Shape
    policy: Policy
    timing: Timing


Outcome = tuple[tuple[int, ...] | None, bool, int, bool]


def hint_list(nodes: int, need: int) -> tuple[Hint, ...]:
    """A provider's answer for a request of ``need`` nodes on an empty machine.

    Every subset of width >= need, by width then lexicographically (as the
    kubelet enumerates them); preferred exactly at width == need.
    """
    return tuple(
        Hint(NodeSet(subset), preferred=width == need, score=0)
        for width in range(need, nodes + 1)
        for subset in itertools.combinations(range(nodes), width)
    )


def build_providers(nodes: int, shape: Shape) -> list[ProviderHints]:
    dev, cpu, mem = (hint_list(nodes, need) for need in shape.needs(nodes))
    return [{RESOURCES[0]: dev}, {RESOURCES[1]: cpu}, {RESOURCES[2]: mem, RESOURCES[3]: mem}]


def list_lengths(providers: Sequence[ProviderHints]) -> list[int]:
    """Lengths of the lists the kubelet walks (a nil or empty list is one placeholder hint)."""
    return [len(hints) if hints else 1 for p in providers for hints in (p[r] for r in sorted(p))]


def time_calls(call: Callable[[], object], budget: Budget) -> Timing:
    """Median and best of repeated calls; garbage from earlier points collected first."""
    gc.collect()
    times: list[float] = []
    spent = 0.0
    while len(times) < budget.min_runs or spent < budget.min_seconds:
        if times and spent >= budget.max_seconds:
            break
        start = time.perf_counter()
        call()
        elapsed = time.perf_counter() - start
        times.append(elapsed)
        spent += elapsed
    return Timing(len(times), statistics.median(times) * 1000, min(times) * 1000)


def numad_merge(nodes: int, policy: Policy, providers: Sequence[ProviderHints]) -> Decision:
    return merge(policy, PolicyOptions(), Machine(NodeSet(range(nodes))), providers)


def outcome(decision: Decision) -> Outcome:
    affinity = None if decision.affinity is None else decision.affinity.sorted()
    return affinity, decision.preferred, decision.score, decision.admit


def describe(decision: Decision) -> str:
    affinity = "any" if decision.affinity is None else decision.affinity.format_list()
    return f"affinity {affinity} preferred={decision.preferred} admit={decision.admit}"


def check_plain(
    point: Point, providers: Sequence[ProviderHints], decision: Decision, budget: Budget
) -> None:
    """Time the plain enumeration on the same inputs and insist on the same result."""
    nodes, policy, ms = point.nodes, point.policy, point.timing.median_ms
    found: list[Outcome] = []

    def run() -> None:
        affinity, preferred, score, admit = plain_merge(policy.value, range(nodes), providers)
        found.append((None if affinity is None else tuple(affinity), preferred, score, admit))

    timing = time_calls(run, budget)
    expected, got = found[0], outcome(decision)
    if got != expected:
        raise SystemExit(
            f"MISMATCH at {nodes} nodes, {policy}: numad {got} != plain enumeration {expected}"
        )
    print(
        f"{'':>23}plain enumeration: median {timing.median_ms:,.1f} ms, best "
        f"{timing.best_ms:,.1f} ms, {timing.runs} run(s); {timing.median_ms / ms:,.0f}x numad; "
        "same (affinity, preferred, score, admit): yes"
    )


def target_note(nodes: int, ms: float) -> str:
    target = TARGETS_MS.get(nodes)
    if target is None:
        return ""
    return f"  target <= {target:g} ms: {'PASS' if ms <= target else 'FAIL'}"


def run_size(nodes: int, plan: Plan) -> list[Point]:
    points = []
    for shape in SHAPES:
        providers = build_providers(nodes, shape)
        lengths = list_lengths(providers)
        print(
            f"{nodes:>2} nodes, shape {shape.name}: needs {shape.needs(nodes)}; hints per list "
            f"{' '.join(map(str, lengths))}; kubelet permutations {math.prod(lengths):,}"
        )
        for policy in POLICIES:
            decision = numad_merge(nodes, policy, providers)
            call = functools.partial(numad_merge, nodes, policy, providers)
            timing = time_calls(call, plan.numad)
            points.append(Point(nodes, shape, policy, timing))
            print(
                f"{'':>6}{policy.value:<17}numad median {timing.median_ms:9.3f} ms, best "
                f"{timing.best_ms:9.3f} ms, {timing.runs:>5} runs; {describe(decision)}"
                f"{target_note(nodes, timing.median_ms)}"
            )
            if nodes in PLAIN_SIZES:
                check_plain(points[-1], providers, decision, plan.plain)
    return points


def report_targets(points: Sequence[Point], max_nodes: int) -> bool:
    """One line per target, judged on the slowest median at that size; True if all pass."""
    print("\ntargets (median ms per merge, slowest shape and policy at that size):")
    passed = True
    for nodes, target in TARGETS_MS.items():
        at_size = [p for p in points if p.nodes == nodes]
        if nodes > max_nodes or not at_size:
            print(f"  {nodes:>2} nodes <= {target:g} ms: not run (--max-nodes {max_nodes})")
            continue
        worst = max(at_size, key=lambda p: p.timing.median_ms)
        ok = worst.timing.median_ms <= target
        passed = passed and ok
        print(
            f"  {nodes:>2} nodes <= {target:g} ms: {worst.timing.median_ms:.3f} ms "
            f"(shape {worst.shape.name}, {worst.policy.value})  {'PASS' if ok else 'FAIL'}"
        )
    return passed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--max-nodes", type=int, default=SIZES[-1], metavar="N")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions per point")
    args = parser.parse_args()
    sizes = [n for n in SIZES if n <= args.max_nodes]
    if not sizes:
        parser.error(f"--max-nodes must be at least {SIZES[0]}")
    plan = QUICK if args.quick else FULL
    budget = plan.numad
    print(f"numad merge benchmark: {len(RESOURCES)} lists per merge ({', '.join(RESOURCES)})")
    for shape in SHAPES:
        print(f"  shape {shape.name}: {shape.about}")
    print(
        f"  numad.policy.merge only (hint lists prebuilt); per point >= {budget.min_runs} runs "
        f"and >= {budget.min_seconds:g} s, capped at {budget.max_seconds:g} s\n"
    )
    points: list[Point] = []
    for nodes in sizes:
        points.extend(run_size(nodes, plan))
    if not report_targets(points, args.max_nodes):
        sys.exit(2)


if __name__ == "__main__":
    main()
