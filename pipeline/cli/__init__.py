"""`mqaudit pipeline ...`: the lakehouse commands (registered through the mqaudit.commands
entry point, so that broker_runtime never imports the pipeline).

`python -m pipeline.cli <command> ...` runs them without the rest of `mqaudit`; that is what
spark-submit runs (dags/spark_app.py). Every module here loads Spark, Delta and Great
Expectations only when a command runs.
"""

from __future__ import annotations

import argparse
import sys

from broker_runtime.common.progress import show_progress
from pipeline.cli.audit_cmds import add_audit_parsers
from pipeline.cli.remediation_cmds import add_remediation_parsers


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    pipeline = sub.add_parser("pipeline", help="lakehouse jobs (PySpark + Delta Lake)")
    cmds = pipeline.add_subparsers(dest="pipeline_cmd", required=True)
    add_audit_parsers(cmds)
    add_remediation_parsers(cmds)


def main(argv: list[str] | None = None) -> int:
    """The pipeline commands without the rest of `mqaudit`."""
    parser = argparse.ArgumentParser(prog="python -m pipeline.cli")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["pipeline", *(sys.argv[1:] if argv is None else argv)])
    show_progress(quiet=getattr(args, "quiet", False))
    try:
        code: int = args.func(args)
    except ValueError as e:
        print(f"pipeline: {e}", file=sys.stderr)
        return 2
    return code
