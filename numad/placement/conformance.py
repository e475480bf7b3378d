"""Conformance runner: numad's answers to the kubelet test vectors.

Usage: ``python -m numad.placement.conformance FILE[.gz] [--time]``. Reads one case per
line (format: shared conformance/README.md) and prints one JSON line per case
with the shape of its ``expect`` plus ``"id"``; ``--time`` adds
``"ns_per_op"``, the time of the decision alone (parsing excluded), averaged
over enough repetitions to take at least 20 ms.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from numad.cpuset import NodeSet
from numad.errors import NumadError
from numad.placement.hints import Hint, ProviderHints
from numad.placement.managers.cpu.conformance import cpu_case
from numad.placement.merge import Strategy
from numad.placement.policy import Machine, Policy, PolicyOptions, merge

Case = dict[str, Any]


def read_cases(path: Path) -> Iterator[Case]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as lines:
        for line in lines:
            if line.strip():
                yield json.loads(line)


def merge_case(case: Case) -> Callable[[], dict[str, Any]]:
    """A closure that decides one merge case (parsing done up front)."""
    policy = Policy(case["policy"])
    raw = case.get("options") or {}
    options = PolicyOptions(
        prefer_closest=bool(raw.get("prefer-closest-numa-nodes")),
        strategy=Strategy(raw.get("numa-allocation-strategy") or "none"),
        weights=raw.get("numa-score-weights"),
    )
    machine = Machine(NodeSet(case["numa_nodes"]), _distances(case.get("distances")))
    providers = [_provider(p) for p in case["providers"]]

    def decide() -> dict[str, Any]:
        d = merge(policy, options, machine, providers)
        return {
            "affinity": None if d.affinity is None else list(d.affinity),
            "preferred": d.preferred,
            "score": d.score,
            "admit": d.admit,
        }

    return decide


def _distances(raw: Mapping[str, list[int]] | None) -> dict[int, dict[int, int]] | None:
    if raw is None:
        return None
    # Rows are indexed by node id (a sparse machine's rows hold zeros between).
    return {int(node): dict(enumerate(row)) for node, row in raw.items()}


def _provider(raw: Mapping[str, list[dict[str, Any]] | None]) -> ProviderHints:
    return {
        resource: None
        if hints is None
        else tuple(
            Hint(
                None if h["affinity"] is None else NodeSet(h["affinity"]),
                bool(h["preferred"]),
                int(h.get("score", 0)),
            )
            for h in hints
        )
        for resource, hints in raw.items()
    }


RUNNERS: dict[str, Callable[[Case], Callable[[], dict[str, Any]]]] = {
    "merge": merge_case,
    "take": cpu_case,
    "hints": cpu_case,
    "reserve": cpu_case,
}


def kind_of(case: Case) -> str:
    return str(case.get("op", "merge"))


def run_case(case: Case, timed: bool = False) -> dict[str, Any]:
    try:
        decide = RUNNERS[kind_of(case)](case)
        result = {"id": case["id"], **decide()}
    except NumadError as err:
        return {"id": case["id"], "error": str(err)}
    if timed:
        result["ns_per_op"] = _time(decide)
    return result


def _time(decide: Callable[[], object]) -> int:
    reps = 1
    while True:
        start = time.perf_counter_ns()
        for _ in range(reps):
            decide()
        elapsed = time.perf_counter_ns() - start
        if elapsed >= 20_000_000 or reps >= 1 << 20:
            return elapsed // reps
        reps *= 4


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m numad.placement.conformance", description=__doc__
    )
    parser.add_argument("file", type=Path)
    parser.add_argument("--time", action="store_true", help="add ns_per_op to every line")
    args = parser.parse_args(argv)
    for case in read_cases(args.file):
        sys.stdout.write(json.dumps(run_case(case, args.time)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
