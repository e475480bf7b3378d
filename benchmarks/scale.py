"""Whole admissions on 8- to 64-node machines half full, against the issue 14 targets.

Run from the repository root:

    .venv/bin/python benchmarks/scale.py [--quick] [--seed N] [--machine NAME ...]

Machines (recorded or synthetic sysfs trees of fixtures/sysfs, unpacked with
``load_fixture`` and read with ``discover``, as the daemon reads its host):

* 8 nodes: 48amd64-4pa2n6c-sparse (node ids 0-73, sparse);
* 16 nodes: there is no 16-node recording; 128ia64-17n4s2c (17 nodes, node 16
  CPU-less) stands in for the 16-node target;
* 34 nodes: 144arm-2pa72co+32gpumem-gb200like (synthetic: 2 CPU nodes and 32
  memory-only GPU-memory nodes, 4 GPUs);
* 64 nodes: 256intel64-64n2co2t-sgiuvlike (synthetic, 8 NICs).

Engine and books are built as ``Daemon.start`` builds them (numad.daemon.root):
discovery, the static CPU policy with the default config's reserved CPU, the
memory manager on (static memory policy), the topology policy best-effort and
container scope. Device classes follow each machine's PCI devices (GPUs: PCI
class 0x0302 of vendor 0x10de; NICs: class 0x0200 of vendor 0x8086); a
recording with no PCI devices gets one accelerator per NUMA node added to the
model's device inventory, and a machine whose 2 MiB hugepage pools hold no
pages gets no hugepages request; both are printed.

Method. Per machine and state (a seeded RNG), workloads are admitted on the
empty books until about half the allocatable CPUs are held exclusively: 1-16
exclusive CPUs; memory steered toward half the machine's allocatable memory
(0.5-1.5 times what is still missing of that half per CPU still missing); 2 MiB
hugepages for two in five, steered the same way; one device for one in four
while at most half the devices are held. A rejected fill workload is skipped
(the memory manager's group rule refuses some); the shares reached are printed
per state. Unpacking and discovering a fixture (2-16 s) is not timed. Then, on
those occupied books,
each timed sample is one pod of one container asking for 2-16 exclusive CPUs
(capped by the free ones), 1-4 GiB of memory, 64-512 MiB of 2 MiB hugepages
(where there are pages) and one device: one whole
``numad.placement.admission.admit(engine, books, pod)`` call (hint generation, the merge
by search, allocation), under best-effort and under restricted. The new books
are checked and dropped, so every sample sees the same half-full state.

Every admitted pod is checked (exit 1 if wrong): exactly the CPUs asked for,
all of them free before; the device free before; memory blocks of exactly the
amounts asked for, no node over its allocatable amount; under restricted, a
preferred merge. After each timed call an untimed one counts the search's
steps and whether it ran out of its budget (numad.placement.search BUDGET; the merge
then falls back to the fold or the documented rule).

Beside each machine: the kubelet's enumeration for the same pod, one hint list
per resource (cpu, memory, hugepages-2Mi, the device class), each up to 2^N - 1
node masks, and the product of the list lengths its merge would fold.

Targets (issue 14, "including hint generation"): <= 2 ms at 8 nodes, <= 10 ms
at 16, <= 50 ms at 34 and at 64, judged on the median of every policy; p99
and max are printed beside it.

Exit status: 0 if every target passed, 1 if an admission raised or returned a
wrong result (the traceback is printed; other machines still run), 2 if a
target failed.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import math
import random
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from unittest import mock

import numad.placement.policy
from numad.cpuset import CPUSet
from numad.daemon.config import Config
from numad.daemon.restore import choose_reserved, distances
from numad.hostfs import HostFS
from numad.placement.admission import (
    Books,
    ContainerRequest,
    Engine,
    Outcome,
    WorkloadRequest,
    admit,
)
from numad.placement.managers.cpu.state import CPUState
from numad.placement.managers.cpu.static import StaticOptions, StaticPolicy
from numad.placement.managers.cpu.topology import CPUTopology
from numad.placement.managers.device import Device, DeviceClass, DeviceInventory, DeviceState
from numad.placement.managers.memory import MEMORY, MemoryState, MemoryTable
from numad.placement.merge import Merged
from numad.placement.policy import Machine, Policy, check_machine, parse_options
from numad.placement.search import Search, SearchBudgetError
from numad.topology.discover import discover
from numad.topology.model import Topology
from numad.topology.record import load_fixture

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "sysfs"
SEED = 20261201
MiB, GiB = 1 << 20, 1 << 30
HUGE = "hugepages-2Mi"
HUGE_PAGE = 2 * MiB
ADDED_CLASS = "accelerator"  # the class added where the recording has no PCI devices
POLICIES = (Policy.BEST_EFFORT, Policy.RESTRICTED)
FILL_SHARE = 0.5  # of the allocatable CPUs, held exclusively by the fill
FILL_MAX_CPUS = 16
FILL_HUGE_SHARE = 0.4  # of fill workloads that take hugepages
FILL_DEVICE_SHARE = 0.25  # of fill workloads that take a device (while <= half are held)
FILL_MAX_REJECTS = 200  # rejected fill workloads before a state is taken as it is
POD_CPUS = (2, 16)
POD_MEMORY_GIB = (1, 4)
POD_HUGE_PAGES = (32, 256)  # 64-512 MiB of 2 MiB pages


@dataclass(frozen=True, slots=True)
class Spec:
    fixture: str
    target_nodes: int  # the machine size this one is judged against
    target_ms: float
    device: DeviceClass | None  # None: the recording has no PCI devices; one per node is added
    about: str


MACHINES = (
    Spec("48amd64-4pa2n6c-sparse", 8, 2.0, None, "recorded"),
    Spec(
        "128ia64-17n4s2c",
        16,
        10.0,
        None,
        "recorded; 17 nodes, no 16-node recording: stands in for the 16-node target",
    ),
    Spec(
        "144arm-2pa72co+32gpumem-gb200like",
        34,
        50.0,
        DeviceClass("gpu", vendor="0x10de", class_prefix="0x0302"),
        "synthetic",
    ),
    Spec(
        "256intel64-64n2co2t-sgiuvlike",
        64,
        50.0,
        DeviceClass("nic", vendor="0x8086", class_prefix="0x0200"),
        "synthetic",
    ),
)


@dataclass(frozen=True, slots=True)
class Plan:
    states: int
    pods: int  # timed pods per state (each under every policy)


FULL = Plan(states=5, pods=40)
QUICK = Plan(states=2, pods=10)


class WrongResultError(Exception):
    """An admission returned a result that breaks the books' rules."""


