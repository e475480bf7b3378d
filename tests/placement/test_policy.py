"""Policy options as the kubelet validates them, the node limit, and explanations."""

from __future__ import annotations

import pytest

from numad.cpuset import NodeSet
from numad.errors import ConfigError
from numad.placement.explain import explain
from numad.placement.hints import Hint, ProviderHints
from numad.placement.merge import Strategy
from numad.placement.policy import (
    DEFAULT_MAX_NUMA_NODES,
    OPTIONS,
    Machine,
    Policy,
    PolicyOptions,
    check_machine,
    merge,
    parse_options,
    parse_weights,
)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param({}, PolicyOptions(), id="defaults"),
        pytest.param(
            {"prefer-closest-numa-nodes": "True"}, PolicyOptions(prefer_closest=True), id="go-bool"
        ),
        pytest.param({"prefer-closest-numa-nodes": "0"}, PolicyOptions(), id="go-bool-zero"),
        pytest.param(
            {"max-allowable-numa-nodes": "12"}, PolicyOptions(max_numa_nodes=12), id="max-nodes"
        ),
        pytest.param(
            {"numa-allocation-strategy": ""}, PolicyOptions(), id="empty-strategy-is-none"
        ),
        pytest.param(
            {"numa-allocation-strategy": "most-allocated"},
            PolicyOptions(strategy=Strategy.MOST_ALLOCATED),
            id="strategy",
        ),
        pytest.param(
            {"numa-score-weights": " cpu=3, ,memory=1,cpu=5"},
            PolicyOptions(weights={"cpu": 5, "memory": 1}),
            id="weights-last-wins-empty-skipped",
        ),
        pytest.param(
            {"align-per-resource": "true"},
            PolicyOptions(align_per_resource=True),
            id="align-per-resource",
        ),
        pytest.param(
            {"align-per-resource": "F", "prefer-closest-numa-nodes": "1"},
            PolicyOptions(prefer_closest=True),
            id="align-per-resource-off",
        ),
    ],
)
def test_options_parse(raw: dict[str, str], expected: PolicyOptions) -> None:
    assert parse_options(Policy.BEST_EFFORT, raw) == expected


