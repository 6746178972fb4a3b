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
        "--data-dir", type=Path, default=None, help="cluster data dir or a store dir"
    )
    ingest.add_argument("--lake", type=Path, required=True, help="tables go to LAKE/<table>")
    ingest.add_argument("--spark-master", default=DEFAULT_MASTER)
    ingest.add_argument("--ledger-url", default=None, help="PostgreSQL URL of both ledgers")
    ingest.add_argument("--broker-name", default=None, help="broker name of a bare store dir")
    ingest.add_argument(
        "--broker-conf",
        type=Path,
        action="append",
        default=[],
        help="an Apache RocketMQ broker's config file (mqbroker -c FILE; repeatable): its "
        "storePathRootDir is ingested as broker brokerName/brokerId",
    )
    ingest.add_argument(
        "--range-mb", type=int, default=DEFAULT_RANGE_BYTES >> 20, help="CommitLog MB per task"
    )
    ingest.add_argument("--quiet", action="store_true", help="no progress on stderr")
    ingest.set_defaults(func=cmd_ingest)
    add_audit_parsers(cmds)
    from pipeline.remediation.cli import add_remediation_parsers

    add_remediation_parsers(cmds)


def cmd_ingest(args: argparse.Namespace) -> int:
    if args.range_mb <= 0:
        raise ValueError(f"--range-mb must be positive, got {args.range_mb}")
    if args.data_dir is None and not args.broker_conf:
        raise ValueError("give --data-dir, --broker-conf or both")
    if args.data_dir is not None and not args.data_dir.is_dir():
        raise ValueError(f"data dir {args.data_dir} does not exist")
    from pipeline.jobs.ingest import run_ingest  # Spark loads only when a job runs

    summary = run_ingest(
        args.data_dir,
        args.lake,
        master=args.spark_master,
        ledger_url=args.ledger_url,
        broker_name=args.broker_name,
        broker_confs=args.broker_conf,
        range_bytes=args.range_mb << 20,
        progress=not args.quiet,
    )
    print(json.dumps(summary, indent=2))
    return 0


# -- audits and reports ----------------------------------------------------------------------


