"""The config file: every value type- and range-checked, errors naming the key."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

import numad.daemon.config
from numad.cpuset import CPUSet
from numad.daemon.config import Config, Paths, check_reserved, load, parse
from numad.errors import ConfigError
from numad.placement.managers.device import DeviceClass
from numad.placement.policy import Policy
from numad.placement.scope import Scope

POLICIES = "none, best-effort, restricted, single-numa-node"
GRACE = "not a number of seconds from 0 to 86400"
RECONCILE = "not a number of seconds from 0.1 to 3600"
STRINGS = "not an array of non-empty strings"


def test_reconcile_seconds_defaults_to_ten_and_can_be_set() -> None:
    assert parse({}).reconcile_seconds == 10.0
    assert parse({"daemon": {"reconcile-seconds": 2}}).reconcile_seconds == 2.0


@pytest.mark.parametrize("bad", [0, -1, 0.01, 7200, "10", True])
def test_reconcile_seconds_out_of_range_or_not_a_number_is_refused(bad: object) -> None:
    with pytest.raises(ConfigError, match="reconcile-seconds"):
        parse({"daemon": {"reconcile-seconds": bad}})


@pytest.mark.parametrize(("value", "parsed"), [("auto", None), (True, True), (False, False)])
def test_partitions_are_auto_true_or_false(value: object, parsed: bool | None) -> None:
    assert Config().partitions is None  # "auto": where offered and permitted
    assert parse({"host": {"partitions": value}}).partitions is parsed


@pytest.mark.parametrize("bad", ["yes", "Auto", 1, "true"])
def test_partitions_other_values_are_refused(bad: object) -> None:
    with pytest.raises(ConfigError, match=r'partitions = .*not true, false or "auto"'):
        parse({"host": {"partitions": bad}})


def test_no_file_gives_the_defaults() -> None:
    assert parse({}) == Config()
    assert Config().release_grace_seconds == 30.0
    assert Config().metrics_page is False  # the live page is opt-in (issue 24 item 10)


def test_the_documented_example_parses() -> None:
    doc = numad.daemon.config.__doc__ or ""
    example = doc[doc.index("    [topology]") :]
    config = parse(tomllib.loads(example))
    assert config.release_grace_seconds == 30.0
    assert config.isolate
    assert config.topology_options == {"prefer-closest-numa-nodes": "true"}
    assert config.cpu_options == {"full-pcpus-only": True}
    assert config.device_classes == (DeviceClass("gpu", vendor="0x10de", class_prefix="0x0302"),)


def test_every_value_can_be_set() -> None:
    raw: dict[str, Any] = {
        "topology": {
            "policy": "single-numa-node",
            "scope": "pod",
            "options": {
                "prefer-closest-numa-nodes": True,
                "max-allowable-numa-nodes": "4",
                "align-per-resource": False,
            },
        },
        "cpu": {"reserved-cpus": "0,16-17", "options": {"full-pcpus-only": False}},
        "memory": {"policy": "none", "reserved": {"1": {"memory": "1Gi"}}},
        "devices": {"nic": {"addresses": ["0000:3B:00.0"]}, "ve": {"driver": "ve_drv"}},
        "paths": {"cgroup-root": "/cg", "managed-roots": ["a.slice", "b.slice"]},
        "daemon": {"release-grace-seconds": 0.5},
        "metrics": {"listen": "::1", "port": 0, "page": True},
        "host": {"isolate": False},
    }
    assert parse(raw) == Config(
        policy=Policy.SINGLE_NUMA_NODE,
        scope=Scope.POD,
        topology_options={
            "prefer-closest-numa-nodes": "true",
            "max-allowable-numa-nodes": "4",
            "align-per-resource": "false",
        },
        reserved_cpus="0,16-17",
        cpu_options={"full-pcpus-only": False},
        memory_static=False,
        memory_reserved={1: {"memory": 1 << 30}},
        device_classes=(
            DeviceClass("nic", addresses=("0000:3b:00.0",)),
            DeviceClass("ve", driver="ve_drv"),
        ),
        paths=Paths(cgroup_root="/cg", managed_roots=("a.slice", "b.slice")),
        metrics_listen="::1",
        metrics_port=0,
        metrics_page=True,
        release_grace_seconds=0.5,
        isolate=False,
    )


@pytest.mark.parametrize(
    ("section", "key", "value", "field"),
    [
        pytest.param("metrics", "port", 0, "metrics_port", id="port-0-any-free"),
        pytest.param("metrics", "port", 65535, "metrics_port", id="port-highest"),
        pytest.param("cpu", "reserved-count", 0, "reserved_count", id="reserve-no-cpu"),
        pytest.param("daemon", "release-grace-seconds", 0, "release_grace_seconds", id="grace-0"),
        pytest.param(
            "daemon", "release-grace-seconds", 86400, "release_grace_seconds", id="grace-a-day"
        ),
        pytest.param("daemon", "reconcile-seconds", 0.1, "reconcile_seconds", id="reconcile-min"),
    ],
)
def test_range_ends_are_allowed(section: str, key: str, value: object, field: str) -> None:
    assert getattr(parse({section: {key: value}}), field) == value


PREFER = "prefer-closest-numa-nodes"


def _bad(where: str, key: str, value: object, message: str, case: str) -> Any:
    """A case: ``value`` at ``where``'s ``key`` and the start of the error it gives."""
    raw: dict[str, Any] = {key: value}
    for name in reversed(where.strip("[]").split(".") if where else []):
        raw = {name: raw}
    return pytest.param(raw, where, f"{key} = {value!r}: {message}", id=case)


