"""SQL92 subscriptions: the behaviours RocketMQ's filter was seen to have (each row below was
answered the same way by RocketMQ 4.9.7's or 5.3.3's own filter; tests/interop/
test_sql_filter.py holds the two to each other over thousands of generated cases)."""

from __future__ import annotations

import re

import pytest

from broker_runtime.common.java_values import JavaError, java_double, java_int, java_long
from broker_runtime.common.sql_filter import SqlFilterError, compile_sql


@pytest.mark.parametrize(
    ("expr", "props", "matches"),
    [
        ("a > 5", {"a": "10"}, True),  # a property is converted to the literal's type
        ("a between 0 and 3", {"a": "2"}, True),
        ("a = 10", {"a": "10"}, True),
        ("a > 5", {"a": "5.5"}, False),  # Integer.valueOf("5.5") fails: no match
        ("a > 5.0", {"a": "5.5"}, True),
        ("a > 5", {"a": "3000000000"}, False),  # 5 is an Integer; the value is no int
        ("a = 3000000000", {"a": "3000000000"}, True),  # a Long literal
        ("a > b", {"a": "10", "b": "9"}, True),  # two strings compare as doubles
        ("a >= 5", {"a": " 7"}, False),  # Integer.valueOf does not trim
        ("a >= 5.0", {"a": " 7"}, True),  # Double.valueOf does
        ("a > 1.5", {"a": "NaN"}, True),  # Double.compare puts NaN above all
        ("a", {"a": "true"}, False),  # a property is a string, never TRUE
        ("a = TRUE", {"a": "TRUE"}, True),
        ("TRUE = a", {"a": "true"}, False),  # Boolean vs String: Java throws
        ("a = b", {}, True),  # both absent: equal
        ("a <> 5", {}, False),  # null
        ("b is null", {"a": "1"}, True),
        ("not (b = 1 and a = 1)", {"a": "2"}, True),  # null AND FALSE is FALSE
        ("not (b = 1 or a = 2)", {"a": "2"}, False),
        ("a = 1 or b > 1", {"a": "1", "b": "x"}, True),  # OR stops at TRUE
        ("b > 1 or a = 1", {"a": "1", "b": "x"}, False),  # the failed conversion comes first
        ("a not in ('x')", {}, False),
        ("a not in ('x')", {"a": "y"}, True),
        ("a = 'it''s'", {"a": "it's"}, True),
        ("-a = -5", {"a": "5"}, False),  # a string does not negate
        ("TAGS in ('TagA', 'TagB') and n between 1 and 3", {"TAGS": "TagB", "n": "3"}, True),
        ("a contains 'x'", {"a": "axb"}, True),
        ("a contains ''", {"a": "1"}, False),  # an empty search never matches
        ("a not contains 'x'", {}, False),  # nor does an absent property, either way
        ("a not startswith 'x'", {"a": "1"}, True),
        ("a endswith 'b'", {"a": "ab"}, True),
        ("A = 1", {"a": "1"}, False),  # property names are case-sensitive
        ("a = 1 AnD b = 2 oR c = 3", {"c": "3"}, True),  # keywords are not
    ],
)
def test_matches_as_rocketmq(expr: str, props: dict[str, str], matches: bool) -> None:
    assert compile_sql(expr).matches(props) is matches


@pytest.mark.parametrize(
    ("expr", "message", "column"),
    [
        ("a >> 5", "unexpected '>'", 4),
        ("a = 1 )))", "unexpected ')'", 7),  # RocketMQ ignores the rest; refused here
        ("a in (1, 2)", "unexpected '1'", 7),  # IN takes strings only
        ("not a > 5", "Value 'NOT a' cannot be compared", 1),  # NOT binds tighter
        ("5", "will not result in a boolean value", 1),
        ("a between 5 and 1", "Illegal values of between", 1),
        ("a = NULL", "'NULL' cannot be compared", 1),
        ("a = 99999999999999999999", "NumberFormatException", 5),
        ("a > 0.0", "0.0 is less than 4.9E-324", 5),  # RocketMQ refuses a zero double
        ("'x' in ('x')", "Expected a property for In expression", 1),
        ("TRUE = 5", "'TRUE' cannot be compared with '5'", 1),
        ("a = 'x' and\n b >", "unexpected 'end of input'", 5),
        ("(a = 1", "unexpected 'end of input'", 7),
    ],
)
def test_refuses_what_rocketmq_refuses_and_says_where(expr: str, message: str, column: int) -> None:
    with pytest.raises(SqlFilterError, match=re.escape(message)) as err:
        compile_sql(expr)
    assert err.value.column == column


def test_an_error_on_a_later_line_is_placed_on_it() -> None:
    with pytest.raises(SqlFilterError) as err:
        compile_sql("a = 1\nand b >> 2")
    assert (err.value.line, err.value.column) == (2, 8)


def test_java_number_parsing() -> None:
    assert java_int("+5") == 5 and java_int("-2147483648") == -(1 << 31)
    assert java_long("9223372036854775807") == (1 << 63) - 1
    assert java_int("\u0663") == 3  # Character.digit takes any script's digits
    assert java_double(" 7 ") == 7.0 and java_double("1d") == 1.0 and java_double("0x1p3") == 8
    assert java_double("-Infinity") == float("-inf")
    for bad in ("2147483648", " 7", "1_000", "", "+", "0x10"):
        with pytest.raises(JavaError):
            java_int(bad)
    for bad in ("1_000", "inf", "Infinityd", "1e", "abc"):
        with pytest.raises(JavaError):
            java_double(bad)
