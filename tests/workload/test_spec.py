"""Workload specs: valid and invalid specs and Pod manifests, files, and fuzzing."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from numad.errors import ConfigError, SpecError
from numad.placement.admission import ContainerRequest, WorkloadRequest
from numad.placement.managers.cpu.state import ContainerKind
from numad.placement.policy import Policy
from numad.workload.decode import MAX_SPEC_BYTES, Format
from numad.workload.shape import MAX_BYTES, MAX_CPUS, MAX_DEVICES, ContainerSpec, WorkloadSpec
from numad.workload.spec import load_spec, parse_spec

GiB = 1 << 30
MiB = 1 << 20
APP, INIT, SIDECAR = ContainerKind.APP, ContainerKind.INIT, ContainerKind.SIDECAR
CLASSES = ("gpu", "nic")

DESIGN_EXAMPLE = """
name = "inference"                       # [a-z0-9][a-z0-9._-]{0,62}
cgroup = "numad.slice/inference.service" # relative to the cgroup root
policy = "single-numa-node"              # optional override of the host policy
[[containers]]
name = "main"
cgroup = "main"
cpus = 8
memory = "32Gi"
hugepages-1Gi = 4
devices = { gpu = 1 }
"""


def c(
    name: str,
    cgroup: str | None = None,
    *,
    cpus: int = 0,
    millis: int = 0,
    memory: Mapping[str, int] | None = None,
    devices: Mapping[str, int] | None = None,
    kind: ContainerKind = APP,
) -> ContainerSpec:
    cg = name if cgroup is None else cgroup
    return ContainerSpec(name, cg, cpus, millis, memory or {}, devices or {}, kind)


def w(
    name: str, *containers: ContainerSpec, policy: Policy | None = None, cgroup: str | None = None
) -> WorkloadSpec:
    return WorkloadSpec(name, cgroup or f"numad.slice/{name}", policy, containers)


def toml(body: str, name: str = "web") -> str:
    return f'name = "{name}"\ncgroup = "numad.slice/{name}"\n{body}'


def pod(containers: str, init: str = "", notes: str = "", name: str = "web") -> str:
    """A Pod manifest; ``containers`` and ``init`` are YAML list items at 2 spaces."""
    meta = f"  annotations:\n{notes}" if notes else ""
    init_block = f"  initContainers:\n{init}" if init else ""
    return (
        f"apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n{meta}"
        f"spec:\n{init_block}  containers:\n{containers}"
    )


def box(name: str, limits: str = "", requests: str = "", extra: str = "") -> str:
    out = f"  - name: {name}\n{extra}    resources:\n"
    out += f"      limits: {{{limits}}}\n" if limits else ""
    out += f"      requests: {{{requests}}}\n" if requests else ""
    return out if limits or requests else f"  - name: {name}\n{extra}"


GUARANTEED = "cpu: 2, memory: 1Gi"
SIDECAR_EXTRA = "    restartPolicy: Always\n"

VALID: list[Any] = [
    pytest.param(
        "toml",
        DESIGN_EXAMPLE,
        w(
            "inference",
            c(
                "main",
                cpus=8,
                memory={"memory": 32 * GiB, "hugepages-1Gi": 4 * GiB},
                devices={"gpu": 1},
            ),
            policy=Policy.SINGLE_NUMA_NODE,
            cgroup="numad.slice/inference.service",
        ),
        id="design-example",
    ),
    pytest.param(
        "toml",
        toml('cpus = 4\nmemory = 1073741824\nhugepages-2Mi = "64Mi"\ndevices = {nic = 2}'),
        w(
            "web",
            c(
                "main",
                "",
                cpus=4,
                memory={"memory": GiB, "hugepages-2Mi": 64 * MiB},
                devices={"nic": 2},
            ),
        ),
        id="top-level-fields-make-the-default-container",
    ),
    pytest.param("toml", toml(""), w("web", c("main", "")), id="no-resources"),
    pytest.param(
        "toml", toml('cpus = "500m"'), w("web", c("main", "", millis=500)), id="millicpus"
    ),
    pytest.param("toml", toml("cpus = 0.5"), w("web", c("main", "", millis=500)), id="fraction"),
    pytest.param(
        "toml", toml('cpus = "2.5"'), w("web", c("main", "", millis=2500)), id="text-fraction"
    ),
    pytest.param("toml", toml('cpus = "4"'), w("web", c("main", "", cpus=4)), id="text-integer"),
    pytest.param("toml", toml("cpus = 2.0"), w("web", c("main", "", cpus=2)), id="whole-float"),
    pytest.param(
        "toml", toml('cpus = "2000m"'), w("web", c("main", "", millis=2000)), id="2000m-shared"
    ),
    pytest.param(
        "toml",
        toml(f"cpus = {MAX_CPUS}\nhugepages-2048Ki = 3"),
        w("web", c("main", "", cpus=MAX_CPUS, memory={"hugepages-2Mi": 6 * MiB})),
        id="max-cpus-and-hugepage-size-canonicalised",
    ),
    pytest.param(
        "json",
        json.dumps(
            {
                "name": "db",
                "cgroup": "numad.slice/db.slice/db.service",
                "policy": "restricted",
                "containers": [
                    {"name": "prep", "kind": "init", "cpus": 2},
                    {"name": "log", "kind": "sidecar", "cgroup": "side/log", "cpus": "100m"},
                    {"name": "main", "cpus": 6, "memory": "1.5Gi", "devices": {"gpu": 2}},
                ],
            }
        ),
        w(
            "db",
            c("prep", cpus=2, kind=INIT),
            c("log", "side/log", millis=100, kind=SIDECAR),
            c("main", cpus=6, memory={"memory": 3 * GiB // 2}, devices={"gpu": 2}),
            policy=Policy.RESTRICTED,
            cgroup="numad.slice/db.slice/db.service",
        ),
        id="json-init-sidecar-app",
    ),
    pytest.param(
        "yaml",
        "name: web\ncgroup: numad.slice/web\ncpus: 1\n",
        w("web", c("main", "", cpus=1)),
        id="yaml-in-numad-shape",
    ),
    pytest.param(
        "yaml",
        pod(
            box(
                "app",
                "cpu: 4, memory: 8Gi, hugepages-2Mi: 512Mi, example.com/gpu: 2, other.io/x: 1",
            )
        ),
        w(
            "web",
            c(
                "app",
                cpus=4,
                memory={"memory": 8 * GiB, "hugepages-2Mi": 512 * MiB},
                devices={"gpu": 2},
            ),
        ),
        id="pod-guaranteed-vendor-prefixed-device",
    ),
    pytest.param(
        "yaml",
        pod(box("app", GUARANTEED) + box("side", "cpu: 1500m, memory: 1Gi")),
        w(
            "web",
            c("app", cpus=2, memory={"memory": GiB}),
            c("side", millis=1500, memory={"memory": GiB}),
        ),
        id="pod-guaranteed-fractional-container-on-shared-pool",
    ),
    pytest.param(
        "yaml",
        pod(box("app", GUARANTEED, "cpu: 2000m, memory: 1024Mi")),
        w("web", c("app", cpus=2, memory={"memory": GiB})),
        id="pod-requests-equal-limits-in-other-units",
    ),
    pytest.param(
        "yaml",
        pod(box("app", "cpu: 4, memory: 8Gi, gpu: 1", "cpu: 3")),
        w("web", c("app", millis=3000, devices={"gpu": 1})),
        id="pod-burstable-shared-no-memory-pinning",
    ),
    pytest.param(
        "yaml",
        pod(box("app", GUARANTEED), box("setup", "cpu: 1")),
        w("web", c("setup", millis=1000, kind=INIT), c("app", millis=2000)),
        id="pod-burstable-init-container-decides",
    ),
    pytest.param(
        "yaml",
        pod(box("app")),
        w("web", c("app")),
        id="pod-best-effort",
    ),
    pytest.param(
        "yaml",
        pod(
            box("app", GUARANTEED),
            box("setup", "cpu: 1, memory: 1Gi")
            + box("proxy", "cpu: 1, memory: 1Gi", extra=SIDECAR_EXTRA),
            notes="    numad.io/cgroup: numad.slice/pods/web\n"
            "    numad.io/topology-policy: best-effort\n",
            name="Web",
        ),
        w(
            "web",
            c("setup", cpus=1, memory={"memory": GiB}, kind=INIT),
            c("proxy", cpus=1, memory={"memory": GiB}, kind=SIDECAR),
            c("app", cpus=2, memory={"memory": GiB}),
            policy=Policy.BEST_EFFORT,
            cgroup="numad.slice/pods/web",
        ),
        id="pod-init-sidecar-annotations-lower-cased-name",
    ),
    pytest.param(
        "json",
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "j"},
                "spec": {
                    "containers": [
                        {"name": "a", "resources": {"limits": {"cpu": "1", "memory": 64}}}
                    ]
                },
            }
        ),
        w("j", c("a", cpus=1, memory={"memory": 64})),
        id="pod-as-json",
    ),
]


VALID += [
    pytest.param(
        "toml",
        toml("cpus = 2\ntransient = true\n"),
        replace(w("web", c("main", "", cpus=2)), transient=True),
        id="transient",
    ),
]
INVALID_TRANSIENT = [
    pytest.param(toml('cpus = 2\ntransient = "yes"\n'), "transient", id="transient-not-bool"),
    pytest.param(
        'unit = "db.service"\ncpus = 2\ntransient = true\n', "transient", id="transient-unit"
    ),
]


HUGE = "0x" + "f" * 1_000_000  # 4 million bits: TOML and YAML read it in linear time


@pytest.mark.parametrize(
    ("fmt", "text", "where"),
    [
        pytest.param("toml", toml(f"cpus = {HUGE}\n"), "cpus", id="toml-cpus"),
        pytest.param("toml", toml(f"cpus = 1\nmemory = {HUGE}\n"), "memory", id="toml-memory"),
        pytest.param(
            "toml", toml(f"cpus = 1\nhugepages-2Mi = {HUGE}\n"), "hugepages-2Mi", id="toml-pages"
        ),
        pytest.param(
            "yaml", f"name: web\ncgroup: numad.slice/web\ncpus: {HUGE}\n", "cpus", id="yaml-cpus"
        ),
    ],
)
def test_a_huge_number_is_a_spec_error_naming_its_field(fmt: Format, text: str, where: str) -> None:
    """Before: its conversion to Decimal took ~20 s of the daemon's time, then
    raised decimal.Overflow (a 500); now it is out of range without converting."""
    with pytest.raises(SpecError, match=rf"^web: {where}: a huge integer (pages )?is "):
        parse_spec(text, fmt, device_classes=CLASSES)


@pytest.mark.parametrize(("text", "where"), INVALID_TRANSIENT)
def test_transient_is_a_bool_and_no_unit(text: str, where: str) -> None:
    with pytest.raises(SpecError, match=rf"^[\w.]+: {where}: "):
        parse_spec(text, "toml", device_classes=CLASSES)


@pytest.mark.parametrize(("fmt", "text", "expected"), VALID)
def test_valid(fmt: Format, text: str, expected: WorkloadSpec) -> None:
    assert parse_spec(text, fmt, device_classes=CLASSES) == expected


@pytest.mark.parametrize(("fmt", "text", "expected"), VALID)
def test_to_dict_round_trips(fmt: Format, text: str, expected: WorkloadSpec) -> None:
    spec = parse_spec(text, fmt, device_classes=CLASSES)
    assert parse_spec(json.dumps(spec.to_dict()), "json", device_classes=CLASSES) == spec


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(1, 1, id="one-byte"),
        pytest.param('"1Ki"', 1024, id="Ki"),
        pytest.param('"1k"', 1000, id="k"),
        pytest.param('"1.5Gi"', 3 * GiB // 2, id="fraction-of-Gi"),
        pytest.param('"2e3"', 2000, id="exponent"),
        pytest.param('"7Ei"', 7 << 60, id="7Ei"),
        pytest.param(f'"{MAX_BYTES}"', MAX_BYTES, id="2^63-1"),
    ],
)
def test_memory_quantities(value: str, expected: int) -> None:
    spec = parse_spec(toml(f"memory = {value}"), "toml")
    assert spec.containers[0].memory == {"memory": expected}


INVALID: list[Any] = [
    pytest.param("toml", 'cgroup = "numad.slice/x"', "spec", "name", id="no-name"),
    pytest.param("toml", toml("", name="Web"), "spec", "name", id="upper-case-name"),
    pytest.param("toml", toml("", name="-web"), "spec", "name", id="name-starts-with-dash"),
    pytest.param("toml", toml("", name="a" * 64), "spec", "name", id="name-too-long"),
    pytest.param("toml", 'name = "web"', "web", "cgroup", id="no-cgroup"),
    pytest.param(
        "toml", 'name = "web"\ncgroup = "numad.slice/../etc"', "web", "cgroup", id="dotdot"
    ),
    pytest.param(
        "toml", 'name = "web"\ncgroup = "/numad.slice/web"', "web", "cgroup", id="absolute"
    ),
    pytest.param(
        "toml", 'name = "web"\ncgroup = "numad.slice//web"', "web", "cgroup", id="empty-part"
    ),
    pytest.param(
        "toml", 'name = "web"\ncgroup = "numad.slice/./web"', "web", "cgroup", id="dot-part"
    ),
    pytest.param(
        "toml", 'name = "web"\ncgroup = "numad.slice"', "web", "cgroup", id="the-root-itself"
    ),
    pytest.param(
        "toml", 'name = "web"\ncgroup = "system.slice/web"', "web", "cgroup", id="outside-root"
    ),
    pytest.param(
        "toml", 'name = "web"\ncgroup = "numad.slicex/web"', "web", "cgroup", id="root-prefix"
    ),
    pytest.param(
        "toml", 'name = "web"\ncgroup = "numad.slice/a\\\\b"', "web", "cgroup", id="backslash"
    ),
    pytest.param(
        "json", '{"name": "web", "cgroup": "numad.slice/a\\u0000"}', "web", "cgroup", id="nul"
    ),
    pytest.param("toml", 'name = "web"\ncgroup = "numad.slice/a b"', "web", "cgroup", id="space"),
    pytest.param("toml", 'name = "web"\ncgroup = 3', "web", "cgroup", id="cgroup-not-text"),
    pytest.param("toml", toml('policy = "always"'), "web", "policy", id="bad-policy"),
    pytest.param("toml", toml("replicas = 2"), "web", "replicas", id="unknown-top-field"),
    pytest.param(
        "toml",
        toml('[[containers]]\nname = "a"\ncpu = 1'),
        "web",
        "containers[0].cpu",
        id="unknown-container-field",
    ),
    pytest.param("toml", toml('memory = "32Qi"'), "web", "memory", id="bad-quantity"),
    pytest.param("toml", toml("memory = -1"), "web", "memory", id="negative-memory"),
    pytest.param("toml", toml('memory = "0.5"'), "web", "memory", id="fractional-bytes"),
    pytest.param("toml", toml('memory = "8Ei"'), "web", "memory", id="memory-2^63"),
    pytest.param("toml", toml("memory = 0"), "web", "memory", id="zero-memory"),
    pytest.param("toml", toml("memory = true"), "web", "memory", id="boolean-memory"),
    pytest.param("toml", toml("cpus = 0"), "web", "cpus", id="zero-cpus"),
    pytest.param("toml", toml("cpus = -2"), "web", "cpus", id="negative-cpus"),
    pytest.param("toml", toml(f"cpus = {MAX_CPUS + 1}"), "web", "cpus", id="too-many-cpus"),
    pytest.param("toml", toml("cpus = 1e30"), "web", "cpus", id="huge-float-cpus"),
    pytest.param("toml", toml("cpus = nan"), "web", "cpus", id="nan-cpus"),
    pytest.param("toml", toml('cpus = "0m"'), "web", "cpus", id="zero-millicpus"),
    pytest.param("toml", toml("cpus = 0.0001"), "web", "cpus", id="finer-than-millicpu"),
    pytest.param("toml", toml('cpus = "1.5m"'), "web", "cpus", id="fractional-millicpu"),
    pytest.param("toml", toml("cpus = true"), "web", "cpus", id="boolean-cpus"),
    pytest.param("toml", toml('cpus = "two"'), "web", "cpus", id="word-cpus"),
    pytest.param(
        "toml", toml("devices = {tpu = 1}"), "web", "devices.tpu", id="unknown-device-class"
    ),
    pytest.param("toml", toml("devices = {gpu = 0}"), "web", "devices.gpu", id="zero-devices"),
    pytest.param(
        "toml", toml("devices = {gpu = 1.5}"), "web", "devices.gpu", id="fractional-devices"
    ),
    pytest.param("toml", toml("devices = [1]"), "web", "devices", id="devices-not-table"),
    pytest.param(
        "toml", toml('hugepages-1Gi = "1536Mi"'), "web", "hugepages-1Gi", id="not-whole-pages"
    ),
    pytest.param(
        "toml", toml('hugepages-1Gi = "4"'), "web", "hugepages-1Gi", id="plain-text-is-bytes"
    ),
    pytest.param("toml", toml("hugepages-3Mi = 1"), "web", "hugepages-3Mi", id="not-a-page-size"),
    pytest.param("toml", toml("hugepages-2Mi = 0"), "web", "hugepages-2Mi", id="zero-pages"),
    pytest.param("toml", toml("hugepages-1Gi = 1e3"), "web", "hugepages-1Gi", id="float-pages"),
    pytest.param(
        "toml",
        toml("hugepages-2Mi = 1\nhugepages-2048Ki = 1"),
        "web",
        "hugepages-2Mi",
        id="same-page-size-twice",
    ),
    pytest.param(
        "toml", toml("containers = [1]"), "web", "containers[0]", id="container-not-table"
    ),
    pytest.param(
        "toml", toml('containers = "main"'), "web", "containers", id="containers-not-array"
    ),
    pytest.param("toml", toml("containers = []"), "web", "containers", id="no-containers"),
    pytest.param(
        "toml",
        toml('cpus = 1\n[[containers]]\nname = "a"'),
        "web",
        "cpus",
        id="fields-beside-containers",
    ),
    pytest.param(
        "toml",
        toml('[[containers]]\nname = "a"\n[[containers]]\nname = "a"'),
        "web",
        "containers[1].name",
        id="duplicate-names",
    ),
    pytest.param(
        "toml",
        toml('[[containers]]\nname = "a"\ncgroup = "x"\n[[containers]]\nname = "b"\ncgroup = "x"'),
        "web",
        "containers[1].cgroup",
        id="duplicate-cgroups",
    ),
    pytest.param(
        "toml",
        toml('[[containers]]\nname = "a"\n[[containers]]\nname = "b"\ncgroup = "a/b"'),
        "web",
        "containers[1].cgroup",
        id="nested-cgroups",
    ),
    pytest.param(
        "toml",
        toml('[[containers]]\nname = "a"\ncgroup = "../x"'),
        "web",
        "containers[0].cgroup",
        id="container-dotdot",
    ),
    pytest.param(
        "toml",
        toml('[[containers]]\nname = "a"\ncgroup = ""'),
        "web",
        "containers[0].cgroup",
        id="empty-cgroup",
    ),
    pytest.param(
        "toml",
        toml('[[containers]]\nname = "A"'),
        "web",
        "containers[0].name",
        id="bad-container-name",
    ),
    pytest.param(
        "toml",
        toml("[[containers]]\ncpus = 1"),
        "web",
        "containers[0].name",
        id="container-no-name",
    ),
    pytest.param(
        "toml",
        toml('[[containers]]\nname = "a"\nkind = "job"'),
        "web",
        "containers[0].kind",
        id="bad-kind",
    ),
    pytest.param(
        "toml",
        toml('[[containers]]\nname = "a"\nkind = "init"'),
        "web",
        "containers",
        id="no-app-container",
    ),
    pytest.param(
        "toml",
        toml('[[containers]]\nname = "a"\n[[containers]]\nname = "b"\nmemory = "1x"'),
        "web",
        "containers[1].memory",
        id="second-container-quantity",
    ),
    pytest.param("json", "[]", "spec", "top level", id="json-not-object"),
    pytest.param(
        "json", '{"name": "web", "name": "web"}', "spec", "not valid JSON", id="json-duplicate-key"
    ),
    pytest.param("json", '{"name": NaN}', "spec", "not valid JSON", id="json-nan"),
    pytest.param("toml", "name = ", "spec", "not valid TOML", id="toml-syntax"),
    pytest.param("yaml", "a: [", "spec", "not valid YAML", id="yaml-syntax"),
    pytest.param("yaml", "", "spec", "top level", id="yaml-empty"),
    pytest.param("yaml", "a: 1\na: 2", "spec", "not valid YAML", id="yaml-duplicate-key"),
    pytest.param(
        "yaml", "a: !!python/name:os.system", "spec", "not valid YAML", id="yaml-python-tag"
    ),
    pytest.param("json", "[" * 100_000, "spec", "not valid JSON", id="deep-nesting"),
    pytest.param("yaml", "apiVersion: apps/v1\nkind: Deployment", "spec", "kind", id="not-a-pod"),
    pytest.param("yaml", pod(box("a"), name="web/1"), "spec", "metadata.name", id="pod-bad-name"),
    pytest.param(
        "yaml", "apiVersion: v1\nkind: Pod\nspec: {}", "spec", "metadata", id="pod-no-metadata"
    ),
    pytest.param(
        "yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: web}\nspec: {containers: []}",
        "web",
        "spec.containers",
        id="pod-no-containers",
    ),
    pytest.param(
        "yaml",
        pod(box("a", "cpu: 1x")),
        "web",
        "spec.containers[0].resources.limits.cpu",
        id="pod-bad-quantity",
    ),
    pytest.param(
        "yaml",
        pod(box("a", "cpu: -1")),
        "web",
        "spec.containers[0].resources.limits.cpu",
        id="pod-negative",
    ),
    pytest.param(
        "yaml",
        pod(box("a", "cpu: 1", "cpu: 2")),
        "web",
        "spec.containers[0].resources.requests.cpu",
        id="pod-request-over-limit",
    ),
    pytest.param(
        "yaml",
        pod(box("a", "cpu: 5000, memory: 1Gi")),
        "web",
        "spec.containers[0].resources.requests.cpu",
        id="pod-too-many-cpus",
    ),
    pytest.param(
        "yaml",
        pod(box("a", GUARANTEED + ", hugepages-2Mi: 3Mi")),
        "web",
        "spec.containers[0].resources.requests.hugepages-2Mi",
        id="pod-hugepages-not-whole",
    ),
    pytest.param(
        "yaml",
        pod(box("a", "gpu: 0.5")),
        "web",
        "spec.containers[0].resources.limits.gpu",
        id="pod-half-device",
    ),
    pytest.param(
        "yaml",
        pod(box("a", "gpu: 1, example.com/gpu: 1")),
        "web",
        "spec.containers[0].resources.limits.gpu",
        id="pod-device-class-twice",
    ),
    pytest.param(
        "yaml",
        pod(box("a"), box("a")),
        "web",
        "spec.containers[0].name",
        id="pod-init-and-app-share-a-name",
    ),
    pytest.param(
        "yaml",
        pod(box("a"), box("i", extra="    restartPolicy: Never\n")),
        "web",
        "spec.initContainers[0].restartPolicy",
        id="pod-bad-restart-policy",
    ),
    pytest.param(
        "yaml",
        pod(box("a"), notes="    numad.io/cgroup: system.slice/web\n"),
        "web",
        'metadata.annotations["numad.io/cgroup"]',
        id="pod-cgroup-outside",
    ),
    pytest.param(
        "yaml",
        pod(box("a"), notes="    numad.io/topology-policy: strict\n"),
        "web",
        'metadata.annotations["numad.io/topology-policy"]',
        id="pod-bad-policy",
    ),
]


@pytest.mark.parametrize(("fmt", "text", "subject", "where"), INVALID)
def test_invalid(fmt: Format, text: str, subject: str, where: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec(text, fmt, device_classes=CLASSES)
    err = caught.value
    assert err.subject == subject
    assert err.problem.startswith(f"{where}:"), err.problem
    assert str(err).startswith(f"{subject}: {where}: ")


def test_error_reads_like_the_house_style() -> None:
    text = DESIGN_EXAMPLE.replace('"32Gi"', '"32Qi"')
    with pytest.raises(
        SpecError,
        match=r"^inference: containers\[0\]\.memory: \"32Qi\" is not a quantity; use bytes",
    ):
        parse_spec(text, "toml")


def test_unknown_field_names_field_and_place() -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec(toml('[[containers]]\nname = "a"\ncpu = 1'), "toml")
    assert (
        str(caught.value)
        == "web: containers[0].cpu: unknown field in containers[0]; did you mean cpus?"
    )


def test_unknown_device_class_lists_the_known_ones() -> None:
    with pytest.raises(SpecError, match=r"unknown device class \"tpu\"; known: gpu, nic$"):
        parse_spec(toml("devices = {tpu = 1}"), "toml", device_classes=CLASSES)


def test_any_device_class_name_without_a_class_list() -> None:
    spec = parse_spec(toml("devices = {tpu = 1}"), "toml")
    assert spec.containers[0].devices == {"tpu": 1}


def test_other_managed_roots() -> None:
    text = 'name = "vm"\ncgroup = "machine.slice/vm"'
    assert parse_spec(text, "toml", managed_roots=("/machine.slice/",)).cgroup == "machine.slice/vm"
    with pytest.raises(SpecError, match=r"outside the managed roots; put it in numad\.slice$"):
        parse_spec(text, "toml")


@pytest.mark.parametrize("root", ["", "/", "a/../b", "a b"])
def test_bad_managed_root_is_the_callers_config_error(root: str) -> None:
    with pytest.raises(ConfigError):
        parse_spec(toml(""), "toml", managed_roots=(root,))


def test_pod_without_classes_maps_no_devices() -> None:
    spec = parse_spec(pod(box("app", "gpu: 1")), "yaml")
    assert spec.containers[0].devices == {}


def test_to_request_and_cgroups() -> None:
    spec = parse_spec(DESIGN_EXAMPLE, "toml")
    assert spec.to_request() == WorkloadRequest(
        "inference",
        (
            ContainerRequest(
                "main", 8, {"hugepages-1Gi": 4 * GiB, "memory": 32 * GiB}, {"gpu": 1}, APP
            ),
        ),
        Policy.SINGLE_NUMA_NODE,
    )
    assert spec.container_cgroup(spec.containers[0]) == "numad.slice/inference.service/main"
    default = parse_spec(toml("cpus = 1"), "toml")
    assert default.container_cgroup(default.containers[0]) == "numad.slice/web"


def test_to_dict_shape() -> None:
    spec = parse_spec(DESIGN_EXAMPLE, "toml")
    assert spec.to_dict() == {
        "name": "inference",
        "cgroup": "numad.slice/inference.service",
        "policy": "single-numa-node",
        "containers": [
            {
                "name": "main",
                "cgroup": "main",
                "kind": "app",
                "cpus": 8,
                "hugepages-1Gi": 4,
                "memory": 32 * GiB,
                "devices": {"gpu": 1},
            }
        ],
    }
    assert parse_spec(toml('cpus = "250m"'), "toml").to_dict() == {
        "name": "web",
        "cgroup": "numad.slice/web",
        "cpus": "250m",
    }


# -- files ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("suffix", "text"),
    [
        pytest.param(".toml", toml("cpus = 2"), id="toml"),
        pytest.param(
            ".json", json.dumps({"name": "web", "cgroup": "numad.slice/web", "cpus": 2}), id="json"
        ),
        pytest.param(".yml", "name: web\ncgroup: numad.slice/web\ncpus: 2\n", id="yml"),
        pytest.param(
            ".YAML", "name: web\ncgroup: numad.slice/web\ncpus: 2\n", id="upper-case-yaml"
        ),
    ],
)
def test_load_spec(tmp_path: Path, suffix: str, text: str) -> None:
    path = tmp_path / f"web{suffix}"
    path.write_text(text)
    assert load_spec(path) == w("web", c("main", "", cpus=2))


@pytest.mark.parametrize(
    ("name", "content", "problem"),
    [
        pytest.param("w.ini", b"", "unknown spec format", id="suffix"),
        pytest.param("w.toml", None, "cannot read", id="missing"),
        pytest.param("w.toml", b"#" * (MAX_SPEC_BYTES + 1), "larger than", id="too-large"),
        pytest.param("w.json", b'{"name": "\xff"}', "not UTF-8", id="not-utf8"),
        pytest.param("w.toml", b'name = "W"', "name:", id="bad-name-names-the-file"),
    ],
)
def test_load_spec_errors_name_the_file(
    tmp_path: Path, name: str, content: bytes | None, problem: str
) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    assert caught.value.subject == str(path)
    assert caught.value.problem.startswith(problem)


def test_load_spec_of_a_directory(tmp_path: Path) -> None:
    (tmp_path / "d.toml").mkdir()
    with pytest.raises(SpecError, match="cannot read"):
        load_spec(tmp_path / "d.toml")


# -- properties ------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=15,
)
odd_values = json_values | st.sampled_from(
    ["0", "-1", "0m", "1.5m", "8Ei", "1e99", "x/../y", "/abs", "", "Main", "nan", "3Mi", "tpu"]
)


def mostly(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``good`` in about nine draws of ten, else an odd value: the fuzz reaches deep fields."""
    # (one_of would not do: it draws a distinct branch, not an even one.)
    return st.sampled_from([True] * 9 + [False]).flatmap(lambda ok: good if ok else odd_values)


