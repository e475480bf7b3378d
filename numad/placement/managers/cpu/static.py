"""The static CPU policy: options, exclusive allocation, NUMA hints, reserved CPUs.

Pure core (reference/cpu-manager.md sections 2-4, 7, 8, 10). Sets are CPU bit
masks; ``available`` is the shared pool minus the reserved CPUs, as the
kubelet's ``GetAvailableCPUs``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from numad.cpuset import CPUSet, NodeSet
from numad.errors import AllocationError, ConfigError
from numad.placement.hints import Hint
from numad.placement.hintspace import HintSpace, min_width
from numad.placement.managers.cpu.distributed import take_distributed
from numad.placement.managers.cpu.packed import Strategy, take_packed
from numad.placement.managers.cpu.topology import CPUTopology


class CPUOption(StrEnum):
    FULL_PCPUS_ONLY = "full-pcpus-only"
    DISTRIBUTE_ACROSS_NUMA = "distribute-cpus-across-numa"
    ALIGN_BY_SOCKET = "align-by-socket"
    DISTRIBUTE_ACROSS_CORES = "distribute-cpus-across-cores"
    STRICT_RESERVATION = "strict-cpu-reservation"
    PREFER_UNCORE = "prefer-align-cpus-by-uncorecache"


# Checked in this order; the first pair found is reported (reference 10).
_EXCLUSIVE = (
    (CPUOption.FULL_PCPUS_ONLY, CPUOption.DISTRIBUTE_ACROSS_CORES),
    (CPUOption.DISTRIBUTE_ACROSS_NUMA, CPUOption.DISTRIBUTE_ACROSS_CORES),
    (CPUOption.PREFER_UNCORE, CPUOption.DISTRIBUTE_ACROSS_CORES),
    (CPUOption.PREFER_UNCORE, CPUOption.DISTRIBUTE_ACROSS_NUMA),
)


@dataclass(frozen=True, slots=True)
class StaticOptions:
    full_pcpus_only: bool = False
    distribute_across_numa: bool = False
    align_by_socket: bool = False
    distribute_across_cores: bool = False
    strict_reservation: bool = False
    prefer_uncore: bool = False

    @classmethod
    def parse(cls, raw: Mapping[str, bool]) -> StaticOptions:
        on: set[CPUOption] = set()
        for name, value in raw.items():
            try:
                option = CPUOption(name)
            except ValueError:
                raise ConfigError(name, f'unknown CPU Manager Policy option: "{name}"') from None
            if value:
                on.add(option)
        for a, b in _EXCLUSIVE:
            if a in on and b in on:
                raise ConfigError(
                    "cpu manager options",
                    f"static policy options {a} and {b} can not be used at the same time",
                )
        return cls(
            full_pcpus_only=CPUOption.FULL_PCPUS_ONLY in on,
            distribute_across_numa=CPUOption.DISTRIBUTE_ACROSS_NUMA in on,
            align_by_socket=CPUOption.ALIGN_BY_SOCKET in on,
            distribute_across_cores=CPUOption.DISTRIBUTE_ACROSS_CORES in on,
            strict_reservation=CPUOption.STRICT_RESERVATION in on,
            prefer_uncore=CPUOption.PREFER_UNCORE in on,
        )

    def check(self, topo: CPUTopology, topology_policy: str | None = None) -> None:
        """The start-up checks that need the machine and the Topology Manager policy."""
        if not self.align_by_socket:
            return
        if topology_policy == "single-numa-node":
            raise ConfigError(
                CPUOption.ALIGN_BY_SOCKET,
                "Topolgy manager single-numa-node policy is incompatible with CPUManager "
                "align-by-socket policy option",  # sic: the kubelet's spelling
            )
        if topo.num_sockets > topo.num_numa_nodes:
            raise ConfigError(
                CPUOption.ALIGN_BY_SOCKET,
                "Align by socket is not compatible with hardware where number of sockets are more "
                "than number of NUMA",
            )


class StaticPolicy:
    """The static policy on one machine with one set of options."""

    def __init__(self, topo: CPUTopology, options: StaticOptions) -> None:
        self.topo = topo
        self.options = options

    def take(self, available: int, count: int, min_numas: int = 0) -> int:
        """The kubelet's takeByTopology: the allocator the options select."""
        o = self.options
        strategy = Strategy.SPREAD if o.distribute_across_cores else Strategy.PACKED
        if o.distribute_across_numa:
            return take_distributed(
                self.topo,
                available,
                count,
                group_size=self.topo.cpus_per_core if o.full_pcpus_only else 1,
                strategy=strategy,
                align_by_socket=o.align_by_socket,
                min_numas_from_hint=min_numas,
            )
        return take_packed(
            self.topo, available, count, strategy=strategy, prefer_uncore=o.prefer_uncore
        )

    def allocate(
        self,
        available: int,
        count: int,
        numa_affinity: NodeSet | None,
        *,
        reusable: int = 0,
        reserved: int = 0,
        near: int = 0,
    ) -> int:
        """Exclusive CPUs for one container: option checks, the aligned part, then the rest.
        ``near``: CPUs local to the container's devices, taken first (``_nearer``)."""
        if self.options.full_pcpus_only:
            self._check_smt(available, count, reserved)
        allocatable = available | reusable
        result = 0
        if numa_affinity is not None:
            aligned = allocatable & self._aligned(numa_affinity)
            result = self.take(aligned, min(count, aligned.bit_count()), len(numa_affinity))
            if near & aligned and aligned & ~near:  # known, and narrower than the nodes
                result = self._nearer(aligned, result, near)
        return result | self.take(allocatable & ~result, count - result.bit_count())

    def _nearer(self, aligned: int, picked: int, near: int) -> int:
        """``picked`` (the aligned CPUs the kubelet's allocator chose) chosen again, as
        many on each NUMA node (so every later hint is the same), nearest the devices
        first: their local CPUs, then the rest of the L3 groups those touch, then the
        rest of the node, each through takeByTopology; a level that cannot give all the
        rest gives whole cores' worth, so a core is not split for nearness. The
        kubelet's choice where that fails."""
        t = self.topo
        caches = 0
        for cache in t.uncore.values():
            if cache & near:
                caches |= cache
        out = 0
        try:
            for node in t.numa.values():
                want = (picked & node).bit_count()
                for level in (near, caches, node):
                    pool = aligned & node & level & ~out
                    left = want - (out & node).bit_count()
                    take = min(left, pool.bit_count())
                    if take < left and t.cpus_per_core:  # a part: whole cores' worth only
                        take -= take % t.cpus_per_core
                    if take > 0:
                        out |= self.take(pool, take)
        except AllocationError:
            return picked
        return out if out.bit_count() == picked.bit_count() else picked

    def _aligned(self, nodes: NodeSet) -> int:
        if self.options.align_by_socket:
            sockets = self.topo.sockets_of(self.topo.numa_mask(nodes))
            mask = 0
            for s in sockets:
                mask |= self.topo.socket[s]
            return mask
        return self.topo.numa_mask(nodes)

    def _check_smt(self, available: int, count: int, reserved: int) -> None:
        per_core = self.topo.cpus_per_core
        if per_core and count % per_core:
            raise AllocationError(
                "cpu",
                f"SMT Alignment Error: requested {count} cpus not multiple cpus per core "
                f"= {per_core}",
            )
        reserved_cores = 0
        for c in _bits(reserved):
            info = self.topo.info.get(c)
            if info is not None:
                reserved_cores |= self.topo.core[info.core]
        physical = (available & ~reserved_cores).bit_count()
        if count > physical:
            raise AllocationError(
                "cpu",
                "SMT Alignment Error: not enough free physical CPUs: available physical CPUs = "
                f"{physical}, requested CPUs = {count}, CPUs per core = {per_core}",
            )

    def hints(
        self, available: int, count: int, *, reusable: int = 0, allocated: int | None = None
    ) -> tuple[Hint, ...] | None:
        """NUMA hints for ``count`` exclusive CPUs, listed (None: no preference)."""
        space = self.hint_space(available, count, reusable=reusable, allocated=allocated)
        return space.materialize() if isinstance(space, HintSpace) else space

    def hint_space(
        self, available: int, count: int, *, reusable: int = 0, allocated: int | None = None
    ) -> HintSpace | tuple[()] | None:
        """NUMA hints for ``count`` exclusive CPUs, described (reference 7): every node
        set whose available CPUs, with the reusable ones (all of which it must hold),
        reach ``count``; preferred when as narrow as the fewest nodes whose CPUs, free
        or not, could hold it (or, aligned by socket, touching as few sockets).
        None: no preference (0 CPUs); (): an assignment of another size."""
        if count == 0:
            return None
        if allocated is not None:
            if allocated.bit_count() != count:
                return ()  # an assignment of another size: cannot be satisfied
            available, reusable = allocated, 0
        t = self.topo
        ids = sorted(t.numa)
        size = max(ids) + 1
        free, capacity = [0] * size, [0] * size
        must = 0
        for n in ids:
            free[n] = (available & t.numa[n]).bit_count()
            capacity[n] = t.numa[n].bit_count()
            if reusable & t.numa[n]:
                must |= 1 << n
        nodes = sum(1 << n for n in ids)
        width = min_width((tuple(capacity),), (count,), nodes)
        sockets: tuple[int, ...] = ()
        min_sockets = 0
        if self.options.align_by_socket and t.num_sockets:
            per_socket = t.num_numa_nodes // t.num_sockets
            if per_socket:
                min_sockets = (width + per_socket - 1) // per_socket
                sockets = tuple(
                    sum(1 << n for n in ids if t.numa[n] & t.socket[s]) for s in sorted(t.socket)
                )
        return HintSpace(
            nodes,
            (tuple(free),),
            (count - reusable.bit_count(),),
            width,
            must=must,
            sockets=sockets,
            min_sockets=min_sockets,
        )

    def reserve(self, count: int, explicit: int | None = None) -> int:
        """Reserved CPUs: an explicit list of ``count`` CPUs, or ``count`` CPUs chosen by
        sending the whole machine through the same allocator (reference 4)."""
        if explicit is not None:
            reserved = explicit
        else:
            try:
                reserved = self.take(self.topo.all, count)
            except AllocationError:
                reserved = 0  # reported below, in the kubelet's words
        if reserved.bit_count() != count:
            listed = CPUSet.from_bits(reserved).format_list()
            raise ConfigError(
                "reserved cpus",
                "[cpumanager] unable to reserve the required amount of CPUs "
                f"(size of {listed} did not equal {count})",
            )
        return reserved


def _bits(mask: int) -> Iterable[int]:
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low
