"""Spec text decoded: TOML, JSON or strict YAML into plain values, within size limits.

The input edge of admission, under ``numad.workload.spec`` (numad's own shape) and
``numad.workload.pod`` (Kubernetes Pods), which check the decoded document. The only
code that opens a spec file (``read_text``); otherwise it touches nothing but
its arguments. Decoding is as strict as Kubernetes' own: duplicate keys are
refused in JSON and YAML, as are JSON's ``NaN``/``Infinity``. Any fault becomes
a ``SpecError`` naming the input. ``show``, ``type_name`` and ``member`` name
decoded values and fields in the errors of every shape.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

import yaml

from numad.errors import SpecError

Format = Literal["toml", "json", "yaml"]

MAX_SPEC_BYTES = 1 << 20
FORMATS: Mapping[str, Format] = {".toml": "toml", ".json": "json", ".yaml": "yaml", ".yml": "yaml"}
_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,62}")


def read_text(path: Path) -> tuple[str, Format]:
    """A spec file's text and its format, which comes from its suffix."""
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise SpecError(str(path), "unknown spec format", "use .toml, .json, .yaml or .yml")
    try:
        with path.open("rb") as f:
            data = f.read(MAX_SPEC_BYTES + 1)
    except OSError as err:
        raise SpecError(str(path), f"cannot read the spec: {err.strerror or err}") from err
    if len(data) > MAX_SPEC_BYTES:
        raise SpecError(str(path), f"larger than {MAX_SPEC_BYTES} bytes", "is it a spec?")
    try:
        return data.decode("utf-8"), fmt
    except UnicodeDecodeError as err:
        raise SpecError(str(path), f"not UTF-8 text (byte {err.start})") from None


def check_length(text: str, source: str) -> None:
    """Refuse text longer than any spec (before anything else looks at it)."""
    if len(text) > MAX_SPEC_BYTES:
        raise SpecError(source, f"longer than {MAX_SPEC_BYTES} characters", "is it a spec?")


def decode(text: str, fmt: Format, source: str) -> object:
    """The document ``text`` spells in ``fmt``; ``source`` names the input in errors."""
    try:
        if fmt == "toml":
            return tomllib.loads(text)
        if fmt == "json":
            return json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
        if fmt == "yaml":
            return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 (a SafeLoader)
    except (yaml.YAMLError, ValueError, TypeError, RecursionError) as err:
        # tomllib and json raise ValueErrors; PyYAML's constructors can raise
        # ValueError (dates like 2020-13-45) and TypeError; all recurse on nesting.
        raise SpecError(source, f"not valid {fmt.upper()}: {_decode_problem(err)}") from None
    raise SpecError(source, f"unknown spec format {fmt!r}", "use toml, json or yaml")


class _StrictLoader(yaml.SafeLoader):
    """The safe loader, refusing duplicate keys as Kubernetes' strict decoding does."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[tuple[str, str]] = set()
        for key, _ in node.value:
            if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                if (key.tag, key.value) in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key.value!r}", key.start_mark
                    )
                seen.add((key.tag, key.value))
        return super().construct_mapping(node, deep)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {show(key)}")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _decode_problem(err: Exception) -> str:
    if isinstance(err, RecursionError):
        return "nested too deeply"
    problem = " ".join(str(err).split())
    if isinstance(err, yaml.MarkedYAMLError) and err.problem_mark is not None:
        mark = err.problem_mark
        problem = f"{err.problem} (at line {mark.line + 1}, column {mark.column + 1})"
    return problem[:300] or type(err).__name__


# -- naming decoded values in errors ---------------------------------------------------------


def type_name(value: object, *, empty: bool = False) -> str:
    names = {bool: "boolean", int: "integer", float: "number", str: "string", dict: "table"}
    if empty and value == []:
        return "an empty one"
    if value is None:
        return "null"
    return "array" if isinstance(value, list) else names.get(type(value), type(value).__name__)


def show(value: object) -> str:
    """A short rendering of an input value. Containers are named, not shown: YAML
    aliases make small documents whose repr is exponentially large."""
    if isinstance(value, str):
        text = json.dumps(value[:60])
    elif isinstance(value, Decimal):
        text = f"{value.normalize():f}"
    elif isinstance(value, bool) or value is None:
        text = json.dumps(value)
    elif isinstance(value, int) and value.bit_length() > 256:
        text = "a huge integer"  # TOML hex literals have no digit limit; repr would refuse
    elif isinstance(value, list | dict | set | tuple):
        text = f"an {type_name(value)}" if isinstance(value, list) else f"a {type_name(value)}"
    else:
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def member(where: str, key: str) -> str:
    """``where.key``, or ``where["odd key"]`` when the key is not a plain word."""
    if not _PLAIN_KEY.fullmatch(key):
        return f"{where}[{show(key)}]"
    return f"{where}.{key}" if where else key
