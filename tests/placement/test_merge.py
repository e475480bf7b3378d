"""The merger against the kubelet's vectors and a plain enumeration of the product."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from numad.cpuset import NodeSet
from numad.placement.conformance import read_cases, run_case
from numad.placement.hints import Hint, ProviderHints
from numad.placement.merge import Strategy
from numad.placement.policy import Machine, Policy, PolicyOptions, merge
from tests.plain_merge import plain_merge

VECTORS = Path(__file__).resolve().parents[1] / "conformance"


def _cases(name: str) -> list[Any]:
    return [pytest.param(c, id=c["id"]) for c in read_cases(VECTORS / f"{name}.jsonl.gz")]


@pytest.mark.parametrize("case", _cases("merge-kubelet-tests"))
def test_kubelet_unit_test_tables(case: dict[str, Any]) -> None:
    got = run_case(case)
    for field in case["asserted"]:
        assert got[field] == case["expect"][field], field


@pytest.mark.parametrize("case", _cases("merge-public"))
def test_public_vectors(case: dict[str, Any]) -> None:
    """Every field of every case, the `uncertain` ones included (numad drops the
    score on the single-numa-node collapse, as the reference model does)."""
    got = run_case(case)
    assert {k: got[k] for k in case["expect"]} == case["expect"]


# -- fast merge == plain enumeration, on random small inputs ---------------------

NODE_SETS = st.lists(st.integers(0, 5), min_size=1, max_size=4, unique=True).map(sorted)


@st.composite
def merge_inputs(draw: st.DrawFn) -> dict[str, Any]:
    nodes = draw(NODE_SETS)
    universe = [*nodes, max(nodes) + 1]  # one node outside the machine, as the vectors have

    def hint() -> Hint:
        kind = draw(st.sampled_from(["mask", "mask", "mask", "nil", "empty"]))
        affinity = None
        if kind == "mask":
            affinity = NodeSet(
                draw(st.lists(st.sampled_from(universe), min_size=1, max_size=3, unique=True))
            )
        elif kind == "empty":
            affinity = NodeSet()
        return Hint(
            affinity, draw(st.booleans()), draw(st.sampled_from([0, 0, 10, 25, 50, 75, 100]))
        )

    providers: list[ProviderHints] = []
    for _ in range(draw(st.integers(0, 3))):
        provider: dict[str, tuple[Hint, ...] | None] = {}
        for name in draw(
            st.lists(st.sampled_from(["cpu", "memory", "gpu", "nic"]), max_size=2, unique=True)
        ):
            size = draw(st.sampled_from([None, 0, 1, 2, 3, 4]))
            provider[name] = None if size is None else tuple(hint() for _ in range(size))
        providers.append(provider)
    distances = {
        a: {b: 10 if a == b else draw(st.sampled_from([11, 12, 20, 21])) for b in nodes}
        for a in nodes
    }
    weights = draw(
        st.none() | st.dictionaries(st.sampled_from(["cpu", "memory", "gpu"]), st.integers(0, 5))
    )
    return {
        "policy": draw(st.sampled_from(list(Policy))),
        "nodes": nodes,
        "providers": providers,
        "prefer_closest": draw(st.booleans()),
        "strategy": draw(st.sampled_from(list(Strategy))),
        "weights": weights,
        "distances": distances,
    }


@settings(max_examples=1500, deadline=None)
@given(merge_inputs())
def test_fast_merge_equals_plain_enumeration(inputs: dict[str, Any]) -> None:
    options = PolicyOptions(
        prefer_closest=inputs["prefer_closest"],
        strategy=inputs["strategy"],
        weights=inputs["weights"],
    )
    machine = Machine(NodeSet(inputs["nodes"]), inputs["distances"])
    d = merge(inputs["policy"], options, machine, inputs["providers"])
    got = (None if d.affinity is None else list(d.affinity), d.preferred, d.score, d.admit)
    want = plain_merge(
        str(inputs["policy"]),
        inputs["nodes"],
        inputs["providers"],
        prefer_closest=inputs["prefer_closest"],
        strategy=str(inputs["strategy"]),
        weights=inputs["weights"],
        distances=inputs["distances"],
    )
    assert got == want
