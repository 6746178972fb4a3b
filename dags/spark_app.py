"""The application SparkSubmitOperator runs for the mqaudit DAGs' Spark steps.

    spark-submit dags/spark_app.py <command> [options]

`validate` gates the lake's ingested tables (Great Expectations); every other command is a
`mqaudit pipeline` command (ingest, audit, report, dlq-report, resend, replay). A leading
`~` in an argument is expanded (templated Variables may carry one). The in-process DAG tasks
call `validate_ingested` too, so the gate step is one piece of code in both modes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any


def validate_ingested(
    spark: Any, lake: Path, docs_dir: Path, run_name: str, progress: bool = True
) -> dict[str, Any]:
    """Gate every ingested table of `lake`; raises expectations' GateFailed (naming the
    expectations and sample rows) if any fails. Data Docs go to `docs_dir`."""
    from expectations.checkpoints import run_all_gates
    from expectations.suites import INGESTED_TABLES
    from pipeline import schemas as S
    from pipeline.delta_io import DeltaIO
    from pipeline.jobs.ingest import table_path

    io = DeltaIO(spark)
    tables = {t: io.read(table_path(lake, t), S.TABLES[t]) for t in INGESTED_TABLES}
    say = (lambda line: print(line, file=sys.stderr, flush=True)) if progress else None
    summary: dict[str, Any] = run_all_gates(
        tables, docs_dir=docs_dir, run_name=run_name, progress=say
    )
    return summary


def gate_audits(spark: Any, lake: Path, docs_dir: Path, run_name: str) -> dict[str, Any]:
    """The audit tables' gates (their thresholds) without failing: the outcome for a report.

    Findings are what the audit is for; a run that found losses has done its job."""
    from expectations.checkpoints import run_all_gates
    from pipeline.audit_schemas import AUDIT_TABLES
    from pipeline.delta_io import DeltaIO, table_exists
    from pipeline.jobs.ingest import table_path

    io = DeltaIO(spark)
    tables = {
        t: io.read(table_path(lake, t), schema)
        for t, schema in AUDIT_TABLES.items()
        if table_exists(table_path(lake, t))
    }
    summary: dict[str, Any] = run_all_gates(
        tables, docs_dir=docs_dir, run_name=run_name, raise_on_failure=False, progress=None
    )
    return summary


def _validate(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="spark_app.py validate")
    p.add_argument("--lake", type=Path, required=True)
    p.add_argument("--docs", type=Path, required=True, help="Data Docs folder")
    p.add_argument("--run-name", default="validate")
    p.add_argument("--spark-master", default=None)
    args = p.parse_args(argv)
    from pipeline.spark_session import build_spark

    spark = build_spark("mqaudit-validate", args.spark_master)
    print(json.dumps(validate_ingested(spark, args.lake, args.docs, args.run_name), indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = [os.path.expanduser(a) for a in (sys.argv[1:] if argv is None else argv)]
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    if args[0] == "validate":
        return _validate(args[1:])
    from pipeline.cli import main as pipeline_main

    return pipeline_main(args)


if __name__ == "__main__":
    sys.exit(main())
