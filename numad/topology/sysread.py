"""Typed reads of single sysfs attributes, with the fallbacks discovery documents.

Discovery edge: reads host files only through a ``HostFS``. A value that is
missing yields ``None``; a value that is present but unusable also yields
``None`` and leaves a note naming the file, so garbage never crashes discovery.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from numad.cpuset import CPUSet, _IdSet
from numad.hostfs import HostFS

_S = TypeVar("_S", bound=_IdSet)


class Reader:
    """A ``HostFS`` plus the notes of what discovery had to work around."""

    def __init__(self, fs: HostFS) -> None:
        self.fs = fs
        self.notes: list[str] = []

    def note(self, path: str, problem: str) -> None:
        self.notes.append(f"{path}: {problem}")

    def text(self, path: str) -> str | None:
        """The attribute's text, stripped. Quirk: some kernels (seen on arm64
        ``topology/*_list``, x86 ``nohz_full``) pad attributes with NUL bytes;
        they are dropped here."""
        raw = self.fs.read_optional(path)
        if raw is None:
            return None
        return raw.replace("\x00", "").strip()

    def integer(self, path: str) -> int | None:
        text = self.text(path)
        if not text:  # hwloc's recordings leave unreadable attributes empty
            return None
        try:
            return int(text, 0) if text.lower().startswith("0x") else int(text)
        except ValueError:
            self.note(path, f"not an integer: {text[:40]!r} (ignored)")
            return None

    def id_list(self, path: str, kind: type[_S]) -> _S | None:
        """A list-format set (``0-3,8``)."""
        return self._id_set(path, kind.parse_list, "list")

    def id_mask(self, path: str, kind: type[_S]) -> _S | None:
        """A hex-mask set (``0000ffff,ffffffff``), the format of old kernels."""
        return self._id_set(path, kind.parse_mask, "mask")

    def _id_set(self, path: str, parse: Callable[[str], _S], form: str) -> _S | None:
        text = self.text(path)
        if text is None:
            return None
        try:
            return parse(text)
        except ValueError as err:
            self.note(path, f"unreadable {form} ({err}; ignored)")
            return None

    def cpus(self, list_path: str, mask_path: str | None = None) -> CPUSet | None:
        """A CPU set from its list file, else from its older hex-mask twin."""
        found = self.id_list(list_path, CPUSet)
        if found is None and mask_path is not None:
            found = self.id_mask(mask_path, CPUSet)
        return found
