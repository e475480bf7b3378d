"""CPUSet and NodeSet: the kernel's list and mask formats, set algebra, type safety."""

from __future__ import annotations

import copy
import operator
import pickle
import re
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from numad.cpuset import CPUSet, NodeSet

MAX_ID = (1 << 20) - 1  # the largest id cpuset accepts (its _MAX_ID - 1)

Kind = type[CPUSet] | type[NodeSet]
KINDS = [pytest.param(CPUSet, id="cpuset"), pytest.param(NodeSet, id="nodeset")]

# Small ids most of the time so that ranges and shared members are common; now
# and then ids a few 32-bit words up, so that masks span several words.
ids = st.one_of(st.integers(0, 70), st.integers(0, 2047))
id_sets = st.frozensets(ids, max_size=40)


# -- list format -----------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("", (), id="empty"),
        pytest.param("\n", (), id="empty-newline"),
        pytest.param("  \t ", (), id="only-whitespace"),
        pytest.param("0", (0,), id="single-zero"),
        pytest.param("7\n", (7,), id="single-trailing-newline"),
        pytest.param("0-3", (0, 1, 2, 3), id="range"),
        pytest.param("5-5", (5,), id="range-of-one"),
        pytest.param("0-3,8,10-11", (0, 1, 2, 3, 8, 10, 11), id="kernel-example"),
        pytest.param("10-11,8,0-3", (0, 1, 2, 3, 8, 10, 11), id="unsorted"),
        pytest.param("0-5,2-3,4-7", tuple(range(8)), id="overlapping"),
        pytest.param("3,3,3", (3,), id="duplicates"),
        pytest.param("0-3,4-7", tuple(range(8)), id="adjacent-ranges"),
        pytest.param(" 0-3 , 8 \n", (0, 1, 2, 3, 8), id="whitespace-around-parts"),
        pytest.param("0-1023", tuple(range(1024)), id="1024-cpus"),
        pytest.param("31-32,63-64", (31, 32, 63, 64), id="across-word-boundaries"),
        pytest.param(str(MAX_ID), (MAX_ID,), id="largest-id"),
    ],
)
def test_parse_list(kind: Kind, text: str, expected: tuple[int, ...]) -> None:
    parsed = kind.parse_list(text)
    assert type(parsed) is kind
    assert parsed.sorted() == expected
    assert parsed == kind(expected)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("3-1", "reversed", id="reversed-range"),
        pytest.param("abc", "not an id", id="garbage"),
        pytest.param("-1", "not an id", id="negative"),
        pytest.param("1--3", "not an id", id="negative-range-end"),
        pytest.param("1-", "not an id", id="open-range"),
        pytest.param("-", "not an id", id="lone-dash"),
        pytest.param("1-2-3", "not an id", id="double-range"),
        pytest.param("1,,2", "not an id", id="empty-part"),
        pytest.param("0-3,", "not an id", id="trailing-comma"),
        pytest.param(",0", "not an id", id="leading-comma"),
        pytest.param("1 2", "not an id", id="space-inside-id"),
        pytest.param("0x3", "not an id", id="hex"),
        pytest.param("1.5", "not an id", id="decimal-point"),
        pytest.param("+1", "not an id", id="plus-sign"),
        pytest.param("1_0", "not an id", id="underscore"),
        pytest.param("\u00b2", "not an id", id="superscript-digit"),
        pytest.param("\u0663", "not an id", id="arabic-indic-digit"),
        pytest.param("0-7:2/4", "not an id", id="stride-syntax"),
        pytest.param(str(MAX_ID + 1), "out of range", id="huge-id"),
        pytest.param(f"0-{MAX_ID + 1}", "out of range", id="huge-range-end"),
        pytest.param("9" * 30, "out of range", id="enormous-id"),
    ],
)
def test_parse_list_rejects(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CPUSet.parse_list(text)


@pytest.mark.parametrize(
    ("members", "expected"),
    [
        pytest.param((), "", id="empty"),
        pytest.param((0,), "0", id="single"),
        pytest.param((0, 1), "0-1", id="pair-is-a-range"),
        pytest.param((0, 1, 2, 3, 8, 10, 11), "0-3,8,10-11", id="kernel-example"),
        pytest.param((1, 3, 5), "1,3,5", id="no-runs"),
        pytest.param((0, 31, 32, 63, 64), "0,31-32,63-64", id="across-word-boundaries"),
        pytest.param(tuple(range(1024)), "0-1023", id="1024-cpus"),
        pytest.param((MAX_ID,), str(MAX_ID), id="largest-id"),
    ],
)
def test_format_list(members: tuple[int, ...], expected: str) -> None:
    assert CPUSet(members).format_list() == expected
    assert str(CPUSet(members)) == expected


# -- mask format -----------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("0", (), id="zero-short"),
        pytest.param("00000000", (), id="zero-word"),
        pytest.param("00000001", (0,), id="bit-0"),
        pytest.param("80000000", (31,), id="bit-31"),
        pytest.param("0000ffff", tuple(range(16)), id="low-16"),
        pytest.param("00000001,00000000", (32,), id="bit-32"),
        pytest.param("00000000,0000ffff", tuple(range(16)), id="leading-zero-word"),
        pytest.param("00000000,00000000,00000001", (0,), id="two-leading-zero-words"),
        pytest.param("ffffffff,ffffffff", tuple(range(64)), id="two-full-words"),
        pytest.param("0000000f,00000000,00000003", (0, 1, 64, 65, 66, 67), id="three-words-gap"),
        pytest.param("FF", tuple(range(8)), id="upper-case"),
        pytest.param("000000ff\n", tuple(range(8)), id="trailing-newline"),
        pytest.param(" 3 , 1 ", (0, 32, 33), id="whitespace-around-words"),
        pytest.param("1,0", (32,), id="short-words-are-whole-words"),
        pytest.param("80000000" + ",00000000" * 32767, (MAX_ID,), id="largest-id"),
    ],
)
def test_parse_mask(kind: Kind, text: str, expected: tuple[int, ...]) -> None:
    parsed = kind.parse_mask(text)
    assert type(parsed) is kind
    assert parsed.sorted() == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("", "empty mask", id="empty"),
        pytest.param("\n", "empty mask", id="only-newline"),
        pytest.param(",", "bad mask word", id="lone-comma"),
        pytest.param("ff,", "bad mask word", id="trailing-comma"),
        pytest.param(",ff", "bad mask word", id="leading-comma"),
        pytest.param("123456789", "bad mask word", id="nine-digit-word"),
        pytest.param("0x1", "bad mask word", id="hex-prefix"),
        pytest.param("fg", "bad mask word", id="not-hex"),
        pytest.param("-1", "bad mask word", id="negative"),
        pytest.param("ff ff", "bad mask word", id="space-inside-word"),
        pytest.param("ff;00", "bad mask word", id="wrong-separator"),
        pytest.param("\u0661", "bad mask word", id="non-ascii-digit"),
        pytest.param("1" + ",00000000" * 32768, "beyond", id="id-past-limit"),
    ],
)
def test_parse_mask_rejects(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CPUSet.parse_mask(text)


@pytest.mark.parametrize(
    ("members", "expected"),
    [
        pytest.param((), "00000000", id="empty-is-one-zero-word"),
        pytest.param((0,), "00000001", id="bit-0"),
        pytest.param((31,), "80000000", id="bit-31"),
        pytest.param(tuple(range(16)), "0000ffff", id="low-16"),
        pytest.param((32,), "00000001,00000000", id="bit-32"),
        pytest.param((0, 63), "80000000,00000001", id="two-words"),
        pytest.param((64,), "00000001,00000000,00000000", id="three-words"),
        pytest.param(tuple(range(8, 16)), "0000ff00", id="lower-case-hex"),
    ],
)
def test_format_mask(members: tuple[int, ...], expected: str) -> None:
    assert CPUSet(members).format_mask() == expected


# -- construction ----------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "message"),
    [
        pytest.param(lambda: CPUSet([-1]), "out of range", id="negative-id"),
        pytest.param(lambda: CPUSet([MAX_ID + 1]), "out of range", id="id-past-limit"),
        pytest.param(lambda: NodeSet([0, -5]), "out of range", id="negative-node"),
        pytest.param(lambda: CPUSet.from_bits(-1), "negative", id="negative-mask"),
        pytest.param(lambda: CPUSet.from_bits(1 << (MAX_ID + 1)), "beyond", id="mask-past-limit"),
    ],
)
def test_construction_rejects(build: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()


def test_largest_id_is_accepted_everywhere() -> None:
    top = CPUSet([MAX_ID])
    assert CPUSet.from_bits(1 << MAX_ID) == top
    assert CPUSet.parse_list(top.format_list()) == top
    assert top.max() == MAX_ID


@pytest.mark.parametrize("kind", KINDS)
def test_empty_set(kind: Kind) -> None:
    empty = kind()
    assert not empty
    assert len(empty) == 0
    assert empty.sorted() == ()
    assert empty.bits == 0
    assert repr(empty) == f"{kind.__name__}('')"
    with pytest.raises(ValueError, match="min"):
        empty.min()
    with pytest.raises(ValueError, match="max"):
        empty.max()


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        pytest.param(3, True, id="member"),
        pytest.param(4, False, id="non-member"),
        pytest.param(-1, False, id="negative"),
        pytest.param(10**30, False, id="huge"),
        pytest.param("3", False, id="string"),
        pytest.param(None, False, id="none"),
    ],
)
def test_contains(item: object, expected: bool) -> None:
    assert (item in CPUSet([1, 3])) is expected


