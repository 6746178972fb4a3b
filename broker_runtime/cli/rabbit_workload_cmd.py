"""`mqaudit rabbit-workload`: RabbitMQ's fault scenarios on a broker, truth.json written.

Runs `broker_runtime.workload.rabbit.run_rabbit_faults` in the virtual host of `--amqp`
(its exchanges and queues are declared there), with the ledgers under `--data-dir`; the
truth lists the findings the audit must give. The summary on stdout counts them per kind.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "rabbit-workload", help="RabbitMQ fault scenarios with the pika ledger hooks; truth.json"
    )
    p.add_argument("--amqp", required=True, help="amqp://USER:PASS@HOST:PORT/VHOST")
    p.add_argument("--data-dir", type=Path, required=True, help="the ledgers go to DIR/ledger/")
    p.add_argument("--truth", type=Path, required=True, help="where to write truth.json")
    p.add_argument("--seed", type=int, default=0, help="how many messages each fault takes")
    p.set_defaults(func=cmd_rabbit_workload)


def cmd_rabbit_workload(args: argparse.Namespace) -> int:
    from broker_runtime.workload.rabbit import run_rabbit_faults

    if not args.amqp.startswith(("amqp://", "amqps://")):
        raise ValueError(f"--amqp must be an amqp:// URL, got {args.amqp!r}")
    truth = run_rabbit_faults(args.amqp, args.data_dir, args.seed)
    doc = {"system": "rabbitmq", "seed": args.seed, "findings": truth}
    args.truth.parent.mkdir(parents=True, exist_ok=True)
    args.truth.write_text(json.dumps(doc, indent=2))
    print(json.dumps({"findings": dict(Counter(t["kind"] for t in truth))}), flush=True)
    return 0
