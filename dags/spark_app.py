"""The application SparkSubmitOperator runs for the mqaudit DAGs' Spark steps.

    spark-submit dags/spark_app.py <command> [options]

Every command is a `mqaudit pipeline` command (ingest, validate, audit, report, dlq-report,
resend, replay, run). A leading `~` in an argument is expanded (templated Variables may
carry one). The in-process DAG tasks call the same step functions (`validate_ingested`,
`gate_audits` from pipeline.jobs.run), so each step is one piece of code in both modes.
"""

from __future__ import annotations

import os
import sys
from typing import Any

_STEPS = ("gate_audits", "validate_ingested")


def __getattr__(name: str) -> Any:
    """The shared steps, imported on first use: Great Expectations takes seconds to load
    and only the gate steps need it."""
    if name in _STEPS:
        from pipeline.jobs import run

        return getattr(run, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main(argv: list[str] | None = None) -> int:
    args = [os.path.expanduser(a) for a in (sys.argv[1:] if argv is None else argv)]
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    from pipeline.cli import main as pipeline_main

    return pipeline_main(args)


if __name__ == "__main__":
    sys.exit(main())
