"""`numad topology --nrt` and GET /v1/nrt: this host as a NodeResourceTopology object,
valid against the v1alpha2 OpenAPI schema of the CRD the scheduler's
NodeResourceTopologyMatch plugin reads (vendored in tests/data/nrt/), with the values
numad holds: every NUMA node a zone, its CPUs, memory, hugepages and devices, the
distances as costs, the policy and scope as attributes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from numad.cli.demo import CONFIG, MACHINE
from numad.cpuset import CPUSet
from numad.host.scratch import scratch_mkdir
from numad.hostfs import HostFS
from numad.topology.discover import discover
from tests.conftest import Machines
from tests.daemon.test_daemon_e2e import Numad

CRD = Path(__file__).resolve().parents[1] / "data" / "nrt" / "crd.yaml"
LARGE = ("144arm-2pa72co+32gpumem-gb200like", "256intel64-64n2co2t-sgiuvlike")


def _schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha2"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def _validate(obj: dict[str, Any]) -> None:
    jsonschema.Draft4Validator(_schema()).validate(obj)  # OpenAPI v3 schemas are draft-4-like


def _zone(obj: dict[str, Any], node: int) -> dict[str, dict[str, Any]]:
    (zone,) = [z for z in obj["zones"] if z["name"] == f"node-{node}"]
    assert zone["type"] == "Node"
    return {r["name"]: r for r in zone["resources"]}


def test_the_schema_catches_what_it_should() -> None:
    """The validator is live: an object without zones, or with a quantity that is
    neither an integer nor a string, is refused."""
    with pytest.raises(jsonschema.ValidationError):
        _validate({"apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology"})
    bad = {"zones": [{"name": "node-0", "type": "Node", "resources": [{"name": "cpu"}]}]}
    with pytest.raises(jsonschema.ValidationError):
        _validate(bad)


@pytest.mark.parametrize("machine", [MACHINE, *LARGE])
def test_offline_object_is_valid_and_states_the_machine(machines: Machines, machine: str) -> None:
    root = machines.root(machine)
    done = subprocess.run(
        [sys.executable, "-m", "numad", "topology", "--nrt", "--root", str(root)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    obj = json.loads(done.stdout)
    _validate(obj)
    topo = discover(HostFS(root))
    assert obj["apiVersion"] == "topology.node.k8s.io/v1alpha2"
    assert [z["name"] for z in obj["zones"]] == [f"node-{n.id}" for n in topo.nodes]
    for node in topo.nodes:
        resources = _zone(obj, node.id)
        cpu = resources["cpu"]
        assert cpu["capacity"] == len(node.cpus)
        assert cpu["available"] == cpu["allocatable"] <= cpu["capacity"]  # nothing held
        if node.memory_total_kb:
            assert resources["memory"]["capacity"] == node.memory_total_kb * 1024
        (zone,) = [z for z in obj["zones"] if z["name"] == f"node-{node.id}"]
        costs = {c["name"]: c["value"] for c in zone.get("costs", [])}
        for other in topo.nodes:
            assert costs.get(f"node-{other.id}") == topo.distance(node.id, other.id)
    attributes = {a["name"]: a["value"] for a in obj["attributes"]}
    assert attributes == {
        "topologyManagerPolicy": "best-effort",
        "topologyManagerScope": "container",
    }


def test_the_daemon_publishes_what_it_holds(machines: Machines, tmp_path: Path) -> None:
    root = tmp_path / "machine"
    subprocess.run(["cp", "-a", str(machines.root(MACHINE)), str(root)], check=True)
    config = tmp_path / "numad.toml"
    config.write_text(CONFIG.replace('policy = "none"', 'policy = "static"'))  # memory held
    daemon = Numad(root, config)
    daemon.start()
    try:
        before = daemon.call("GET", "/v1/nrt")
        _validate(before)
        scratch_mkdir(daemon.cgroups, "numad.slice/db")
        spec = {"name": "db", "cgroup": "numad.slice/db", "cpus": 4, "memory": "1Gi"}
        spec["devices"] = {"vector-engine": 2}
        daemon.call("POST", "/v1/workloads", spec)
        after = daemon.call("GET", "/v1/nrt")
        _validate(after)
        held = CPUSet.parse_list(
            daemon.call("GET", "/v1/workloads/db")["containers"]["main"]["cpus"]
        )
        topo = discover(HostFS(root))
        (node,) = [n for n in topo.nodes if not n.cpus.isdisjoint(held)]
        was, now = _zone(before, node.id), _zone(after, node.id)
        assert now["cpu"]["available"] == was["cpu"]["available"] - 4
        assert now["vector-engine"]["available"] == was["vector-engine"]["available"] - 2
        assert now["memory"]["available"] == was["memory"]["available"] - 2**30
        assert now["cpu"]["allocatable"] == was["cpu"]["allocatable"]
        listed = subprocess.run(
            [sys.executable, "-m", "numad", "topology", "--nrt", "--socket", daemon.socket],
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert json.loads(listed.stdout) == after
    finally:
        daemon.stop()
