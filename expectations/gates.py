"""Gates: validate a table's DataFrame with its suite; a failed gate stops the task, saying why.

A gate first runs its suite pass/fail only (on Spark few jobs: GX bundles the counts; a
small table is validated by GX's pandas engine instead, see expectations.context). Only if
that fails, a second checkpoint re-runs just the failed expectations with sample failing
rows named by the table's row id columns (on Spark each sample is a job of its own). Data
Docs show both: the verdict over the whole suite, then the evidence for what failed.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import great_expectations as gx
from great_expectations.core.run_identifier import RunIdentifier
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame

from broker_runtime.common.progress import reporter
from expectations.context import ENGINES, GateContext, shared_context
from expectations.results import GateFailed, GateResult, summarize
from expectations.suites import SPECS
from expectations.suites.common import SuiteSpec, referenced_columns, resolve_parameters

_GATE = reporter("gate")
# A table of at most this many rows (of the columns its suite reads) is validated by GX's
# pandas engine, a larger one by its Spark engine (expectations.context says why).
PANDAS_MAX_ROWS = 200_000


def _context(context: GateContext | None, docs_dir: Path | str | None) -> GateContext:
    if context is not None:
        return context
    return shared_context(None if docs_dir is None else Path(docs_dir).resolve())


def _checked(df: DataFrame, table: str, spec: SuiteSpec | None, suite: Any) -> DataFrame:
    """The derived check columns added, then only the columns the gate reads (GX caches them)."""
    if spec is not None and spec.prepare is not None:
        try:
            df = spec.prepare(df)
        except AnalysisException as e:
            raise ValueError(f"table {table!r}: cannot derive its check columns: {e}") from e
    wanted = referenced_columns(suite) | set(spec.row_id if spec else ())
    return df.select(*[c for c in df.columns if c in wanted])


def _batch(checked: DataFrame, engine: str | None) -> tuple[str, Any]:
    """The engine validating `checked` and its batch: its rows as pandas if there are at
    most PANDAS_MAX_ROWS (one Spark job fetches them), else the DataFrame. `engine`
    ("spark" or "pandas") forces one."""
    if engine not in (None, *ENGINES):
        raise ValueError(f"unknown gate engine {engine!r}: one of {', '.join(ENGINES)}")
    if engine == "spark":
        return "spark", checked
    table = (checked if engine == "pandas" else checked.limit(PANDAS_MAX_ROWS + 1)).toArrow()
    if table.num_rows <= PANDAS_MAX_ROWS or engine == "pandas":
        # A nullable integer column stays Python ints and None (pandas' default makes it
        # floats, and failing rows would show offsets as 2.0).
        return "pandas", table.to_pandas(integer_object_nulls=True)
    return "spark", checked


def _only(checkpoint_result: Any) -> Any:
    (validation,) = checkpoint_result.run_results.values()
    return validation


def run_gate(
    df: DataFrame,
    table: str,
    suite: gx.ExpectationSuite | None = None,
    params: Mapping[str, Any] | None = None,
    docs_dir: Path | str | None = None,
    *,
    context: GateContext | None = None,
    raise_on_failure: bool = True,
    run_name: str | None = None,
    publish: bool = True,
    engine: str | None = None,
) -> GateResult:
    """Validate `df` as `table` with `suite` (default: the table's own) and `params`.

    Unset parameters take the suite's defaults. Without `context` the process-wide context
    for `docs_dir` is used. Raises GateFailed on failure unless `raise_on_failure` is false.
    `publish=False` leaves the Data Docs to the caller's `context.publish_docs()`. `engine`
    forces GX's "spark" or "pandas" engine (default: by the table's size, see _batch).
    """
    ctx = _context(context, docs_dir)
    spec = SPECS.get(table)
    suite = suite if suite is not None else ctx.suite_for(table)
    values = resolve_parameters(suite, spec.defaults if spec else {}, params or {})
    checked = _checked(df, table, spec, suite)
    row_id = tuple(c for c in (spec.row_id if spec else ()) if c in checked.columns)
    name = run_name or f"gate-{table}"
    started = time.perf_counter()
    try:
        used, batch = _batch(checked, engine)
        gate = ctx.gate(table, suite, row_id, used)
        quick = gate.quick.run(**_run_args(batch, values, name))
        ctx.note(quick)
        verdict = _only(quick)
        failed = {r.expectation_config.id for r in verdict.results if not r.success}
        declared, evidence = gate.stored, None
        if failed:
            declared, detail = ctx.detail(gate, failed)
            again = detail.run(**_run_args(batch, values, name + "-failed"))
            ctx.note(again)
            evidence = _only(again)
    finally:
        checked.unpersist()
    if publish:
        ctx.publish_docs()
    docs = None if ctx.docs_index is None else str(ctx.docs_index)
    result = summarize(
        table,
        suite.name,
        verdict,
        evidence,
        declared,
        values,
        time.perf_counter() - started,
        docs,
        used,
    )
    if raise_on_failure and not result.success:
        raise GateFailed([result], docs)
    return result


def _run_args(batch: Any, values: Mapping[str, Any], run_name: str) -> dict[str, Any]:
    now = datetime.datetime.now(datetime.UTC)
    return {
        "batch_parameters": {"dataframe": batch},
        "expectation_parameters": dict(values),
        "run_id": RunIdentifier(run_name=run_name, run_time=now),
    }


def run_all_gates(
    tables: Mapping[str, DataFrame],
    docs_dir: Path | str | None = None,
    params: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    context: GateContext | None = None,
    raise_on_failure: bool = True,
    run_name: str | None = None,
    progress: Callable[[str], None] | None = _GATE,
    engine: str | None = None,
) -> dict[str, Any]:
    """Gate every table of a lake (name -> DataFrame) in one context; a JSON-able summary.

    `params` maps table -> parameter overrides. Tables without a suite are listed under
    `unvalidated`, not skipped silently. Raises GateFailed (carrying the summary) after all
    tables ran if any failed, unless `raise_on_failure` is false. `engine` as for run_gate.
    """
    params = params or {}
    stray = sorted(set(params) - set(tables))
    if stray:
        raise ValueError(f"parameters given for tables not in the lake: {', '.join(stray)}")
    ctx = _context(context, docs_dir)
    started = time.perf_counter()
    results: dict[str, GateResult] = {}
    for table, df in tables.items():
        if table not in SPECS:
            continue
        result = run_gate(
            df,
            table,
            params=params.get(table),
            context=ctx,
            raise_on_failure=False,
            run_name=run_name,
            publish=False,
            engine=engine,
        )
        results[table] = result
        if progress is not None:
            state = "passed" if result.success else f"FAILED {len(result.failures)} of"
            progress(f"{table}: {state} {result.evaluated} expectations, {result.seconds} s")
    ctx.publish_docs()  # one build of the site for every table
    docs = None if ctx.docs_index is None else str(ctx.docs_index)
    summary: dict[str, Any] = {
        "success": all(r.success for r in results.values()),
        "run_name": run_name,
        "docs_index": docs,
        "seconds": round(time.perf_counter() - started, 3),
        "tables": {t: r.to_dict() for t, r in results.items()},
        "unvalidated": sorted(set(tables) - set(results)),
    }
    failed = [r for r in results.values() if not r.success]
    if raise_on_failure and failed:
        raise GateFailed(failed, docs, summary)
    return summary
