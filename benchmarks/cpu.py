"""CPU allocation and NUMA hint time on synthetic 64-, 256- and 1024-CPU machines, against targets.

Run from the repository root:

    .venv/bin/python benchmarks/cpu.py [--quick] [--seed N]

The machines are built with CPUTopology.of and numbered as Linux numbers
Intel and AMD parts: physical core p has threads p and p + N/2, its core id
is p (the lowest thread id), and the uncore id is its L3 group:

* 64 CPUs: 2 sockets x 16 cores x 2 threads, 2 NUMA nodes, 4 L3 groups;
* 256 CPUs: 2 sockets x 64 cores x 2 threads, 8 NUMA nodes (NPS4), 16 L3 groups;
* 1024 CPUs: 4 sockets x 128 cores x 2 threads, 16 NUMA nodes, 64 L3 groups.

Each sample is a machine with a random 0-60 % of its CPUs already taken
(whole cores, and one in ten a single thread, scattered over the machine), a
request from a weighted mix of 1..64 CPUs (capped by what is free; even with
full-pcpus-only), and a NUMA affinity: none for a quarter of the samples (no
Topology Manager), otherwise the best-effort merge of the CPU provider's
hints, as the Topology Manager would hand it to Allocate. The hint list passed
to the merge keeps only the narrowest width that has a hint: with a single
provider no wider hint can win (numad.placement.merge steps 1 and 2), and it spares the
2^16 masks the full list has at 16 nodes.

Timed: one ``StaticPolicy.allocate(available, count, affinity)`` per sample,
for the packed, uncore, distributing and distributing + full-pcpus-only
paths (the same states for every path), and ``StaticPolicy.hints(available,
count)`` at 8 NUMA nodes (and, with no target, at 16). Every allocation is
checked: exactly ``count`` CPUs, all of them from ``available``.

Exit status: 0 if every target passed, 1 if an allocation failed or returned
a wrong set (stops at once), 2 if a target failed.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import math
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from numad.cpuset import CPUSet, NodeSet
from numad.errors import AllocationError
from numad.placement.hints import Hint
from numad.placement.managers.cpu.static import StaticOptions, StaticPolicy
from numad.placement.managers.cpu.topology import CPUInfo, CPUTopology, bits
from numad.placement.policy import Machine, Policy, PolicyOptions, merge

MAX_TAKEN = 0.6  # share of the machine already taken, drawn uniformly from 0 to this
SINGLE_THREAD_SHARE = 0.1  # share of taken cores of which only one thread is taken
NO_AFFINITY_SHARE = 0.25  # share of requests allocated without a NUMA affinity
REQUEST_MIX = {1: 12, 2: 20, 4: 20, 6: 6, 8: 16, 16: 12, 32: 8, 64: 6}  # CPUs: weight
ALLOC_TARGET_MS = {256: 5.0, 1024: 50.0}  # median per allocation, every path
HINT_TARGET_MS = 5.0  # median hint generation at 8 NUMA nodes
SEED = 20260301


@dataclass(frozen=True, slots=True)
class Spec:
    sockets: int
    cores_per_socket: int
    numa_per_socket: int
    l3_per_socket: int
    kubelet_ms: str  # the kubelet's Go median per take (reference/cpu-manager.md 13.12)

    @property
    def cpus(self) -> int:
        return self.sockets * self.cores_per_socket * 2

    def describe(self) -> str:
        return (
            f"{self.cpus} CPUs: {self.sockets} sockets x {self.cores_per_socket} cores x 2 "
            f"threads, {self.sockets * self.numa_per_socket} NUMA nodes, "
            f"{self.sockets * self.l3_per_socket} L3 groups"
        )


SPECS = (
    Spec(2, 16, 1, 2, "0.1-0.5"),
    Spec(2, 64, 4, 8, "1-5"),
    Spec(4, 128, 4, 16, "5-50"),
)
HINT_SPEC = SPECS[1]  # the 8-node machine of the hint target


@dataclass(frozen=True, slots=True)
class Path:
    name: str
    options: StaticOptions

    @property
    def even(self) -> bool:
        """full-pcpus-only admits only whole-core counts (2 CPUs per core here)."""
        return self.options.full_pcpus_only


PATHS = (
    Path("packed", StaticOptions()),
    Path("uncore", StaticOptions(prefer_uncore=True)),
    Path("distributing", StaticOptions(distribute_across_numa=True)),
    Path("distributing+full", StaticOptions(distribute_across_numa=True, full_pcpus_only=True)),
)


@dataclass(frozen=True, slots=True)
class Plan:
    allocations: int  # samples per machine and path
    hints: int  # samples for the hint target at 8 nodes
    hints_16: int  # samples for the informational hint time at 16 nodes


FULL = Plan(allocations=1000, hints=1000, hints_16=40)
QUICK = Plan(allocations=100, hints=100, hints_16=5)


@dataclass(frozen=True, slots=True)
class State:
    """A machine state and a raw request, before the path shapes the count."""

    available: int
    request: int
    aligned: bool  # whether the request gets a NUMA affinity


@dataclass(frozen=True, slots=True)
class Sample:
    available: int
    count: int
    affinity: NodeSet | None


@dataclass(frozen=True, slots=True)
class Stats:
    runs: int
    median_ms: float
    p95_ms: float
    max_ms: float

    @classmethod
    def of(cls, seconds: Sequence[float]) -> Stats:
        ms = sorted(s * 1000 for s in seconds)
        p95 = ms[math.ceil(0.95 * len(ms)) - 1]  # nearest rank
        return cls(len(ms), statistics.median(ms), p95, ms[-1])

    def line(self) -> str:
        return (
            f"median {self.median_ms:8.3f} ms  p95 {self.p95_ms:8.3f} ms  "
            f"max {self.max_ms:8.3f} ms  ({self.runs} runs)"
        )


def build_topology(spec: Spec) -> CPUTopology:
    """Threads p and p + N/2 on core p; NUMA nodes and L3 groups are runs of cores."""
    cores = spec.sockets * spec.cores_per_socket
    per_numa = spec.cores_per_socket // spec.numa_per_socket
    per_l3 = spec.cores_per_socket // spec.l3_per_socket
    return CPUTopology.of(
        CPUInfo(
            cpu=p + t * cores,
            core=p,
            socket=p // spec.cores_per_socket,
            numa=p // per_numa,
            uncore=p // per_l3,
        )
        for p in range(cores)
        for t in range(2)
    )


def random_available(topo: CPUTopology, rng: random.Random) -> int:
    """The free CPUs after a random 0-60 % of the machine was taken, mostly as whole cores."""
    target = int(topo.num_cpus * rng.uniform(0.0, MAX_TAKEN))
    cores = list(topo.core.values())
    rng.shuffle(cores)
    available, taken = topo.all, 0
    for core in cores:
        if taken >= target:
            break
        take = core
        if rng.random() < SINGLE_THREAD_SHARE or taken + core.bit_count() > target:
            take = 1 << rng.choice(bits(core))
        available &= ~take
        taken += take.bit_count()
    return available


def random_states(topo: CPUTopology, rng: random.Random, n: int) -> list[State]:
    sizes, weights = list(REQUEST_MIX), list(REQUEST_MIX.values())
    return [
        State(
            random_available(topo, rng),
            rng.choices(sizes, weights)[0],
            rng.random() >= NO_AFFINITY_SHARE,
        )
        for _ in range(n)
    ]


def shaped_count(request: int, free: int, even: bool) -> int:
    if even:
        return min(request + request % 2, free - free % 2)
    return min(request, free)


def narrowest_hints(topo: CPUTopology, available: int, count: int) -> tuple[Hint, ...]:
    """StaticPolicy.hints cut to its narrowest width (same order, same preference)."""
    nodes = sorted(topo.numa)
    # The preferred width counts whole nodes, free or not: the widest nodes first.
    sizes = sorted((m.bit_count() for m in topo.numa.values()), reverse=True)
    preferred = next((w for w in range(1, len(sizes) + 1) if sum(sizes[:w]) >= count), len(sizes))
    for width in range(1, len(nodes) + 1):
        found = [
            Hint(NodeSet(combo), preferred=width == preferred)
            for combo in itertools.combinations(nodes, width)
            if (available & topo.numa_mask(combo)).bit_count() >= count
        ]
        if found:
            return tuple(found)
    return ()


def merged_affinity(topo: CPUTopology, available: int, count: int) -> NodeSet | None:
    """The best-effort merge of the CPU provider's hints (None: any node)."""
    hints = narrowest_hints(topo, available, count)
    machine = Machine(NodeSet(topo.numa))
    return merge(Policy.BEST_EFFORT, PolicyOptions(), machine, [{"cpu": hints}]).affinity


