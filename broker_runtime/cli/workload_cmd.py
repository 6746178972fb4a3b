"""`mqaudit workload`: run the fault scenarios against the cluster in DIR, write truth.json.

Progress goes to stderr; the last stdout line is the JSON summary (finding counts per
scenario and kind, and the duplicate deliveries of the rebalance with the lock off and on).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from broker_runtime.workload.plan import SCENARIOS


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "workload", help="run producers and consumers with injected faults; write truth.json"
    )
    p.add_argument("--data-dir", type=Path, required=True, help="a running cluster's data dir")
    p.add_argument(
        "--messages", type=int, required=True, help="messages in all, split over the scenarios"
    )
    p.add_argument(
        "--scenario",
        default="all",
        help=f"all, or one or more (comma-separated) of: {', '.join(SCENARIOS)}",
    )
    p.add_argument("--truth", type=Path, required=True, help="where to write truth.json")
    p.add_argument("--seed", type=int, default=0, help="where the faults land")
    p.add_argument(
        "--ledger-url", default=None,
        help="one database for every ledger (default: SQLite files under each cluster dir)",
    )  # fmt: skip
    p.set_defaults(func=cmd_workload)


def cmd_workload(args: argparse.Namespace) -> int:
    if args.messages <= 0:
        raise ValueError("--messages must be positive")
    # Imported here: every node process runs this CLI, and the clients and ledgers it
    # loads (SQLAlchemy among them) would slow each start.
    from broker_runtime.common import aio
    from broker_runtime.workload import runner

    logging.basicConfig(level=logging.ERROR)  # the clients' warnings are expected here
    from broker_runtime.workload.harness import WorkloadError

    try:
        summary, ok = aio.run(
            runner.run(
                args.data_dir, args.messages, args.scenario, args.truth, args.seed, args.ledger_url
            )
        )
    except WorkloadError as e:  # before any scenario ran: no cluster there, nodes down
        print(f"mqaudit: {e}", file=sys.stderr)
        return 2
    print(json.dumps(summary), flush=True)
    return 0 if ok else 1
