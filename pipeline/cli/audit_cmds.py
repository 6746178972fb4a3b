"""`ingest`, `validate`, `audit`, `report`, `dlq-report` and `run` under `mqaudit pipeline`.

Each command runs one step of `pipeline.steps` (`run` runs them all) with the `RunInputs`
its options give, so a command and the DAG task of the same step do the same thing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, TypeAlias

from broker_runtime.common.constants import (
    DEFAULT_CLUSTER,
    DEFAULT_MAX_SEND_COUNT,
    HALF_STUCK_AFTER_MS,
)
from pipeline.readers.commitlog import DEFAULT_RANGE_BYTES
from pipeline.spark_session import DEFAULT_MASTER
from pipeline.steps import (
    AUDIT,
    DLQ_REPORT,
    INGEST,
    REPORT,
    VALIDATE,
    RunInputs,
    Step,
    StepResult,
    split_dirs,
)

Parsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def inputs_of(args: argparse.Namespace) -> RunInputs:
    """The RunInputs a command's options give (options it does not have: their defaults)."""
    from pipeline.transforms.lag import LagThresholds

    def get(name: str, default: Any = None) -> Any:
        return getattr(args, name, default)

    lag = None
    if get("warn_lag_messages") is not None:
        lag = LagThresholds(args.warn_lag_messages, args.warn_lag_ms, args.stopped_after_ms)
    range_mb = get("range_mb")
    return RunInputs(
        lake=args.lake,
        data_dirs=split_dirs(get("data_dir")),
        out=get("out"),
        docs=get("docs"),
        run_name=get("run_name", "mqaudit"),
        as_of_ms=get("as_of"),
        max_send_count=get("max_send_count", DEFAULT_MAX_SEND_COUNT),
        half_stuck_ms=get("half_stuck_ms", HALF_STUCK_AFTER_MS),
        ledger_url=get("ledger_url") or None,  # an empty template value: none
        rabbit_api=get("rabbit_api") or None,
        rabbit_vhosts=get("rabbit_vhosts") or "/",
        spark_master=get("spark_master"),
        progress=not get("quiet", False),
        broker_name=get("broker_name"),
        cluster=get("cluster"),
        broker_confs=tuple(get("broker_conf") or ()),
        range_bytes=range_mb << 20 if range_mb is not None else None,
        lag=lag,
    )


def add_audit_parsers(cmds: Parsers) -> None:
    ingest = cmds.add_parser(
        "ingest",
        help="broker files and ledgers into Delta tables (incremental, idempotent)",
        description="Prints a JSON summary on stdout; progress goes to stderr.",
    )
    _data_dirs(ingest, "cluster data dir or a store dir")
    ingest.add_argument("--lake", type=Path, required=True, help="tables go to LAKE/<table>")
    ingest.add_argument("--spark-master", default=DEFAULT_MASTER)
    ingest.add_argument("--ledger-url", default=None, help="PostgreSQL URL of both ledgers")
    _rabbit(ingest)
    ingest.add_argument("--broker-name", default=None, help="broker name of a bare store dir")
    ingest.add_argument(
        "--cluster",
        default=None,
        help="cluster name of a single data dir whose cluster.json names none, or of a bare "
        f"store dir (default {DEFAULT_CLUSTER})",
    )
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
    _quiet(ingest)
    ingest.set_defaults(func=cmd_ingest)
    _add_validate(cmds)
    _add_audit(cmds)
    _add_reports(cmds)
    _add_run(cmds)
    _add_migrate(cmds)


def _data_dirs(parser: argparse.ArgumentParser, what: str, required: bool = False) -> None:
    parser.add_argument(
        "--data-dir",
        action="append",
        required=required,
        help=f"{what}; several clusters into one lake: repeat it, or join dirs with "
        f"'{os.pathsep}' as in PATH (each names its cluster: cluster_name in its cluster.json)",
    )


