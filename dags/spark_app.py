"""The application SparkSubmitOperator runs for the mqaudit DAGs' Spark steps.

    spark-submit dags/spark_app.py <command> [options]

Every command is a `mqaudit pipeline` command (ingest, validate, audit, report, dlq-report,
resend, replay, run); the DAGs build each step's command line from pipeline.steps, so a
submitted step runs the same code with the same inputs as the in-process task. A leading `~`
in an argument is expanded (templated Variables may carry one).
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str] | None = None) -> int:
    args = [os.path.expanduser(a) for a in (sys.argv[1:] if argv is None else argv)]
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    from pipeline.cli import main as pipeline_main

    return pipeline_main(args)


if __name__ == "__main__":
    sys.exit(main())