@dataclass(slots=True)
class Host:
    """A machine as the daemon would hold it: engine, empty books, and what was adapted."""

    spec: Spec
    topo: Topology
    engine: Engine
    books: Books
    device: str
    huge: bool  # whether pods ask for 2 MiB hugepages
    notes: list[str]


@dataclass(slots=True)
class Fill:
    cpus: float = 0.0  # shares of the allocatable amounts held
    memory: float = 0.0
    huge: float = 0.0
    devices: str = ""
    workloads: int = 0
    rejected: int = 0
    reasons: Counter[str] = field(default_factory=Counter)


@dataclass(slots=True)
class Samples:
    ms: list[float] = field(default_factory=list)
    admitted: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    steps: list[int] = field(default_factory=list)
    budget_hits: int = 0


@dataclass(frozen=True, slots=True)
class Latency:
    runs: int
    p50_ms: float
    p99_ms: float
    max_ms: float

    @classmethod
    def of(cls, ms: Sequence[float]) -> Latency:
        ordered = sorted(ms)
        p50, p99 = (ordered[math.ceil(q * len(ordered)) - 1] for q in (0.5, 0.99))  # nearest rank
        return cls(len(ordered), p50, p99, ordered[-1])


@dataclass(frozen=True, slots=True)
class Row:
    spec: Spec
    nodes: int
    policy: Policy
    latency: Latency | None
    admitted: str
    rejected: str
    search: str
    kubelet: str
    error: str = ""

    @property
    def passed(self) -> bool:
        return self.latency is not None and self.latency.p50_ms <= self.spec.target_ms


# -- the machine, as the daemon builds it -------------------------------------------------


