"""CPU sets and NUMA node sets: immutable id sets with the kernel's text formats.

Pure values, no I/O. Two formats are understood:

* the list format of ``cpulist``, ``cpuset.cpus``, ``online``: ``0-3,8,10-11``
  (empty string for the empty set);
* the hex mask format of ``cpumap``/``thread_siblings``: comma-separated
  32-bit words, most significant first, e.g. ``00000000,0000ffff``.

``CPUSet`` and ``NodeSet`` are distinct types: mixing them in set algebra raises
``TypeError`` and they never compare equal, so a CPU set is never taken for a
node set.
The set is held as an integer bit mask, which keeps the algebra fast at the
1024-CPU scale the allocator works at.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Self

_MAX_ID = 1 << 20  # far above any kernel's NR_CPUS (8192) or MAX_NUMNODES (1024)


class _IdSet:
    """An immutable set of non-negative ids, stored as a bit mask."""

    __slots__ = ("_bits",)
    _bits: int

    def __init__(self, ids: Iterable[int] = ()) -> None:
        bits = 0
        for i in ids:
            if i < 0 or i >= _MAX_ID:
                raise ValueError(f"id {i} is out of range 0..{_MAX_ID - 1}")
            bits |= 1 << i
        object.__setattr__(self, "_bits", bits)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __reduce__(self) -> tuple[Callable[[int], Self], tuple[int]]:
        # The default reduction restores the slot through __setattr__, which is
        # blocked, so copy, deepcopy (dataclasses.asdict) and pickle would fail.
        return (type(self).from_bits, (self._bits,))

    @classmethod
    def from_bits(cls, bits: int) -> Self:
        if bits < 0:
            raise ValueError("a bit mask cannot be negative")
        if bits.bit_length() > _MAX_ID:
            raise ValueError(f"a bit mask cannot name ids beyond {_MAX_ID - 1}")
        new = cls.__new__(cls)
        object.__setattr__(new, "_bits", bits)
        return new

    @classmethod
    def parse_list(cls, text: str) -> Self:
        """Parse the kernel list format; raises ValueError naming the bad part."""
        bits = 0
        body = text.strip()
        if not body:
            return cls.from_bits(0)
        for part in body.split(","):
            lo_text, sep, hi_text = part.strip().partition("-")
            lo = _parse_id(lo_text, text)
            hi = _parse_id(hi_text, text) if sep else lo
            if hi < lo:
                raise ValueError(f"range {part.strip()!r} is reversed in {text!r}")
            bits |= ((1 << (hi - lo + 1)) - 1) << lo
        return cls.from_bits(bits)

    @classmethod
    def parse_mask(cls, text: str) -> Self:
        """Parse the hex mask format (``0000ffff,ffffffff``)."""
        body = text.strip()
        if not body:
            raise ValueError("empty mask")
        bits = 0
        for raw_word in body.split(","):
            word = raw_word.strip()
            if not word or len(word) > 8 or any(c not in _HEX for c in word):
                raise ValueError(f"bad mask word {word!r} in {text!r}")
            bits = (bits << 32) | int(word, 16)
        if bits.bit_length() > _MAX_ID:
            raise ValueError(f"mask {text!r} names ids beyond {_MAX_ID - 1}")
        return cls.from_bits(bits)

    @property
    def bits(self) -> int:
        return self._bits

    def format_list(self) -> str:
        """The kernel list format, ranges merged: ``0-3,8``."""
        parts: list[str] = []
        lo = hi = -2
        for i in self:
            if i == hi + 1:
                hi = i
                continue
            if hi >= 0:
                parts.append(str(lo) if lo == hi else f"{lo}-{hi}")
            lo = hi = i
        if hi >= 0:
            parts.append(str(lo) if lo == hi else f"{lo}-{hi}")
        return ",".join(parts)

    def format_mask(self) -> str:
        """The hex mask format, 32-bit words, most significant first."""
        words: list[str] = []
        bits = self._bits
        while True:
            words.append(f"{bits & 0xFFFFFFFF:08x}")
            bits >>= 32
            if not bits:
                break
        return ",".join(reversed(words))

    def __iter__(self) -> Iterator[int]:
        bits = self._bits
        if bits.bit_length() <= 256:
            while bits:
                low = bits & -bits
                yield low.bit_length() - 1
                bits ^= low
            return
        # Large masks: scan the bytes once (bit tricks on a huge int are quadratic).
        data = bits.to_bytes((bits.bit_length() + 7) // 8, "little")
        for index, byte in enumerate(data):
            rest = byte
            while rest:
                low = rest & -rest
                yield index * 8 + low.bit_length() - 1
                rest ^= low

    def sorted(self) -> tuple[int, ...]:
        return tuple(self)

    def __len__(self) -> int:
        return self._bits.bit_count()

    def __bool__(self) -> bool:
        return self._bits != 0

    def __contains__(self, item: object) -> bool:
        return isinstance(item, int) and item >= 0 and bool(self._bits >> item & 1)

    def _check(self, other: object) -> int:
        if type(other) is not type(self):
            raise TypeError(f"cannot combine {type(self).__name__} with {type(other).__name__}")
        assert isinstance(other, _IdSet)
        return other._bits

    def __or__(self, other: Self) -> Self:
        return self.from_bits(self._bits | self._check(other))

    def __and__(self, other: Self) -> Self:
        return self.from_bits(self._bits & self._check(other))

    def __sub__(self, other: Self) -> Self:
        return self.from_bits(self._bits & ~self._check(other))

    def __xor__(self, other: Self) -> Self:
        return self.from_bits(self._bits ^ self._check(other))

    def issubset(self, other: Self) -> bool:
        return self._bits & ~self._check(other) == 0

    def issuperset(self, other: Self) -> bool:
        return self._check(other) & ~self._bits == 0

    def isdisjoint(self, other: Self) -> bool:
        return self._bits & self._check(other) == 0

    def min(self) -> int:
        if not self._bits:
            raise ValueError(f"min() of an empty {type(self).__name__}")
        return (self._bits & -self._bits).bit_length() - 1

    def max(self) -> int:
        if not self._bits:
            raise ValueError(f"max() of an empty {type(self).__name__}")
        return self._bits.bit_length() - 1

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, _IdSet)
        return self._bits == other._bits

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._bits))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.format_list()!r})"

    def __str__(self) -> str:
        return self.format_list()


_HEX = frozenset("0123456789abcdefABCDEF")


def digits(text: str) -> bool:
    """Whether ``text`` is a decimal number in ASCII digits: ``str.isdigit`` alone also
    takes "¹" or "٣", which ``int`` refuses or reads as a number no kernel wrote."""
    return text.isascii() and text.isdigit()


def _parse_id(text: str, whole: str) -> int:
    text = text.strip()
    if not digits(text):
        raise ValueError(f"{text!r} is not an id in {whole!r}")
    value = int(text)
    if value >= _MAX_ID:
        raise ValueError(f"id {value} is out of range in {whole!r}")
    return value


class CPUSet(_IdSet):
    """A set of logical CPU ids (the kernel's OS indexes)."""

    __slots__ = ()


class NodeSet(_IdSet):
    """A set of NUMA node ids."""

    __slots__ = ()