def with_stray_keys(docs: st.SearchStrategy[dict[str, Any]], *keys: str) -> st.SearchStrategy[Any]:
    stray = st.dictionaries(st.sampled_from(keys), odd_values, max_size=1)
    extras = st.sampled_from([True] * 9 + [False]).flatmap(lambda ok: stray if ok else st.just({}))
    return st.builds(lambda d, e: {**d, **e}, docs, extras)


small_names = st.sampled_from(["a", "b", "main", "side"])
resources = {
    "cpus": mostly(st.sampled_from([1, 2, 64, "500m", "4", 0.5, "2.5", 1.0])),
    "memory": mostly(st.sampled_from([1024, "32Gi", "1.5Ki", "1e3", "7Ei", 1.0])),
    "hugepages-2Mi": mostly(st.sampled_from([1, 4, "4Mi", "64Mi"])),
    "hugepages-1Gi": mostly(st.sampled_from([1, "2Gi"])),
    "devices": mostly(st.dictionaries(st.sampled_from(CLASSES), st.integers(1, 4), max_size=2)),
}
container_docs = with_stray_keys(
    st.fixed_dictionaries(
        {"name": mostly(small_names)},
        optional={
            "cgroup": mostly(st.sampled_from(["x", "Sub/a", "Sub/b", "a/b"])),
            "kind": mostly(st.sampled_from(["app", "app", "init", "sidecar"])),
            **resources,
        },
    ),
    "cpu",
    "hugepages-3Mi",
    "nodes",
)
workload_head = {
    "name": mostly(st.sampled_from(["web", "db.1"])),
    "cgroup": mostly(st.sampled_from(["numad.slice/web", "numad.slice/a/b"])),
}
native_docs = with_stray_keys(
    st.fixed_dictionaries(
        {**workload_head, "containers": mostly(st.lists(container_docs, min_size=1, max_size=3))},
        optional={"policy": mostly(st.sampled_from(["restricted", "none"]))},
    )
    | st.fixed_dictionaries(workload_head, optional=resources),
    "cpus",
    "replicas",
)
quantities = mostly(st.sampled_from(["1", "2", "500m", "1Gi", "4Mi", "1.5", "4000m", 2, 0.5]))
resource_lists = st.dictionaries(
    st.sampled_from(["cpu", "memory", "hugepages-2Mi", "gpu", "example.com/gpu", "nic", "other"]),
    quantities,
    max_size=5,
)


