"""Properties of the CPU manager over random machines: allocation, hints, reserved CPUs.

The machines cover what the kubelet's integer averages get wrong (reference
13.0): hybrid chips, offline SMT siblings, uneven sockets, NUMA nodes spanning
sockets and VM-style layouts, with Intel-style (n, n+N) or sibling-adjacent
(2k, 2k+1) numbering and gaps in the CPU ids.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from itertools import combinations
from types import FrameType

import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st
from hypothesis.vendor.pretty import RepresentationPrinter

from numad.cpuset import NodeSet
from numad.errors import AllocationError, ConfigError
from numad.placement.managers.cpu.distributed import take_distributed
from numad.placement.managers.cpu.packed import Strategy, take_packed
from numad.placement.managers.cpu.static import CPUOption, StaticOptions, StaticPolicy
from numad.placement.managers.cpu.topology import CPUInfo, CPUTopology, bits, mask_of

# A call that runs this long is taken for one that never ends (the kubelet's
# distributing allocator can loop forever, reference 13.1).
TIME_LIMIT = 10.0

# The distributing allocator walks every k-subset of the NUMA nodes and, for
# each, every subset of it for the remainder: beyond 8 nodes a large request
# can take many seconds (16 nodes of 6 CPUs, 55 CPUs: about 20 s), so the
# random tests leave it to machines of at most this many nodes.
DISTRIBUTE_MAX_NUMAS = 8


@contextmanager
def _terminates(seconds: float = TIME_LIMIT) -> Iterator[None]:
    def expire(_signum: int, _frame: FrameType | None) -> None:
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    except TimeoutError as err:
        # A fresh error: the frame the signal interrupted can lack a line
        # number, which breaks pytest's traceback report.
        raise AssertionError(str(err)) from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# -- machines ------------------------------------------------------------------


Thread = tuple[int, int]


@dataclass(frozen=True)
class Machine:
    """Online CPUs of a random machine; the repr lists cores as ``cpus:s<socket>n<numa>u<l3>``."""

    infos: tuple[CPUInfo, ...]

    @cached_property
    def topo(self) -> CPUTopology:
        return CPUTopology.of(self.infos)

    def __repr__(self) -> str:
        cores: dict[int, list[CPUInfo]] = {}
        for c in self.infos:
            cores.setdefault(c.core, []).append(c)
        parts = []
        for threads in cores.values():
            c = threads[0]
            ids = ",".join(str(t.cpu) for t in threads)
            parts.append(f"{ids}:s{c.socket}n{c.numa}u{c.uncore}")
        return f"Machine({' '.join(parts)})"

    def _repr_pretty_(self, p: RepresentationPrinter, cycle: bool) -> None:
        p.text(repr(self))  # Hypothesis would print every CPUInfo field


@st.composite
def _cells(draw: st.DrawFn) -> list[tuple[int, int]]:
    """The (socket, NUMA node) pairs that hold cores, in numbering order."""
    sockets = draw(st.integers(1, 4))
    layout = draw(st.sampled_from(["per-socket", "per-socket", "spanning", "vm"]))
    if layout == "spanning":  # a NUMA node holds `span` sockets (the last may hold fewer)
        span = draw(st.integers(1, sockets))
        return [(s, s // span) for s in range(sockets)]
    if layout == "per-socket":  # SNC / NPS: 1-4 NUMA nodes in each socket, maybe uneven
        first = draw(st.integers(1, 4))
        uniform = draw(st.booleans())
        cells: list[tuple[int, int]] = []
        for s in range(sockets):
            k = first if uniform or s == 0 else draw(st.integers(1, 4))
            cells += [(s, len(cells) + i) for i in range(k)]
        return cells
    # A VM: any socket may meet any NUMA node (QEMU's -numa takes any CPU list).
    numas = draw(st.integers(1, 4))
    pairs = {(s, draw(st.integers(0, numas - 1))) for s in range(sockets)}
    pairs |= {(draw(st.integers(0, sockets - 1)), n) for n in range(numas)}
    extra = draw(st.sets(st.tuples(st.integers(0, sockets - 1), st.integers(0, numas - 1))))
    return sorted(pairs | extra)


@st.composite
def _cores(draw: st.DrawFn) -> list[tuple[int, int, int, int]]:
    """Cores as (socket, NUMA node, L3 group or -1 for none, threads), in numbering order."""
    smt = draw(st.sampled_from([1, 1, 2, 2, 2, 4]))
    hybrid = smt > 1 and draw(st.booleans())  # E-cores: one thread, after the P-cores
    uniform = draw(st.booleans())
    per_cell = draw(st.integers(1, 12))
    l3_size = draw(st.sampled_from([0, 0, 2, 3, 4, 8]))  # 0: uncore falls back to socket
    cores: list[tuple[int, int, int, int]] = []
    groups = 0
    for socket, numa in draw(_cells()):
        n = per_cell if uniform else draw(st.integers(1, 12))
        e_cores = draw(st.integers(0, n)) if hybrid else 0
        for i in range(n):
            width = 1 if i >= n - e_cores else smt
            cores.append((socket, numa, groups + i // l3_size if l3_size else -1, width))
        groups += -(-n // l3_size) if l3_size else 0
    return cores


@st.composite
def _numbering(draw: st.DrawFn, cores: list[tuple[int, int, int, int]]) -> dict[Thread, int]:
    """CPU ids of the threads (core index, thread index): Intel-style or adjacent, with gaps."""
    threads = [(i, t) for i, core in enumerate(cores) for t in range(core[3])]
    if draw(st.booleans()):  # Intel/AMD: first threads of all cores, then the second ...
        threads.sort(key=lambda it: (it[1], it[0]))
    base = draw(st.integers(0, 8))
    holes = draw(st.sets(st.integers(0, len(threads)), max_size=4))
    return {it: base + k + sum(h <= k for h in holes) for k, it in enumerate(threads)}


@st.composite
def machines(draw: st.DrawFn) -> Machine:
    cores = draw(_cores())
    ids = draw(_numbering(cores))
    offline: dict[int, int] = {}  # core index -> its offline thread
    if draw(st.booleans()):
        smt_cores = [i for i, core in enumerate(cores) if core[3] > 1]
        for i in draw(
            st.sets(st.sampled_from(smt_cores), min_size=1, max_size=8)
            if smt_cores
            else st.just(())
        ):
            offline[i] = draw(st.integers(0, cores[i][3] - 1))
    socket_ids = draw(st.permutations(range(max(c[0] for c in cores) + 1)))
    numa_ids = draw(st.permutations(range(max(c[1] for c in cores) + 1)))
    infos = []
    for (i, t), cpu in ids.items():
        socket, numa, group, width = cores[i]
        if offline.get(i) == t:
            continue
        core_id = min(ids[i, u] for u in range(width) if offline.get(i) != u)
        uncore = socket_ids[socket] if group < 0 else group
        infos.append(CPUInfo(cpu, core_id, socket_ids[socket], numa_ids[numa], uncore))
    return Machine(tuple(sorted(infos, key=lambda c: c.cpu)))


# -- state -----------------------------------------------------------------------


def _cores_mask(topo: CPUTopology, cpus: int) -> int:
    """``cpus`` and all their siblings."""
    out = 0
    for cpu in bits(cpus):
        out |= topo.core[topo.info[cpu].core]
    return out


@st.composite
def _subset(draw: st.DrawFn, topo: CPUTopology, universe: int, modes: tuple[str, ...]) -> int:
    """A random part of ``universe``: all, none, about 1/4, 1/2 or 3/4 of it, or whole cores."""
    mode = draw(st.sampled_from(modes))
    if mode == "all":
        return universe
    if mode == "none":
        return 0
    top = (1 << universe.bit_length()) - 1
    a = draw(st.integers(0, top)) & universe
    if mode == "half":
        return a
    b = draw(st.integers(0, top))
    if mode == "sparse":
        return a & b
    if mode == "dense":
        return (a | b) & universe
    # "cores": about half the cores whole (those whose id is in a), less 1/8 of their CPUs
    whole = 0
    for core, cpus in topo.core.items():
        if a >> core & 1:
            whole |= cpus
    return whole & universe & ~(b & draw(st.integers(0, top)))


@st.composite
def static_options(
    draw: st.DrawFn, topo: CPUTopology, *, packed_only: bool = False
) -> StaticOptions:
    """A valid option set: no pair ``StaticOptions.parse`` forbids, align-by-socket only
    where ``StaticOptions.check`` allows it."""
    raw = {o.value: draw(st.booleans()) for o in CPUOption}
    raw[CPUOption.DISTRIBUTE_ACROSS_CORES] = not packed_only and draw(st.integers(0, 3)) == 3
    off: set[CPUOption] = set()
    if raw[CPUOption.DISTRIBUTE_ACROSS_CORES]:
        off |= {CPUOption.FULL_PCPUS_ONLY, CPUOption.DISTRIBUTE_ACROSS_NUMA}
        off.add(CPUOption.PREFER_UNCORE)
    if packed_only:
        off |= {CPUOption.DISTRIBUTE_ACROSS_NUMA, CPUOption.PREFER_UNCORE}
    if raw[CPUOption.PREFER_UNCORE] and raw[CPUOption.DISTRIBUTE_ACROSS_NUMA]:
        off.add(draw(st.sampled_from([CPUOption.PREFER_UNCORE, CPUOption.DISTRIBUTE_ACROSS_NUMA])))
    if topo.num_numa_nodes > DISTRIBUTE_MAX_NUMAS:
        off.add(CPUOption.DISTRIBUTE_ACROSS_NUMA)
    if topo.num_sockets > topo.num_numa_nodes:
        off.add(CPUOption.ALIGN_BY_SOCKET)
    for option in off:
        raw[option] = False
    options = StaticOptions.parse(raw)
    options.check(topo)
    return options


@dataclass(frozen=True)
class Scenario:
    """One allocation request on a machine in some state."""

    machine: Machine
    options: StaticOptions
    available: int
    reserved: int
    reusable: int
    count: int
    affinity: NodeSet | None

    @property
    def free(self) -> int:
        return self.available | self.reusable

    def __repr__(self) -> str:
        return (
            f"Scenario({self.machine!r}, {self.options}, available={bits(self.available)}, "
            f"reserved={bits(self.reserved)}, reusable={bits(self.reusable)}, "
            f"count={self.count}, affinity={self.affinity})"
        )

    def _repr_pretty_(self, p: RepresentationPrinter, cycle: bool) -> None:
        p.text(repr(self))


STATE = ("all", "half", "half", "sparse", "dense", "dense", "cores", "cores", "none")
SOME = ("none", "sparse", "half")


@st.composite
def scenarios(draw: st.DrawFn, *, packed_only: bool = False) -> Scenario:
    machine = draw(machines())
    topo = machine.topo
    available = draw(_subset(topo, topo.all, STATE))
    reserved = draw(_subset(topo, topo.all & ~available, SOME))
    reusable = draw(_subset(topo, topo.all & ~available & ~reserved, SOME))
    free = (available | reusable).bit_count()
    too_many = free == 0 or draw(st.integers(0, 9)) == 9
    count = draw(st.integers(free + 1, free + 2) if too_many else st.integers(1, free))
    nodes = sorted(topo.numa)
    affinity = draw(st.none() | st.sets(st.sampled_from(nodes), min_size=1).map(NodeSet))
    options = draw(static_options(topo, packed_only=packed_only))
    return Scenario(machine, options, available, reserved, reusable, count, affinity)


def _attempt(call: Callable[[], int]) -> int | AllocationError:
    """The CPUs a call returns, or the AllocationError it raises; anything else fails."""
    try:
        with _terminates():
            return call()
    except AllocationError as err:
        return err


def _allocate(s: Scenario, topo: CPUTopology | None = None) -> int | AllocationError:
    policy = StaticPolicy(topo or s.machine.topo, s.options)
    return _attempt(
        lambda: policy.allocate(
            s.available, s.count, s.affinity, reusable=s.reusable, reserved=s.reserved
        )
    )


def _smt_rejects(s: Scenario) -> bool:
    """Whether full-pcpus-only's admission checks (reference 7.2) refuse the request."""
    if not s.options.full_pcpus_only:
        return False
    topo = s.machine.topo
    per_core = topo.num_cpus // topo.num_cores
    physical = s.available & ~_cores_mask(topo, s.reserved)
    return s.count % per_core != 0 or s.count > physical.bit_count()


