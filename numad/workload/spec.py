"""Workload specs from text: numad's own shape (TOML, JSON, YAML) or a Kubernetes Pod.

The input edge of admission. Text is parsed once, here, into a validated
``WorkloadSpec`` (``numad.workload.shape``): ``numad.workload.decode`` turns text
(or the file ``load_spec`` names) into a document; ``numad.workload.reader`` checks
numad's shape and ``numad.workload.pod`` a Pod's, with the same ``Reader``. Touches
no file itself but the one ``load_spec`` names.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path

from numad.errors import ConfigError
from numad.workload.decode import Format, check_length, decode, read_text
from numad.workload.pod import read_pod
from numad.workload.reader import PATH_HINT, Reader, path_problem
from numad.workload.shape import DEFAULT_MANAGED_ROOTS, WorkloadSpec


def load_spec(
    path: Path,
    *,
    managed_roots: Sequence[str] = DEFAULT_MANAGED_ROOTS,
    device_classes: Collection[str] | None = None,
) -> WorkloadSpec:
    """Read and parse a spec file; the format comes from its suffix."""
    text, fmt = read_text(path)
    return parse_spec(
        text, fmt, managed_roots=managed_roots, device_classes=device_classes, source=str(path)
    )


def parse_spec(
    text: str,
    fmt: Format,
    *,
    managed_roots: Sequence[str] = DEFAULT_MANAGED_ROOTS,
    device_classes: Collection[str] | None = None,
    source: str = "spec",
) -> WorkloadSpec:
    """A validated spec from TOML, JSON or YAML text; YAML and JSON may be a v1 Pod.

    ``source`` names the input in errors until the workload's name is known.
    Bad managed roots are the caller's ``ConfigError``; anything wrong with the
    text is a ``SpecError``.
    """
    check_length(text, source)
    classes = None if device_classes is None else frozenset(device_classes)
    reader = Reader(source, _roots(managed_roots), classes)
    doc = reader.table(decode(text, fmt, source), "top level")
    if fmt != "toml" and ("apiVersion" in doc or "kind" in doc):
        return read_pod(reader, doc)
    return reader.native(doc)


def _roots(managed_roots: Sequence[str]) -> tuple[str, ...]:
    roots = tuple(r.strip("/") for r in managed_roots)
    for root in roots:
        problem = path_problem(root)
        if problem:
            raise ConfigError("managed-roots", problem, PATH_HINT)
    return roots
