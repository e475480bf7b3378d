"""The CPU manager's state: reserved CPUs, exclusive assignments, the shared pool.

Pure core: every operation returns a new ``CPUState``. Pools as in the
kubelet (reference/cpu-manager.md section 3):

* shared pool = online CPUs not exclusively assigned (minus the reserved ones
  under strict-cpu-reservation); numad never lets it become empty;
* available = shared pool minus reserved: the only source of exclusive CPUs;
* exclusive assignments per (workload, container). Within one workload an app
  container may reuse the CPUs of a finished init container (reference 7.3),
  so two containers of the same workload can share CPUs; across workloads
  exclusive sets are always disjoint.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from types import MappingProxyType

from numad.cpuset import CPUSet, NodeSet
from numad.errors import AllocationError
from numad.placement.hintspace import HintSpace
from numad.placement.managers.cpu.packed import not_enough
from numad.placement.managers.cpu.static import StaticPolicy

Key = tuple[str, str]  # (workload, container)


class ContainerKind(StrEnum):
    APP = "app"
    INIT = "init"  # runs to completion before the app containers: its CPUs can be reused
    SIDECAR = "sidecar"  # a restartable init container: runs beside the apps, no reuse


@dataclass(frozen=True, slots=True)
class CPUState:
    online: int
    reserved: int
    strict: bool = False
    assignments: Mapping[Key, int] = field(default_factory=lambda: MappingProxyType({}))
    reuse_workload: str | None = None  # the one workload whose init CPUs may be reused
    reusable: int = 0

    @property
    def exclusive(self) -> int:
        union = 0
        for cpus in self.assignments.values():
            union |= cpus
        return union

    @property
    def shared_pool(self) -> int:
        pool = self.online & ~self.exclusive
        return pool & ~self.reserved if self.strict else pool

    @property
    def available(self) -> int:
        return self.shared_pool & ~self.reserved

    def assigned(self, workload: str, container: str) -> int | None:
        return self.assignments.get((workload, container))

    def _reusable_for(self, workload: str) -> int:
        return self.reusable if self.reuse_workload == workload else 0

    def hints(
        self, policy: StaticPolicy, workload: str, container: str, count: int
    ) -> HintSpace | tuple[()] | None:
        return policy.hint_space(
            self.available,
            count,
            reusable=self._reusable_for(workload),
            allocated=self.assigned(workload, container),
        )

    def allocate(
        self,
        policy: StaticPolicy,
        key: Key,
        count: int,
        affinity: NodeSet | None,
        kind: ContainerKind = ContainerKind.APP,
        *,
        near: int = 0,
        first: Sequence[tuple[int, int, int]] = (),
    ) -> CPUState:
        """Exclusive CPUs for one container (an existing assignment is kept); ``near``:
        CPUs local to its devices, preferred inside its nodes (``StaticPolicy.allocate``).
        ``first``: (node, count, CPUs near) to take on those nodes before the rest
        (``_first``; align-per-resource); empty: the kubelet's allocation."""
        if count <= 0 or key in self.assignments:
            return self
        workload = key[0]
        reusable = self._reusable_for(workload)
        free = (self.available | reusable).bit_count()
        if count > free:
            # The allocator takes the aligned part first and reports only the rest it
            # could not find (as the kubelet does); the whole request is named here.
            raise not_enough(count, free)
        cpus = self._first(policy, count, affinity, reusable, near, first) if first else None
        if cpus is None:
            cpus = policy.allocate(
                self.available,
                count,
                affinity,
                reusable=reusable,
                reserved=self.reserved,
                near=near,
            )
        new = self.reassigned(key, cpus)
        if not new.shared_pool:
            raise AllocationError(
                f"{workload}/{key[1]}",
                f"taking cpus {CPUSet.from_bits(cpus)} would leave the shared pool empty",
                "reserve fewer CPUs or ask for fewer exclusive CPUs",
            )
        return new._reuse_after(workload, cpus, kind)

    def _first(  # noqa: PLR0917 - allocate's arguments, passed on
        self,
        policy: StaticPolicy,
        count: int,
        affinity: NodeSet | None,
        reusable: int,
        near: int,
        first: Sequence[tuple[int, int, int]],
    ) -> int | None:
        """``count`` CPUs, on each node of ``first`` as many as it asks there or has free
        (each part through the allocator, nearest its CPUs near), the rest as
        ``StaticPolicy.allocate`` takes them in ``affinity``. None where that fails or
        would leave the shared pool empty where the plain allocation may not: the
        caller then allocates as the kubelet does, so the option never rejects."""
        taken = 0
        try:
            for node, wanted, local in first:
                on_node = policy.topo.numa.get(node, 0) & ~taken
                pool, reuse = self.available & on_node, reusable & on_node
                take = min(wanted, (pool | reuse).bit_count())
                if policy.options.full_pcpus_only and policy.topo.cpus_per_core:
                    take -= take % policy.topo.cpus_per_core  # whole cores, as the option asks
                if take > 0:
                    taken |= policy.allocate(
                        pool,
                        take,
                        NodeSet([node]),
                        reusable=reuse,
                        reserved=self.reserved,
                        near=local,
                    )
            rest = count - taken.bit_count()
            if rest > 0:
                taken |= policy.allocate(
                    self.available & ~taken,
                    rest,
                    affinity,
                    reusable=reusable & ~taken,
                    reserved=self.reserved,
                    near=near,
                )
        except AllocationError:
            return None
        return taken if taken.bit_count() == count and self.shared_pool & ~taken else None

    def reassigned(self, key: Key, cpus: int) -> CPUState:
        """This state with ``key`` holding exactly ``cpus`` (whatever it held before);
        the caller checks the shared pool (``shared_pool``) is left non-empty."""
        assignments = dict(self.assignments)
        assignments[key] = cpus
        return replace(self, assignments=MappingProxyType(assignments))

    def _reuse_after(self, workload: str, cpus: int, kind: ContainerKind) -> CPUState:
        reusable = self._reusable_for(workload)
        if kind is ContainerKind.INIT:
            reusable |= cpus
        elif kind is ContainerKind.APP:
            reusable &= ~cpus
        return replace(self, reuse_workload=workload, reusable=reusable)

    def release(self, workload: str, container: str | None = None) -> CPUState:
        """Give back one container's CPUs, or every container's of the workload."""
        assignments = {
            k: v
            for k, v in self.assignments.items()
            if not (k[0] == workload and (container is None or k[1] == container))
        }
        new = replace(self, assignments=MappingProxyType(assignments))
        if container is None and self.reuse_workload == workload:
            new = replace(new, reuse_workload=None, reusable=0)
        return new
