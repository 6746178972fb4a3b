"""mqaudit's TransactionProducer against Apache RocketMQ 4.9.7's broker: a commit, a rollback
and an unknown transaction that the real broker's check-back asks about and our producer then
commits. The official push consumer gets exactly the two committed messages, and the real
broker's store has the same transaction units as for the official TransactionMQProducer
(tests/interop/test_transactions.py's `shape` holds both to RocketMQ 4.9's layout)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from broker_runtime.client.model import new_message
from broker_runtime.client.transaction_producer import LocalTransactionState as S
from broker_runtime.client.transaction_producer import TransactionProducer, TransactionSendResult
from broker_runtime.common.message import UNIQ_KEY
from tests.integration.test_clients_cluster import config
from tests.integration.test_transactions_cluster import Listener
from tests.interop.rocketmq import broker_settings, java, mqadmin, real_namesrv, start_broker
from tests.interop.test_transactions import GROUP, TOPIC, shape, transaction_units

pytestmark = [pytest.mark.integration, pytest.mark.interop]


def test_our_transaction_producer_commits_rolls_back_and_answers_the_real_check_back(
    interop_classpath: str, tmp_path: Path
) -> None:
    listener = Listener(
        execute={"c": S.COMMIT_MESSAGE, "r": S.ROLLBACK_MESSAGE, "u": S.UNKNOW},
        check={"u": S.COMMIT_MESSAGE},
    )

    async def transactions(ns: str) -> tuple[dict[str, TransactionSendResult], list[Any]]:
        async with TransactionProducer(config(ns, "our-tx"), GROUP, listener) as producer:
            sent = {b: await producer.send_in_transaction(new_message(TOPIC, b.encode()))
                    for b in ("c", "r", "u")}  # fmt: skip
            # The producer stays up to answer the check-back while the consumer waits.
            got = await asyncio.to_thread(
                java, "PushConsumer", "--namesrv", ns, "--topic", TOPIC, "--group", "tx-ours",
                "--expect", "2", "--idle-ms", "60000", timeout=180,
            )  # fmt: skip
        return sent, got

    with real_namesrv(tmp_path / "ns") as ns:
        settings = broker_settings(
            tmp_path / "b", ns.addr,
            transactionTimeOut="3000", transactionCheckInterval="1000", transactionCheckMax="5",
        )  # fmt: skip
        broker = start_broker(tmp_path / "b", settings)
        try:
            out = mqadmin(
                ns.addr, "updateTopic", "-b", broker.addr, "-t", TOPIC, "-r", "4", "-w", "4"
            )
            assert "success" in out, out
            sent, got = asyncio.run(transactions(ns.addr))
        finally:
            broker.stop()
    assert all(r.send.status.value == "SEND_OK" for r in sent.values())
    assert sorted(r["body"] for r in got if "body" in r) == ["c", "u"]
    delivered = {r["body"]: r["msgId"] for r in got if "body" in r}
    assert delivered == {b: sent[b].send.msg_id for b in ("c", "u")}
    assert listener.checks.get("u", 0) >= 1  # the real broker asked, our producer answered
    assert listener.checks.get("c", 0) == listener.checks.get("r", 0) == 0
    units = transaction_units(Path(settings["storePathRootDir"]))
    assert shape(units)["rechecked_u"]
    halves = {h["body"]: h for h in units["half"]}
    assert {b: halves[b.encode()]["properties"][UNIQ_KEY] for b in "cru"} == {
        b: r.send.msg_id for b, r in sent.items()
    }
