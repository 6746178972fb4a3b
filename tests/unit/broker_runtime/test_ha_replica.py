"""Replication without sockets: the HA frames, and a slave store built from a master's bytes
in arbitrary chunks (units and segment blanks cut anywhere) equals the master's."""

from __future__ import annotations

import dataclasses
import random

import pytest

from broker_runtime.broker.message_filter import parse_subscription
from broker_runtime.broker.pull_reader import read_queue
from broker_runtime.common.config import StoreConfig
from broker_runtime.common.message import KEYS, TAGS, Message
from broker_runtime.ha.protocol import (
    HAProtocolError,
    decode_report,
    decode_transfer_header,
    encode_report,
    encode_transfer,
)
from broker_runtime.store import record_codec as codec
from broker_runtime.store.message_store import MessageStore
from broker_runtime.store.replica import ReplicaError, ReplicaWriter


def test_frames() -> None:
    assert decode_report(encode_report(12345)) == 12345
    frame = encode_transfer(99, b"abc")
    assert decode_transfer_header(frame[:12]) == (99, 3) and frame[12:] == b"abc"
    with pytest.raises(HAProtocolError):
        decode_report(encode_report(-1))
    with pytest.raises(HAProtocolError):
        decode_transfer_header(encode_transfer(-5, b""))


def test_slave_copy_equals_master(small_config: StoreConfig) -> None:
    master = MessageStore(small_config)
    slave_cfg = dataclasses.replace(small_config, store_dir=small_config.store_dir.parent / "s")
    slave = MessageStore(slave_cfg)
    rng = random.Random(7)
    try:
        for i in range(600):  # several 64 KiB segments, each closed by a blank unit
            body = bytes(rng.randrange(256) for _ in range(rng.randrange(10, 400)))
            master.put_message(Message(f"T{i % 3}", body, {KEYS: f"k{i}"}, queue_id=i % 2))
        writer = ReplicaWriter(slave)
        offset = 0
        while offset < master.commit_log.max_offset:
            chunk = master.read_log(offset, rng.randrange(1, 5000))
            assert chunk is not None
            assert writer.append(offset, chunk) == offset + len(chunk)
            offset += len(chunk)
        with pytest.raises(ReplicaError, match="ends at"):
            writer.append(offset - 10, b"x")
        master.wait_dispatched()
        slave.wait_dispatched()
        assert slave.commit_log.max_offset == master.commit_log.max_offset
        for key, cq in master.queues().items():
            assert slave.max_offset(*key) == cq.max_offset
            got = slave.get_messages(key[0], key[1], 0, 1000).messages
            assert got == master.get_messages(key[0], key[1], 0, 1000).messages
        assert [m.body for m in slave.query_by_key("T1", "k7")] == [
            m.body for m in master.query_by_key("T1", "k7")
        ]
        # Bytes that are not message units are refused and taken back.
        end = slave.commit_log.max_offset
        with pytest.raises(ReplicaError, match="not message units"):
            writer.append(end, b"\x00\x00\x01\x00" + b"\x12\x34\x56\x78" * 70)
        assert slave.commit_log.max_offset == end
    finally:
        master.shutdown()
        slave.shutdown()


def test_slave_queues_carry_the_masters_tag_codes_and_serve_pulls_by_tag(
    small_config: StoreConfig,
) -> None:
    """The slave builds its ConsumeQueues from the replicated bytes (record_codec's dispatch
    request): every entry, tag code included, is the master's, and a pull by tag from the
    slave returns exactly the messages with that tag (tags and keys differ on purpose)."""
    master = MessageStore(small_config)
    slave = MessageStore(dataclasses.replace(small_config, store_dir=small_config.store_dir / "s"))
    try:
        for i in range(300):
            props = {TAGS: f"tag{i % 3}", KEYS: f"k{i}"}
            master.put_message(Message("T", f"m{i}".encode() * 30, props, queue_id=i % 2))
        replicate(master, slave)
        master.wait_dispatched()
        slave.wait_dispatched()
        for key, cq in master.queues().items():
            assert slave.queues()[key].entries(0, 1000) == cq.entries(0, 1000), key
        flt = parse_subscription("tag1")
        for qid in (0, 1):
            r = read_queue(
                slave, "T", qid, 0, 32, flt,
                max_bytes=1 << 20, correct_offset=False, slave_lag_bytes=1 << 30,
            )  # fmt: skip
            got = [codec.decode(u) for u in r.units]
            want = [i for i in range(300) if i % 2 == qid and i % 3 == 1][: len(got)]
            assert len(got) >= 20
            assert [m.body for m in got] == [f"m{i}".encode() * 30 for i in want]
    finally:
        master.shutdown()
        slave.shutdown()


def replicate(master: MessageStore, slave: MessageStore) -> None:
    writer = ReplicaWriter(slave)
    offset = 0
    while offset < master.commit_log.max_offset:
        chunk = master.read_log(offset, 7000)
        assert chunk is not None
        offset = writer.append(offset, chunk)
