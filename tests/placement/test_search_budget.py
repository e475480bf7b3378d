"""The merge by search past its step budget (numad.placement.search, module docstring):
a machine of at most LISTABLE nodes gets the fold of the listed hints (exact), a
larger one the documented rule: the best width-B mask found within the budget,
else the machine's mask, not preferred.

The request: CPUs free only on nodes 0-1 and memory only on nodes 2-3, each
needing two nodes. No mask is preferred by both; the exact merge is 0-1, not
preferred (reach: memory picks 0-3, CPU picks 0-1). With the budget forced down
to a few steps the search gives up in phase 1, before any width-B mask is found.
"""

from __future__ import annotations

import pytest

from numad.cpuset import NodeSet
from numad.placement import policy as policy_module
from numad.placement import search
from numad.placement.hints import ProviderHints
from numad.placement.hintspace import HintSpace, listed
from numad.placement.merge import Merged
from numad.placement.policy import Decision, Machine, Policy, PolicyOptions, merge
from numad.placement.search import LISTABLE

SMALL_BUDGET = 3


class _Counted(search.Search):
    """The search, counting the merges that ran out of budget."""

    exhausted = 0

    def run(self) -> Merged:
        try:
            return super().run()
        except search.SearchBudgetError:
            _Counted.exhausted += 1
            raise


@pytest.fixture
def small_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(search, "BUDGET", SMALL_BUDGET)
    monkeypatch.setattr(policy_module, "Search", _Counted)
    _Counted.exhausted = 0


def _providers(n: int) -> list[ProviderHints]:
    every = (1 << n) - 1
    cpus = tuple(4 if node in (0, 1) else 0 for node in range(n))
    memory = tuple(8 if node in (2, 3) else 0 for node in range(n))
    return [
        {"cpu": HintSpace(every, (cpus,), (8,), 2)},
        {"memory": HintSpace(every, (memory,), (16,), 2)},
    ]


def _decision(d: Decision) -> tuple[object, ...]:
    return (d.affinity, d.preferred, d.score, d.admit)


POLICIES = [
    pytest.param(Policy.RESTRICTED, id="restricted"),
    pytest.param(Policy.BEST_EFFORT, id="best-effort"),
]


@pytest.mark.usefixtures("small_budget")
@pytest.mark.parametrize("policy", POLICIES)
def test_a_16_node_machine_past_the_budget_gets_the_exact_fold(policy: Policy) -> None:
    assert LISTABLE == 16
    machine = Machine(NodeSet(range(16)))
    providers = _providers(16)
    decided = merge(policy, PolicyOptions(), machine, providers)
    assert _Counted.exhausted == 1  # the search did run out of its budget
    folded = merge(policy, PolicyOptions(), machine, [_listed(p) for p in providers])
    assert _decision(decided) == _decision(folded)
    admit = policy is Policy.BEST_EFFORT
    assert _decision(decided) == (NodeSet([0, 1]), False, 0, admit)  # not the rule's 0-15


@pytest.mark.usefixtures("small_budget")
@pytest.mark.parametrize("policy", POLICIES)
def test_a_17_node_machine_past_the_budget_gets_the_documented_rule(policy: Policy) -> None:
    machine = Machine(NodeSet(range(17)))
    decided = merge(policy, PolicyOptions(), machine, _providers(17))
    assert _Counted.exhausted == 1
    # No width-B mask was found within 3 steps: the machine's mask, not preferred.
    admit = policy is Policy.BEST_EFFORT
    assert _decision(decided) == (NodeSet(range(17)), False, 0, admit)


@pytest.mark.parametrize("policy", POLICIES)
def test_within_the_budget_the_17_node_machine_gets_the_exact_merge(policy: Policy) -> None:
    """The same request with the real budget: the rule above is not the answer by chance."""
    machine = Machine(NodeSet(range(17)))
    decided = merge(policy, PolicyOptions(), machine, _providers(17))
    assert _decision(decided) == (NodeSet([0, 1]), False, 0, policy is Policy.BEST_EFFORT)


def _listed(provider: ProviderHints) -> ProviderHints:
    return {r: listed(v) for r, v in provider.items()}