def build(spec: Spec, topo: Topology) -> Host:
    """Engine and empty books as ``Daemon.start`` makes them from a default config."""
    config = Config(
        policy=Policy.BEST_EFFORT,
        memory_static=True,
        device_classes=() if spec.device is None else (spec.device,),
    )
    view = CPUTopology.from_topology(topo)
    options = parse_options(config.policy, config.topology_options)
    machine = Machine(topo.node_ids, distances(topo))
    check_machine(config.policy, options, machine)
    cpu_options = StaticOptions.parse(config.cpu_options)
    cpu_options.check(view, str(config.policy))
    cpu_policy = StaticPolicy(view, cpu_options)
    reserved, _ = choose_reserved(config, cpu_policy, None)
    engine = Engine(machine, cpu_policy, config.policy, options, config.scope, config.memory_static)
    notes: list[str] = []
    inventory = DeviceInventory.build(topo, config.device_classes)
    if spec.device is None:
        if topo.pci_devices:
            raise SystemExit(f"{spec.fixture}: has PCI devices now; name a class for them")
        added = tuple(Device(f"added:{i:02x}:00.0", node.id) for i, node in enumerate(topo.nodes))
        inventory = DeviceInventory(inventory.nodes, MappingProxyType({ADDED_CLASS: added}))
        device = ADDED_CLASS
        notes.append(
            f"no PCI devices recorded: added {len(added)} {ADDED_CLASS!r} devices to the "
            "device inventory, one per NUMA node"
        )
    else:
        device = spec.device.name
        found = inventory.classes[device]
        where = Counter(d.node for d in found)
        notes.append(
            f"device class {device!r} ({_selector(spec.device)}): {len(found)} devices, "
            + ", ".join(f"{k} on node {n}" for n, k in sorted(where.items(), key=_node_key))
        )
    table = MemoryTable.build(topo, config.memory_reserved)
    pages = sum(table.allocatable(n, HUGE) for n in table.nodes) // HUGE_PAGE
    huge = pages > 0
    if not huge:
        if any(p.size_kb == 2048 for n in topo.nodes for p in n.hugepages):
            notes.append("2 MiB hugepage pools recorded with 0 pages: no hugepages request")
        else:
            notes.append("no hugepages recorded: no hugepages request")
    else:
        held = [n for n in table.nodes if table.allocatable(n, HUGE)]
        notes.append(f"{pages} 2 MiB pages on {len(held)} of {len(table.nodes)} nodes")
    books = Books(
        CPUState(view.all, reserved & view.all, cpu_options.strict_reservation),
        MemoryState(table),
        DeviceState(inventory),
    )
    notes.append(
        f"{len(topo.nodes)} nodes, {view.all.bit_count()} CPUs, reserved "
        f"{CPUSet.from_bits(reserved)}; policy {engine.policy.value}, memory manager static, "
        f"scope {engine.scope.value}"
    )
    return Host(spec, topo, engine, books, device, huge, notes)


def _selector(c: DeviceClass) -> str:
    return f"vendor {c.vendor}, class {c.class_prefix}"


def _node_key(item: tuple[int | None, int]) -> int:
    return -1 if item[0] is None else item[0]


# -- half full ------------------------------------------------------------------------------


def _total(books: Books, resource: str) -> int:
    table = books.memory.table
    return sum(table.allocatable(n, resource) for n in table.nodes)


def _held(books: Books, resource: str) -> int:
    table = books.memory.table
    return sum(books.memory.used(n, resource) for n in table.nodes)


