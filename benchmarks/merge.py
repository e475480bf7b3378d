"""Merge time on worst-case hints, 4 to 64 NUMA nodes, against the targets.

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

Each provider's answer is given twice: described (numad.placement.hintspace, what
numad's providers hand the merge since issue 14: one amount per node, the
request, the preferred width; merged by search, numad.placement.search) and listed
(the kubelet's lists, folded by numad.placement.merge; up to 16 nodes, where 2^N masks
per list can still be built). Both must give the same decision. Only
``numad.placement.policy.merge`` is timed (the answers are built beforehand); each
point runs until it has enough runs and enough total time, or hits its time
cap. At 4 and 6 nodes the plain enumeration of tests/plain_merge.py runs on
the same inputs: its time, the ratio, and a check that both give the same
(affinity, preferred, score, admit). Targets apply to the described merge.

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
from numad.placement.hints import Hint, ProviderHints
from numad.placement.hintspace import HintSpace
from numad.placement.policy import Decision, Machine, Policy, PolicyOptions, merge

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # tests/ is not installed: take it from the checkout

from tests.plain_merge import plain_merge  # noqa: E402 (needs ROOT on sys.path, set just above)

SIZES = (4, 6, 8, 10, 12, 14, 16, 24, 34, 64)
PLAIN_SIZES = (4, 6)
LISTED_MAX = 16  # nodes: the largest machine whose lists are built and folded
TARGETS_MS = {8: 5.0, 16: 50.0, 34: 50.0, 64: 50.0}
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


def hint_space(nodes: int, need: int) -> HintSpace:
    """The same answer, described: one unit per node, ``need`` units, preferred width."""
    return HintSpace((1 << nodes) - 1, ((1,) * nodes,), (need,), need)


def build_providers(nodes: int, shape: Shape, *, listed: bool) -> list[ProviderHints]:
    make = hint_list if listed else hint_space
    dev, cpu, mem = (make(nodes, need) for need in shape.needs(nodes))
    return [{RESOURCES[0]: dev}, {RESOURCES[1]: cpu}, {RESOURCES[2]: mem, RESOURCES[3]: mem}]


def list_lengths(nodes: int, shape: Shape) -> list[int]:
    """Lengths of the lists the kubelet walks: every subset at least as wide as the need."""
    return [
        sum(math.comb(nodes, w) for w in range(need, nodes + 1))
        for need in (*shape.needs(nodes), shape.needs(nodes)[2])
    ]


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
        described = build_providers(nodes, shape, listed=False)
        listed = build_providers(nodes, shape, listed=True) if nodes <= LISTED_MAX else None
        lengths = list_lengths(nodes, shape)
        print(
            f"{nodes:>2} nodes, shape {shape.name}: needs {shape.needs(nodes)}; kubelet hints "
            f"per list {' '.join(f'{n:,}' for n in lengths)}; permutations "
            f"{_magnitude(math.prod(lengths))}"
        )
        for policy in POLICIES:
            decision = numad_merge(nodes, policy, described)
            timing = time_calls(
                functools.partial(numad_merge, nodes, policy, described), plan.numad
            )
            points.append(Point(nodes, shape, policy, timing))
            print(
                f"{'':>6}{policy.value:<17}described median {timing.median_ms:9.3f} ms, best "
                f"{timing.best_ms:9.3f} ms, {timing.runs:>5} runs; {describe(decision)}"
                f"{target_note(nodes, timing.median_ms)}"
            )
            if listed is not None:
                folded = numad_merge(nodes, policy, listed)
                if outcome(folded) != outcome(decision):
                    raise SystemExit(
                        f"MISMATCH at {nodes} nodes, {policy}: described {outcome(decision)}"
                        f" != listed {outcome(folded)}"
                    )
                fold = time_calls(functools.partial(numad_merge, nodes, policy, listed), plan.numad)
                print(f"{'':>23}listed (fold) median {fold.median_ms:9.3f} ms; same decision: yes")
            if nodes in PLAIN_SIZES:
                assert listed is not None
                check_plain(points[-1], listed, decision, plan.plain)
    return points


def _magnitude(n: int) -> str:
    return f"{n:,}" if n < 10**9 else f"~10^{len(str(n)) - 1}"


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
        f"  numad.placement.policy.merge only (answers prebuilt);"
        f" per point >= {budget.min_runs} runs "
        f"and >= {budget.min_seconds:g} s, capped at {budget.max_seconds:g} s\n"
    )
    points: list[Point] = []
    for nodes in sizes:
        points.extend(run_size(nodes, plan))
    if not report_targets(points, args.max_nodes):
        sys.exit(2)


if __name__ == "__main__":
    main()
