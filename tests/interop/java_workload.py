"""The official Java clients' workload of the store-file tests (Apache RocketMQ -> mqaudit),
and the message-by-message check of the stores it leaves behind.

    sent = run(namesrv_addr)                 # sends, delayed sends, push consumer with failures
    check_stores(Workload(stores, confs, *sent))   # `mqaudit store verify` + `store dump`

Against any RocketMQ brokers (4.9, 5.x) on one name server: 16 plain sends and 4 sends with
delay level 2 to TOPIC, then GROUP consumes them answering RECONSUME_LATER for bodies
matching FAIL with --max-reconsume 1, so that 3 messages go SCHEDULE_TOPIC_XXXX (level 3) ->
%RETRY%GROUP -> %DLQ%GROUP.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker_runtime.common.message import UNIQ_KEY
from tests.interop import store_checks as sc
from tests.interop.rocketmq import java

TOPIC = "FromRocketMQ"
GROUP = "st_real"
RETRY, DLQ, SCHEDULE = f"%RETRY%{GROUP}", f"%DLQ%{GROUP}", "SCHEDULE_TOPIC_XXXX"
FAIL = "body-(3|7)"  # plain body-3, body-7 and delayed body-3 go to retry, then dead letters
PLAIN, DELAYED, FAILING = 16, 4, 3
Rows = list[dict[str, Any]]


@dataclass
class Workload:
    stores: dict[str, Path]  # broker name -> storePathRootDir
    confs: list[Path]  # each broker's config file (`mqbroker -c`)
    plain: Rows  # the Producer's acknowledgements
    delayed: Rows  # ... of the delay-level-2 sends
    deliveries: Rows  # the PushConsumer's lines


def run(namesrv: str) -> tuple[Rows, Rows, Rows]:
    """Acknowledgements of the plain and delayed sends, and the consumer's deliveries."""
    args = ["--namesrv", namesrv, "--topic", TOPIC, "--prop", "color=red"]
    plain = java("Producer", *args, "--count", str(PLAIN), "--keys", "r", "--tags", "TagR")
    delayed = java("Producer", *args, "--count", str(DELAYED), "--keys", "dl", "--tags", "TagD",
                   "--delay-level", "2")  # fmt: skip
    # Until every good delivery and 6 failed ones (3 first tries, 3 retries, which then go to
    # the DLQ: --max-reconsume 1), their send-backs done.
    deliveries = java(
        "PushConsumer", "--namesrv", namesrv, "--topic", TOPIC, "--group", GROUP,
        "--fail", FAIL, "--max-reconsume", "1", "--expect", str(PLAIN + DELAYED - FAILING),
        "--expect-failed", str(2 * FAILING), "--idle-ms", "60000",
    )  # fmt: skip
    errors = [r for r in plain + delayed if "error" in r]
    assert not errors, errors  # every send acknowledged: the check below compares the stores
    return (
        [r for r in plain if "status" in r],
        [r for r in delayed if "status" in r],
        [r for r in deliveries if "msgId" in r],
    )


def check_stores(w: Workload) -> dict[str, Rows]:
    """`store verify` finds every store consistent and `store dump` holds exactly what the Java
    side sent and what retries and delays made of it, each unit as sent; the dumps."""
    sends = w.plain + w.delayed
    assert [r["status"] for r in sends] == ["SEND_OK"] * (PLAIN + DELAYED)
    dumps: dict[str, Rows] = {}
    for name, store in w.stores.items():
        report = sc.verify(store)
        assert report["consistent"], report["problems"]
        dumps[name] = sc.dump(store)
        assert report["messages"] == len(dumps[name])
        for row in dumps[name]:
            assert row["crc_ok"] and row["store_host"].startswith("127.0.0.1:")

    def rows(name: str, topic: str, uniq: str, retry: bool | None = None) -> Rows:
        """The units of `topic` with this UNIQ_KEY (`retry`: only those of a retry, or none)."""
        return [
            r
            for r in dumps[name]
            if r["topic"] == topic
            and r["properties"][UNIQ_KEY] == uniq
            and retry in (None, "RETRY_TOPIC" in r["properties"])
        ]

    expected: Counter[tuple[str, str, str]] = Counter()  # (broker, topic, UNIQ_KEY)
    for ack in sends:
        b, uniq, i = ack["broker"], ack["msgId"], ack["i"]
        is_delayed = ack in w.delayed
        (row,) = rows(b, TOPIC, uniq)  # delivered (delayed ones by the schedule service)
        p = row["properties"]
        assert row["body"] == f"body-{i}" and p["color"] == "red"
        assert (p["KEYS"], p["TAGS"]) == ((f"dl-{i}", "TagD") if is_delayed else (f"r-{i}", "TagR"))
        assert row["queue_id"] == ack["queueId"]
        if is_delayed:  # the acknowledgement names the SCHEDULE_TOPIC_XXXX unit
            (sched,) = rows(b, SCHEDULE, uniq, retry=False)
            assert (sched["queue_id"], sched["properties"]["DELAY"]) == (1, "2")
            assert (sched["queue_offset"], sched["msg_id"]) == (
                ack["queueOffset"],
                ack["offsetMsgId"],
            )
            assert sched["properties"]["REAL_TOPIC"] == TOPIC
            assert int(sched["properties"]["REAL_QID"]) == ack["queueId"]
            assert sched["phys_offset"] < row["phys_offset"]
            expected[(b, SCHEDULE, uniq)] += 1
        else:
            assert (row["queue_offset"], row["msg_id"]) == (ack["queueOffset"], ack["offsetMsgId"])
        expected[(b, TOPIC, uniq)] += 1
    failed = [d for d in w.deliveries if d["answer"] == "RECONSUME_LATER"]
    first_failures = [d for d in failed if d["reconsumeTimes"] == 0]
    assert len(first_failures) == FAILING and len(failed) == 2 * FAILING, failed
    for d in first_failures:
        b = next(a["broker"] for a in sends if a["msgId"] == d["msgId"])
        origin = rows(b, TOPIC, d["msgId"])[0]
        for topic, times in ((RETRY, 1), (DLQ, 2)):
            (row,) = rows(b, topic, d["msgId"])
            p = row["properties"]
            assert row["body"] == d["body"] and row["reconsume_times"] == times
            assert (p["RETRY_TOPIC"], p["ORIGIN_MESSAGE_ID"]) == (TOPIC, origin["msg_id"])
            assert (p["KEYS"], p["TAGS"]) == (d["keys"], d["tags"])
            expected[(b, topic, d["msgId"])] += 1
        (back,) = rows(b, SCHEDULE, d["msgId"], retry=True)  # level 3: 3 + reconsume times 0
        assert back["queue_id"] == 2 and back["properties"]["REAL_TOPIC"] == RETRY
        expected[(b, SCHEDULE, d["msgId"])] += 1
    stored = Counter(
        (name, r["topic"], r["properties"][UNIQ_KEY]) for name, rs in dumps.items() for r in rs
    )
    assert stored == expected  # nothing missing, nothing extra
    consumed = {d["msgId"] for d in w.deliveries if d["answer"] == "CONSUME_SUCCESS"}
    assert len(consumed) == PLAIN + DELAYED - FAILING
    return dumps