def occupy(host: Host, rng: random.Random, state: int) -> tuple[Books, Fill]:
    """Random workloads admitted until about half the allocatable CPUs are held; their
    memory and hugepages steered toward half the machine's by then."""
    books = host.books
    cpus = books.cpu.available.bit_count()
    goal = round(cpus * FILL_SHARE)
    memory, pages = _total(books, MEMORY), _total(books, HUGE) // HUGE_PAGE
    devices = len(books.devices.inventory.classes[host.device])
    fill = Fill()
    held = 0
    while held < goal and fill.rejected < FILL_MAX_REJECTS:
        want = rng.randint(1, min(FILL_MAX_CPUS, goal - held))
        # What is still missing of half the memory, per CPU still missing of half the CPUs.
        per_cpu = max(0, memory * FILL_SHARE - _held(books, MEMORY)) / (goal - held)
        amounts = {MEMORY: _mib(want * per_cpu * rng.uniform(0.5, 1.5))}
        if host.huge and rng.random() < FILL_HUGE_SHARE:
            missing = max(0, pages * FILL_SHARE - _held(books, HUGE) // HUGE_PAGE)
            share = want * missing / (goal - held) / FILL_HUGE_SHARE
            amounts[HUGE] = max(1, round(share * rng.uniform(0.5, 1.5))) * HUGE_PAGE
        taken = len(books.devices.in_use(host.device))
        wants_device = rng.random() < FILL_DEVICE_SHARE and taken + 1 <= devices // 2
        name = f"fill-{state}-{fill.workloads + fill.rejected}"
        request = ContainerRequest(
            "main",
            cpus=want,
            memory=amounts,
            devices={host.device: 1} if wants_device else {},
        )
        new, outcome = admit(host.engine, books, WorkloadRequest(name, (request,)))
        if outcome.admitted:
            books, held = new, held + want
            fill.workloads += 1
        else:
            fill.rejected += 1
            fill.reasons[outcome.detail or str(outcome.reason)] += 1
    fill.cpus = books.cpu.exclusive.bit_count() / cpus
    fill.memory = _held(books, MEMORY) / memory
    fill.huge = _held(books, HUGE) / (pages * HUGE_PAGE) if pages else 0.0
    fill.devices = f"{len(books.devices.in_use(host.device))}/{devices}"
    return books, fill


def _mib(amount: float) -> int:
    return max(1, round(amount / MiB)) * MiB


# -- the timed pods -------------------------------------------------------------------------


def pod(host: Host, books: Books, rng: random.Random, name: str) -> WorkloadRequest:
    free = books.cpu.available.bit_count()
    cpus = min(rng.randint(*POD_CPUS), free)
    memory = {MEMORY: rng.randint(*POD_MEMORY_GIB) * GiB}
    if host.huge:
        memory[HUGE] = rng.randint(*POD_HUGE_PAGES) * HUGE_PAGE
    container = ContainerRequest("main", cpus=cpus, memory=memory, devices={host.device: 1})
    return WorkloadRequest(name, (container,))


def check(
    host: Host,
    before: Books,
    after: Books,
    request: WorkloadRequest,
    *,
    policy: Policy,
    outcome: Outcome,
) -> None:
    """The admitted pod's allocations, against the books it was admitted on."""
    container = request.containers[0]
    key = (request.name, container.name)
    cpus = after.cpu.assignments.get(key, 0)
    if cpus.bit_count() != container.cpus or cpus & ~before.cpu.available:
        raise WrongResultError(
            f"{key}: cpus {CPUSet.from_bits(cpus)} for a request of {container.cpus}, "
            f"free before: {CPUSet.from_bits(before.cpu.available)}"
        )
    got = after.devices.held.get(key, {}).get(host.device, ())
    if len(got) != 1 or set(got) & before.devices.in_use(host.device):
        raise WrongResultError(
            f"{key}: devices {got}, in use before: {before.devices.in_use(host.device)}"
        )
    blocks = {b.resource: b.size for b in after.memory.blocks.get(key, ())}
    if blocks != dict(container.memory):
        raise WrongResultError(f"{key}: memory blocks {blocks} for a request of {container.memory}")
    over = after.memory.conflicts()
    if over:
        raise WrongResultError(f"{key}: {'; '.join(over)}")
    if policy is Policy.RESTRICTED and not all(d.preferred for _, d in outcome.decisions):
        raise WrongResultError(f"{key}: admitted under restricted without a preferred merge")


class _Audit(Search):
    """The search, counting its steps (the untimed second call only)."""

    runs: list[tuple[int, bool]] = []  # noqa: RUF012 - one audit at a time

    def run(self) -> Merged:
        try:
            merged = super().run()
        except SearchBudgetError:
            _Audit.runs.append((self.steps, True))
            raise
        _Audit.runs.append((self.steps, False))
        return merged


def sample(
    host: Host, books: Books, request: WorkloadRequest, policy: Policy, into: Samples
) -> None:
    engine = dataclasses.replace(host.engine, policy=policy)
    start = time.perf_counter()
    after, outcome = admit(engine, books, request)
    into.ms.append((time.perf_counter() - start) * 1000)
    if outcome.admitted:
        into.admitted += 1
        check(host, books, after, request, policy=policy, outcome=outcome)
    else:
        reason = outcome.reason.value if outcome.reason else "?"
        into.reasons[f"{reason}: {outcome.detail}" if outcome.detail else reason] += 1
    _Audit.runs = []
    with mock.patch.object(numad.placement.policy, "Search", _Audit):
        admit(engine, books, request)
    into.steps.extend(steps for steps, _ in _Audit.runs)
    into.budget_hits += sum(1 for _, hit in _Audit.runs if hit)


# -- the kubelet's side ---------------------------------------------------------------------


def kubelet(host: Host) -> str:
    """The kubelet's lists for the same pod: each up to 2^N - 1 masks, and their product."""
    n = len(host.topo.nodes)
    lists = ["cpu", MEMORY, *([HUGE] if host.huge else []), host.device]
    per_list = 2**n - 1
    power = len(lists) * math.log10(per_list)
    return f"{len(lists)} lists x 2^{n}-1 masks = {per_list:,}/list; product ~10^{power:.1f}"


# -- one machine ----------------------------------------------------------------------------


def run_machine(spec: Spec, plan: Plan, seed: int) -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="numad-scale-") as tmp:
        root = load_fixture(FIXTURES / f"{spec.fixture}.tar.bz2", Path(tmp))
        topo = discover(HostFS(root))
    host = build(spec, topo)
    nodes = len(topo.nodes)
    print(f"{spec.fixture} ({spec.about}); judged against the {spec.target_nodes}-node target")
    for note in host.notes:
        print(f"    {note}")
    print(f"    kubelet: {kubelet(host)}")
    rng = random.Random(f"{seed}:{spec.fixture}")  # noqa: S311 (reproducible, not a secret)
    samples = {p: Samples() for p in POLICIES}
    error = ""
    try:
        for state in range(plan.states):
            books, fill = occupy(host, rng, state)
            print(
                f"    state {state}: {fill.workloads} workloads ({fill.rejected} rejected), "
                f"CPUs {fill.cpus:.0%}, memory {fill.memory:.0%}"
                + (f", hugepages {fill.huge:.0%}" if host.huge else "")
                + f", {host.device} {fill.devices} held"
            )
            for detail, count in fill.reasons.most_common():
                print(f"        fill rejected {count}x: {detail}")
            gc.collect()
            for i in range(plan.pods):
                request = pod(host, books, rng, f"pod-{state}-{i}")
                for policy in POLICIES:
                    sample(host, books, request, policy, samples[policy])
    except Exception as err:  # noqa: BLE001 - reported with its traceback, the run goes on
        traceback.print_exc()
        error = f"{type(err).__name__}: {err}"
    rows = []
    for policy, got in samples.items():
        runs = len(got.ms)
        reasons = "; ".join(f"{v}x {k}" for k, v in got.reasons.most_common())
        rows.append(
            Row(
                spec,
                nodes,
                policy,
                Latency.of(got.ms) if got.ms else None,
                f"{got.admitted}/{runs} {got.admitted / max(runs, 1):4.0%}",
                reasons,
                f"{max(got.steps, default=0):,} max steps, {got.budget_hits} over budget",
                kubelet(host),
                error,
            )
        )
    print()
    return rows


