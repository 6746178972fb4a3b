"""`mqaudit produce`: send N messages to a topic; the last stdout line is
`{"sent": .., "failed": .., "statuses": {"SEND_OK": .., ...}}`: messages the broker stored,
messages it did not, and the stored ones by send status. Exit 1 unless every one is SEND_OK
(FLUSH_SLAVE_TIMEOUT and SLAVE_NOT_AVAILABLE are stored on the master only)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
from collections import Counter
from typing import Any

from broker_runtime.cli.client_args import add_target, client_config
from broker_runtime.client.model import MQClientError, SendStatus, new_message
from broker_runtime.client.producer import Producer
from broker_runtime.common import aio
from broker_runtime.common.message import Message
from broker_runtime.common.progress import Count, counter
from broker_runtime.remoting.connection import RemotingError

log = logging.getLogger(__name__)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("produce", help="send messages to a topic")
    add_target(p)
    p.add_argument("--topic", required=True)
    p.add_argument("--count", type=int, required=True, help="messages to send")
    p.add_argument("--size", type=int, default=128, help="body bytes per message")
    p.add_argument("--keys", action="store_true", help="give message i the key key-i")
    p.add_argument("--tags", default=None, help="tag every message")
    p.add_argument("--group", default="mqaudit-producer", help="producer group")
    p.add_argument("--concurrency", type=int, default=8, help="sends in flight")
    p.add_argument("--batch", type=int, default=1, help="messages per batch send")
    p.set_defaults(func=cmd_produce)


def body_of(i: int, size: int) -> bytes:
    """`size` bytes starting with the message number (readable in a dump)."""
    head = f"msg-{i}:".encode()
    return (head + b"x" * max(0, size - len(head)))[: max(size, 1)]


def message_of(args: argparse.Namespace, i: int) -> Message:
    return new_message(
        args.topic,
        body_of(i, args.size),
        tags=args.tags,
        keys=f"key-{i}" if args.keys else None,
    )


async def produce(args: argparse.Namespace) -> dict[str, Any]:
    with counter("sent", args.count) as progress:
        return await _produce(args, progress)


async def _produce(args: argparse.Namespace, progress: Count) -> dict[str, Any]:
    counts = {"sent": 0, "failed": 0}
    statuses: Counter[str] = Counter()
    next_i = iter(range(args.count))
    producer = Producer(client_config(args), args.group)
    await producer.start()

    async def worker() -> None:
        while True:
            chunk = [i for _, i in zip(range(args.batch), next_i, strict=False)]
            if not chunk:
                return
            msgs = [message_of(args, i) for i in chunk]
            try:
                if len(msgs) == 1:
                    result = await producer.send(msgs[0])
                else:
                    result = await producer.send_batch(msgs)
                counts["sent"] += len(msgs)
                statuses[result.status.value] += len(msgs)
            except (MQClientError, RemotingError) as e:
                counts["failed"] += len(msgs)
                log.warning("send failed: %s", e)
            rate = counts["sent"] / max(progress.elapsed(), 1e-9)
            progress.update(counts["sent"], f"failed {counts['failed']} ({rate:,.0f} msg/s)")

    try:
        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    finally:
        await producer.shutdown()
    return {**counts, "statuses": dict(sorted(statuses.items()))}


def cmd_produce(args: argparse.Namespace) -> int:
    for name in ("count", "size", "concurrency", "batch"):
        if getattr(args, name) <= 0:
            raise ValueError(f"--{name} must be positive")
    summary = aio.run(produce(args))
    print(json.dumps(summary))
    return 0 if summary["statuses"].get(SendStatus.SEND_OK, 0) == args.count else 1
