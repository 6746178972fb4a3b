"""Java's value semantics where RocketMQ's behaviour depends on them: Integer and Long
parsing (`Integer.valueOf`, `Long.valueOf`), `Double.valueOf`, `Double.compare`, and the
conversions ActiveMQ's ComparisonExpression makes before comparing two values of different
types (RocketMQ's SQL92 filter compares that way). Pure functions; no I/O.

Java types are Python ones: Boolean is bool, Integer int, Long `JLong` (an int subclass),
Double float, String str.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

INT_MIN, INT_MAX = -(1 << 31), (1 << 31) - 1
LONG_MIN, LONG_MAX = -(1 << 63), (1 << 63) - 1


class JavaError(Exception):
    """Where Java would throw (NumberFormatException, ClassCastException)."""


class JLong(int):
    """A Java Long; a plain int is a Java Integer (RocketMQ narrows literals that fit)."""


_JAVA_DOUBLE = re.compile(
    r"[+-]?(NaN|Infinity|([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?[fFdD]?)"
)
_JAVA_HEX_DOUBLE = re.compile(
    r"([+-]?)0[xX](([0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)[pP][+-]?[0-9]+)[fFdD]?"
)


def _java_integral(text: str, lo: int, hi: int, wrap: Callable[[int], int]) -> int:
    """Integer.valueOf / Long.valueOf: an optional sign, then decimal digits (any script's,
    as Character.digit takes them), nothing else."""
    digits = text[1:] if text[:1] in "+-" else text
    if not digits or not all(c.isdecimal() for c in digits):
        raise JavaError(f'NumberFormatException: For input string: "{text}"')
    value = int(text)
    if not lo <= value <= hi:
        raise JavaError(f'NumberFormatException: For input string: "{text}"')
    return wrap(value)


def java_int(text: str) -> int:
    return _java_integral(text, INT_MIN, INT_MAX, int)


def java_long(text: str) -> JLong:
    return JLong(_java_integral(text, LONG_MIN, LONG_MAX, JLong))


def java_double(text: str) -> float:
    """Double.valueOf: trimmed of characters <= U+0020, then Java's floating literal forms."""
    s = text.strip("".join(chr(c) for c in range(33)))
    if _JAVA_DOUBLE.fullmatch(s):
        body = s[:-1] if s[-1] in "fFdD" else s
        return float(body.replace("Infinity", "inf").replace("NaN", "nan"))
    hexed = _JAVA_HEX_DOUBLE.fullmatch(s)
    if hexed:
        value = float.fromhex("0x" + hexed.group(2))
        return -value if hexed.group(1) == "-" else value
    raise JavaError(f'NumberFormatException: For input string: "{text}"')


def _kind(value: object) -> str:
    if isinstance(value, bool):
        return "Boolean"
    if isinstance(value, JLong):
        return "Long"
    if isinstance(value, int):
        return "Integer"
    if isinstance(value, float):
        return "Double"
    return "String"


def double_compare(a: float, b: float) -> int:
    """Double.compare: NaN above everything and equal to itself, -0.0 below 0.0."""
    if math.isnan(a) or math.isnan(b):
        return (math.isnan(a) and not math.isnan(b)) - (math.isnan(b) and not math.isnan(a))
    if a == b == 0.0:
        return (math.copysign(1, a) > 0) - (math.copysign(1, b) > 0)
    return (a > b) - (a < b)


def _convert(lv: Any, rv: Any) -> tuple[Any, Any] | None:
    """ComparisonExpression.__compare's conversions with string conversion on (RocketMQ
    always sets it); None where Java answers -1 without comparing."""
    lc, rc = _kind(lv), _kind(rv)
    if lc == rc:
        return lv, rv
    numeric = {"Integer": java_int, "Long": java_long, "Double": java_double}
    if lc == "Boolean":
        if rc == "String":  # Boolean.valueOf((String) lv) on a Boolean
            raise JavaError("ClassCastException: Boolean cannot be cast to String")
        return None
    if lc == "String":
        if rc == "Boolean":
            return lv.lower() == "true" and len(lv) == 4, rv
        return numeric[rc](lv), rv
    if rc == "String":
        return lv, numeric[lc](rv)
    if rc == "Boolean":
        return None
    if "Double" in (lc, rc):
        return float(lv), float(rv)
    return JLong(lv), JLong(rv)  # Integer against Long


def java_compare(lv: Any, rv: Any) -> int:
    """The sign of ComparisonExpression.__compare(lv, rv): converted, then compareTo."""
    pair = _convert(lv, rv)
    if pair is None:
        return -1
    a, b = pair
    if isinstance(a, float):
        return double_compare(a, b)
    if isinstance(a, str):  # String.compareTo: UTF-16 code units
        ea, eb = a.encode("utf-16-be", "surrogatepass"), b.encode("utf-16-be", "surrogatepass")
        return int(ea > eb) - int(ea < eb)
    return int(a > b) - int(a < b)