def test_align_per_resource_is_off_by_default_and_known_to_the_config() -> None:
    assert PolicyOptions().align_per_resource is False
    assert "align-per-resource" in OPTIONS


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        pytest.param(
            {"bogus": "1"}, 'unknown Topology Manager Policy option: "bogus"', id="unknown"
        ),
        pytest.param(
            {"prefer-closest-numa-nodes": "yes"},
            'bad value for option "prefer-closest-numa-nodes"',
            id="bool",
        ),
        pytest.param(
            {"align-per-resource": "on"},
            "align-per-resource: bad value for option \"align-per-resource\": invalid syntax 'on'",
            id="align-per-resource-bool",
        ),
        pytest.param(
            {"max-allowable-numa-nodes": "x"},
            "unable to convert policy option to integer",
            id="int",
        ),
        pytest.param(
            {"max-allowable-numa-nodes": "4"},
            'the minimum value of "max-allowable-numa-nodes" should not be less than 8',
            id="below-8",
        ),
        pytest.param(
            {"numa-allocation-strategy": "packed"},
            'must be one of ["least-allocated" "most-allocated" "none"]',
            id="strategy",
        ),
    ],
)
def test_options_errors(raw: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=None) as err:
        parse_options(Policy.BEST_EFFORT, raw)
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        pytest.param("cpu", 'invalid weight entry "cpu": expected resource=weight', id="no-equals"),
        pytest.param("=3", 'empty resource name in weight entry "=3"', id="no-name"),
        pytest.param("cpu=x", 'invalid weight value for "cpu"', id="not-int"),
        pytest.param("cpu=101", 'weight for "cpu" must be in range [0, 100], got 101', id="range"),
    ],
)
def test_weight_errors(value: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_weights(value)
    assert str(err.value).startswith(
        'numa-score-weights: bad value for option "numa-score-weights": '
    )
    assert message in str(err.value)


def test_no_node_limit_by_default_and_the_kubelet_meaning_where_set() -> None:
    assert DEFAULT_MAX_NUMA_NODES is None
    for n in (16, 17, 34, 64, 256):  # numad sets no ceiling of its own
        check_machine(Policy.RESTRICTED, PolicyOptions(), Machine(NodeSet(range(n))))
    options = parse_options(Policy.RESTRICTED, {"max-allowable-numa-nodes": "64"})
    check_machine(Policy.RESTRICTED, options, Machine(NodeSet(range(64))))
    with pytest.raises(ConfigError) as caught:
        check_machine(Policy.RESTRICTED, options, Machine(NodeSet(range(65))))
    # The message names the file, the section and the key, and what to do.
    assert str(caught.value) == (
        "[topology] options max-allowable-numa-nodes: this machine has 65 NUMA nodes, more"
        " than the max-allowable-numa-nodes of 64 set in the config; raise it, or remove it"
        " from options in [topology] of the config file (/etc/numad/numad.toml or --config):"
        " numad has no limit of its own"
    )
    check_machine(Policy.NONE, options, Machine(NodeSet(range(80))))  # none never merges


def test_prefer_closest_needs_distances() -> None:
    with pytest.raises(ConfigError, match="NUMA distances"):
        check_machine(
            Policy.BEST_EFFORT, PolicyOptions(prefer_closest=True), Machine(NodeSet([0, 1]))
        )
    # single-numa-node ignores prefer-closest, so it needs no distances
    check_machine(
        Policy.SINGLE_NUMA_NODE, PolicyOptions(prefer_closest=True), Machine(NodeSet([0, 1]))
    )


def _h(nodes: list[int], preferred: bool = True) -> Hint:
    return Hint(NodeSet(nodes), preferred)


TWO_NODES = Machine(NodeSet([0, 1]))


def test_rejection_names_the_conflicting_resources() -> None:
    providers: list[ProviderHints] = [
        {"example.com/gpu": (_h([1]), _h([0, 1], False))},
        {"cpu": (_h([0]), _h([1]), _h([0, 1], False))},
        {"memory": (_h([0]), _h([0, 1], False))},
    ]
    decision = merge(Policy.RESTRICTED, PolicyOptions(), TWO_NODES, providers)
    assert not decision.admit
    why = explain(decision)
    assert why.conflict == ("example.com/gpu", "memory")
    assert why.text() == (
        "rejected: no NUMA node set is preferred by all of example.com/gpu and memory "
        "(policy restricted); example.com/gpu fits only on node 1; cpu fits on node 0 or node 1; "
        "memory fits only on node 0"
    )


def test_rejection_of_a_resource_that_fits_nowhere() -> None:
    providers: list[ProviderHints] = [{"cpu": (_h([0]),)}, {"example.com/nic": ()}]
    decision = merge(Policy.SINGLE_NUMA_NODE, PolicyOptions(), TWO_NODES, providers)
    assert not decision.admit
    assert "example.com/nic cannot be placed on any NUMA node" in explain(decision).text()


def test_single_numa_node_rejection_when_nothing_fits_one_node() -> None:
    providers: list[ProviderHints] = [{"cpu": (_h([0, 1]),)}]
    decision = merge(Policy.SINGLE_NUMA_NODE, PolicyOptions(), TWO_NODES, providers)
    assert (decision.admit, decision.affinity) == (False, None)
    assert explain(decision).conflict == ("cpu",)
    assert "cpu has no preferred NUMA placement" in explain(decision).text()


def test_admission_is_explained_too() -> None:
    providers: list[ProviderHints] = [{"cpu": (_h([0]), _h([1]))}, {"memory": (_h([1]),)}]
    decision = merge(Policy.RESTRICTED, PolicyOptions(), TWO_NODES, providers)
    assert decision.admit
    assert explain(decision).text() == (
        "admitted on node 1 (preferred, policy restricted); cpu fits on node 0 or node 1; "
        "memory fits only on node 1"
    )
    assert explain(decision).conflict == ()
