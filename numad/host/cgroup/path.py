"""cgroup paths, checked as text: relative, no ``.``/``..``, no empty components,
inside a managed root.

The cgroup layer (the last stage, run after the checkpoint), its first check:
pure, it touches no file. ``numad.host.cgroup.hierarchy`` checks the same paths on
disk.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from numad.errors import CgroupError

DEFAULT_MANAGED_ROOTS = ("numad.slice",)
_NAME_MAX = 255  # the kernel's limit on one cgroup (directory) name
_CONTROL = re.compile("[\x00-\x1f\x7f]")  # no cgroup name holds a control character


@dataclass(frozen=True, slots=True)
class CgroupPath:
    """A cgroup's path relative to the hierarchy root, checked as text."""

    parts: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> CgroupPath:
        """Check ``text`` (``numad.slice/db.service``); raises CgroupError naming the fault."""
        subject = f"cgroup path {text!r}"
        if not text:
            raise CgroupError(subject, "is empty")
        if text.startswith("/"):
            raise CgroupError(subject, "is absolute", "make it relative to the cgroup root")
        parts = tuple(text.split("/"))
        for part in parts:
            if part in ("", ".", ".."):
                raise CgroupError(
                    subject, f"has a {part!r} component", "write it without '.', '..' or '//'"
                )
            if len(part.encode()) > _NAME_MAX or _CONTROL.search(part):
                raise CgroupError(subject, f"{part!r} is not a valid cgroup name")
        return cls(parts)

    def __str__(self) -> str:
        return "/".join(self.parts)

    @property
    def parent(self) -> CgroupPath:
        return CgroupPath(self.parts[:-1])

    def is_within(self, other: CgroupPath) -> bool:
        """True if this path is ``other`` or below it."""
        return self.parts[: len(other.parts)] == other.parts

    def managed_by(self, roots: Iterable[CgroupPath]) -> CgroupPath:
        """The (innermost) managed root this path lies in; CgroupError if none."""
        inside = [root for root in roots if self.is_within(root)]
        if not inside:
            names = ", ".join(str(root) for root in roots)
            raise CgroupError(
                f"cgroup path {str(self)!r}",
                f"is outside the managed cgroup roots ({names})",
                "use a path below one of them",
            )
        return max(inside, key=lambda root: len(root.parts))


def as_path(path: CgroupPath | str) -> CgroupPath:
    return path if isinstance(path, CgroupPath) else CgroupPath.parse(path)


# Levels below the hierarchy's root that numad follows. Deeper cgroups are not
# isolated one by one (on v2 their isolated ancestor bounds them) and are named in
# health: a chain of thousands of levels would otherwise cost every pass O(depth^2).
MAX_DEPTH = 32