@st.composite
def pod_containers(draw: st.DrawFn) -> Any:
    limits = draw(resource_lists)
    requests = draw(st.sampled_from([None, limits]) | resource_lists)
    out: dict[str, Any] = {"name": draw(mostly(small_names))}
    if limits or requests is not None:
        out["resources"] = {"limits": limits} | ({} if requests is None else {"requests": requests})
    return out | draw(
        st.sampled_from([{}, {}, {}, {"restartPolicy": "Always"}])
        | odd_values.map(lambda v: {"restartPolicy": v})
    )


notes = st.fixed_dictionaries(
    {},
    optional={
        "numad.io/cgroup": mostly(st.just("numad.slice/pods/web")),
        "numad.io/topology-policy": mostly(st.just("single-numa-node")),
    },
)
pod_docs = st.fixed_dictionaries(
    {
        "apiVersion": mostly(st.just("v1")),
        "kind": mostly(st.just("Pod")),
        "metadata": mostly(
            st.fixed_dictionaries({"name": mostly(st.just("Web"))}, optional={"annotations": notes})
        ),
        "spec": st.fixed_dictionaries(
            {"containers": mostly(st.lists(pod_containers(), min_size=1, max_size=3))},
            optional={"initContainers": mostly(st.lists(pod_containers(), max_size=2))},
        ),
    },
)


