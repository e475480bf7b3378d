"""``movable`` in every spec shape (TOML, JSON, a Pod's ``numad.io/movable``
annotation): false unless asked, a boolean (an annotation's "true" or "false"), kept by
``to_dict``; and the spec's resize helpers (``container``, ``resized``)."""

from __future__ import annotations

import json

import pytest

from numad.errors import SpecError
from numad.workload.spec import parse_spec

POD = """\
apiVersion: v1
kind: Pod
metadata:
  name: db
  annotations: {ANNOTATIONS}
spec:
  containers:
  - name: main
    resources:
      limits: {{cpu: "2", memory: 1Gi}}
"""


def test_movable_is_false_unless_asked_and_round_trips() -> None:
    fixed = parse_spec('name = "db"\ncgroup = "numad.slice/db"\ncpus = 2\n', "toml")
    assert fixed.movable is False
    assert "movable" not in fixed.to_dict()
    movable = parse_spec(
        json.dumps({"name": "db", "cgroup": "numad.slice/db", "cpus": 2, "movable": True}), "json"
    )
    assert movable.movable is True
    assert parse_spec(json.dumps(movable.to_dict()), "json") == movable


@pytest.mark.parametrize("value", ['"true"', "1", "[]"])
def test_movable_must_be_a_boolean(value: str) -> None:
    text = f'name = "db"\ncgroup = "numad.slice/db"\ncpus = 2\nmovable = {value}\n'
    with pytest.raises(SpecError, match="movable: expected true or false"):
        parse_spec(text, "toml")


@pytest.mark.parametrize(
    ("annotations", "movable"),
    [
        pytest.param("{}", False, id="none"),
        pytest.param('{"numad.io/movable": "true"}', True, id="true"),
        pytest.param('{"numad.io/movable": "false"}', False, id="false"),
    ],
)
def test_a_pod_asks_through_its_annotation(annotations: str, movable: bool) -> None:
    spec = parse_spec(POD.format(ANNOTATIONS=annotations), "yaml")
    assert spec.movable is movable
    assert parse_spec(json.dumps(spec.to_dict()), "json").movable is movable


def test_a_pod_annotation_of_another_word_is_an_error() -> None:
    with pytest.raises(SpecError, match=r'numad.io/movable"\]: expected "true" or "false"'):
        parse_spec(POD.format(ANNOTATIONS='{"numad.io/movable": "yes"}'), "yaml")


def test_container_and_resized() -> None:
    doc = {
        "name": "db",
        "cgroup": "numad.slice/db",
        "containers": [
            {"name": "a", "cpus": 2, "memory": "1Gi"},
            {"name": "b", "cpus": 1},
            {"name": "i", "kind": "init", "cpus": 1},
        ],
    }
    spec = parse_spec(json.dumps(doc), "json")
    assert spec.container(None) is None  # two app containers: which one?
    assert spec.container("b") is spec.containers[1]
    assert spec.container("x") is None
    bigger = spec.resized("a", 4, 2 << 30)
    assert (bigger.containers[0].exclusive_cpus, bigger.containers[0].memory["memory"]) == (
        4,
        2 << 30,
    )
    assert bigger.containers[1:] == spec.containers[1:]
    assert spec.resized("b", None, None) == spec
    only = parse_spec(json.dumps({"name": "w", "cgroup": "numad.slice/w", "cpus": 2}), "json")
    assert only.container(None) is only.containers[0]
