"""`mqaudit consume`: consume a topic as a group member until `--count` messages arrived or
none arrived for `--timeout` seconds; the last stdout line is
`{"consumed": .., "unique": ..}` (deliveries, and distinct message ids among them).

Exit 1, with the reason on stderr and in the summary, when a broker refused the consumer
(`"refused"`: ACL) or when it stopped with messages left in queues it could not read past
(`"stuck"`: queue, offset, the queue's max offset and the last pull error)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from broker_runtime.cli.client_args import add_target, client_config
from broker_runtime.client.consume_service import ConsumeContext
from broker_runtime.client.consumer_base import ConsumerBase
from broker_runtime.client.consumer_options import ConsumerOptions
from broker_runtime.client.model import (
    ConsumeFromWhere,
    ConsumeStatus,
    MessageModel,
    MQClientError,
    ReceivedMessage,
)
from broker_runtime.client.push_consumer import PushConsumer
from broker_runtime.common import aio
from broker_runtime.common.clock import parse_time_ms
from broker_runtime.common.progress import Count, counter

FROM = {
    "first": ConsumeFromWhere.FIRST_OFFSET,
    "last": ConsumeFromWhere.LAST_OFFSET,
    "timestamp": ConsumeFromWhere.TIMESTAMP,
}


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("consume", help="consume a topic as a member of a group")
    add_target(p)
    p.add_argument("--group", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--count", type=int, default=None, help="stop after this many messages")
    p.add_argument(
        "--timeout", type=float, default=10.0, help="stop after this many seconds with no message"
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument("--tags", default="*", help="tag expression: * or 'TAGA || TAGB'")
    which.add_argument(
        "--sql", default=None, help="SQL92 over message properties (broker: enable_property_filter)"
    )
    p.add_argument(
        "--from",
        dest="consume_from",
        choices=sorted(FROM),
        default="first",
        help="where a group without a committed offset starts",
    )
    p.add_argument("--timestamp", default=None, help="with --from timestamp: ms, ISO or now")
    p.add_argument("--broadcast", action="store_true", help="broadcasting instead of clustering")
    p.add_argument("--offsets-dir", type=Path, default=None, help="broadcasting offset files")
    p.add_argument("--threads", type=int, default=8, help="messages consumed at once")
    p.set_defaults(func=cmd_consume)


async def stuck_queues(consumer: ConsumerBase) -> list[dict[str, Any]]:
    """Queues this consumer owns whose messages it has not consumed to the end."""
    stuck = []
    for mq in sorted(consumer.pq_table):
        offset = consumer.offset_store.table.get(mq)
        error = consumer.pull_errors.get(mq)
        try:
            high = await consumer.max_offset(mq)
        except Exception as e:
            high, error = -1, f"max offset unknown: {e}"
        if high < 0 or (offset is not None and offset < high):
            where = f"{mq.topic}@{mq.broker}:{mq.queue_id}"
            stuck.append(
                {"queue": where, "offset": offset, "max_offset": high, "last_error": error}
            )
    return stuck


async def consume(args: argparse.Namespace) -> dict[str, Any]:
    with counter("consumed", args.count) as progress:
        return await _consume(args, progress)


async def _consume(args: argparse.Namespace, progress: Count) -> dict[str, Any]:
    seen: set[str] = set()
    counts = {"consumed": 0, "unique": 0}
    enough = asyncio.Event()
    last_arrival = [time.monotonic()]

    async def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeStatus:
        for m in msgs:
            counts["consumed"] += 1
            seen.add(m.msg_id)
        counts["unique"] = len(seen)
        last_arrival[0] = time.monotonic()
        if args.count is not None and counts["consumed"] >= args.count:
            enough.set()
        progress.update(counts["consumed"], f"unique {counts['unique']}")
        return ConsumeStatus.CONSUME_SUCCESS

    offsets_dir = args.offsets_dir
    if offsets_dir is None and args.data_dir is not None:
        offsets_dir = args.data_dir / "consumer-offsets"
    consumer = PushConsumer(
        client_config(args),
        args.group,
        listener,
        options=ConsumerOptions(
            message_model=MessageModel.BROADCASTING if args.broadcast else MessageModel.CLUSTERING,
            consume_from=FROM[args.consume_from],
            consume_timestamp_ms=parse_time_ms(args.timestamp) if args.timestamp else None,
            offsets_dir=offsets_dir,
            suspend_ms=min(15_000, max(1000, int(args.timeout * 500))),
        ),
        threads=args.threads,
    )
    if args.sql is not None:
        consumer.subscribe(args.topic, args.sql, "SQL92")
    else:
        consumer.subscribe(args.topic, args.tags)
    try:
        await consumer.start()
    except MQClientError as e:
        return {**counts, "refused": str(e)}
    outcome: dict[str, Any] = {}
    try:
        while not enough.is_set() and time.monotonic() - last_arrival[0] < args.timeout:
            if consumer.instance.api.refused is not None:  # e.g. permissions changed since
                outcome["refused"] = str(consumer.instance.api.refused)
                break
            try:
                await asyncio.wait_for(enough.wait(), 0.2)
            except TimeoutError:
                progress.update(counts["consumed"], f"unique {counts['unique']}")
        if not enough.is_set() and not outcome:
            stuck = await stuck_queues(consumer)
            if stuck:
                outcome["stuck"] = stuck
    finally:
        await consumer.shutdown(grace_s=5.0)
    return {**counts, **outcome}


def cmd_consume(args: argparse.Namespace) -> int:
    if args.count is not None and args.count <= 0:
        raise ValueError("--count must be positive")
    if args.timeout <= 0 or args.threads <= 0:
        raise ValueError("--timeout and --threads must be positive")
    if args.consume_from == "timestamp" and args.timestamp is None:
        raise ValueError("--from timestamp needs --timestamp")
    summary = aio.run(consume(args))
    print(json.dumps(summary))
    if "refused" in summary:
        print(f"mqaudit: the broker refused this consumer: {summary['refused']}", file=sys.stderr)
        return 1
    for q in summary.get("stuck", []):
        print(
            f"mqaudit: queue {q['queue']} stuck at offset {q['offset']} of {q['max_offset']}: "
            f"{q['last_error'] or 'nothing arrived'}",
            file=sys.stderr,
        )
    return 1 if "stuck" in summary else 0