def _parses_or_spec_error(text: str, fmt: Format) -> None:
    """Anything but a SpecError escapes; what parses is sane and round-trips."""
    try:
        spec = parse_spec(text, fmt, device_classes=CLASSES)
    except SpecError as err:
        caught = err
    else:
        assert spec.cgroup.startswith("numad.slice/")
        for container in spec.containers:
            parts = spec.container_cgroup(container).split("/")
            assert all(p not in ("", ".", "..") for p in parts)
        assert parse_spec(json.dumps(spec.to_dict()), "json", device_classes=CLASSES) == spec
        return
    assert caught.subject
    assert caught.problem


@settings(deadline=None, max_examples=300)
@given(st.one_of(native_docs, pod_docs, json_values))
def test_any_json_document_is_a_spec_or_a_spec_error(doc: Any) -> None:
    _parses_or_spec_error(json.dumps(doc), "json")


@settings(deadline=None, max_examples=150)
@given(native_docs | pod_docs)
def test_any_yaml_document_is_a_spec_or_a_spec_error(doc: Any) -> None:
    _parses_or_spec_error(yaml.safe_dump(doc), "yaml")


@settings(deadline=None, max_examples=300)
@given(st.text(), st.sampled_from(["toml", "json", "yaml"]))
def test_any_text_is_a_spec_or_a_spec_error(text: str, fmt: Format) -> None:
    _parses_or_spec_error(text, fmt)


