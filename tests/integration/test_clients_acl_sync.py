"""Clients with ACL keys on a cluster with ACL on, through the blocking facades."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from broker_runtime.client.admin import MQAdmin
from broker_runtime.client.config import ClientConfig
from broker_runtime.client.consumer_options import ConsumerOptions
from broker_runtime.client.lite_pull_consumer import LitePullConsumer
from broker_runtime.client.model import (
    ConsumeFromWhere,
    MQBrokerError,
    MQClientError,
    ReceivedMessage,
    new_message,
)
from broker_runtime.client.producer import Producer
from broker_runtime.client.push_consumer import PushConsumer
from broker_runtime.client.sync import SyncLitePullConsumer, SyncProducer
from broker_runtime.common import aio
from broker_runtime.remoting.protocol import ResponseCode
from tests.integration.cluster_fixtures import running_cluster

pytestmark = pytest.mark.integration

ADMIN = ("adminKey01", "adminSecret01")
APP = ("appKey0001", "appSecret01")
ACCOUNTS = {
    "accounts": [
        {"accessKey": ADMIN[0], "secretKey": ADMIN[1], "admin": True},
        {
            "accessKey": APP[0],
            "secretKey": APP[1],
            "defaultTopicPerm": "DENY",
            "defaultGroupPerm": "DENY",
            "topicPerms": ["Orders=PUB|SUB", "Audit=SUB"],
            "groupPerms": ["orders-app=SUB"],
        },
    ]
}


def test_signed_clients_work_and_unpermitted_ones_get_a_clear_error(tmp_path: Path) -> None:
    acl = tmp_path / "acl.json"
    acl.write_text(json.dumps(ACCOUNTS))
    with running_cluster(tmp_path / "c", name_servers=1, slaves=False, acl=acl) as cluster:
        ns = cluster.namesrv_addr

        def cfg(keys: tuple[str, str] | None) -> ClientConfig:
            ak, sk = keys if keys else (None, None)
            return ClientConfig(ns, access_key=ak, secret_key=sk)

        async def create() -> None:
            async with MQAdmin(cfg(ADMIN)) as admin:
                await admin.topic_create("Orders", 2)
                await admin.topic_create("Audit", 2)
            async with MQAdmin(cfg(APP)) as app:
                with pytest.raises(MQBrokerError) as refused:  # admin-only operation
                    await app.topic_create("Other", 2)
            assert refused.value.code == ResponseCode.NO_PERMISSION

        aio.run(create())

        with SyncProducer(Producer(cfg(APP), "orders-producer")) as producer:
            for _ in range(50):  # the brokers register the new topics with the name server
                try:
                    first = producer.send(new_message("Orders", b"o-0", keys="k0"))
                    break
                except MQClientError:
                    time.sleep(0.1)
            else:
                raise AssertionError("topic Orders never became sendable")
            results = [first] + [
                producer.send(new_message("Orders", f"o-{i}".encode())) for i in range(1, 20)
            ]
            batch = producer.send_batch([new_message("Orders", b"b") for _ in range(5)])
            assert len(batch.msg_ids) == 5
            with pytest.raises(MQClientError, match="code 16"):  # NO_PERMISSION
                producer.send(new_message("Audit", b"not allowed"))  # SUB only
        with SyncProducer(Producer(cfg(None), "anonymous")) as anonymous:
            with pytest.raises(MQClientError):
                anonymous.send(new_message("Orders", b"unsigned"))

        with SyncLitePullConsumer(
            LitePullConsumer(
                cfg(APP),
                "orders-app",
                options=ConsumerOptions(consume_from=ConsumeFromWhere.FIRST_OFFSET),
            )
        ) as consumer:
            consumer.subscribe("Orders")
            got: list[ReceivedMessage] = []
            for _ in range(100):
                got += consumer.poll(1.0)
                if len(got) >= 25:
                    break
            consumer.commit()
        assert {m.msg_id for m in got} == {r.msg_id for r in results} | set(batch.msg_ids)

        async def refused_consumers() -> None:
            for keys, group in ((APP, "not-my-group"), ((APP[0], "wrong-secret"), "orders-app")):
                consumer = PushConsumer(cfg(keys), group, lambda msgs, ctx: None)
                consumer.subscribe("Orders")
                with pytest.raises(MQBrokerError) as refused:  # not a silent idle consumer
                    await consumer.start()
                assert refused.value.code == ResponseCode.NO_PERMISSION
                assert not consumer.running

        aio.run(refused_consumers())
