"""mqaudit's SQL92 filter held to Apache RocketMQ's own: thousands of generated expressions
and property sets, each compiled and evaluated by both, must get the same answers (accepted
or refused; matching or not). RocketMQ 4.9's filter judges the grammar they share, RocketMQ
5's the string tests it added (CONTAINS, STARTSWITH, ENDSWITH)."""

from __future__ import annotations

import json
import random
import subprocess
from typing import Any

import pytest

from broker_runtime.common.sql_filter import SqlFilterError, compile_sql
from tests.interop.rocketmq import TARGET, classpath, java_argv

pytestmark = [pytest.mark.integration, pytest.mark.interop]

NAMES = ("a", "b", "c", "TAGS")
VALUES = (
    "1", "5", "-5", "+5", " 7", "7 ", "5.5", ".5", "1e3", "1E3", "1d", "1f", "0x1p3", "NaN",
    "Infinity", "-Infinity", "-0", "0.0", "-0.0", "true", "TRUE", "false", "yes", "abc", "",
    "x", "xy", "yx", "it's", "3000000000", "2147483647", "2147483648", "-2147483648",
    "9223372036854775807", "9223372036854775808", "10L", "\u0663", "TagA", "TagB",
)  # fmt: skip
NUMBERS = ("0", "1", "5", "7", "10L", "2147483647", "2147483648", "3000000000", "1.5", ".5",
           "5E3", "5.", "0.0")  # fmt: skip
STRINGS = ("'x'", "'1'", "'5'", "'abc'", "'it''s'", "''", "'TagA'", "'true'", "'5.5'")


class Generator:
    """Random well-formed expressions over RocketMQ's grammar (no trailing garbage, where
    the two parsers deliberately differ)."""

    def __init__(self, seed: int, string_tests: bool) -> None:
        self.rng = random.Random(seed)
        self.string_tests = string_tests

    def operand(self, depth: int) -> str:
        r = self.rng.random()
        if r < 0.45:
            return self.rng.choice(NAMES)
        if r < 0.7:
            return self.rng.choice(NUMBERS)
        if r < 0.82:
            return self.rng.choice(STRINGS)
        if r < 0.88:
            return self.rng.choice(("TRUE", "FALSE", "NULL"))
        if r < 0.95 and depth > 0:
            return self.rng.choice(("-", "+", "- ")) + self.operand(depth - 1)
        return f"({self.boolean(depth - 1)})" if depth > 0 else self.rng.choice(NAMES)

    def boolean(self, depth: int) -> str:
        rng, op = self.rng, self.operand
        kinds = ["cmp", "eq", "null", "in", "between", "name", "const"]
        if depth > 0:
            kinds += ["and", "or", "not", "paren", "and", "or"]
        if self.string_tests:
            kinds += ["str", "str"]
        kind = rng.choice(kinds)
        if kind == "cmp":
            return f"{op(depth)} {rng.choice(('>', '>=', '<', '<='))} {op(depth)}"
        if kind == "eq":
            return f"{op(depth)} {rng.choice(('=', '<>'))} {op(depth)}"
        if kind == "null":
            return f"{op(depth)} IS {rng.choice(('', 'NOT '))}NULL"
        if kind == "in":
            items = ", ".join(rng.choice(STRINGS) for _ in range(rng.randint(1, 3)))
            return f"{op(depth)} {rng.choice(('', 'NOT '))}IN ({items})"
        if kind == "between":
            return f"{op(depth)} {rng.choice(('', 'NOT '))}BETWEEN {op(depth)} AND {op(depth)}"
        if kind == "name":
            return rng.choice(NAMES)
        if kind == "const":
            return rng.choice(("TRUE", "FALSE", "NULL"))
        if kind == "str":
            test = rng.choice(("CONTAINS", "STARTSWITH", "ENDSWITH"))
            return f"{op(depth)} {rng.choice(('', 'NOT '))}{test} {rng.choice(STRINGS)}"
        if kind == "not":
            return f"NOT {rng.choice((op(depth - 1), '(' + self.boolean(depth - 1) + ')'))}"
        if kind == "paren":
            return f"({self.boolean(depth - 1)})"
        word = kind.upper() if rng.random() < 0.7 else kind
        return f"{self.boolean(depth - 1)} {word} {self.boolean(depth - 1)}"

    def properties(self) -> dict[str, str]:
        return {n: self.rng.choice(VALUES) for n in NAMES if self.rng.random() < 0.7}


def referee(queries: list[dict[str, Any]], *, rocketmq5: bool) -> list[dict[str, Any]]:
    """RocketMQ's answers, from one JVM running tests/interop's SqlReferee over `queries`."""
    argv = java_argv("SqlReferee")
    if rocketmq5:
        cp = classpath().split(":")
        swapped = [str(next((TARGET / "filter5").glob("rocketmq-filter-*.jar")))]
        cp = [swapped[0] if "rocketmq-filter-4" in p else p for p in cp]
        argv[argv.index("-cp") + 1] = ":".join(cp)
    stdin = "".join(json.dumps(q) + "\n" for q in queries)
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    answers = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(answers) == len(queries)
    return answers


def ours(expr: str, props: dict[str, str]) -> dict[str, Any]:
    try:
        compiled = compile_sql(expr)
    except SqlFilterError as exc:
        return {"compiled": False, "error": str(exc)}
    return {"compiled": True, "match": compiled.matches(props)}


@pytest.mark.parametrize(("seed", "rocketmq5"), [(1, False), (2, False), (3, True)])
def test_every_generated_expression_gets_rocketmqs_answer(
    interop_classpath: str, seed: int, rocketmq5: bool
) -> None:
    gen = Generator(seed, string_tests=rocketmq5)
    queries = [
        {"expr": gen.boolean(gen.rng.randint(0, 3)), "props": gen.properties()} for _ in range(1500)
    ]
    answers = referee(queries, rocketmq5=rocketmq5)
    wrong = []
    for q, theirs in zip(queries, answers, strict=True):
        mine = ours(q["expr"], q["props"])
        same = mine["compiled"] == theirs["compiled"] and (
            not mine["compiled"] or mine["match"] == theirs["match"]
        )
        if not same:
            wrong.append((q, mine, theirs))
    accepted = sum(a["compiled"] for a in answers)
    matched = sum(a.get("match", False) for a in answers)
    assert not wrong, f"{len(wrong)} of {len(queries)} differ, e.g. {wrong[:5]}"
    # The corpus must exercise all three outcomes, or the comparison proves little.
    assert 300 < accepted < len(queries) - 100 and matched > 100, (accepted, matched)