def _split_whole_cores(topo: CPUTopology, free_before: int, result: int) -> list[int]:
    """Cores that were wholly free before and are now partly taken."""
    return [
        core
        for core, cpus in topo.core.items()
        if cpus & ~free_before == 0 and 0 < (cpus & result).bit_count() < cpus.bit_count()
    ]


# -- 1, 2: exactly `count` free CPUs, or an AllocationError ---------------------------


@settings(max_examples=400, deadline=None)
@given(scenarios())
def test_allocate_gives_count_free_cpus_or_allocation_error(s: Scenario) -> None:
    result = _allocate(s)
    if isinstance(result, AllocationError):
        if _smt_rejects(s):
            assert result.problem.startswith("SMT Alignment Error")
        else:
            assert s.count > s.free.bit_count(), f"refused a feasible request: {result}"
            assert result.problem.startswith("not enough cpus available")
        return
    assert not _smt_rejects(s)
    assert result.bit_count() == s.count
    assert result & ~s.free == 0, f"not free: {bits(result & ~s.free)}"
    if s.affinity is not None:  # the aligned part first (reference 7.2)
        topo = s.machine.topo
        aligned = topo.numa_mask(s.affinity)
        if s.options.align_by_socket:
            aligned = mask_of(c.cpu for c in topo.cpus if topo.socket[c.socket] & aligned)
        inside = (aligned & s.free).bit_count()
        assert (result & aligned).bit_count() == min(s.count, inside)


