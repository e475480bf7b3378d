"""The merge by search on every conformance vector, forced past the fold.

numad routes listed hints on machines of up to 16 nodes to the fold
(numad.placement.merge), so the vectors alone never reach numad.placement.search. Here every merge
goes to the search (``LISTABLE`` set to 0), and each vector's affinity,
preferred and admit must come out as the kubelet's. The search takes no scores
(numad's providers give none), so the score is compared only where no hint of
the vector carries one, and vectors whose allocation strategy compares scores
are left to the fold (tests/test_merge.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from numad.placement import policy
from numad.placement.conformance import read_cases, run_case

VECTORS = Path(__file__).resolve().parents[1] / "conformance"
CASES = [
    c
    for name in ("merge-public", "merge-kubelet-tests")
    for c in read_cases(VECTORS / f"{name}.jsonl.gz")
]


def _scored(case: dict[str, Any]) -> bool:
    return any(
        h.get("score", 0)
        for provider in case["providers"]
        for hints in provider.values()
        if hints
        for h in hints
    )


def _strategy(case: dict[str, Any]) -> bool:
    return (case.get("options") or {}).get("numa-allocation-strategy") not in (None, "", "none")


UNSCORED = [c for c in CASES if not (_scored(c) and _strategy(c))]


def test_most_vectors_take_part() -> None:
    assert len(UNSCORED) > 0.55 * len(CASES), (len(UNSCORED), len(CASES))  # 1,942 of 3,202


@pytest.mark.parametrize("case", [pytest.param(c, id=c["id"]) for c in UNSCORED])
def test_the_search_answers_each_vector_as_the_kubelet(
    case: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(policy, "LISTABLE", 0)
    got = run_case(case)
    fields = [f for f in ("affinity", "preferred", "admit", "score") if f in case["expect"]]
    if _scored(case):
        fields.remove("score")
    if "asserted" in case:
        fields = [f for f in fields if f in case["asserted"]]
    assert {f: got[f] for f in fields} == {f: case["expect"][f] for f in fields}