def test_repr_names_the_type() -> None:
    assert repr(CPUSet([0, 1, 2, 5])) == "CPUSet('0-2,5')"
    assert repr(NodeSet([1])) == "NodeSet('1')"


# -- CPU sets and node sets do not mix -------------------------------------

BINARY_OPS = [
    pytest.param(operator.or_, id="or"),
    pytest.param(operator.and_, id="and"),
    pytest.param(operator.sub, id="sub"),
    pytest.param(operator.xor, id="xor"),
    pytest.param(lambda a, b: a.issubset(b), id="issubset"),
    pytest.param(lambda a, b: a.issuperset(b), id="issuperset"),
    pytest.param(lambda a, b: a.isdisjoint(b), id="isdisjoint"),
]


@pytest.mark.parametrize("op", BINARY_OPS)
@pytest.mark.parametrize(
    ("left", "right"),
    [
        pytest.param(CPUSet([0, 1]), NodeSet([0, 1]), id="cpus-with-nodes"),
        pytest.param(NodeSet([0]), CPUSet([0]), id="nodes-with-cpus"),
        pytest.param(CPUSet(), NodeSet(), id="both-empty"),
        pytest.param(CPUSet([0]), frozenset({0}), id="cpus-with-frozenset"),
        pytest.param(NodeSet([0]), 1, id="nodes-with-int"),
    ],
)
def test_mixing_kinds_raises(
    op: Callable[[object, object], object], left: object, right: object
) -> None:
    with pytest.raises(TypeError, match="cannot combine"):
        op(left, right)


