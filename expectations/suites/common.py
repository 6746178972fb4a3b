"""What every suite module shares: the spec of a table's gate and small expectation helpers."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import great_expectations as gx
import great_expectations.expectations as gxe
from pyspark.sql import DataFrame

from broker_runtime.common.constants import NAME_PATTERN

# Suites' regexes are read by Java (Spark's rlike) and by Python (pandas) alike: `$` lets a
# trailing newline pass in both, `\z` is Java's only, so a regex ends with END, a lookahead
# that means "end of input" in both.
END = r"(?![\s\S])"
# The same rule as broker_runtime.common.topics (names become paths on the broker).
NAME_REGEX = rf"^{NAME_PATTERN}{END}"

# Epoch milliseconds before 2001-09-09: a timestamp this small was written in seconds (or is
# garbage), which every later time comparison would silently get wrong.
MIN_TIMESTAMP_MS = 1_000_000_000_000


def param(name: str) -> dict[str, str]:
    """A suite parameter reference, filled in from the gate's params at run time."""
    return {"$PARAMETER": name}


@dataclass(frozen=True)
class SuiteSpec:
    """How to gate one table: its suite, parameter defaults and the columns naming a row.

    `prepare` adds the derived check columns the suite needs (pure DataFrame transform);
    `row_id` columns are shown for every failing row in gate messages and Data Docs.
    """

    table: str
    build: Callable[[], gx.ExpectationSuite]
    defaults: Mapping[str, Any]
    row_id: tuple[str, ...]
    prepare: Callable[[DataFrame], DataFrame] | None = None
    doc: Mapping[str, str] = field(default_factory=dict)


def not_null(columns: Iterable[str]) -> list[gxe.Expectation]:
    return [gxe.ExpectColumnValuesToNotBeNull(column=c) for c in columns]


def at_least(minimum: int, columns: Iterable[str]) -> list[gxe.Expectation]:
    """Each column >= minimum where not null (nulls are the not-null checks' business)."""
    return [gxe.ExpectColumnValuesToBeBetween(column=c, min_value=minimum) for c in columns]


def legal_names(columns: Iterable[str], row_condition: Any = None) -> list[gxe.Expectation]:
    return [
        gxe.ExpectColumnValuesToMatchRegex(column=c, regex=NAME_REGEX, row_condition=row_condition)
        for c in columns
    ]


def not_before(column_a: str, column_b: str) -> gxe.Expectation:
    """column_a >= column_b on rows where both are set (one clock wrote both)."""
    return gxe.ExpectColumnPairValuesAToBeGreaterThanB(
        column_A=column_a, column_B=column_b, or_equal=True, ignore_row_if="either_value_is_missing"
    )


def increasing(column: str, previous: str) -> gxe.Expectation:
    """column > previous (the derived value of the row before in its group), where set."""
    return gxe.ExpectColumnPairValuesAToBeGreaterThanB(
        column_A=column, column_B=previous, or_equal=False, ignore_row_if="either_value_is_missing"
    )


def suite_parameters(suite: gx.ExpectationSuite) -> set[str]:
    """Names of the `$PARAMETER`s the suite's expectations refer to."""
    names: set[str] = set()
    for expectation in suite.expectations:
        for value in expectation.configuration.kwargs.values():
            if isinstance(value, dict) and "$PARAMETER" in value:
                names.add(str(value["$PARAMETER"]))
    return names


def resolve_parameters(
    suite: gx.ExpectationSuite, defaults: Mapping[str, Any], overrides: Mapping[str, Any]
) -> dict[str, Any]:
    """The suite's parameter values: defaults, then overrides; unknown or missing names raise.

    A misspelt threshold must not silently leave the default in force.
    """
    names = suite_parameters(suite)
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise ValueError(
            f"suite {suite.name!r} has no parameter {', '.join(unknown)}; "
            f"its parameters are {sorted(names) or 'none'}"
        )
    values = {k: v for k, v in defaults.items() if k in names}
    values.update(overrides)
    missing = sorted(names - set(values))
    if missing:
        raise ValueError(f"suite {suite.name!r} needs a value for {', '.join(missing)}")
    return values


def referenced_columns(suite: gx.ExpectationSuite) -> set[str]:
    """Every column the suite's expectations and their row conditions read."""
    names: set[str] = set()

    def walk_condition(condition: Any) -> None:
        column = getattr(condition, "column", None)
        if column is not None:
            names.add(str(getattr(column, "name", column)))
        for inner in getattr(condition, "conditions", None) or []:
            walk_condition(inner)

    for expectation in suite.expectations:
        kwargs = expectation.configuration.kwargs
        for key in ("column", "column_A", "column_B"):
            if isinstance(kwargs.get(key), str):
                names.add(kwargs[key])
        names.update(kwargs.get("column_list") or [])
        walk_condition(getattr(expectation, "row_condition", None))
    return names
