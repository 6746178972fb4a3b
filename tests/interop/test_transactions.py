"""Transactions against the real thing: the official TransactionMQProducer commits, rolls
back and answers a check-back, on Apache RocketMQ's broker and on mqaudit's, and the units
each broker wrote (half, op, committed, re-checked half) have the same shape, read by
mqaudit's store reader."""

from __future__ import annotations

import base64
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from broker_runtime.common.message import (
    PRODUCER_GROUP,
    REAL_QUEUE_ID,
    REAL_TOPIC,
    TRAN_MSG,
    TRANSACTION_CHECK_TIMES,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_MASK,
)
from broker_runtime.common.topics import TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC
from broker_runtime.store.inspection import dump
from tests.db_servers import stop_process
from tests.integration.cluster_fixtures import running_cluster
from tests.interop.rocketmq import (
    _java_env,
    broker_settings,
    java,
    java_argv,
    mqadmin,
    real_namesrv,
    start_broker,
)

pytestmark = [pytest.mark.integration, pytest.mark.interop]

# c commits, r rolls back, u is unknown until its check-back commits it.
TXS = {"c": "COMMIT_MESSAGE", "r": "ROLLBACK_MESSAGE", "u": "UNKNOW/COMMIT_MESSAGE"}
TOPIC, GROUP = "TxInterop", "tx-java"


def transaction_units(store: Path) -> dict[str, list[dict[str, Any]]]:
    """A store's units of TOPIC's transactions, by kind: half, op, committed."""
    out: dict[str, list[dict[str, Any]]] = {"half": [], "op": [], "committed": []}
    kinds = {TRANS_HALF_TOPIC: "half", TRANS_OP_HALF_TOPIC: "op", TOPIC: "committed"}
    for row in dump(store):
        if row["topic"] in kinds:
            row["body"] = base64.b64decode(row["body"])
            out[kinds[row["topic"]]].append(row)
    return out


def shape(units: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """What must be equal between two brokers' stores for the same transactions, checking on
    the way what RocketMQ 4.9 writes for commit c, rollback r and unknown-then-committed u."""
    halves, ops, committed = units["half"], units["op"], units["committed"]
    first = {h["body"]: h for h in halves if TRANSACTION_CHECK_TIMES not in h["properties"]}
    assert set(first) == {b"c", b"r", b"u"}
    for h in halves:
        p = h["properties"]
        assert (h["queue_id"], h["sys_flag"] & TRANSACTION_MASK) == (0, 0)
        assert (p[REAL_TOPIC], p[TRAN_MSG], p[PRODUCER_GROUP]) == (TOPIC, "true", GROUP)
    rechecked = [h for h in halves if TRANSACTION_CHECK_TIMES in h["properties"]]
    assert rechecked and {h["body"] for h in rechecked} == {b"u"}
    assert rechecked[0]["properties"][TRANSACTION_CHECK_TIMES] == "1"
    assert rechecked[0]["born_timestamp"] == first[b"u"]["born_timestamp"]
    assert sorted(c["body"] for c in committed) == [b"c", b"u"]
    for c in committed:
        half = next(h for h in halves if h["phys_offset"] == c["prepared_transaction_offset"])
        assert c["sys_flag"] & TRANSACTION_MASK == TRANSACTION_COMMIT_TYPE
        assert c["queue_id"] == int(half["properties"][REAL_QUEUE_ID])
        assert c["properties"] == half["properties"]  # RocketMQ 4.9.7 keeps them all
    ended = {int(op["body"]) for op in ops}
    assert {first[b"c"]["queue_offset"], first[b"r"]["queue_offset"]} <= ended
    assert {h["queue_offset"] for h in rechecked} & ended
    return {
        "half_keys": sorted({k for h in halves for k in h["properties"]}),
        "op_properties": sorted({tuple(sorted(op["properties"].items())) for op in ops}),
        "committed_keys": sorted({k for c in committed for k in c["properties"]}),
        "op_queues": sorted({op["queue_id"] for op in ops}),
        "rechecked_u": len(rechecked) >= 1,
    }


@contextmanager
def transactions_running(namesrv: str, broker: str) -> Iterator[None]:
    """TOPIC made on `broker` by mqadmin; the Java producer sends the three transactions and
    stays up to answer check-backs until the official consumer has both committed messages."""
    out = mqadmin(namesrv, "updateTopic", "-b", broker, "-t", TOPIC, "-r", "4", "-w", "4")
    assert "success" in out, out
    argv = ["--namesrv", namesrv, "--topic", TOPIC, "--group", GROUP, "--linger-ms", "120000"]
    for body, answers in TXS.items():
        argv += ["--tx", f"{body}={answers}"]
    proc = subprocess.Popen(
        java_argv("TransactionProducer", *argv, "--await-checks", "1000"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=_java_env(),
    )
    try:
        got = java("PushConsumer", "--namesrv", namesrv, "--topic", TOPIC, "--group", "tx-c",
                   "--expect", "2", "--idle-ms", "60000", timeout=180)  # fmt: skip
        assert sorted(r["body"] for r in got if "body" in r) == ["c", "u"]
        yield
    finally:
        stop_process(proc)


def test_the_official_transaction_producer_gets_the_same_store_from_both_brokers(
    interop_classpath: str, tmp_path: Path
) -> None:
    with real_namesrv(tmp_path / "ns") as ns:
        settings = broker_settings(
            tmp_path / "b", ns.addr,
            transactionTimeOut="3000", transactionCheckInterval="1000", transactionCheckMax="5",
        )  # fmt: skip
        broker = start_broker(tmp_path / "b", settings)
        try:
            with transactions_running(ns.addr, broker.addr):
                pass
        finally:
            broker.stop()
    real = shape(transaction_units(Path(settings["storePathRootDir"])))

    ours = {
        "transaction_timeout_ms": "3000",
        "transaction_check_interval_ms": "1000",
        "transaction_check_max": "5",
    }
    with running_cluster(tmp_path / "m", name_servers=1, slaves=False, settings=ours) as c:
        with transactions_running(c.namesrv_addr, c.addr("broker-a-master")):
            pass
        store = c.store_dir("broker-a-master")
        c.stop("broker-a-master")
        ours = shape(transaction_units(store))
        assert ours == real, f"mqaudit {ours} != RocketMQ {real}"
