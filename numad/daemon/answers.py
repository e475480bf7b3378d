"""The API's answers about admission outcomes, as JSON values: the placement of each
container (with its devices' groups) and the decision explained (the whole text, and
each container's parts).
Used by the API, the views and the offline plan."""

from __future__ import annotations

from typing import Any

from numad.placement.admission import Outcome, Placement


def explained_json(outcome: Outcome) -> dict[str, Any]:
    """The outcome explained: ``explanation`` the whole text ("; " between parts),
    ``conflict`` the decisive merge's, ``explained`` each decided container's parts."""
    explained = outcome.explained()
    why = outcome.decisive(explained)
    parts = {name: each.parts() for name, each in explained}
    if len(explained) <= 1:
        text = "; ".join(part for each in parts.values() for part in each)  # Explanation.text
    else:
        whole = [
            f"admitted: {len(explained)} containers"
            if outcome.admitted
            else f"rejected: container {outcome.failed_container} cannot be placed"
        ]
        for name, (first, *rest) in parts.items():
            whole += [f"{name}: {first}", *rest]
        text = "; ".join(whole)
    moves = outcome.move_lines()
    if moves:
        text = "; ".join((text, *moves)) if text else "; ".join(moves)
    return {
        "explanation": text or None,
        "moves": [
            {
                "workload": m.workload,
                "from": {"cpus": m.cpus_from.format_list(), "nodes": m.nodes_from.format_list()},
                "to": {"cpus": m.cpus_to.format_list(), "nodes": m.nodes_to.format_list()},
                "bytes": m.bytes,
            }
            for m in outcome.moves
        ],
        "unmovable": list(outcome.unmovable),
        "conflict": [] if why is None else list(why.conflict),
        "explained": [
            {"container": name, "parts": list(parts[name]), "conflict": list(each.conflict)}
            for name, each in explained
        ],
    }


def outcome_json(outcome: Outcome) -> dict[str, Any]:
    return {
        "admitted": outcome.admitted,
        "already": outcome.held,
        "reason": None if outcome.reason is None else str(outcome.reason),
        "detail": outcome.detail,
        **explained_json(outcome),
        "containers": {
            name: {
                "cpus": p.cpus.format_list(),
                "mems": p.mems.format_list(),
                "devices": {k: list(v) for k, v in p.devices.items()},
                **groups_json(p),
            }
            for name, p in outcome.placements.items()
        },
    }


def groups_json(placed: Placement | None) -> dict[str, Any]:
    """``{"groups": [...]}``: each device with a node and the CPUs and memory that go
    with it (numad.placement.groups), in their order; empty (no key) for a container
    without such devices."""
    if placed is None or not placed.groups:
        return {}
    return {
        "groups": [
            {
                "class": g.device_class,
                "device": g.device,
                "node": g.node,
                "cpus": g.cpus.format_list(),
                "memory": g.memory,
                "local": g.local,
            }
            for g in placed.groups
        ]
    }
