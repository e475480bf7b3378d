"""Adapters from the CPU conformance vectors (`take`, `hints`, `reserve`) to the static policy.

Used by ``python -m numad.placement.conformance``; the vector format is in the shared
conformance README.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from numad.cpuset import NodeSet
from numad.errors import NumadError
from numad.placement.managers.cpu.distributed import take_distributed
from numad.placement.managers.cpu.packed import Strategy, take_packed
from numad.placement.managers.cpu.static import StaticOptions, StaticPolicy
from numad.placement.managers.cpu.topology import CPUInfo, CPUTopology, bits, mask_of

Case = dict[str, Any]


def cpu_case(case: Case) -> Callable[[], dict[str, Any]]:
    """A closure answering one CPU case (parsing done up front)."""
    topo = CPUTopology.of(
        (CPUInfo(c["cpu"], c["core"], c["socket"], c["numa"], c["uncore"]) for c in case["cpus"]),
        case.get("topology"),
    )
    op = case["op"]
    available = mask_of(case.get("available") or ())
    count = int(case["num_cpus"])

    def decide() -> dict[str, Any]:
        try:
            if case.get("raw"):
                return {"result": bits(_raw(topo, case["raw"], available, count)), "error": None}
            options = StaticOptions.parse(case.get("options") or {})
            options.check(topo)
            policy = StaticPolicy(topo, options)
            if op == "hints":
                return {"hints": _hints(policy, case, available, count), "error": None}
            if op == "reserve":
                explicit = case.get("reserved") or None
                reserved = policy.reserve(count, None if explicit is None else mask_of(explicit))
                return {"result": bits(reserved), "error": None}
            affinity = case.get("numa_affinity")
            result = policy.allocate(
                available,
                count,
                None if affinity is None else NodeSet(affinity),
                reusable=mask_of(case.get("reusable") or ()),
                reserved=mask_of(case.get("reserved") or ()),
            )
            return {"result": bits(result), "error": None}
        except NumadError as err:
            key = "hints" if op == "hints" else "result"
            return {key: None, "error": err.problem}

    return decide


def _hints(
    policy: StaticPolicy, case: Case, available: int, count: int
) -> list[dict[str, Any]] | None:
    allocated = case.get("allocated")
    hints = policy.hints(
        available,
        count,
        reusable=mask_of(case.get("reusable") or ()),
        allocated=None if allocated is None else mask_of(allocated),
    )
    if hints is None:
        return None
    return [
        {
            "affinity": None if h.affinity is None else list(h.affinity),
            "preferred": h.preferred,
            "score": h.score,
        }
        for h in hints
    ]


def _raw(topo: CPUTopology, raw: dict[str, Any], available: int, count: int) -> int:
    strategy = Strategy(raw.get("strategy", "packed"))
    if raw["fn"] == "packed":
        return take_packed(
            topo, available, count, strategy=strategy, prefer_uncore=bool(raw.get("prefer_uncore"))
        )
    return take_distributed(
        topo,
        available,
        count,
        group_size=int(raw.get("cpu_group_size", 1)),
        strategy=strategy,
        align_by_socket=bool(raw.get("align_by_socket")),
        min_numas_from_hint=int(raw.get("min_numas_from_hint", 0)),
    )