def _take_directly(
    topo: CPUTopology, available: int, count: int, data: st.DataObject
) -> tuple[int | AllocationError, bool]:
    """take_packed or take_distributed with drawn parameters; and whether whole cores come
    before split ones (the packed strategy, no uncore step)."""
    strategy = data.draw(st.sampled_from(list(Strategy)), label="strategy")
    if len(topo.numa) <= DISTRIBUTE_MAX_NUMAS and data.draw(st.booleans(), label="distributed"):
        group_size = data.draw(st.sampled_from([1, 2, 4, topo.cpus_per_core]), label="g")
        align_by_socket = data.draw(st.booleans(), label="align_by_socket")
        min_numas = data.draw(st.integers(0, len(topo.numa) + 1), label="min_numas_from_hint")
        return _attempt(
            lambda: take_distributed(
                topo,
                available,
                count,
                group_size=group_size,
                strategy=strategy,
                align_by_socket=align_by_socket,
                min_numas_from_hint=min_numas,
            )
        ), False
    uncore = data.draw(st.booleans(), label="prefer_uncore")
    result = _attempt(
        lambda: take_packed(topo, available, count, strategy=strategy, prefer_uncore=uncore)
    )
    return result, strategy is Strategy.PACKED and not uncore


@settings(max_examples=400, deadline=None)
@given(machines(), st.data())
def test_allocators_give_count_free_cpus_or_allocation_error(
    machine: Machine, data: st.DataObject
) -> None:
    topo = machine.topo
    available = data.draw(_subset(topo, topo.all, STATE), label="available")
    count = data.draw(st.integers(0, available.bit_count() + 2), label="count")
    note(f"available={bits(available)}")
    result, whole_cores_first = _take_directly(topo, available, count, data)
    if isinstance(result, AllocationError):
        assert count > available.bit_count(), f"refused a feasible request: {result}"
        return
    assert result.bit_count() == count
    assert result & ~available == 0, f"not free: {bits(result & ~available)}"
    if whole_cores_first:  # property 3, as in test_packed_splits_at_most_one_whole_free_core
        split = _split_whole_cores(topo, available, result)
        assert len(split) <= 1, f"wholly free cores split: {split}"


