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

from collections.abc import Mapping
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
    ) -> CPUState:
        """Exclusive CPUs for one container (an existing assignment is kept); ``near``:
        CPUs local to its devices, preferred inside its nodes (``StaticPolicy.allocate``)."""
        if count <= 0 or key in self.assignments:
            return self
        workload = key[0]
        reusable = self._reusable_for(workload)
        free = (self.available | reusable).bit_count()
        if count > free:
            # The allocator takes the aligned part first and reports only the rest it
            # could not find (as the kubelet does); the whole request is named here.
            raise not_enough(count, free)
        cpus = policy.allocate(
            self.available, count, affinity, reusable=reusable, reserved=self.reserved, near=near
        )
        assignments = dict(self.assignments)
        assignments[key] = cpus
        new = replace(self, assignments=MappingProxyType(assignments))
        if not new.shared_pool:
            raise AllocationError(
                f"{workload}/{key[1]}",
                f"taking cpus {CPUSet.from_bits(cpus)} would leave the shared pool empty",
                "reserve fewer CPUs or ask for fewer exclusive CPUs",
            )
        return new._reuse_after(workload, cpus, kind)

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