BAD = [
    # booleans only as TOML booleans: bool("false") is True
    _bad("[cpu.options]", "full-pcpus-only", "false", "not a boolean", "cpu-option-quoted"),
    _bad("[cpu.options]", "full-pcpus-only", 0, "not a boolean", "cpu-option-number"),
    _bad("[host]", "isolate", "false", "not a boolean", "isolate-quoted"),
    _bad("[metrics]", "page", "true", "not a boolean", "page-quoted"),
    _bad("[cpu]", "options", "x", "not a table", "cpu-options-str"),
    # enums list their values
    _bad("[memory]", "policy", "Static", "not one of static, none", "memory-policy-capital"),
    _bad("[memory]", "policy", 3, "not one of static, none", "memory-policy-int"),
    _bad("[topology]", "policy", 3, f"not one of {POLICIES}", "policy-int"),
    _bad("[topology]", "policy", "single", f"not one of {POLICIES}", "policy-unknown"),
    _bad("[topology]", "scope", "node", "not one of container, pod", "scope-unknown"),
    _bad("[topology.options]", PREFER, 1, "not a string or a boolean", "topology-option-int"),
    _bad("[topology.options]", PREFER, [], "not a string or a boolean", "topology-option-list"),
    # whole numbers and seconds, with their ranges
    _bad("[cpu]", "reserved-count", "2", "not a whole number of 0 or more", "count-str"),
    _bad("[cpu]", "reserved-count", -1, "not a whole number of 0 or more", "count-negative"),
    _bad("[cpu]", "reserved-count", True, "not a whole number of 0 or more", "count-bool"),
    _bad("[cpu]", "reserved-count", 1.5, "not a whole number of 0 or more", "count-float"),
    _bad("[metrics]", "port", "x", "not a whole number from 0 to 65535", "port-str"),
    _bad("[metrics]", "port", 70000, "not a whole number from 0 to 65535", "port-too-high"),
    _bad("[metrics]", "port", -1, "not a whole number from 0 to 65535", "port-negative"),
    _bad("[daemon]", "release-grace-seconds", 86401, GRACE, "grace-over-a-day"),
    _bad("[daemon]", "release-grace-seconds", -1, GRACE, "grace-negative"),
    _bad("[daemon]", "release-grace-seconds", "30", GRACE, "grace-str"),
    _bad("[daemon]", "release-grace-seconds", True, GRACE, "grace-bool"),
    _bad("[daemon]", "reconcile-seconds", 0, RECONCILE, "reconcile-zero"),
    # strings and arrays of strings
    _bad("[paths]", "managed-roots", "numad.slice", STRINGS, "managed-roots-str"),
    _bad("[paths]", "managed-roots", [""], STRINGS, "managed-roots-empty-name"),
    _bad("[paths]", "managed-roots", [1], STRINGS, "managed-roots-int"),
    _bad("[paths]", "cgroup-root", 1, "not a string", "cgroup-root-int"),
    _bad("[paths]", "state-dir", [], "not a string", "state-dir-list"),
    _bad("[paths]", "socket", False, "not a string", "socket-bool"),
    _bad("[paths]", "workloads-dir", 2, "not a string", "workloads-dir-int"),
    _bad("[metrics]", "listen", 5, "not a string", "listen-int"),
    _bad("[cpu]", "reserved-cpus", 0, "not a string", "reserved-cpus-int"),
    _bad("[cpu]", "reserved-cpus", "0,x", "", "reserved-cpus-garbage"),
    _bad("[cpu]", "reserved-cpus", "3-1", "range '3-1' is reversed", "reserved-cpus-reversed"),
    # device classes
    _bad("[devices.gpu]", "vendor", 0x10DE, "not a string", "vendor-int"),
    _bad("[devices.gpu]", "addresses", "0000:01:00.0", STRINGS, "addresses-str"),
    _bad("[devices.gpu]", "addresses", [1], STRINGS, "addresses-int"),
    _bad("[devices]", "gpu", 3, "not a table", "device-class-not-a-table"),
    _bad("", "topology", 3, "not a table", "section-not-a-table"),
]


