"""Files, mqaudit -> Apache RocketMQ: the real 4.9 broker started on a store mqaudit's broker
wrote (after a clean stop, and after kill -9 under SYNC_FLUSH) recovers it without cutting
good data and serves every message to the official consumer, in order per queue, at the
queue and log offsets mqaudit gave it.

The store spans two 64 KiB CommitLog files (so the end-of-file blank unit is crossed), holds
single sends, a batch and a message still waiting in SCHEDULE_TOPIC_XXXX (level 6: minutes
on mqaudit, 1 s on the real broker, which delivers it from mqaudit's ConsumeQueue and
delayOffset.json). mqaudit's store dir is the real broker's storePathRootDir as it is.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from broker_runtime.client.model import new_message
from broker_runtime.client.producer import Producer
from broker_runtime.client.sync import SyncProducer
from broker_runtime.common.message import UNIQ_KEY
from tests.integration.cluster_fixtures import running_cluster
from tests.interop import store_checks as sc
from tests.interop.rocketmq import JavaServer, broker_settings, java, real_namesrv, start_broker

# JVMs boot in ~10 s on an idle machine, minutes at a load of 40: fixture set-up counts too.
pytestmark = [pytest.mark.integration, pytest.mark.interop, pytest.mark.timeout(600)]

TOPIC = "FromMqaudit"
SEGMENT = 64 << 10
MASTER = "broker-a-master"
DELAY_LEVEL = 6  # 2 min on mqaudit's default levels: still waiting when the broker stops
PROPS = {"c": "b"}
PAD = "x" * 2500  # 24 singles + a batch of 8 fill more than one 64 KiB CommitLog file


@dataclass
class Sent:
    msg_id: str
    body: str
    keys: str
    tags: str
    queue_id: int
    queue_offset: int


@dataclass
class Copies:
    namesrv: JavaServer
    clean: Path  # the store after a clean stop
    killed: Path  # ... after more SYNC_FLUSH sends and kill -9
    first: list[Sent]  # acknowledged before the clean stop
    second: list[Sent]  # acknowledged before kill -9
    delayed: Sent  # waiting in SCHEDULE_TOPIC_XXXX (queue, offset: its real queue, -1)


def _send(p: SyncProducer, n: int, keys: str, tags: str) -> list[Sent]:
    out = []
    for i in range(n):
        body = f"{keys}-{i}-{PAD}"
        m = new_message(TOPIC, body.encode(), tags=tags, keys=f"{keys}-{i}", properties=PROPS)
        r = p.send(m)
        out.append(Sent(r.msg_id, body, f"{keys}-{i}", tags, r.mq.queue_id, r.queue_offset))
    return out


@pytest.fixture(scope="module")
def copies(interop_classpath: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Copies]:
    tmp = tmp_path_factory.mktemp("mq-to-rocketmq")
    with (
        real_namesrv(tmp / "namesrv") as ns,
        running_cluster(
            tmp / "c", groups=("broker-a",), slaves=False, name_servers=1, flush="sync",
            segment_size=SEGMENT,
        ) as c,
    ):  # fmt: skip
        store = c.store_dir(MASTER)
        with SyncProducer(Producer(c.namesrv_addr, "st_producer")) as p:
            first = _send(p, 24, "s", "TagS")
            batch = [
                new_message(
                    TOPIC, f"b-{i}-{PAD}".encode(), tags="TagB", keys=f"b-{i}", properties=PROPS
                )
                for i in range(8)
            ]
            r = p.send_batch(batch)
            first += [
                Sent(mid, f"b-{i}-{PAD}", f"b-{i}", "TagB", r.mq.queue_id, r.queue_offset + i)
                for i, mid in enumerate(r.msg_ids)
            ]
            d = p.send(new_message(TOPIC, b"delayed-0", tags="TagD", keys="d-0",
                                   delay_level=DELAY_LEVEL))  # fmt: skip
            delayed = Sent(d.msg_id, "delayed-0", "d-0", "TagD", d.mq.queue_id, -1)
        c.stop(MASTER)
        assert not (store / "abort").exists()
        shutil.copytree(store, tmp / "clean")
        c.start(MASTER)
        with SyncProducer(Producer(c.namesrv_addr, "st_producer")) as p:
            second = _send(p, 10, "k", "TagK")
        c.kill(MASTER)
        assert (store / "abort").exists()  # the crash path of the real broker's recovery
        shutil.copytree(store, tmp / "killed")
        yield Copies(ns, tmp / "clean", tmp / "killed", first, second, delayed)


def _serve(copies: Copies, store: Path, expect: int) -> list[dict[str, Any]]:
    """Start a real broker on `store`, pull TOPIC with the official lite-pull consumer."""
    home = store.parent / f"real-{store.name}"
    settings = broker_settings(
        home, copies.namesrv.addr, brokerName="broker-s", storePathRootDir=str(store),
        storePathCommitLog=str(store / "commitlog"), flushDiskType="SYNC_FLUSH",
        **sc.same_file_sizes(SEGMENT),
    )  # fmt: skip
    broker = start_broker(home, settings)
    try:
        rows = java(
            "LitePullConsumer", "--namesrv", copies.namesrv.addr, "--topic", TOPIC,
            "--group", f"st_pull_{store.name}", "--expect", str(expect), "--idle-ms", "20000",
        )  # fmt: skip
    finally:
        broker.stop()
    return [r for r in rows if "msgId" in r]


def _check_served(store: Path, copies: Copies, sent: list[Sent]) -> None:
    before = sc.dump(store)
    end, ends = sc.log_end(before), sc.queue_ends(store)
    good = sc.log_bytes(store, end)
    phys = {r["properties"][UNIQ_KEY]: r["phys_offset"] for r in before if r["topic"] == TOPIC}
    assert sorted(phys) == sorted(s.msg_id for s in sent)  # mqaudit's own view first

    got = _serve(copies, store, len(sent) + 1)

    assert sc.log_bytes(store, end) == good, "the real broker changed mqaudit's CommitLog"
    after = sc.queue_ends(store)
    delayed_q = (TOPIC, copies.delayed.queue_id)
    for key, n in ends.items():
        assert after[key] == n + (key == delayed_q), key  # only the delivered delay added
    received = {r["msgId"]: r for r in got}
    assert len(received) == len(got), "a message served twice"
    assert set(received) == {s.msg_id for s in sent} | {copies.delayed.msg_id}
    for s in sent:
        r = received[s.msg_id]
        assert (r["topic"], r["body"], r["keys"], r["tags"]) == (TOPIC, s.body, s.keys, s.tags)
        assert r["properties"]["c"] == PROPS["c"] and r["properties"][UNIQ_KEY] == s.msg_id
        assert (r["queueId"], r["queueOffset"]) == (s.queue_id, s.queue_offset), s.keys
        assert r["commitLogOffset"] == phys[s.msg_id]
    d = received[copies.delayed.msg_id]
    want = ("delayed-0", "d-0", "TagD", copies.delayed.queue_id)
    assert (d["body"], d["keys"], d["tags"], d["queueId"]) == want
    assert d["queueOffset"] == ends[delayed_q] and d["commitLogOffset"] >= end
    for key, offsets in sc.by_queue(got).items():
        assert offsets == list(range(after[key])), f"{key} not served in order"
    report = sc.verify(store)  # and mqaudit reads what the real broker made of it
    assert report["consistent"], report["problems"]


def test_real_broker_serves_a_store_mqaudit_stopped_cleanly(copies: Copies) -> None:
    _check_served(copies.clean, copies, copies.first)


def test_real_broker_recovers_a_store_mqaudit_crashed_under_sync_flush(copies: Copies) -> None:
    _check_served(copies.killed, copies, copies.first + copies.second)
