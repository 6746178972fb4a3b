"""Java String.hashCode, one string at a time and in batches."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker_runtime.common import java_hash
from broker_runtime.common.java_hash import java_hash_many, java_string_hash, tags_code

# Printed by OpenJDK's String.hashCode for these strings.
JAVA_VALUES = {
    "": 0,
    "a": 97,
    "hello": 99162322,
    "Aa": 2112,
    "BB": 2112,
    "hello world": 1794106052,
    "polygenelubricants": -2147483648,
    "TopicTest#key": 85128477,
    "TopicTest#ORDER_1": -1111208162,
    "été": 227742,
    "中文": 646394,
    "😀": 1772899,  # surrogate pair D83D DE00
    "TopicTest#7F00000100012A9F5E0B1C2D3E4F": 1476677561,
}


def _by_formula(s: str) -> int:
    """s[0]*31^(n-1) + ... + s[n-1] over UTF-16 units, as a signed 32-bit int."""
    data = s.encode("utf-16-be")
    units = [int.from_bytes(data[i : i + 2], "big") for i in range(0, len(data), 2)]
    n = len(units)
    h: int = sum(u * 31 ** (n - 1 - i) for i, u in enumerate(units)) % (1 << 32)
    return h - (1 << 32) if h >= 1 << 31 else h


@pytest.mark.parametrize(("s", "expected"), JAVA_VALUES.items())
def test_known_java_values(s: str, expected: int) -> None:
    assert java_string_hash(s) == expected
    assert _by_formula(s) == expected


def test_batch_matches_known_values_in_numpy_path() -> None:
    strings = list(JAVA_VALUES) * 3  # more than the small-batch cut-off
    assert java_hash_many(strings) == [JAVA_VALUES[s] for s in strings]


def test_batch_edge_cases() -> None:
    assert java_hash_many([]) == []
    strings = ["", "", "a\0", "a\0\0", "\0", "a", *["x"] * 10]
    assert java_hash_many(strings) == [java_string_hash(s) for s in strings]
    assert java_string_hash("a\0") == 97 * 31  # trailing NULs count, unlike numpy's padding


def test_uneven_lengths_and_long_strings(monkeypatch: pytest.MonkeyPatch) -> None:
    strings = [f"k{i}" for i in range(600)] + ["L" * 5000, "é" * 3000 + "😀"]
    expected = [java_string_hash(s) for s in strings]
    assert java_hash_many(strings) == expected
    monkeypatch.setattr(java_hash, "_MAX_CELLS", 64)  # forces per-block and per-string paths
    assert java_hash_many(strings) == expected


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=40), max_size=80))
def test_batch_equals_single(strings: list[str]) -> None:
    assert java_hash_many(strings) == [java_string_hash(s) for s in strings]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(alphabet=st.characters(codec="ascii"), max_size=30), min_size=8))
def test_ascii_batch_equals_formula(strings: list[str]) -> None:
    assert java_hash_many(strings) == [_by_formula(s) for s in strings]


def test_tags_code_unchanged() -> None:
    assert tags_code(None) == 0
    assert tags_code("") == 0
    assert tags_code("TagA") == java_string_hash("TagA")
