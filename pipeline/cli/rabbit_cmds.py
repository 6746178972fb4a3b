"""`mqaudit pipeline ingest-rabbit`: a RabbitMQ system's topology and ledgers into the lake.

RabbitMQ has no store files for `ingest` to read: this command snapshots the topology of
each `--vhost` from the management API (`--api http://USER:PASSWORD@HOST:15672/api`; guest
when the URL names no user) into `rabbit_topology`, and the ledgers (`--data-dir` or
`--ledger-url`) into `message_stub` and `message_log`. `audit` then finds RabbitMQ's rows.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from pipeline.spark_session import DEFAULT_MASTER


def add_rabbit_parsers(cmds: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = cmds.add_parser(
        "ingest-rabbit",
        help="a RabbitMQ topology (management API) and the ledgers into Delta tables",
        description="Prints a JSON summary on stdout; progress goes to stderr.",
    )
    p.add_argument("--lake", type=Path, required=True, help="tables go to LAKE/<table>")
    p.add_argument("--api", required=True, help="management API, http://USER:PASS@HOST:PORT/api")
    p.add_argument(
        "--vhost", action="append", default=[], help="a virtual host (repeatable; default /)"
    )
    p.add_argument("--data-dir", type=Path, default=None, help="DIR/ledger/*.db hold the ledgers")
    p.add_argument("--ledger-url", default=None, help="PostgreSQL URL of both ledgers")
    p.add_argument("--spark-master", default=DEFAULT_MASTER)
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=cmd_ingest_rabbit)


def cmd_ingest_rabbit(args: argparse.Namespace) -> int:
    from pipeline.jobs.ledger_ingest import ingest_ledgers
    from pipeline.jobs.rabbit import api_credentials, ingest_topology
    from pipeline.spark_session import build_spark

    api, user, password = api_credentials(args.api)
    if args.data_dir is not None and not args.data_dir.is_dir():
        raise ValueError(f"data dir {args.data_dir} does not exist")
    args.lake.mkdir(parents=True, exist_ok=True)
    spark = build_spark("mqaudit-ingest-rabbit", args.spark_master)
    progress = not args.quiet
    vhosts = args.vhost or ["/"]
    summary: dict[str, Any] = {
        "rabbit_topology": ingest_topology(
            spark, args.lake, api, vhosts, user=user, password=password, progress=progress
        ),
        "vhosts": vhosts,
    }
    if args.data_dir is not None or args.ledger_url:
        summary |= ingest_ledgers(
            spark, args.lake, args.data_dir, args.ledger_url, progress=progress
        )
    print(json.dumps(summary, indent=2))
    return 0