def _hybrid_8p_8e() -> list[CPUInfo]:
    """One socket: 8 P-cores with siblings (0,1)...(14,15), 8 E-cores 16-23."""
    p_cores = [CPUInfo(cpu, cpu & ~1, 0, 0, 0) for cpu in range(16)]
    return p_cores + [CPUInfo(cpu, cpu, 0, 0, 0) for cpu in range(16, 24)]


def _offline_sibling() -> list[CPUInfo]:
    """Four cores with siblings (n, n+4); CPU 7 offline, so 7 CPUs / 4 cores = 1 per core."""
    return [CPUInfo(cpu, cpu % 4, 0, 0, 0) for cpu in range(7)]


def _uneven_sockets() -> list[CPUInfo]:
    """One NUMA node over two sockets of 4 and 2 CPUs: 6 / 2 = 3 per "idle" socket."""
    return [CPUInfo(cpu, cpu, 0 if cpu < 4 else 1, 0, 0) for cpu in range(6)]


@pytest.mark.parametrize(
    ("cpus", "free", "count"),
    [
        # Reference 13.0: the kubelet answers {6,7,13}; CPU 6 is not free.
        pytest.param(_hybrid_8p_8e(), {7, 10, 11, 13}, 3, id="hybrid-8p8e-13.0"),
        # The kubelet takes core {0,4} whole (1 free = the average of 1), CPU 0 busy.
        pytest.param(_offline_sibling(), {1, 4, 5}, 2, id="offline-sibling"),
        # The kubelet takes socket 0 whole (3 free = the average of 3), CPU 3 busy.
        pytest.param(_uneven_sockets(), {0, 1, 2, 4, 5}, 4, id="uneven-sockets"),
    ],
)
@pytest.mark.parametrize(
    "options",
    [
        pytest.param(StaticOptions(), id="packed"),
        pytest.param(StaticOptions(prefer_uncore=True), id="uncore"),
        pytest.param(StaticOptions(distribute_across_numa=True), id="distribute"),
        pytest.param(StaticOptions(distribute_across_cores=True), id="spread"),
    ],
)
def test_no_double_allocation_on_non_uniform_machines(
    cpus: list[CPUInfo], free: set[int], count: int, options: StaticOptions
) -> None:
    result = StaticPolicy(CPUTopology.of(cpus), options).allocate(mask_of(free), count, None)
    assert result.bit_count() == count
    assert set(bits(result)) <= free