def samples_for(topo: CPUTopology, states: Sequence[State], even: bool) -> list[Sample]:
    samples = []
    for s in states:
        count = shaped_count(s.request, s.available.bit_count(), even)
        affinity = merged_affinity(topo, s.available, count) if s.aligned else None
        samples.append(Sample(s.available, count, affinity))
    return samples


def check(name: str, sample: Sample, result: int) -> None:
    """Exactly ``count`` CPUs, all from ``available``; otherwise stop with exit status 1."""
    if result.bit_count() == sample.count and result & ~sample.available == 0:
        return
    raise SystemExit(
        f"{name}: wrong allocation for {sample.count} CPUs (affinity {sample.affinity}): got "
        f"{CPUSet.from_bits(result).format_list()} ({result.bit_count()} CPUs), "
        f"{CPUSet.from_bits(result & ~sample.available).format_list() or 'none'} not available"
    )


def time_allocations(name: str, policy: StaticPolicy, samples: Sequence[Sample]) -> Stats:
    gc.collect()
    seconds = []
    for sample in samples:
        try:
            start = time.perf_counter()
            result = policy.allocate(sample.available, sample.count, sample.affinity)
            seconds.append(time.perf_counter() - start)
        except AllocationError as err:
            raise SystemExit(
                f"{name}: {sample.count} CPUs from "
                f"{CPUSet.from_bits(sample.available).format_list()}: {err}"
            ) from err
        check(name, sample, result)
    return Stats.of(seconds)


