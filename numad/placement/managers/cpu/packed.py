"""The packed allocator: the kubelet's takeByTopologyNUMAPacked, without its double allocation.

Pure core (reference/cpu-manager.md section 5). Best-fit: every list is
ordered "fewest free CPUs first, then lowest id", and the allocator takes, in
order, whole first-level domains (NUMA nodes or sockets, whichever is
bigger), whole second-level domains, optionally uncore caches, whole cores,
then single CPUs.

Where numad departs from the kubelet: a domain counts as idle by the
kubelet's test (free CPUs equal to an integer average for cores and sockets),
but numad takes it only if every CPU of the domain is free. The kubelet takes
the domain's CPUs from the full topology, which on hybrid chips, machines
with an offline SMT sibling or uneven sockets hands out CPUs that belong to
another container or to the reserved set (reference 13.0). Everywhere else
the two agree CPU for CPU.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from enum import StrEnum

from numad.errors import AllocationError
from numad.placement.managers.cpu.topology import CPUTopology, bits


class Strategy(StrEnum):
    """Order of the single-CPU step: by core (packed) or by CPU id within a socket (spread)."""

    PACKED = "packed"
    SPREAD = "spread"


def not_enough(requested: int, available: int) -> AllocationError:
    return AllocationError(
        "cpu",
        "not enough cpus available to satisfy request: "
        f"requested={requested}, available={available}",
    )


class Accumulator:
    """The free view shrinking as CPUs are taken, and what is still needed."""

    def __init__(self, topo: CPUTopology, available: int, needed: int, strategy: Strategy) -> None:
        self.topo = topo
        self.free = available & topo.all
        self.needed = needed
        self.result = 0
        self.strategy = strategy
        self.numa_first = topo.num_sockets >= topo.num_numa_nodes

    # -- basics --------------------------------------------------------------

    def satisfied(self) -> bool:
        return self.needed < 1

    def failed(self) -> bool:
        return self.needed > self.free.bit_count()

    def needs_at_least(self, n: int) -> bool:
        return self.needed >= n

    def take(self, cpus: int) -> None:
        # Only CPUs not taken yet count. The kubelet counts a CPU again when an
        # order lists it twice (a NUMA node spanning sockets lists their cores
        # under each node) and then returns fewer CPUs than asked for.
        new = cpus & ~self.result
        self.result |= new
        self.free &= ~new
        self.needed -= new.bit_count()

    def take_whole(self, domain: int) -> None:
        """Take a whole domain, but only if all of it is free (numad's fix of 13.0)."""
        if domain & ~self.free == 0:
            self.take(domain)

    def _sort(self, ids: Iterable[int], masks: Mapping[int, int]) -> list[int]:
        free = self.free
        return sorted(ids, key=lambda i: ((masks[i] & free).bit_count(), i))

    def _having_free(
        self, ids: Iterable[int], masks: Mapping[int, int], within: int = -1
    ) -> list[int]:
        free = self.free & within
        return [i for i in ids if masks[i] & free]

    # -- orders (reference 5.3) ----------------------------------------------------

    def numa_order(self) -> list[int]:
        t = self.topo
        if self.numa_first:
            return self._sort(self._having_free(t.numa, t.numa), t.numa)
        order: list[int] = []
        for socket in self.socket_order():
            numas = self._having_free(t.socket_numas[socket], t.numa, t.socket[socket])
            order += self._sort(numas, t.numa)
        return order

    def socket_order(self) -> list[int]:
        t = self.topo
        if not self.numa_first:
            return self._sort(self._having_free(t.socket, t.socket), t.socket)
        order: list[int] = []
        for numa in self.numa_order():
            sockets = self._having_free(t.numa_sockets[numa], t.socket, t.numa[numa])
            order += self._sort(sockets, t.socket)
        return order

    def core_order(self) -> list[int]:
        t = self.topo
        order: list[int] = []
        if self.numa_first:
            for socket in self.socket_order():
                cores = self._having_free(t.socket_cores[socket], t.core, t.socket[socket])
                order += self._sort(cores, t.core)
        else:
            for numa in self.numa_order():
                cores = self._having_free(t.numa_cores[numa], t.core, t.numa[numa])
                order += self._sort(cores, t.core)
        return order

    def uncore_order(self) -> list[int]:
        t = self.topo
        order: list[int] = []
        for numa in self.numa_order():
            uncores = self._having_free(t.numa_uncores[numa], t.uncore, t.numa[numa])
            order += self._sort(uncores, t.uncore)
        return order

    def cpu_order(self) -> list[int]:
        t = self.topo
        order: list[int] = []
        if self.strategy is Strategy.SPREAD:
            for socket in self.socket_order():
                order += bits(t.socket[socket] & self.free)
        else:
            for core in self.core_order():
                order += bits(t.core[core] & self.free)
        return order

    # -- idle tests (reference 5.4: the kubelet's integer averages) ----------------

    def _idle(
        self, order: list[int], masks: Mapping[int, int], size: Callable[[int], int]
    ) -> list[int]:
        return [i for i in order if (masks[i] & self.free).bit_count() == size(i)]

    def idle_numas(self) -> list[int]:
        t = self.topo
        return self._idle(self.numa_order(), t.numa, lambda n: t.numa[n].bit_count())

    def idle_sockets(self) -> list[int]:
        t = self.topo
        return self._idle(self.socket_order(), t.socket, lambda _s: t.cpus_per_socket)

    def idle_cores(self) -> list[int]:
        t = self.topo
        return self._idle(self.core_order(), t.core, lambda _c: t.cpus_per_core)

    def idle_uncores(self) -> list[int]:
        t = self.topo
        return self._idle(self.uncore_order(), t.uncore, lambda u: t.uncore[u].bit_count())

    # -- steps (reference 5.5, 5.6) -------------------------------------------------

    def take_whole_domains(self, ids: list[int], masks: Mapping[int, int]) -> None:
        for i in ids:
            if self.needs_at_least(masks[i].bit_count()):
                self.take_whole(masks[i])

    def take_first_level(self) -> None:
        if self.numa_first:
            self.take_whole_domains(self.idle_numas(), self.topo.numa)
        else:
            self.take_whole_domains(self.idle_sockets(), self.topo.socket)

    def take_second_level(self) -> None:
        if self.numa_first:
            self.take_whole_domains(self.idle_sockets(), self.topo.socket)
        else:
            self.take_whole_domains(self.idle_numas(), self.topo.numa)

    def take_uncore_caches(self) -> None:
        per_uncore = self.topo.cpus_per_uncore
        for uncore in self.uncore_order():
            if self.needs_at_least(per_uncore):
                self.take_whole_domains(self.idle_uncores(), self.topo.uncore)
            if self.satisfied():
                return
            self.take_partial_uncore(uncore)
            if self.satisfied():
                return

    def take_partial_uncore(self, uncore: int) -> None:
        t = self.topo
        per_core = t.cpus_per_core
        if per_core < 1:
            return
        cores_needed = -(-self.needed // per_core)
        free_in = t.uncore[uncore] & self.free
        cores = [c for c in t.uncore_cores[uncore] if t.core[c] & free_in][:cores_needed]
        candidates = 0
        for c in cores:
            candidates |= t.core[c] & self.free
        if self.needed % 2 == 1 and per_core > 1 and candidates.bit_count() > self.needed:
            candidates &= ~(1 << (candidates.bit_length() - 1))  # drop the highest-numbered CPU
        if candidates.bit_count() == self.needed:
            self.take(candidates)

    def take_cores(self) -> None:
        for core in self.idle_cores():
            if self.needs_at_least(self.topo.core[core].bit_count()):
                self.take_whole(self.topo.core[core])

    def take_cpus(self) -> None:
        for cpu in self.cpu_order():
            self.take(1 << cpu)
            if self.satisfied():
                return


def take_packed(
    topo: CPUTopology,
    available: int,
    count: int,
    *,
    strategy: Strategy = Strategy.PACKED,
    prefer_uncore: bool = False,
) -> int:
    """``count`` CPUs out of ``available`` (bit masks), best-fit by topology."""
    acc = Accumulator(topo, available, count, strategy)
    if acc.satisfied():
        return acc.result
    if acc.failed():
        raise not_enough(count, available.bit_count())
    steps: list[Callable[[], None]] = [acc.take_first_level, acc.take_second_level]
    if prefer_uncore:
        steps.append(acc.take_uncore_caches)
    if strategy is not Strategy.SPREAD:
        steps.append(acc.take_cores)
    steps.append(acc.take_cpus)
    for step in steps:
        step()
        if acc.satisfied():
            return acc.result
    raise AllocationError("cpu", "failed to allocate cpus")
