"""`resend`, `replay` and `repair` under `mqaudit pipeline`: the remediation jobs by hand.

Both print a JSON summary on stdout; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

from broker_runtime.common.constants import DEFAULT_MAX_SEND_COUNT
from pipeline.spark_session import DEFAULT_MASTER


def _add_cluster(p: argparse.ArgumentParser, required: bool) -> None:
    where = p.add_mutually_exclusive_group(required=required)
    where.add_argument("--namesrv", help="name servers, host:port;host:port")
    where.add_argument("--data-dir", type=Path, help="a cluster's data dir (its cluster.json)")
    p.add_argument("--access-key", default=None, help="ACL access key (with --secret-key)")
    p.add_argument("--secret-key", default=None)


def _add_sends(p: argparse.ArgumentParser, what: str) -> None:
    """The options replay and repair share: which messages, how fast, dry run, force, the
    run id (`--replay-id` / `--repair-id`) and Spark."""
    p.add_argument(
        "--msg-id", dest="msg_ids", action="append", default=[], help="a UNIQ_KEY (repeatable)"
    )
    p.add_argument("--max-messages", type=int, default=100)
    p.add_argument("--rate", dest="messages_per_second", type=float, default=50.0)
    p.add_argument(
        "--dry-run", action=argparse.BooleanOptionalAction, default=True, help="send nothing"
    )
    p.add_argument("--force", action="store_true", help=f"send even if {what}ed before")
    p.add_argument(f"--{what}-id", default=None, help="default: a new one")
    p.add_argument("--spark-master", default=DEFAULT_MASTER)
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def add_remediation_parsers(cmds: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    replay = cmds.add_parser(
        "replay",
        help="replay dead letters to their original topics (dry run unless --no-dry-run)",
        description="Never replays a message twice unless --force; a --replay-id seen before "
        "resumes that replay. Every outcome goes to LAKE/dlq_replay_log.",
    )
    replay.add_argument("--lake", type=Path, required=True)
    _add_cluster(replay, required=False)
    replay.add_argument(
        "--group",
        required=True,
        help="the consumer group whose DLQ to replay (RabbitMQ: the queue the messages died in)",
    )
    replay.add_argument(
        "--topic",
        default=None,
        help="only messages first sent to this topic (RabbitMQ: published to this exchange)",
    )
    replay.add_argument("--from", dest="from_time", default=None, help="epoch ms or ISO 8601")
    replay.add_argument("--to", dest="to_time", default=None, help="epoch ms or ISO 8601")
    replay.add_argument(
        "--system",
        choices=["rocketmq", "rabbitmq"],
        default="rocketmq",
        help="rabbitmq: replay RabbitMQ dead letters (from their x-death) with --rabbit-url, "
        "the bodies the producer kept in its ledger (--data-dir or --ledger-url)",
    )
    replay.add_argument("--rabbit-url", default=None, help="amqp://user:pass@host:port/vhost")
    replay.add_argument(
        "--cluster",
        default=None,
        help="the cluster whose dead letters to replay (default: --data-dir's, else the "
        "lake's only cluster)",
    )
    replay.add_argument("--ledger-url", default=None, help="PostgreSQL URL of both ledgers")
    _add_sends(replay, "replay")
    replay.set_defaults(func=cmd_replay)

    repair = cmds.add_parser(
        "repair",
        help="send lost_after_ack losses again from the producer's kept bodies "
        "(dry run unless --no-dry-run)",
        description="Repairs the last audit's lost_after_ack losses. Never sends a message "
        "twice unless --force; a --repair-id seen before resumes that repair, and every run "
        "settles the unknown outcomes of runs killed midway first. A loss without a kept body "
        "is logged as not repairable. Every outcome goes to LAKE/repair_log.",
    )
    repair.add_argument("--lake", type=Path, required=True)
    repair.add_argument("--data-dir", type=Path, required=True, help="cluster data dir (ledgers)")
    repair.add_argument("--ledger-url", default=None, help="PostgreSQL URL of both ledgers")
    repair.add_argument("--namesrv", default=None, help="default: DIR/cluster.json's")
    repair.add_argument("--cluster", default=None, help="DIR's cluster (default: cluster.json's)")
    repair.add_argument("--access-key", default=None)
    repair.add_argument("--secret-key", default=None)
    _add_sends(repair, "repair")
    repair.set_defaults(func=cmd_repair)

    resend = cmds.add_parser(
        "resend",
        help="resend the due resend candidates of the last audit; void those at max send count",
        description="Each stub is checked again in the live ledgers first, so a second run "
        "sends nothing twice. Actions go to LAKE/resend_log.",
    )
    resend.add_argument("--lake", type=Path, required=True)
    resend.add_argument("--data-dir", type=Path, required=True, help="cluster data dir (ledgers)")
    resend.add_argument("--ledger-url", default=None, help="PostgreSQL URL of both ledgers")
    resend.add_argument("--namesrv", default=None, help="default: DIR/cluster.json's")
    resend.add_argument("--access-key", default=None)
    resend.add_argument("--secret-key", default=None)
    resend.add_argument("--as-of", default="now", help="due time: epoch ms, ISO 8601 or now")
    resend.add_argument("--max-send-count", type=int, default=DEFAULT_MAX_SEND_COUNT)
    resend.add_argument(
        "--rabbit-url", default=None, help="amqp://...: where RabbitMQ stubs are published again"
    )
    resend.add_argument("--report-dir", type=Path, default=None, help="manual_handling.csv/json")
    resend.add_argument("--run-id", default=None, help="default: a new one")
    resend.add_argument("--spark-master", default=DEFAULT_MASTER)
    resend.add_argument("--quiet", action="store_true", help="no progress on stderr")
    resend.set_defaults(func=cmd_resend)


def _target(args: argparse.Namespace) -> Any:
    from broker_runtime.cluster.layout import namesrv_of_data_dir
    from pipeline.remediation.sender import BrokerTarget

    if args.namesrv is None and args.data_dir is None:
        return None
    namesrv = args.namesrv or namesrv_of_data_dir(args.data_dir)
    return BrokerTarget(namesrv, args.access_key, args.secret_key)


def _replay_target(args: argparse.Namespace, system: str) -> Any:
    if system != "rabbitmq":
        return _target(args)
    from pipeline.remediation.rabbit_sender import RabbitTarget

    if args.rabbit_url is None:
        return None
    data_dir = str(args.data_dir) if args.data_dir else None
    return RabbitTarget(args.rabbit_url, data_dir, args.ledger_url)


def cmd_resend(args: argparse.Namespace) -> int:
    from broker_runtime.common.clock import parse_time_ms

    as_of = parse_time_ms(args.as_of)
    if args.max_send_count < 1:
        raise ValueError(f"--max-send-count must be >= 1, got {args.max_send_count}")
    from pipeline.jobs.resend import run_resend  # Spark loads only when a job runs
    from pipeline.remediation.rabbit_sender import RabbitTarget

    target = None
    if args.namesrv or (args.data_dir / "cluster.json").is_file():
        target = _target(args)
    summary = run_resend(
        str(args.lake.resolve()),
        args.data_dir,
        target,
        as_of_ms=as_of,
        run_id=args.run_id or f"resend-{uuid.uuid4().hex[:16]}",
        ledger_url=args.ledger_url,
        max_send_count=args.max_send_count,
        report_dir=args.report_dir,
        rabbit=RabbitTarget(args.rabbit_url, str(args.data_dir), args.ledger_url)
        if args.rabbit_url
        else None,
        master=args.spark_master,
        progress=not args.quiet,
    )
    print(json.dumps(summary, indent=2))
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from pipeline.remediation.replay_request import parse_request

    request = parse_request(
        {
            k: getattr(args, k)
            for k in (
                "group",
                "topic",
                "from_time",
                "to_time",
                "msg_ids",
                "max_messages",
                "messages_per_second",
                "dry_run",
                "force",
                "system",
                "cluster",
            )
        }
    )
    if request.cluster is None and args.data_dir is not None:
        from pipeline.readers.layout import cluster_of

        request = replace(request, cluster=cluster_of(args.data_dir))
    target = _replay_target(args, request.system)
    if target is None and not request.dry_run:
        raise ValueError(
            "a real replay needs --rabbit-url"
            if request.system == "rabbitmq"
            else "a real replay needs --namesrv or --data-dir"
        )
    from pipeline.jobs.replay import run_replay  # Spark loads only when a job runs

    replay_id = args.replay_id or f"replay-{uuid.uuid4().hex[:16]}"
    summary = run_replay(
        str(args.lake.resolve()),
        request,
        replay_id,
        target,
        master=args.spark_master,
        progress=not args.quiet,
    )
    print(json.dumps(summary, indent=2))
    return 0 if summary["send"].get("failed", 0) == 0 else 1


def cmd_repair(args: argparse.Namespace) -> int:
    from pipeline.remediation.replay_request import REPAIR_DEFAULTS, parse_repair_request

    request = parse_repair_request({k: getattr(args, k) for k in REPAIR_DEFAULTS})
    target = None
    if args.namesrv or (args.data_dir / "cluster.json").is_file():
        target = _target(args)
    if target is None and not request.dry_run:
        raise ValueError("a real repair needs --namesrv or a --data-dir with cluster.json")
    from pipeline.jobs.repair import run_repair  # Spark loads only when a job runs

    summary = run_repair(
        str(args.lake.resolve()),
        args.data_dir,
        request,
        args.repair_id or f"repair-{uuid.uuid4().hex[:16]}",
        target,
        ledger_url=args.ledger_url,
        master=args.spark_master,
        progress=not args.quiet,
    )
    print(json.dumps(summary, indent=2))
    return 0 if summary["send"].get("failed", 0) == 0 else 1
