"""`mqaudit rabbit-workload`: RabbitMQ's fault scenarios on a broker, truth.json written.

Runs `broker_runtime.workload.rabbit.run_rabbit_faults` in the virtual host of `--amqp`
(its exchanges and queues are declared there), with the ledgers under `--data-dir`; the
truth lists the findings the audit must give. The summary on stdout counts them per kind.
With `--start-node` instead of `--amqp` it starts a RabbitMQ node of its own under
DATA_DIR/rabbitmq (broker_runtime.rabbit.node: 127.0.0.1, ephemeral ports), runs in its
virtual host `/`, and stops it by PID at the end, also on failure (its topology goes with
it: the ledgers and the truth stay).
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections import Counter
from pathlib import Path

from broker_runtime.common.progress import reporter

NODE_DIR = "rabbitmq"  # under --data-dir: the node --start-node starts


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "rabbit-workload", help="RabbitMQ fault scenarios with the pika ledger hooks; truth.json"
    )
    p.add_argument("--amqp", default=None, help="amqp://USER:PASS@HOST:PORT/VHOST")
    p.add_argument(
        "--start-node", action="store_true",
        help=f"no --amqp: start a RabbitMQ node of its own under DIR/{NODE_DIR} for the run",
    )  # fmt: skip
    p.add_argument("--data-dir", type=Path, required=True, help="the ledgers go to DIR/ledger/")
    p.add_argument("--truth", type=Path, required=True, help="where to write truth.json")
    p.add_argument("--seed", type=int, default=0, help="how many messages each fault takes")
    p.set_defaults(func=cmd_rabbit_workload)


def cmd_rabbit_workload(args: argparse.Namespace) -> int:
    if (args.amqp is None) == (not args.start_node):
        raise ValueError("give one of --amqp URL and --start-node")
    if args.amqp is not None and not args.amqp.startswith(("amqp://", "amqps://")):
        raise ValueError(f"--amqp must be an amqp:// URL, got {args.amqp!r}")
    if args.amqp is not None:
        return _run(args, args.amqp, None)
    from broker_runtime.rabbit.node import RABBIT_BIN, rabbitmq_available, rabbitmq_node

    if not rabbitmq_available():
        raise ValueError(f"--start-node: RabbitMQ is not installed ({RABBIT_BIN}/rabbitmq-server)")
    root = args.data_dir / NODE_DIR
    shutil.rmtree(root, ignore_errors=True)  # a fresh node: nothing left of an earlier run
    say = reporter("rabbit-workload")
    say(f"starting a RabbitMQ node under {root}")
    with rabbitmq_node(root) as node:
        say(f"node {node.node} up (AMQP port {node.amqp_port}, API {node.api_url})")
        code = _run(args, node.amqp_url(), node.node)
        say(f"stopping node {node.node}")
    return code


def _run(args: argparse.Namespace, amqp: str, node: str | None) -> int:
    from broker_runtime.workload.rabbit import run_rabbit_faults

    truth = run_rabbit_faults(amqp, args.data_dir, args.seed)
    doc = {"system": "rabbitmq", "seed": args.seed, "findings": truth}
    args.truth.parent.mkdir(parents=True, exist_ok=True)
    args.truth.write_text(json.dumps(doc, indent=2))
    summary = {"findings": dict(Counter(t["kind"] for t in truth))}
    print(json.dumps(summary | ({"node": node} if node else {})), flush=True)
    return 0