def _vm(cores: list[tuple[int, int]], smt: int = 1) -> list[CPUInfo]:
    """A VM whose core i (threads i*smt...) sits in socket cores[i][0], NUMA node cores[i][1]."""
    return [
        CPUInfo(i * smt + t, i * smt, socket, numa, socket)
        for i, (socket, numa) in enumerate(cores)
        for t in range(smt)
    ]


# VM layouts where a socket holds several NUMA nodes and a NUMA node spans
# sockets (QEMU's -numa takes any CPU list): the nested orders of reference 5.3
# then list a domain once under each parent.
@pytest.mark.parametrize(
    ("cpus", "free", "count", "options"),
    [
        # NUMA 0 spans sockets 0 and 1, socket 0 holds NUMA 0-2: socket-first,
        # NUMA 0 is listed twice, so a combination can name it twice.
        pytest.param(
            _vm([(0, 0), (0, 1), (0, 2), (1, 0)]),
            {0, 1, 2, 3},
            4,
            StaticOptions(distribute_across_numa=True),
            id="distribute-numa-listed-twice",
        ),
        # Socket 2 holds NUMA 1 and 2: NUMA-first, socket 2's cores listed twice.
        pytest.param(
            _vm([(0, 0), (1, 0), (2, 1), (2, 2)], smt=2),
            {0, 2, 4, 6},
            3,
            StaticOptions(),
            id="packed-core-listed-twice",
        ),
        pytest.param(
            _vm([(0, 0), (0, 0), (0, 0), (0, 1), (1, 0), (1, 1)]),
            {0, 1, 2, 4, 5},
            3,
            StaticOptions(distribute_across_cores=True),
            id="spread-socket-listed-twice",
        ),
    ],
)
def test_domains_listed_twice_on_vm_layouts(
    cpus: list[CPUInfo], free: set[int], count: int, options: StaticOptions
) -> None:
    result = _attempt(
        lambda: StaticPolicy(CPUTopology.of(cpus), options).allocate(mask_of(free), count, None)
    )
    assert not isinstance(result, AllocationError), f"refused a feasible request: {result}"
    assert result.bit_count() == count
    assert set(bits(result)) <= free


# -- 3: whole free cores before split cores ---------------------------------------------


