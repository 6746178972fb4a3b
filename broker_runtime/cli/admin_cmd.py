"""`mqaudit admin ...`: mqadmin's topic and group views (tables, or `--json`)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Awaitable, Callable
from typing import Any

from broker_runtime.cli.client_args import add_target, client_config, print_table
from broker_runtime.client.admin import MQAdmin
from broker_runtime.client.model import MQClientError, ReceivedMessage
from broker_runtime.common import aio
from broker_runtime.common.clock import format_ms, parse_time_ms
from broker_runtime.remoting.connection import RemotingError

BODY_SHOWN = 256


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    admin = sub.add_parser("admin", help="topics, consumer progress, messages (as mqadmin)")
    cmds = admin.add_subparsers(dest="admin_cmd", required=True)

    def cmd(name: str, help: str, func: Callable[[argparse.Namespace], int]) -> Any:
        p = cmds.add_parser(name, help=help)
        add_target(p)
        p.add_argument("--json", action="store_true", help="JSON instead of a table")
        p.set_defaults(func=func)
        return p

    p = cmd("topic-status", "per queue: min/max offset, last update", cmd_topic_status)
    p.add_argument("--topic", required=True)
    p = cmd("consumer-progress", "per queue: broker and consumer offset, diff", cmd_progress)
    p.add_argument("--group", required=True)
    p.add_argument("--topic", default=None)
    p = cmd("query-msg", "a message by id (UNIQ_KEY or offset id) or by key", cmd_query)
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--id", default=None)
    what.add_argument("--key", default=None)
    p.add_argument("--topic", default=None, help="needed for --key and for UNIQ_KEY ids")
    p.add_argument("--max", type=int, default=32, help="messages per broker, with --key")
    p = cmd("reset-offset-by-time", "move a group's offsets to a time", cmd_reset)
    p.add_argument("--group", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--timestamp", required=True, help="epoch ms, ISO 8601 (UTC) or now")
    p = cmd("topic-create", "create or update a topic on masters", cmd_topic_create)
    p.add_argument("--topic", required=True)
    p.add_argument("--queues", type=int, default=4, help="read and write queues per broker")
    p.add_argument("--brokers", default=None, help="broker names, comma separated (default all)")
    cmd("topic-list", "every topic the name server knows", cmd_topic_list)


def _run(args: argparse.Namespace, work: Callable[[MQAdmin], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        async with MQAdmin(client_config(args)) as admin:
            return await work(admin)

    try:
        return aio.run(main())
    except (MQClientError, RemotingError) as e:
        raise ValueError(str(e)) from e  # main() prints it and exits 2


def _emit(args: argparse.Namespace, data: Any, table: Callable[[], None]) -> int:
    if args.json:
        print(json.dumps(data))
    else:
        table()
    return 0


def cmd_topic_status(args: argparse.Namespace) -> int:
    rows = _run(args, lambda a: a.topic_status(args.topic))
    table = [
        [r["brokerName"], r["queueId"], r["minOffset"], r["maxOffset"],
         format_ms(r["lastUpdateTimestamp"])]
        for r in rows
    ]  # fmt: skip
    headers = ["#Broker Name", "#QID", "#Min Offset", "#Max Offset", "#Last Updated"]
    return _emit(args, rows, lambda: print_table(headers, table))


def cmd_progress(args: argparse.Namespace) -> int:
    rows = _run(args, lambda a: a.consumer_progress(args.group, args.topic))

    def table() -> None:
        print_table(
            ["#Topic", "#Broker Name", "#QID", "#Broker Offset", "#Consumer Offset", "#Diff",
             "#LastTime"],
            [
                [r["topic"], r["brokerName"], r["queueId"], r["brokerOffset"],
                 r["consumerOffset"], r["diff"], format_ms(r["lastTimestamp"])]
                for r in rows
            ],
        )  # fmt: skip
        print(f"\nDiff Total: {sum(r['diff'] for r in rows)}")

    return _emit(args, rows, table)


def _message_dict(m: ReceivedMessage) -> dict[str, Any]:
    return {
        "msgId": m.msg_id,
        "offsetMsgId": m.offset_msg_id,
        "topic": m.topic,
        "brokerName": m.broker,
        "queueId": m.queue_id,
        "queueOffset": m.queue_offset,
        "commitLogOffset": m.msg.phys_offset,
        "tags": m.tags,
        "keys": m.keys,
        "reconsumeTimes": m.reconsume_times,
        "bornTimestamp": m.born_timestamp,
        "storeTimestamp": m.store_timestamp,
        "bornHost": "{}:{}".format(*m.msg.born_host),
        "storeHost": "{}:{}".format(*m.store_host),
        "sysFlag": m.msg.sys_flag,
        "properties": m.properties,
        "bodyLength": len(m.body),
        "body": m.body[:BODY_SHOWN].decode("utf-8", "replace"),
    }


def cmd_query(args: argparse.Namespace) -> int:
    if args.key is not None and args.topic is None:
        raise ValueError("--key needs --topic")
    if args.id is not None:
        msgs = _run(args, lambda a: a.query_by_id(args.id, args.topic))
    else:
        msgs = _run(args, lambda a: a.query_by_key(args.topic, args.key, args.max))
    rows = [_message_dict(m) for m in msgs]

    def table() -> None:
        if args.key is not None:
            print_table(
                ["#Message ID", "#Broker Name", "#QID", "#Offset", "#Store Time"],
                [[r["msgId"], r["brokerName"], r["queueId"], r["queueOffset"],
                  format_ms(r["storeTimestamp"])] for r in rows],
            )  # fmt: skip
            return
        for r in rows:
            for k, v in r.items():
                if k.endswith("Timestamp"):
                    v = format_ms(v)
                print(f"{k + ':':<18}{v}")
            print()

    if not rows:
        raise ValueError("no message found")
    return _emit(args, rows, table)


def cmd_reset(args: argparse.Namespace) -> int:
    ts = parse_time_ms(args.timestamp)
    rows = _run(args, lambda a: a.reset_offset_by_time(args.group, args.topic, ts))
    return _emit(
        args,
        rows,
        lambda: print_table(
            ["#brokerName", "#queueId", "#offset"],
            [[r["brokerName"], r["queueId"], r["offset"]] for r in rows],
        ),
    )


def cmd_topic_create(args: argparse.Namespace) -> int:
    if args.queues <= 0:
        raise ValueError("--queues must be positive")
    brokers = args.brokers.split(",") if args.brokers else None
    done = _run(args, lambda a: a.topic_create(args.topic, args.queues, brokers))
    result = {"topic": args.topic, "queues": args.queues, "brokers": done}
    return _emit(args, result, lambda: print(f"create topic {args.topic} on {', '.join(done)}: OK"))


def cmd_topic_list(args: argparse.Namespace) -> int:
    topics = _run(args, lambda a: a.topic_list())
    return _emit(args, topics, lambda: print("\n".join(topics)))