def report(rows: Sequence[Row]) -> bool:
    print(
        f"{'machine':<34} {'N':>3} {'target':>7} {'policy':<12} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'max ms':>8} {'admitted':<14} {'p50 vs target':<14} search"
    )
    passed = True
    for r in rows:
        target = f"<={r.spec.target_ms:g}ms"
        if r.latency is None:
            times = f"{'-':>8} {'-':>8} {'-':>8}"
        else:
            times = f"{r.latency.p50_ms:8.2f} {r.latency.p99_ms:8.2f} {r.latency.max_ms:8.2f}"
        verdict = "PASS" if r.passed else "FAIL"
        if r.error:
            verdict += " (error)"
        passed = passed and r.passed
        print(
            f"{r.spec.fixture:<34} {r.nodes:>3} {target:>7} {r.policy.value:<12} {times} "
            f"{r.admitted:<14} {verdict:<14} {r.search}"
        )
    refused = [r for r in rows if r.rejected]
    if refused:
        print("\nnot admitted:")
        for r in refused:
            print(f"  {r.spec.fixture:<34} {r.policy.value:<12} {r.rejected}")
    print("\nkubelet enumeration for the same pod (per machine):")
    for r in rows:
        if r.policy is POLICIES[0]:
            print(f"  {r.spec.fixture:<34} {r.nodes:>3} nodes: {r.kubelet}")
    return passed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    names = [m.fixture for m in MACHINES]
    parser.add_argument(
        "--quick", action="store_true", help=f"{QUICK.states} states x {QUICK.pods} pods"
    )
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--machine", action="append", choices=names, help="only these (repeat)")
    parser.add_argument("--states", type=int, help="occupied states per machine")
    parser.add_argument("--pods", type=int, help="timed pods per state")
    args = parser.parse_args()
    plan = QUICK if args.quick else FULL
    plan = Plan(args.states or plan.states, args.pods or plan.pods)
    chosen = [m for m in MACHINES if not args.machine or m.fixture in args.machine]
    print(
        f"numad scale benchmark: whole admit() on half-full machines, seed {args.seed}, "
        f"{plan.states} states x {plan.pods} pods x {len(POLICIES)} policies per machine\n"
    )
    rows: list[Row] = []
    for spec in chosen:
        rows.extend(run_machine(spec, plan, args.seed))
    passed = report(rows)
    if any(r.error for r in rows):
        print("\nadmission raised or returned a wrong result:")
        for r in rows:
            if r.error and r.policy is POLICIES[0]:
                print(f"  {r.spec.fixture}: {r.error}")
        sys.exit(1)
    if not passed:
        sys.exit(2)


if __name__ == "__main__":
    main()
