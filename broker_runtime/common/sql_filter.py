"""SQL92 property filters (`MessageSelector.bySql`), decided as Apache RocketMQ's broker does.

The grammar is RocketMQ's SelectorParser (ActiveMQ's JMS selector without arithmetic, LIKE,
hex and octal literals) with the string tests of RocketMQ 5 (`[NOT] CONTAINS`, `STARTSWITH`,
`ENDSWITH`). It is declared for Lark (an LALR(1) parser generator kept by the lark-parser
project; chosen over pyparsing for a grammar that reads like RocketMQ's own `.jj` file and
for its exact error positions). The rest follows RocketMQ's expression classes:

- literals: `123` is a Java Integer when it fits, else a Long (`123L` likewise); `1.5`,
  `.5`, `5E3` are Doubles; `'it''s'` a String; TRUE, FALSE, NULL;
- a property is the message's property of that name (case-sensitive), always a String, or
  null when absent; comparing it with a number converts it to that number's Java type
  (`Integer.valueOf`, `Long.valueOf`, `Double.valueOf`), with a boolean `Boolean.valueOf`;
  a conversion that fails makes the whole evaluation fail;
- `>`, `>=`, `<`, `<=` take numbers or properties only (checked when compiled); two strings
  are compared as Doubles; `NOT` binds tighter than comparisons (`NOT a > 1` is refused);
- null propagates (`a = 1` is null without `a`), AND and OR are three-valued, `a = b` is
  TRUE when both are absent, IN takes string literals only and a property on its left;
- a message matches when the result is TRUE; null, FALSE or a failed evaluation do not.

Deliberate difference: RocketMQ's parser stops at the first token that cannot continue the
expression and ignores the rest (`a = 1 )))` is `a = 1`); here such an expression is refused,
with the position of that token.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedInput

from broker_runtime.common.java_values import (
    INT_MAX,
    LONG_MAX,
    JavaError,
    JLong,
    double_compare,
    java_compare,
    java_double,
)

_PARSER = Lark.open("sql92.lark", rel_to=__file__, parser="lalr", propagate_positions=True)


class SqlFilterError(ValueError):
    """An expression RocketMQ's broker would refuse, with where it went wrong."""

    def __init__(self, message: str, line: int, column: int) -> None:
        super().__init__(f"{message} (line {line}, column {column})")
        self.line = line
        self.column = column


# -- Expressions ----------------------------------------------------------------------------

Context = Mapping[str, str]
Evaluate = Callable[[Context], Any]


@dataclass(frozen=True, slots=True)
class Node:
    """A compiled expression: how to evaluate it, and what RocketMQ's checks need to know."""

    evaluate: Evaluate
    text: str
    kind: str  # "constant", "property", "boolean" (a BooleanExpression) or "value"
    value: Any = None  # a constant's value

    @property
    def boolean_constant(self) -> bool:
        return self.kind == "constant" and (self.value is None or isinstance(self.value, bool))


def _constant(value: Any, text: str) -> Node:
    return Node(lambda ctx: value, text, "constant", value)


def _as_boolean(node: Node, meta: Any) -> Node:
    """SelectorParser.asBooleanExpression: a property is cast, a non-boolean refused."""
    if node.kind == "boolean" or node.boolean_constant:
        return node
    if node.kind == "property":
        ev = node.evaluate

        def cast(ctx: Context) -> bool | None:
            value = ev(ctx)
            return None if value is None else (value if isinstance(value, bool) else False)

        return Node(cast, node.text, "boolean")
    raise SqlFilterError(
        f"Expression will not result in a boolean value: {node.text}", meta.line, meta.column
    )


def _check_comparable(node: Node, meta: Any) -> None:
    """ComparisonExpression.checkLessThanOperand: numbers and properties only."""
    numeric = isinstance(node.value, int | float) and not isinstance(node.value, bool)
    if (node.kind == "constant" and not numeric) or node.kind == "boolean":
        raise SqlFilterError(f"Value '{node.text}' cannot be compared.", meta.line, meta.column)


def _order(left: Node, right: Node, symbol: str, test: Callable[[int], bool], meta: Any) -> Node:
    _check_comparable(left, meta)
    _check_comparable(right, meta)
    lev, rev = left.evaluate, right.evaluate

    def evaluate(ctx: Context) -> bool | None:
        lv = lev(ctx)
        if lv is None:
            return None
        rv = rev(ctx)
        if rv is None:
            return None
        if isinstance(lv, str) and isinstance(rv, str):
            return test(double_compare(java_double(lv), java_double(rv)))
        return test(java_compare(lv, rv))

    return Node(evaluate, f"({left.text} {symbol} {right.text})", "boolean")