def _quiet(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")


def _max_send_count(parser: argparse.ArgumentParser, help: str | None = None) -> None:
    parser.add_argument("--max-send-count", type=int, default=DEFAULT_MAX_SEND_COUNT, help=help)


def _rabbit(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rabbit-api",
        default=None,
        help="RabbitMQ management API, http://USER:PASS@HOST:PORT/api: its topology is "
        "snapshotted into the lake too (as ingest-rabbit does)",
    )
    parser.add_argument(
        "--rabbit-vhosts", default="/", help="RabbitMQ virtual hosts, comma-separated"
    )


def _half_stuck_ms(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--half-stuck-ms",
        type=int,
        default=HALF_STUCK_AFTER_MS,
        help="a half message without commit or rollback this long (ms) is half_stuck",
    )


def _as_of(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--as-of",
        type=int,
        default=None,
        help=f"{what}, epoch ms (default: the lake's last ingest time)",
    )


def _add_validate(cmds: Parsers) -> None:
    validate = cmds.add_parser(
        "validate",
        help="Great Expectations gates on the ingested tables (exit 1 when one fails)",
        description="Writes Data Docs to --docs and prints a JSON summary on stdout. A failed "
        "gate names its expectations and sample rows on stderr and exits 1.",
    )
    validate.add_argument("--lake", type=Path, required=True)
    validate.add_argument("--docs", type=Path, required=True, help="Data Docs folder")
    validate.add_argument("--run-name", default="validate", help="the run's name in Data Docs")
    _max_send_count(validate, "a stub's send count may not exceed this (the resend job's bound)")
    validate.add_argument("--spark-master", default=DEFAULT_MASTER)
    _quiet(validate)
    validate.set_defaults(func=cmd_validate)


def _add_audit(cmds: Parsers) -> None:
    from pipeline.transforms.lag import LagThresholds

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
    _as_of(audit, "the run's time")
    audit.add_argument("--warn-lag-messages", type=int, default=lag.warn_lag_messages)
    audit.add_argument("--warn-lag-ms", type=int, default=lag.warn_lag_ms)
    audit.add_argument("--stopped-after-ms", type=int, default=lag.stopped_after_ms)
    _max_send_count(audit)
    _half_stuck_ms(audit)
    _quiet(audit)
    audit.set_defaults(func=cmd_audit)


def _add_reports(cmds: Parsers) -> None:
    report = cmds.add_parser(
        "report",
        help="HTML audit report with plots from the audit tables",
        description="Writes OUT/audit_report.html and its PNG plots; prints the paths. With "
        "--docs, the audit tables' gates (reported, never failing) go to those Data Docs.",
    )
    report.add_argument("--lake", type=Path, required=True)
    report.add_argument("--out", type=Path, required=True)
    report.add_argument("--docs", type=Path, default=None, help="Data Docs folder to link to")
    report.add_argument("--run-name", default="report", help="the gates' run name in Data Docs")
    report.add_argument("--spark-master", default=DEFAULT_MASTER)
    report.set_defaults(func=cmd_report)

    dlq = cmds.add_parser(
        "dlq-report",
        help="dead-letter report (HTML and CSV) from audit_dead_letters",
        description="Writes OUT/dlq_report.html, OUT/dead_letters.csv and a plot.",
    )
    dlq.add_argument("--lake", type=Path, required=True)
    dlq.add_argument("--out", type=Path, required=True)
    dlq.add_argument(
        "--spark-master", default=DEFAULT_MASTER, help="unused: the table is read with pyarrow"
    )
    dlq.set_defaults(func=cmd_dlq_report)


def _add_run(cmds: Parsers) -> None:
    run = cmds.add_parser(
        "run",
        help="ingest + validate + audit + report in one Spark session",
        description="Progress on stderr; one JSON line on stdout at the end with the paths "
        "written. A failed gate on the ingested tables stops the run before the audit: its "
        "expectations and sample rows go to stderr and the exit code is 1.",
    )
    _data_dirs(run, "cluster data dir", required=True)
    run.add_argument("--lake", type=Path, required=True, help="tables go to LAKE/<table>")
    run.add_argument("--out", type=Path, required=True, help="reports go here")
    run.add_argument("--docs", type=Path, default=None, help="Data Docs (default OUT/data-docs)")
    run.add_argument("--spark-master", default=DEFAULT_MASTER)
    _as_of(run, "the audit's time")
    _max_send_count(run)
    _half_stuck_ms(run)
    run.add_argument("--ledger-url", default=None, help="PostgreSQL URL of both ledgers")
    _rabbit(run)
    _quiet(run)
    run.set_defaults(func=cmd_run)


def _add_migrate(cmds: Parsers) -> None:
    migrate = cmds.add_parser(
        "migrate-lake",
        help="once, for a lake written before its rows named their cluster",
        description="Names CLUSTER in every row of the lake's tables that have no `cluster` "
        "column (one commit per table, history kept); ingest and audit refuse such a lake "
        "until then. Running it again changes nothing. Prints a JSON summary.",
    )
    migrate.add_argument("--lake", type=Path, required=True)
    migrate.add_argument(
        "--cluster", required=True, help="the cluster all of the lake's data came from"
    )
    migrate.add_argument("--spark-master", default=DEFAULT_MASTER)
    migrate.set_defaults(func=cmd_migrate)


def cmd_migrate(args: argparse.Namespace) -> int:
    from pipeline.jobs.migrate import migrate_lake
    from pipeline.spark_session import build_spark

    _lake_must_exist(args.lake)
    spark = build_spark("mqaudit-migrate", args.spark_master)
    print(json.dumps(migrate_lake(args.lake, args.cluster, spark), indent=2))
    return 0


def _lake_must_exist(lake: Path) -> None:
    if not lake.is_dir():
        raise ValueError(f"lake {lake} does not exist")


def _run_step(step: Step, args: argparse.Namespace) -> StepResult:
    return step.run(inputs_of(args), None)


def _dirs_must_exist(args: argparse.Namespace) -> None:
    for d in split_dirs(args.data_dir):
        if not d.is_dir():
            raise ValueError(f"data dir {d} does not exist")


def cmd_ingest(args: argparse.Namespace) -> int:
    if args.range_mb <= 0:
        raise ValueError(f"--range-mb must be positive, got {args.range_mb}")
    if not split_dirs(args.data_dir) and not args.broker_conf:
        raise ValueError("give --data-dir, --broker-conf or both")
    _dirs_must_exist(args)
    print(json.dumps(_run_step(INGEST, args), indent=2))
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from expectations.results import GateFailed

    _lake_must_exist(args.lake)
    try:
        summary = _run_step(VALIDATE, args)
    except GateFailed as e:
        print(f"pipeline validate: {e}", file=sys.stderr)
        return 1
    print(json.dumps(summary, indent=2))
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    _lake_must_exist(args.lake)
    print(json.dumps(_run_step(AUDIT, args), indent=2))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    _lake_must_exist(args.lake)
    done = _run_step(REPORT, args)
    result = done["report"] | (
        {"audit_gates": done["audit_gates"]} if "audit_gates" in done else {}
    )
    print(json.dumps(result, indent=2))
    print(f"audit report: {result['html']}")
    return 0


def cmd_dlq_report(args: argparse.Namespace) -> int:
    _lake_must_exist(args.lake)
    result = _run_step(DLQ_REPORT, args)
    print(json.dumps(result, indent=2))
    print(f"dead-letter report: {result['html']} (CSV {result['csv']})")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from pipeline.run import RunFailed, run_pipeline

    _dirs_must_exist(args)
    try:
        summary = run_pipeline(inputs_of(args))
    except RunFailed as e:
        print(f"pipeline run: {e}", file=sys.stderr)
        print(json.dumps(e.summary), flush=True)
        return 1
    print(json.dumps(summary), flush=True)
    return 0
