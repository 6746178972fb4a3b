"""What a gate run found, as plain data: JSON for tasks and reports, text for error messages."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

_COLUMN_KEYS = ("column", "column_A", "column_B", "column_list")
# Arguments every expectation carries that say nothing about what was expected.
_NOISE = {"batch_id", "result_format", "catch_exceptions", "meta", "notes", "rendered_content"}


def plain(value: Any) -> Any:
    """`value` made JSON-able (GX hands back conditions, numpy and Spark row values)."""
    if isinstance(value, float) and value != value:
        return None  # NaN: pandas' null in a numeric column
    if value is None or isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [plain(v) for v in value]
    item = getattr(value, "item", None)  # numpy scalars
    if callable(item):
        return plain(item())
    return repr(value)


@dataclass(frozen=True)
class Failure:
    """One failed expectation: what it expected, and what the data showed instead."""

    expectation: str
    columns: list[str]
    kwargs: dict[str, Any]
    parameters: dict[str, str]  # argument -> the suite parameter that supplied it
    unexpected_count: int | None = None
    element_count: int | None = None
    observed_value: Any = None
    rows: list[Any] = field(default_factory=list)
    error: str | None = None

    def describe(self, max_rows: int) -> str:
        """`expect_x [columns] arg=value (parameter): what was found`, then sample rows."""
        head = self.expectation
        if self.columns:
            head += " [" + ", ".join(self.columns) + "]"
        for key, value in self.kwargs.items():
            head += f" {key}={json.dumps(value)}"
            if key in self.parameters:
                head += f" (${self.parameters[key]})"
        if self.error is not None:
            found = f"error: {self.error}"
        elif self.unexpected_count is not None:
            found = f"{self.unexpected_count} of {self.element_count} rows unexpected"
        else:
            found = f"observed {json.dumps(self.observed_value)}"
        lines = [f"{head}: {found}"]
        lines += [f"    {json.dumps(row, sort_keys=True)}" for row in self.rows[:max_rows]]
        if len(self.rows) > max_rows:
            lines.append(f"    ... {len(self.rows) - max_rows} more in the sample")
        return "\n".join(lines)


@dataclass(frozen=True)
class GateResult:
    """The outcome of one table's gate."""

    table: str
    suite: str
    success: bool
    evaluated: int
    failures: list[Failure]
    params: dict[str, Any]
    seconds: float
    docs_index: str | None = None
    engine: str = "spark"  # GX's engine that validated the rows: "spark" or "pandas"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self, max_rows: int = 5) -> str:
        if self.success:
            return f"table {self.table!r}: {self.evaluated} expectations passed"
        lines = [
            f"table {self.table!r} (suite {self.suite!r}): {len(self.failures)} of "
            f"{self.evaluated} expectations failed"
        ]
        lines += ["  " + f.describe(max_rows).replace("\n", "\n  ") for f in self.failures]
        return "\n".join(lines)


def _parameter_names(kwargs: Mapping[str, Any]) -> dict[str, str]:
    return {
        k: str(v["$PARAMETER"])
        for k, v in kwargs.items()
        if isinstance(v, Mapping) and "$PARAMETER" in v
    }


def _failure(outcome: Any, declared: Mapping[str, Any], values: Mapping[str, Any]) -> Failure:
    config = outcome.expectation_config
    kwargs = dict(config.kwargs)
    columns: list[str] = []
    for key in _COLUMN_KEYS:
        value = kwargs.pop(key, None)
        if isinstance(value, str):
            columns.append(value)
        elif value is not None:
            columns.extend(str(v) for v in value)
    row_condition = getattr(config, "row_condition", None) or kwargs.pop("row_condition", None)
    shown = {k: plain(v) for k, v in kwargs.items() if k not in _NOISE and v is not None}
    parameters = _parameter_names(declared)
    for argument, name in parameters.items():
        # GX leaves an argument out of the result when it equals its default (mostly=1).
        shown.setdefault(argument, plain(values.get(name)))
    if row_condition is not None:
        shown["row_condition"] = str(row_condition)
    result = outcome.result or {}
    exception = outcome.exception_info or {}
    error = exception.get("exception_message") if exception.get("raised_exception") else None
    rows = result.get("partial_unexpected_index_list") or result.get("partial_unexpected_list")
    return Failure(
        expectation=config.type,
        columns=columns,
        kwargs=shown,
        parameters=parameters,
        unexpected_count=result.get("unexpected_count"),
        element_count=result.get("element_count"),
        observed_value=plain(result.get("observed_value")),
        # In a stable order: Spark hands samples back in its tasks' order, pandas by index.
        rows=sorted(plain(rows or []), key=lambda row: json.dumps(row, sort_keys=True)),
        error=error,
    )


def summarize(
    table: str,
    suite_name: str,
    verdict: Any,
    evidence: Any | None,
    declared: Any,
    params: Mapping[str, Any],
    seconds: float,
    docs_index: str | None,
    engine: str,
) -> GateResult:
    """A GateResult from GX's pass/fail `verdict` and, if it failed, the `evidence` run.

    `declared` is the suite `evidence` ran (or the verdict's): it tells which argument
    came from which suite parameter.
    """
    kwargs = {e.id: e.configuration.kwargs for e in declared.expectations}
    failed = [o for o in (evidence or verdict).results if evidence is not None or not o.success]
    return GateResult(
        table=table,
        suite=suite_name,
        success=bool(verdict.success),
        evaluated=len(verdict.results),
        failures=[_failure(o, kwargs.get(o.expectation_config.id, {}), params) for o in failed],
        params={k: plain(v) for k, v in params.items()},
        seconds=round(seconds, 3),
        docs_index=docs_index,
        engine=engine,
    )


class GateFailed(Exception):
    """Gates failed; the message names each table, failed expectation and sample rows.

    `results` holds the failed gates; `summary` the whole run's JSON-able summary when the
    failure comes from run_all_gates (a task can still hand it to the report).
    """

    def __init__(
        self,
        results: list[GateResult],
        docs_index: str | None = None,
        summary: dict[str, Any] | None = None,
    ) -> None:
        self.results = results
        self.summary = summary
        lines = ["data quality gate failed:"]
        lines += [r.describe() for r in results]
        if docs_index is not None:
            lines.append(f"Data Docs: {docs_index}")
        super().__init__("\n".join(lines))
