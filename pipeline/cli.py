"""`mqaudit pipeline ...`: the lakehouse jobs (registered through the mqaudit.commands entry
point, so that broker_runtime never imports the pipeline)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pipeline.readers.commitlog import DEFAULT_RANGE_BYTES
from pipeline.spark_session import DEFAULT_MASTER


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    pipeline = sub.add_parser("pipeline", help="lakehouse jobs (PySpark + Delta Lake)")
    cmds = pipeline.add_subparsers(dest="pipeline_cmd", required=True)
    ingest = cmds.add_parser(
        "ingest",
        help="broker files and ledgers into Delta tables (incremental, idempotent)",
        description="Prints a JSON summary on stdout; progress goes to stderr.",
    )
    ingest.add_argument(
        "--data-dir", type=Path, required=True, help="cluster data dir or a store dir"
    )
    ingest.add_argument("--lake", type=Path, required=True, help="tables go to LAKE/<table>")
    ingest.add_argument("--spark-master", default=DEFAULT_MASTER)
    ingest.add_argument("--ledger-url", default=None, help="PostgreSQL URL of both ledgers")
    ingest.add_argument("--broker-name", default=None, help="broker name of a bare store dir")
    ingest.add_argument(
        "--range-mb", type=int, default=DEFAULT_RANGE_BYTES >> 20, help="CommitLog MB per task"
    )
    ingest.add_argument("--quiet", action="store_true", help="no progress on stderr")
    ingest.set_defaults(func=cmd_ingest)
    from pipeline.remediation.cli import add_remediation_parsers

    add_remediation_parsers(cmds)


def cmd_ingest(args: argparse.Namespace) -> int:
    if args.range_mb <= 0:
        raise ValueError(f"--range-mb must be positive, got {args.range_mb}")
    from pipeline.jobs.ingest import run_ingest  # Spark loads only when a job runs

    summary = run_ingest(
        args.data_dir,
        args.lake,
        master=args.spark_master,
        ledger_url=args.ledger_url,
        broker_name=args.broker_name,
        range_bytes=args.range_mb << 20,
        progress=not args.quiet,
    )
    print(json.dumps(summary, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    """The pipeline commands without the rest of `mqaudit`: `python -m pipeline.cli ingest ...`
    (and `python -m pipeline.jobs.<job> ...`), which is what spark-submit runs."""
    parser = argparse.ArgumentParser(prog="python -m pipeline.cli")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["pipeline", *(sys.argv[1:] if argv is None else argv)])
    try:
        code: int = args.func(args)
    except ValueError as e:
        print(f"pipeline: {e}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