def _equal(left: Node, right: Node) -> Node:
    lev, rev = left.evaluate, right.evaluate

    def evaluate(ctx: Context) -> bool | None:
        lv, rv = lev(ctx), rev(ctx)
        if (lv is None) != (rv is None):
            return None if lv is None else False
        return lv is None or java_compare(lv, rv) == 0

    return Node(evaluate, f"({left.text} == {right.text})", "boolean")


def _checked_equal(left: Node, right: Node, meta: Any) -> Node:
    for side in (left, right):
        if side.kind == "constant" and side.value is None:
            raise SqlFilterError(f"'{side.text}' cannot be compared.", meta.line, meta.column)
    if left.kind == right.kind == "constant" and left.boolean_constant:
        if not right.boolean_constant:
            raise SqlFilterError(
                f"'{left.text}' cannot be compared with '{right.text}'", meta.line, meta.column
            )
    return _equal(left, right)


def _not(node: Node) -> Node:
    ev = node.evaluate

    def evaluate(ctx: Context) -> bool | None:
        value = ev(ctx)
        return None if value is None else not value

    return Node(evaluate, f"NOT {node.text}", "boolean")


def _logic(left: Node, right: Node, word: str, decisive: bool) -> Node:
    """AND (FALSE decides it) or OR (TRUE decides it), three-valued as RocketMQ's
    LogicExpression: the right side is not evaluated once the left one decided."""
    lev, rev = left.evaluate, right.evaluate

    def evaluate(ctx: Context) -> bool | None:
        lv: bool | None = lev(ctx)
        if lv is decisive:
            return decisive
        rv: bool | None = rev(ctx)
        if rv is decisive:
            return decisive
        return None if lv is None or rv is None else not decisive

    return Node(evaluate, f"({left.text} {word} {right.text})", "boolean")


def _and(left: Node, right: Node) -> Node:
    return _logic(left, right, "AND", False)


def _or(left: Node, right: Node) -> Node:
    return _logic(left, right, "OR", True)


def _string_test(left: Node, search: str, name: str, negate: bool) -> Node:
    """RocketMQ 5's [NOT] CONTAINS / STARTSWITH / ENDSWITH: FALSE for an empty search, an
    absent property or a non-string, in both forms."""
    ev = left.evaluate
    test: Callable[[str], bool] = {
        "CONTAINS": lambda v: search in v,
        "STARTSWITH": lambda v: v.startswith(search),
        "ENDSWITH": lambda v: v.endswith(search),
    }[name]

    def evaluate(ctx: Context) -> bool:
        value = ev(ctx)
        if not search or not isinstance(value, str):
            return False
        return test(value) != negate

    return Node(evaluate, f"{left.text} {'NOT ' * negate}{name} '{search}'", "boolean")


def _in(left: Node, items: Sequence[str], negate: bool, meta: Any) -> Node:
    if left.kind != "property":
        raise SqlFilterError(
            f"Expected a property for In expression, got: {left.text}", meta.line, meta.column
        )
    ev, members = left.evaluate, frozenset(items)

    def evaluate(ctx: Context) -> bool | None:
        value = ev(ctx)
        if not isinstance(value, str):
            return None
        return (value in members) != negate

    return Node(evaluate, f"{left.text} {'NOT ' * negate}IN {sorted(members)}", "boolean")


def _between(value: Node, low: Node, high: Node, negate: bool, meta: Any) -> Node:
    if negate:
        return _or(
            _order(value, low, "<", lambda c: c < 0, meta),
            _order(value, high, ">", lambda c: c > 0, meta),
        )
    if low.kind == high.kind == "constant":
        if low.value is None or high.value is None:
            raise SqlFilterError(
                "Illegal values of between, values can not be null!", meta.line, meta.column
            )
        try:
            backwards = java_compare(high.value, low.value) < 0
        except JavaError as exc:
            raise SqlFilterError(str(exc), meta.line, meta.column) from None
        if backwards:
            raise SqlFilterError(
                f"Illegal values of between, left value({low.text}) must less than or equal "
                f"to right value({high.text})",
                meta.line,
                meta.column,
            )
    return _and(
        _order(value, low, ">=", lambda c: c >= 0, meta),
        _order(value, high, "<=", lambda c: c <= 0, meta),
    )


def _negate(node: Node) -> Node:
    """UnaryExpression.createNegate: a numeric constant is folded; anything else negates
    numbers only, which properties (strings) never are."""
    value = node.value
    if node.kind == "constant" and isinstance(value, int | float) and not isinstance(value, bool):
        return _constant(type(value)(-value), f"-{node.text}")
    ev = node.evaluate

    def evaluate(ctx: Context) -> Any:
        v = ev(ctx)
        if isinstance(v, int | float) and not isinstance(v, bool):
            return type(v)(-v)
        return None

    return Node(evaluate, f"-{node.text}", "value")