def time_hints(policy: StaticPolicy, samples: Sequence[Sample]) -> Stats:
    gc.collect()
    seconds = []
    for sample in samples:
        start = time.perf_counter()
        policy.hints(sample.available, sample.count)
        seconds.append(time.perf_counter() - start)
    return Stats.of(seconds)


def verdict(ms: float, target: float) -> str:
    return f"target <= {target:g} ms: {'PASS' if ms <= target else 'FAIL'}"


def run_machine(spec: Spec, plan: Plan, rng: random.Random) -> dict[str, Stats]:
    topo = build_topology(spec)
    states = random_states(topo, rng, plan.allocations)
    by_parity = {even: samples_for(topo, states, even) for even in (False, True)}
    free = statistics.mean(s.available.bit_count() / topo.num_cpus for s in states)
    print(f"{spec.describe()}; kubelet (Go) median per take {spec.kubelet_ms} ms")
    widths = Counter(len(s.affinity) for s in by_parity[False] if s.affinity is not None)
    spans = ", ".join(f"{n} of {w} node(s)" for w, n in sorted(widths.items()))
    print(
        f"  states: {free:.0%} free on average; affinity: {len(states) - widths.total()} none, "
        f"{spans}"
    )
    target = ALLOC_TARGET_MS.get(spec.cpus)
    results: dict[str, Stats] = {}
    for path in PATHS:
        policy = StaticPolicy(topo, path.options)
        name = f"{spec.cpus} CPUs, {path.name}"
        samples = by_parity[path.even]
        time_allocations(name, policy, samples[:5])  # warm-up
        stats = results[path.name] = time_allocations(name, policy, samples)
        note = "" if target is None else "  " + verdict(stats.median_ms, target)
        print(f"  {path.name:<18}{stats.line()}{note}")
    print()
    return results


def run_hints(spec: Spec, runs: int, rng: random.Random) -> Stats:
    topo = build_topology(spec)
    states = random_states(topo, rng, runs)
    samples = [
        Sample(s.available, shaped_count(s.request, s.available.bit_count(), False), None)
        for s in states
    ]
    policy = StaticPolicy(topo, StaticOptions())
    time_hints(policy, samples[:3])  # warm-up
    return time_hints(policy, samples)


def report_targets(allocations: dict[int, dict[str, Stats]], hints: Stats) -> bool:
    """One line per target, judged on the slowest path's median; True if all pass."""
    print("targets:")
    passed = True
    checks: list[tuple[str, float, float]] = []
    for cpus, target in ALLOC_TARGET_MS.items():
        worst = max(allocations[cpus].items(), key=lambda item: item[1].median_ms)
        label = f"allocation at {cpus} CPUs (slowest: {worst[0]})"
        checks.append((label, worst[1].median_ms, target))
    checks.append(("hint generation at 8 NUMA nodes", hints.median_ms, HINT_TARGET_MS))
    for label, ms, target in checks:
        passed = passed and ms <= target
        print(f"  {label:<54} median {ms:8.3f} ms  {verdict(ms, target)}")
    return passed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer samples per point")
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args()
    plan = QUICK if args.quick else FULL
    mix = ", ".join(map(str, REQUEST_MIX))
    print(
        f"numad CPU allocation benchmark (seed {args.seed}): requests of {mix} CPUs, "
        f"0-{MAX_TAKEN:.0%} of each machine taken\n"
    )
    rng = random.Random(args.seed)  # noqa: S311 (a reproducible workload, not a secret)
    allocations = {spec.cpus: run_machine(spec, plan, rng) for spec in SPECS}
    hints = run_hints(HINT_SPEC, plan.hints, rng)
    target = verdict(hints.median_ms, HINT_TARGET_MS)
    print(f"hint generation,  8 NUMA nodes: {hints.line()}  {target}")
    wide = run_hints(SPECS[2], plan.hints_16, rng)
    print(f"hint generation, 16 NUMA nodes: {wide.line()}  (no target)\n")
    if not report_targets(allocations, hints):
        sys.exit(2)


if __name__ == "__main__":
    main()
