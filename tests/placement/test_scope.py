"""Scopes: the pod's effective request, and merges container by container or once per pod."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from numad.cpuset import NodeSet
from numad.placement.hints import Hint, ProviderHints
from numad.placement.policy import Decision, Machine, Policy, PolicyOptions
from numad.placement.scope import Container, Request, Scope, decide, effective_request


@pytest.mark.parametrize(
    ("containers", "expected"),
    [
        pytest.param(
            [Container("a", {"cpu": 2}), Container("b", {"cpu": 3})], {"cpu": 5}, id="sum-of-apps"
        ),
        pytest.param(
            [
                Container("i", {"cpu": 8}, init=True),
                Container("a", {"cpu": 2}),
                Container("b", {"cpu": 3}),
            ],
            {"cpu": 8},
            id="init-larger-than-sum",
        ),
        pytest.param(
            [
                Container("i", {"cpu": 4, "memory": 10}, init=True),
                Container("a", {"cpu": 2, "memory": 30}),
            ],
            {"cpu": 4, "memory": 30},
            id="per-resource",
        ),
        pytest.param(
            [
                Container("side", {"cpu": 2}, init=True, sidecar=True),
                Container("i", {"cpu": 5}, init=True),
                Container("a", {"cpu": 1}),
            ],
            {"cpu": 7},
            id="sidecar-before-init-counts-in-its-peak",
        ),
        pytest.param(
            [
                Container("i", {"cpu": 5}, init=True),
                Container("side", {"cpu": 2}, init=True, sidecar=True),
                Container("a", {"cpu": 4}),
            ],
            {"cpu": 6},
            id="sidecar-runs-with-the-apps",
        ),
    ],
)
def test_effective_request(containers: list[Container], expected: dict[str, int]) -> None:
    assert effective_request(containers) == expected


MACHINE = Machine(NodeSet([0, 1]))


def _cpu_hints(request: Request) -> Sequence[ProviderHints]:
    """A provider whose nodes hold 4 CPUs each."""
    need = request.get("cpu", 0)
    if need <= 4:
        return [
            {
                "cpu": (
                    Hint(NodeSet([0]), True),
                    Hint(NodeSet([1]), True),
                    Hint(NodeSet([0, 1]), False),
                )
            }
        ]
    return [{"cpu": (Hint(NodeSet([0, 1]), need <= 8),) if need <= 8 else ()}]


def test_container_scope_merges_each_container_and_names_the_rejected_one() -> None:
    containers = [
        Container("init", {"cpu": 2}, init=True),
        Container("big", {"cpu": 6}),
        Container("small", {"cpu": 1}),
    ]
    admitted: list[str] = []

    def on_admit(c: Container, _d: Decision) -> None:
        admitted.append(c.name)

    result = decide(
        Scope.CONTAINER,
        Policy.SINGLE_NUMA_NODE,
        PolicyOptions(),
        MACHINE,
        containers,
        hints_for=_cpu_hints,
        on_admit=on_admit,
    )
    assert (result.admit, result.rejected) == (False, "big")
    assert [name for name, _ in result.decisions] == ["init", "big"]
    assert admitted == ["init"]


def test_pod_scope_merges_once_for_the_effective_request() -> None:
    containers = [
        Container("a", {"cpu": 2}),
        Container("b", {"cpu": 2}),
        Container("i", {"cpu": 3}, init=True),
    ]
    seen: list[Request] = []

    def hints(request: Request) -> Sequence[ProviderHints]:
        seen.append(dict(request))
        return _cpu_hints(request)

    result = decide(
        Scope.POD, Policy.SINGLE_NUMA_NODE, PolicyOptions(), MACHINE, containers, hints_for=hints
    )
    assert seen == [{"cpu": 4}]
    assert result.admit
    assert [name for name, _ in result.decisions] == ["i", "a", "b"]
    assert {d.affinity for _, d in result.decisions} == {NodeSet([0])}


def test_pod_scope_rejects_what_containers_alone_would_fit() -> None:
    containers = [Container("a", {"cpu": 3}), Container("b", {"cpu": 3})]
    pod = decide(
        Scope.POD,
        Policy.SINGLE_NUMA_NODE,
        PolicyOptions(),
        MACHINE,
        containers,
        hints_for=_cpu_hints,
    )
    each = decide(
        Scope.CONTAINER,
        Policy.SINGLE_NUMA_NODE,
        PolicyOptions(),
        MACHINE,
        containers,
        hints_for=_cpu_hints,
    )
    assert (pod.admit, pod.rejected) == (False, "(pod)")
    assert each.admit
