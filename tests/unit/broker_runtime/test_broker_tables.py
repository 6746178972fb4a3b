"""Broker tables and config: topics.json, subscriptionGroup.json, consumer membership, config
files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker_runtime.broker.config_file import ConfigError, broker_config, config_to_json
from broker_runtime.broker.consumer_manager import ConsumerManager
from broker_runtime.broker.controller import BrokerController
from broker_runtime.broker.subscription_groups import SubscriptionGroupManager
from broker_runtime.broker.topic_config import TopicConfig, TopicConfigManager
from broker_runtime.common.config import BrokerConfig, BrokerRole, FlushMode, StoreConfig
from broker_runtime.common.message import Message
from broker_runtime.remoting.bodies import PERM_READ, ConsumerData, SubscriptionData
from broker_runtime.store.message_store import MessageStore


def test_topics_persist_in_rocketmq_shape(tmp_path: Path) -> None:
    m = TopicConfigManager(tmp_path)
    m.put(TopicConfig("T", 8, 8))
    data = json.loads((tmp_path / "config" / "topics.json").read_text())
    assert data["topicConfigTable"]["T"]["writeQueueNums"] == 8
    assert data["dataVersion"]["counter"] == 1
    again = TopicConfigManager(tmp_path)
    assert again.get("T") == TopicConfig("T", 8, 8)
    with pytest.raises(ValueError, match="queue count"):
        TopicConfig("T", 0, 4)
    with pytest.raises(ValueError, match="topic name"):
        TopicConfig("a b")


def test_groups_auto_create_and_persist(tmp_path: Path) -> None:
    m = SubscriptionGroupManager(tmp_path)
    cfg = m.find("G")
    assert cfg is not None and cfg.retry_max_times == 16
    assert SubscriptionGroupManager(tmp_path).table["G"] == cfg
    assert SubscriptionGroupManager(tmp_path / "x", auto_create=False).find("G") is None


def test_consumer_membership_changes() -> None:
    cm = ConsumerManager()
    conn1, conn2 = object(), object()
    data = ConsumerData("G", subscriptions=[SubscriptionData("T", "*")])
    assert cm.register("c1", conn1, data, 1000)
    assert not cm.register("c1", conn1, data, 2000)  # a plain heartbeat changes nothing
    assert cm.register("c2", conn2, data, 2000)
    changed = ConsumerData("G", subscriptions=[SubscriptionData("T", "A")])
    assert cm.register("c2", conn2, changed, 2500)  # a new subscription is a change
    assert cm.client_ids("G") == ["c1", "c2"]
    assert cm.expire(now_ms=122_200, expiry_ms=120_000) == ["G"]  # c1 went silent
    assert cm.client_ids("G") == ["c2"]
    assert cm.connection_closed(conn2) == ["G"]
    assert cm.client_ids("G") == [] and "G" not in cm.groups


def test_broker_config_from_file_dict(tmp_path: Path) -> None:
    cfg = broker_config(
        {
            "broker_name": "broker-b",
            "broker_id": "1",
            "role": "SLAVE",
            "port": "12345",
            "namesrv_addrs": "127.0.0.1:1; 127.0.0.1:2",
            "store": {"store_dir": str(tmp_path), "flush": "sync", "segment_size": "65536"},
        }
    )
    assert cfg.role is BrokerRole.SLAVE and cfg.broker_id == 1
    assert cfg.namesrv_addrs == ("127.0.0.1:1", "127.0.0.1:2")
    assert cfg.store.flush is FlushMode.SYNC and cfg.store.store_host == ("127.0.0.1", 12345)
    assert config_to_json(cfg)["store"]["segment_size"] == 65536
    with pytest.raises(ConfigError, match="unknown keys \\['brokerName'\\]"):
        broker_config({"brokerName": "x", "store_dir": str(tmp_path)})
    with pytest.raises(ConfigError, match="store_dir"):
        broker_config({})
    with pytest.raises(ValueError, match="brokerId other than 0"):
        broker_config({"role": "SLAVE", "broker_id": 0, "store_dir": str(tmp_path)})
    with pytest.raises(ConfigError, match="port"):
        broker_config({"port": "abc", "store_dir": str(tmp_path)})


def test_a_slave_reads_a_topic_its_log_holds_before_it_has_the_masters_table(
    tmp_path: Path,
) -> None:
    """Topics reach a slave by a copy of its master's table every few seconds, and not at
    all once the master is down: a pull for a topic created since then is served from the
    queues the replicated log built (read-only), instead of TOPIC_NOT_EXIST."""
    store_config = StoreConfig(tmp_path / "store")
    store = MessageStore(store_config)
    try:
        store.put_messages([Message("T", b"x", queue_id=q) for q in (0, 1, 1)])
        assert store.wait_dispatched(5.0)
        slave = BrokerController(BrokerConfig(store_config, role=BrokerRole.SLAVE, broker_id=1))
        master = BrokerController(BrokerConfig(StoreConfig(tmp_path / "m")))
        try:
            slave.store = master.store = store
            assert slave.topic_for_read("T", 3) == TopicConfig("T", 4, 4, PERM_READ)
            assert slave.topic_for_read("T", 0) == TopicConfig("T", 2, 2, PERM_READ)
            assert slave.topic_for_read("T", 5000) == TopicConfig("T", 1024, 1024, PERM_READ)
            assert slave.topic_for_read("Other", 0) is None  # nothing of it here
            assert master.topic_for_read("T", 0) is None  # a master knows its own topics
            slave.topics.put(TopicConfig("T", 8, 8))  # once copied, the master's table wins
            assert slave.topic_for_read("T", 3) == TopicConfig("T", 8, 8)
        finally:
            slave.executor.shutdown()
            master.executor.shutdown()
    finally:
        store.shutdown()