@pytest.mark.parametrize(
    ("left", "right"),
    [
        pytest.param(CPUSet([0, 1]), NodeSet([0, 1]), id="same-ids"),
        pytest.param(CPUSet(), NodeSet(), id="both-empty"),
        pytest.param(CPUSet([0]), frozenset({0}), id="frozenset"),
        pytest.param(CPUSet([0]), "0", id="list-text"),
        pytest.param(NodeSet([0]), 1, id="bit-mask-int"),
    ],
)
def test_never_equal_across_kinds(left: object, right: object) -> None:
    assert left != right
    assert right != left
    assert not left == right  # noqa: SIM201 -- __eq__ itself is under test, not __ne__


def test_both_kinds_can_share_a_dict() -> None:
    table: dict[object, str] = {CPUSet([0]): "cpu", NodeSet([0]): "node"}
    assert len(table) == 2
    assert table[CPUSet([0])] == "cpu"
    assert table[NodeSet([0])] == "node"


# -- immutability ----------------------------------------------------------


@pytest.mark.parametrize(
    "mutate",
    [
        pytest.param(lambda s: setattr(s, "_bits", 0), id="set-mask"),
        pytest.param(lambda s: setattr(s, "extra", 1), id="add-attribute"),
        pytest.param(lambda s: delattr(s, "_bits"), id="delete-mask"),
    ],
)
def test_cannot_be_mutated(mutate: Callable[[CPUSet], None]) -> None:
    s = CPUSet([1, 2])
    with pytest.raises(AttributeError):
        mutate(s)
    assert s.sorted() == (1, 2)
    assert not hasattr(s, "__dict__")


def test_in_place_operators_rebind_and_leave_the_original() -> None:
    original = CPUSet([1, 2])
    alias = original
    alias |= CPUSet([3])
    alias -= CPUSet([1])
    assert original.sorted() == (1, 2)
    assert alias.sorted() == (2, 3)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "duplicate",
    [
        pytest.param(copy.copy, id="copy"),
        pytest.param(copy.deepcopy, id="deepcopy"),
        pytest.param(lambda s: pickle.loads(pickle.dumps(s)), id="pickle"),  # noqa: S301 -- own data
    ],
)
def test_copies_keep_kind_and_members(kind: Kind, duplicate: Callable[[object], object]) -> None:
    original = kind([0, 5, 6, 7, 100])
    twin = duplicate(original)
    assert type(twin) is kind
    assert twin == original
    assert hash(twin) == hash(original)


# -- properties ------------------------------------------------------------