def _decimal(text: str, meta: Any) -> Node:
    digits = text[:-1] if text[-1] in "lL" else text
    value = int(digits)
    if value > LONG_MAX:
        raise SqlFilterError(
            f'NumberFormatException: For input string: "{digits}"', meta.line, meta.column
        )
    return _constant(value if value <= INT_MAX else JLong(value), text)


def _float(text: str, meta: Any) -> Node:
    """ConstantExpression.createFloat: within [Double.MIN_VALUE, Double.MAX_VALUE], so a
    literal 0.0 (below the smallest positive double) is refused, as RocketMQ refuses it."""
    value = float(text)
    if value > sys.float_info.max:
        raise SqlFilterError(
            f"{text} is greater than 1.7976931348623157E308", meta.line, meta.column
        )
    if value < 5e-324:
        raise SqlFilterError(f"{text} is less than 4.9E-324", meta.line, meta.column)
    return _constant(value, text)


def _unquote(token: str) -> str:
    return token[1:-1].replace("''", "'")


def _property(name: str) -> Node:
    return Node(lambda ctx: ctx.get(name), name, "property")


def _build(tree: Tree[Token]) -> Node:
    """The node of a parse tree ("+" x and parentheses leave no trace in the tree)."""
    rule, kids, meta = tree.data, tree.children, tree.meta
    nodes = [_build(k) for k in kids if isinstance(k, Tree)]
    tokens = [k for k in kids if isinstance(k, Token)]
    strings = [_unquote(t) for t in tokens if t.type == "STRING"]
    match rule:
        case "string":
            return _constant(strings[0], str(tokens[0]))
        case "float_":
            return _float(str(tokens[0]), meta)
        case "decimal":
            return _decimal(str(tokens[0]), meta)
        case "true" | "false":
            return _constant(rule == "true", rule.upper())
        case "null":
            return _constant(None, "NULL")
        case "prop":
            return _property(str(tokens[0]))
        case "neg":
            return _negate(nodes[0])
        case "not_":
            return _not(_as_boolean(nodes[0], meta))
        case "or_" | "and_":
            left, right = (_as_boolean(n, meta) for n in nodes)
            return _or(left, right) if rule == "or_" else _and(left, right)
        case "eq":
            return _checked_equal(nodes[0], nodes[1], meta)
        case "ne":
            return _not(_checked_equal(nodes[0], nodes[1], meta))
        case "is_null":
            return _equal(nodes[0], _constant(None, "NULL"))
        case "is_not_null":
            return _not(_equal(nodes[0], _constant(None, "NULL")))
        case "gt" | "ge" | "lt" | "le":
            symbol, test = _ORDERS[rule]
            return _order(nodes[0], nodes[1], symbol, test, meta)
        case "between" | "not_between":
            return _between(nodes[0], nodes[1], nodes[2], rule == "not_between", meta)
        case "in_" | "not_in":
            return _in(nodes[0], strings, rule == "not_in", meta)
        case _:  # the string tests
            name = rule.removeprefix("not_").upper()
            return _string_test(nodes[0], strings[0], name, rule.startswith("not_"))


_ORDERS: dict[str, tuple[str, Callable[[int], bool]]] = {
    "gt": (">", lambda c: c > 0),
    "ge": (">=", lambda c: c >= 0),
    "lt": ("<", lambda c: c < 0),
    "le": ("<=", lambda c: c <= 0),
}


@dataclass(frozen=True, slots=True)
class SqlFilter:
    """A compiled SQL92 subscription."""

    expression: str
    root: Node

    def matches(self, properties: Context) -> bool:
        """ExpressionMessageFilter: TRUE matches; null, FALSE or a failed evaluation not."""
        try:
            return self.root.evaluate(properties) is True
        except JavaError:
            return False


def compile_sql(expression: str) -> SqlFilter:
    """Parse and check `expression` as RocketMQ's FilterFactory does, or raise SqlFilterError."""
    try:
        tree = _PARSER.parse(expression)
    except UnexpectedInput as exc:
        token = getattr(exc, "token", None)
        if (isinstance(token, Token) and token.type == "$END") or exc.line < 1:
            lines = expression.split("\n")  # the input ended too soon: just after it
            line, column, got = len(lines), len(lines[-1]) + 1, "end of input"
        else:
            line, column = exc.line, exc.column
            got = str(token if token is not None else getattr(exc, "char", "?"))
        message = f"invalid SQL92 expression: unexpected {got!r}"
        raise SqlFilterError(message, line, column) from None
    root = _as_boolean(_build(tree), tree.meta)
    return SqlFilter(expression, root)