@settings(max_examples=300, deadline=None)
@given(scenarios(packed_only=True))
def test_packed_splits_at_most_one_whole_free_core(s: Scenario) -> None:
    result = _allocate(s)
    if isinstance(result, AllocationError):
        return
    split = _split_whole_cores(s.machine.topo, s.free, result)
    assert len(split) <= 1, f"wholly free cores split: {split}"


# -- 4: determinism -----------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(scenarios(), st.data())
def test_same_inputs_same_result_in_any_cpu_order(s: Scenario, data: st.DataObject) -> None:
    shuffled = data.draw(st.permutations(s.machine.infos), label="cpu order")
    answers = []
    for topo in (s.machine.topo, CPUTopology.of(s.machine.infos), CPUTopology.of(shuffled)):
        answers.append(str(_allocate(s, topo)))
        policy = StaticPolicy(topo, s.options)
        answers[-1] += repr(policy.hints(s.available, s.count, reusable=s.reusable))
    assert answers[0] == answers[1] == answers[2]


# -- 5: hints -----------------------------------------------------------------------------


def _expected_hints(topo: CPUTopology, free: int, reusable: int, count: int) -> list[list[int]]:
    """Every NUMA node set, narrowest first then lexicographic, whose free CPUs cover count."""
    node_cpus: dict[int, int] = {}
    for c in topo.cpus:
        node_cpus[c.numa] = node_cpus.get(c.numa, 0) | 1 << c.cpu
    found = []
    for width in range(1, len(node_cpus) + 1):
        for combo in combinations(sorted(node_cpus), width):
            mask = sum(node_cpus[n] for n in combo)
            if reusable & ~mask == 0 and (free & mask).bit_count() >= count:
                found.append(list(combo))
    return found


def _min_width(topo: CPUTopology, count: int) -> int:
    """The narrowest NUMA node set that holds count CPUs on an empty machine."""
    sizes = sorted((m.bit_count() for m in topo.numa.values()), reverse=True)
    for width in range(1, len(sizes) + 1):
        if sum(sizes[:width]) >= count:
            return width
    return len(sizes)


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_hints_cover_the_request_and_prefer_the_narrowest(s: Scenario) -> None:
    topo = s.machine.topo
    with _terminates():
        hints = StaticPolicy(topo, s.options).hints(s.available, s.count, reusable=s.reusable)
    assert hints is not None
    got = [list(h.affinity or ()) for h in hints]
    assert got == _expected_hints(topo, s.free, s.reusable, s.count)
    narrowest = _min_width(topo, s.count)
    for h in hints:
        assert h.affinity is not None
        if not s.options.align_by_socket:
            assert h.preferred == (len(h.affinity) == narrowest), h
        elif len(h.affinity) == narrowest:
            assert h.preferred, h


@settings(max_examples=100, deadline=None)
@given(machines(), st.data())
def test_hints_for_an_existing_assignment(machine: Machine, data: st.DataObject) -> None:
    topo = machine.topo
    allocated = data.draw(_subset(topo, topo.all, ("half", "sparse", "cores")), label="allocated")
    count = data.draw(st.integers(1, topo.num_cpus), label="count")
    policy = StaticPolicy(topo, StaticOptions())
    hints = policy.hints(topo.all, count, allocated=allocated)
    if allocated.bit_count() != count:
        assert hints == ()
    else:
        assert hints is not None
        assert [list(h.affinity or ()) for h in hints] == _expected_hints(topo, allocated, 0, count)


def test_no_hint_for_zero_cpus() -> None:
    topo = CPUTopology.of(_hybrid_8p_8e())
    assert StaticPolicy(topo, StaticOptions()).hints(topo.all, 0) is None


# -- 6: reserved CPUs ---------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(machines(), st.data())
def test_reserve_gives_exactly_n_cpus(machine: Machine, data: st.DataObject) -> None:
    topo = machine.topo
    options = data.draw(static_options(topo), label="options")
    n = data.draw(st.integers(0, topo.num_cpus + 2), label="n")
    policy = StaticPolicy(topo, options)
    if n > topo.num_cpus:
        with pytest.raises(ConfigError, match="unable to reserve"):
            policy.reserve(n)
        return
    with _terminates():
        reserved = policy.reserve(n)
    assert reserved.bit_count() == n
    assert reserved & ~topo.all == 0