_LIST_FORMAT = re.compile(r"(\d+(-\d+)?(,\d+(-\d+)?)*)?")


@given(id_sets)
def test_list_round_trip(members: frozenset[int]) -> None:
    text = CPUSet(members).format_list()
    assert _LIST_FORMAT.fullmatch(text)
    assert CPUSet.parse_list(text) == CPUSet(members)
    assert NodeSet.parse_list(text).sorted() == tuple(sorted(members))


@given(id_sets)
def test_list_format_is_canonical(members: frozenset[int]) -> None:
    """Ranges are ascending, maximal (never adjacent) and written ``a-b`` only when a < b."""
    text = CPUSet(members).format_list()
    previous_hi = -2
    for part in text.split(",") if text else []:
        lo_text, _, hi_text = part.partition("-")
        lo, hi = int(lo_text), int(hi_text or lo_text)
        assert lo > previous_hi + 1
        assert (lo < hi) == bool(hi_text)
        previous_hi = hi


@given(
    st.lists(st.tuples(ids, st.integers(0, 9)), max_size=12),
    st.sampled_from(["", " ", "\t"]),
    st.sampled_from(["", "\n", " \n"]),
)
def test_parse_list_is_union_of_parts(ranges: list[tuple[int, int]], pad: str, end: str) -> None:
    """Unsorted, overlapping, padded parts parse to the union of their ids."""
    parts = [f"{pad}{lo}{pad}" if width == 0 else f"{pad}{lo}-{lo + width}" for lo, width in ranges]
    expected = {i for lo, width in ranges for i in range(lo, lo + width + 1)}
    assert CPUSet.parse_list(",".join(parts) + end).sorted() == tuple(sorted(expected))


@given(id_sets)
def test_mask_round_trip(members: frozenset[int]) -> None:
    text = CPUSet(members).format_mask()
    words = text.split(",")
    assert all(re.fullmatch(r"[0-9a-f]{8}", w) for w in words)
    # As few words as hold the highest id; the empty set is one zero word.
    assert len(words) == max(members, default=0) // 32 + 1
    assert CPUSet.parse_mask(text) == CPUSet(members)
    assert CPUSet.parse_mask("00000000," + text) == CPUSet(members)


@given(id_sets)
def test_mask_agrees_with_bits(members: frozenset[int]) -> None:
    s = NodeSet(members)
    assert s.bits == sum(1 << i for i in members)
    assert NodeSet.from_bits(s.bits) == s
    assert int(s.format_mask().replace(",", ""), 16) == s.bits


@given(id_sets)
def test_behaves_like_frozenset(members: frozenset[int]) -> None:
    s = CPUSet(members)
    assert len(s) == len(members)
    assert bool(s) == bool(members)
    assert list(s) == sorted(members)
    assert s.sorted() == tuple(sorted(members))
    assert all(i in s for i in members)
    assert all((i in s) == (i in members) for i in range(72))
    if members:
        assert s.min() == min(members)
        assert s.max() == max(members)


ALGEBRA = [
    pytest.param(operator.or_, id="union"),
    pytest.param(operator.and_, id="intersection"),
    pytest.param(operator.sub, id="difference"),
    pytest.param(operator.xor, id="symmetric-difference"),
]


@pytest.mark.parametrize("op", ALGEBRA)
@given(a=id_sets, b=id_sets)
def test_algebra_agrees_with_frozenset(
    op: Callable[[object, object], object], a: frozenset[int], b: frozenset[int]
) -> None:
    result = op(CPUSet(a), CPUSet(b))
    expected = op(a, b)
    assert isinstance(expected, frozenset)
    assert type(result) is CPUSet
    assert result == CPUSet(expected)
    node_result = op(NodeSet(a), NodeSet(b))
    assert type(node_result) is NodeSet


@given(a=id_sets, b=id_sets)
def test_relations_agree_with_frozenset(a: frozenset[int], b: frozenset[int]) -> None:
    x, y = CPUSet(a), CPUSet(b)
    assert x.issubset(y) == a.issubset(b)
    assert x.issuperset(y) == a.issuperset(b)
    assert x.isdisjoint(y) == a.isdisjoint(b)
    assert (x == y) == (a == b)
    if a == b:
        assert hash(x) == hash(y)


@given(a=id_sets, b=id_sets)
def test_operands_are_unchanged(a: frozenset[int], b: frozenset[int]) -> None:
    x, y = CPUSet(a), CPUSet(b)
    _ = (x | y, x & y, x - y, x ^ y)
    assert x.sorted() == tuple(sorted(a))
    assert y.sorted() == tuple(sorted(b))
