"""Explanations in words: the decision first (never "admitted" for a rejection), the
request, what each node had free, each resource's node sets."""

from __future__ import annotations

import pytest

from numad.cpuset import NodeSet
from numad.placement.explain import FREE_SHOWN, Asked, NodeFree, explain, human_bytes, plain
from numad.placement.hints import Hint, ProviderHints
from numad.placement.policy import Machine, Policy, PolicyOptions, merge

TWO_NODES = Machine(NodeSet([0, 1]))


def _h(nodes: list[int], preferred: bool = True) -> Hint:
    return Hint(NodeSet(nodes), preferred)


def test_an_allocation_that_failed_after_the_merge_is_a_rejection() -> None:
    """best-effort admits what fits nowhere; the CPU manager then cannot allocate."""
    providers: list[ProviderHints] = [{"cpu": ()}]
    decision = merge(Policy.BEST_EFFORT, PolicyOptions(), TWO_NODES, providers)
    assert decision.admit  # the merge's answer...
    failure = "not enough cpus available to satisfy request: requested=64, available=31"
    why = explain(decision, Asked("main", 64), (NodeFree(0, 15), NodeFree(1, 16)), failure)
    assert not why.admitted  # ...is not the outcome
    assert why.parts() == (
        "rejected: 64 exclusive CPUs asked for, 31 free (policy best-effort)",
        "main asks for 64 exclusive CPUs",
        "node 0 has 15 CPUs free",
        "node 1 has 16 CPUs free",
        "cpu fits nowhere",
    )
    assert "admitted" not in why.text()


def test_the_request_and_what_is_free_name_memory_and_devices() -> None:
    asked = Asked("db", 4, {"memory": 32 << 30, "hugepages-1Gi": 4 << 30}, {"gpu": 1, "nic": 0})
    assert asked.text() == "db asks for 4 exclusive CPUs, 4Gi hugepages-1Gi, 32Gi memory, 1 gpu"
    assert Asked("web").text() == "web asks for CPUs of the shared pool"
    assert Asked("one", 1).text() == "one asks for 1 exclusive CPU"
    free = NodeFree(1, 7, {"memory": 44780875776}, {"gpu": 0})
    assert free.text() == "node 1 has 7 CPUs, 41.7Gi memory, 0 gpu free"


def test_many_nodes_are_listed_up_to_a_limit() -> None:
    providers: list[ProviderHints] = [{"cpu": (_h([0]),)}]
    decision = merge(Policy.RESTRICTED, PolicyOptions(), Machine(NodeSet(range(64))), providers)
    free = tuple(NodeFree(n, 1) for n in range(64))
    parts = explain(decision, Asked("main", 2), free).parts()
    assert parts[2 : 2 + FREE_SHOWN] == tuple(f"node {n} has 1 CPU free" for n in range(16))
    assert parts[2 + FREE_SHOWN] == "48 more nodes (numad topology shows them)"


@pytest.mark.parametrize(
    ("n", "text"),
    [
        pytest.param(0, "0B", id="zero"),
        pytest.param(512, "512B", id="bytes"),
        pytest.param(1024, "1Ki", id="kibi"),
        pytest.param(1536, "1.5Ki", id="kibi-fraction"),
        pytest.param(3 << 29, "1.5Gi", id="gibi-fraction-of-whole-mebi"),
        pytest.param(22272 << 20, "21.8Gi", id="mebi-shown-in-gibi"),
        pytest.param(200000000 << 20, "190.7Ti", id="huge-in-tebi"),
        pytest.param(5 << 30, "5Gi", id="whole-gibi"),
        pytest.param(44780875776, "41.7Gi", id="gibi-fraction"),
        pytest.param(1 << 40, "1Ti", id="tebi"),
    ],
)
def test_sizes_in_the_largest_unit_to_one_decimal(n: int, text: str) -> None:
    assert human_bytes(n) == text


@pytest.mark.parametrize(
    ("problem", "words"),
    [
        (
            "[memorymanager] failed to find NUMA nodes to extend the current topology hint,"
            " no NUMA nodes with enough memory is available",
            "no NUMA node, nor set of nodes, has that much memory free",
        ),
        (
            "requested number of devices unavailable for gpu. Requested: 2, Available: 1",
            "2 gpu asked for, 1 free",
        ),
        (
            "not enough cpus available to satisfy request: requested=16, available=0",
            "16 exclusive CPUs asked for, 0 free",
        ),
        (
            "SMT Alignment Error: requested 3 cpus not multiple cpus per core = 2",
            "3 CPUs is not a whole number of cores (2 CPUs each)",
        ),
        ("something plain already", "something plain already"),
    ],
)
def test_a_managers_failure_is_said_in_plain_words(problem: str, words: str) -> None:
    assert plain(problem) == words
    assert "[" not in plain(problem)
    assert "Available:" not in plain(problem)


def test_a_device_class_with_nothing_free_never_fits_anywhere() -> None:
    """The device manager gives no preference for a class with no device with a node:
    the explanation says none is there, not that it fits anywhere."""
    providers: list[ProviderHints] = [{"ve": None}, {"cpu": (_h([0]), _h([1]))}]
    decision = merge(Policy.BEST_EFFORT, PolicyOptions(), TWO_NODES, providers)
    for asked, line in (
        (
            Asked("main", 2, {}, {"ve": 1}, {"ve": 0}, {"ve": 0}),
            "ve: its selector matches no device",
        ),
        (Asked("main", 2, {}, {"ve": 1}, {"ve": 0}, {"ve": 4}), "ve: none free on this machine"),
        (Asked("main", 2, {}, {"ve": 1}, {"ve": 3}, {"ve": 4}), "ve has no NUMA preference"),
    ):
        parts = explain(decision, asked).parts()
        assert any(p.startswith(line) for p in parts), parts
        assert not any("anywhere" in p for p in parts), parts