@settings(deadline=None, max_examples=500)
@given(
    st.sampled_from(["toml", "json", "yaml"]), st.text("[]{}:=,\"'-# \n.&*!|>aAzZ019", max_size=60)
)
def test_punctuation_soup_is_a_spec_or_a_spec_error(fmt: Format, text: str) -> None:
    _parses_or_spec_error(text, fmt)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("specs")


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=200), st.sampled_from([".toml", ".json", ".yaml"]))
def test_any_bytes_are_a_spec_or_a_spec_error(scratch: Path, data: bytes, suffix: str) -> None:
    path = scratch / f"spec{suffix}"
    path.write_bytes(data)
    try:
        load_spec(path)
    except SpecError as err:
        caught = err
    else:
        return
    assert caught.subject


names = st.from_regex(r"[a-z0-9][a-z0-9._-]{0,20}", fullmatch=True)
PAGES = {"hugepages-64Ki": 64 << 10, "hugepages-2Mi": 2 << 20, "hugepages-1Gi": 1 << 30}


@st.composite
def container_specs(draw: st.DrawFn, name: str, cgroup: str, kind: ContainerKind) -> ContainerSpec:
    cpus = draw(
        st.sampled_from([(0, 0)])
        | st.tuples(st.integers(1, MAX_CPUS), st.just(0))
        | st.tuples(st.just(0), st.integers(1, MAX_CPUS * 1000))
    )
    memory = {}
    if draw(st.booleans()):
        memory["memory"] = draw(st.integers(1, MAX_BYTES))
    for resource in draw(st.lists(st.sampled_from(sorted(PAGES)), unique=True)):
        memory[resource] = PAGES[resource] * draw(st.integers(1, MAX_BYTES // PAGES[resource]))
    devices = draw(st.dictionaries(st.sampled_from(CLASSES), st.integers(1, MAX_DEVICES)))
    return ContainerSpec(name, cgroup, *cpus, memory, devices, kind)


@st.composite
def workload_specs(draw: st.DrawFn) -> WorkloadSpec:
    name = draw(names)
    cgroup = f"numad.slice/{draw(st.sampled_from(['', 'pods/', 'a.slice/b.slice/']))}{name}"
    policy = draw(st.none() | st.sampled_from(Policy))
    if draw(st.booleans()):
        return WorkloadSpec(name, cgroup, policy, (draw(container_specs("main", "", APP)),))
    container_names = draw(st.lists(names, min_size=1, max_size=4, unique=True))
    kinds = [APP, *draw(st.lists(st.sampled_from(ContainerKind), min_size=3, max_size=3))]
    containers = tuple(
        draw(container_specs(n, draw(st.sampled_from([n, f"Sub/{n}"])), k))
        for n, k in zip(container_names, kinds, strict=False)
    )
    return WorkloadSpec(name, cgroup, policy, containers)


@settings(deadline=None, max_examples=300)
@given(workload_specs())
def test_generated_specs_round_trip(spec: WorkloadSpec) -> None:
    assert parse_spec(json.dumps(spec.to_dict()), "json", device_classes=CLASSES) == spec


def test_yaml_alias_bomb_is_refused_quickly() -> None:
    """Aliases share one object; an error must not render it (10^12 leaves here)."""
    anchors = ["  - &a0 [x, x, x, x, x, x, x, x, x, x]"]
    anchors += [f"  - &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 12)]
    text = pod(box("a", "cpu: *a11")).replace(
        "metadata:", "volumes:\n" + "\n".join(anchors) + "\nmetadata:"
    )
    with pytest.raises(SpecError, match=r"limits\.cpu: an array is not a quantity"):
        parse_spec(text, "yaml")