def add_audit_parsers(cmds: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`audit`, `report` and `dlq-report` under `mqaudit pipeline`."""
    # Light modules only: the jobs (Delta, Spark sessions) load when a command runs.
    from pipeline.transforms.lag import LagThresholds
    from pipeline.transforms.resend import DEFAULT_MAX_SEND_COUNT

    lag = LagThresholds()
    audit = cmds.add_parser(
        "audit",
        help="audit tables from the ingested tables (duplicates, losses, lag, DLQ, resend)",
        description="Rewrites every audit table at LAKE/<name>; prints a JSON summary on "
        "stdout, progress on stderr. Re-running the same --as-of over the same lake commits "
        "nothing.",
    )
    audit.add_argument("--lake", type=Path, required=True)
    audit.add_argument("--spark-master", default=DEFAULT_MASTER)
    audit.add_argument(
        "--as-of",
        type=int,
        default=None,
        help="the run's time, epoch ms (default: the lake's last ingest time)",
    )
    audit.add_argument("--warn-lag-messages", type=int, default=lag.warn_lag_messages)
    audit.add_argument("--warn-lag-ms", type=int, default=lag.warn_lag_ms)
    audit.add_argument("--stopped-after-ms", type=int, default=lag.stopped_after_ms)
    audit.add_argument("--max-send-count", type=int, default=DEFAULT_MAX_SEND_COUNT)
    audit.add_argument("--quiet", action="store_true", help="no progress on stderr")
    audit.set_defaults(func=cmd_audit)

    report = cmds.add_parser(
        "report",
        help="HTML audit report with plots from the audit tables",
        description="Writes OUT/audit_report.html and its PNG plots; prints the paths.",
    )
    report.add_argument("--lake", type=Path, required=True)
    report.add_argument("--out", type=Path, required=True)
    report.add_argument("--docs", type=Path, default=None, help="Data Docs folder to link to")
    report.add_argument("--spark-master", default=DEFAULT_MASTER)
    report.set_defaults(func=cmd_report)

    dlq = cmds.add_parser(
        "dlq-report",
        help="dead-letter report (HTML and CSV) from audit_dead_letters",
        description="Writes OUT/dlq_report.html, OUT/dead_letters.csv and a plot.",
    )
    dlq.add_argument("--lake", type=Path, required=True)
    dlq.add_argument("--out", type=Path, required=True)
    dlq.add_argument("--spark-master", default=DEFAULT_MASTER)
    dlq.set_defaults(func=cmd_dlq_report)
    add_run_parsers(cmds)


def cmd_audit(args: argparse.Namespace) -> int:
    from pipeline.jobs.audit import AuditThresholds, run_audit
    from pipeline.transforms.lag import LagThresholds

    _lake_must_exist(args.lake)
    thresholds = AuditThresholds(
        LagThresholds(args.warn_lag_messages, args.warn_lag_ms, args.stopped_after_ms),
        args.max_send_count,
    )
    summary = run_audit(
        args.lake,
        as_of_ms=args.as_of,
        thresholds=thresholds,
        master=args.spark_master,
        progress=not args.quiet,
    )
    print(json.dumps(summary, indent=2))
    return 0


def _lake_must_exist(lake: Path) -> None:
    if not lake.is_dir():
        raise ValueError(f"lake {lake} does not exist")


def cmd_report(args: argparse.Namespace) -> int:
    from pipeline.reports.audit_report import build_report

    _lake_must_exist(args.lake)
    result = build_report(args.lake, args.out, docs_dir=args.docs, master=args.spark_master)
    print(json.dumps(result, indent=2))
    print(f"audit report: {result['html']}")
    return 0


def cmd_dlq_report(args: argparse.Namespace) -> int:
    from pipeline.reports.dlq_report import build_dlq_report

    _lake_must_exist(args.lake)
    result = build_dlq_report(args.lake, args.out, master=args.spark_master)
    print(json.dumps(result, indent=2))
    print(f"dead-letter report: {result['html']} (CSV {result['csv']})")
    return 0


# -- gates and whole runs --------------------------------------------------------------------


def add_run_parsers(cmds: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`validate` and `run` under `mqaudit pipeline`."""
    from pipeline.transforms.resend import DEFAULT_MAX_SEND_COUNT

    validate = cmds.add_parser(
        "validate",
        help="Great Expectations gates on the ingested tables (exit 1 when one fails)",
        description="Writes Data Docs to --docs and prints a JSON summary on stdout. A failed "
        "gate names its expectations and sample rows on stderr and exits 1.",
    )
    validate.add_argument("--lake", type=Path, required=True)
    validate.add_argument("--docs", type=Path, required=True, help="Data Docs folder")
    validate.add_argument("--run-name", default="validate", help="the run's name in Data Docs")
    validate.add_argument(
        "--max-send-count",
        type=int,
        default=DEFAULT_MAX_SEND_COUNT,
        help="a stub's send count may not exceed this (the resend job's bound)",
    )
    validate.add_argument("--spark-master", default=DEFAULT_MASTER)
    validate.add_argument("--quiet", action="store_true", help="no progress on stderr")
    validate.set_defaults(func=cmd_validate)

    run = cmds.add_parser(
        "run",
        help="ingest + validate + audit + report in one Spark session",
        description="Progress on stderr; one JSON line on stdout at the end with the paths "
        "written. A failed gate on the ingested tables stops the run before the audit: its "
        "expectations and sample rows go to stderr and the exit code is 1.",
    )
    run.add_argument("--data-dir", type=Path, required=True, help="cluster data dir")
    run.add_argument("--lake", type=Path, required=True, help="tables go to LAKE/<table>")
    run.add_argument("--out", type=Path, required=True, help="reports go here")
    run.add_argument("--docs", type=Path, default=None, help="Data Docs (default OUT/data-docs)")
    run.add_argument("--spark-master", default=DEFAULT_MASTER)
    run.add_argument(
        "--as-of",
        type=int,
        default=None,
        help="the audit's time, epoch ms (default: the lake's last ingest time)",
    )
    run.add_argument("--max-send-count", type=int, default=DEFAULT_MAX_SEND_COUNT)
    run.add_argument("--ledger-url", default=None, help="PostgreSQL URL of both ledgers")
    run.add_argument("--quiet", action="store_true", help="no progress on stderr")
    run.set_defaults(func=cmd_run)


def cmd_validate(args: argparse.Namespace) -> int:
    from expectations.checkpoints import GateFailed
    from pipeline.jobs.run import gate_params, validate_ingested
    from pipeline.spark_session import build_spark

    _lake_must_exist(args.lake)
    if args.max_send_count < 1:
        raise ValueError(f"--max-send-count must be >= 1, got {args.max_send_count}")
    spark = build_spark("mqaudit-validate", args.spark_master)
    params = gate_params(args.max_send_count)
    try:
        summary = validate_ingested(
            spark, args.lake, args.docs, args.run_name, params, progress=not args.quiet
        )
    except GateFailed as e:
        print(f"pipeline validate: {e}", file=sys.stderr)
        return 1
    print(json.dumps(summary, indent=2))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from pipeline.jobs.audit import AuditThresholds
    from pipeline.jobs.run import RunFailed, run_pipeline

    if not args.data_dir.is_dir():
        raise ValueError(f"data dir {args.data_dir} does not exist")
    thresholds = AuditThresholds(max_send_count=args.max_send_count)
    try:
        summary = run_pipeline(
            args.data_dir,
            args.lake,
            args.out,
            docs_dir=args.docs,
            master=args.spark_master,
            as_of_ms=args.as_of,
            thresholds=thresholds,
            ledger_url=args.ledger_url,
            progress=not args.quiet,
        )
    except RunFailed as e:
        print(f"pipeline run: {e}", file=sys.stderr)
        print(json.dumps(e.summary), flush=True)
        return 1
    print(json.dumps(summary), flush=True)
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