@pytest.mark.parametrize(("raw", "where", "message"), BAD)
def test_a_bad_value_is_an_error_naming_the_key(
    raw: dict[str, Any], where: str, message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(raw, "/etc/numad/numad.toml")
    subject = f"/etc/numad/numad.toml {where}".rstrip()
    assert caught.value.subject == subject
    assert str(caught.value).startswith(f"{subject}: {message}")


def test_a_file_with_a_bad_value_names_the_file_and_the_key(tmp_path: Path) -> None:
    path = tmp_path / "numad.toml"
    path.write_text('[cpu]\noptions = { "full-pcpus-only" = "false" }\n')
    message = (
        f"{path} [cpu.options]: full-pcpus-only = 'false': not a boolean; "
        "write true or false, without quotes"
    )
    with pytest.raises(ConfigError) as caught:
        load(path)
    assert str(caught.value) == message


def test_unknown_keys_are_still_named() -> None:
    with pytest.raises(ConfigError, match=r"config \[daemon\]: unknown key 'release-grace'"):
        parse({"daemon": {"release-grace": 30}})


@pytest.mark.parametrize(
    ("section", "known"),
    [
        pytest.param(
            "topology",
            "align-per-resource, max-allowable-numa-nodes, numa-allocation-strategy, "
            "numa-score-weights, prefer-closest-numa-nodes",
            id="topology",
        ),
        pytest.param(
            "cpu",
            "align-by-socket, distribute-cpus-across-cores, distribute-cpus-across-numa, "
            "full-pcpus-only, prefer-align-cpus-by-uncorecache, strict-cpu-reservation",
            id="cpu",
        ),
    ],
)
def test_an_unknown_option_lists_the_known_ones(section: str, known: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse({section: {"options": {"bogus": True}}}, "numad.toml")
    assert str(caught.value) == (
        f"numad.toml [{section}.options]: unknown option 'bogus'; known options: {known}"
    )


@pytest.mark.parametrize(
    ("cpu", "message"),
    [
        pytest.param(
            {"reserved-cpus": "0,99"},
            "reserved-cpus = '0,99': CPU 99 does not exist on this machine; its CPUs are 0-31",
            id="one-missing",
        ),
        pytest.param(
            {"reserved-cpus": "30-33"},
            "reserved-cpus = '30-33': CPUs 32-33 do not exist on this machine; its CPUs are 0-31",
            id="two-missing",
        ),
        pytest.param(
            {"reserved-count": 33},
            "reserved-count = 33: this machine has 32 online CPUs; reserve from 0 to 32",
            id="count-over-online",
        ),
    ],
)
def test_reserved_cpus_the_machine_lacks(cpu: dict[str, Any], message: str) -> None:
    config = parse({"cpu": cpu}, "numad.toml")
    with pytest.raises(ConfigError) as caught:
        check_reserved(config, CPUSet.parse_list("0-31"), 32)
    assert str(caught.value) == f"numad.toml [cpu]: {message}"


def test_reserved_cpus_the_machine_has_are_accepted() -> None:
    check_reserved(parse({"cpu": {"reserved-cpus": "0,31"}}), CPUSet.parse_list("0-31"), 30)
    check_reserved(parse({"cpu": {"reserved-count": 30}}), CPUSet.parse_list("0-31"), 30)


@pytest.mark.parametrize(
    "reserved",
    [{"\u00b9": {"memory": "1Gi"}}, {"1": {"memory": "1\u00b9Gi"}}, {"1": {"memory": "\u00b2"}}],
)
def test_a_unicode_digit_is_no_number_in_the_config(reserved: dict[str, Any]) -> None:
    """``str.isdigit`` takes superscripts, which ``int`` refuses: a ConfigError, not a crash."""
    with pytest.raises(ConfigError, match=r"memory\.reserved"):
        parse({"memory": {"reserved": reserved}})
