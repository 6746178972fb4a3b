"""Stores with known content for the pipeline tests, written through the real MessageStore."""

from __future__ import annotations

import os
from pathlib import Path

from broker_runtime.common.config import StoreConfig
from broker_runtime.common.message import (
    DELAY,
    KEYS,
    ORIGIN_MESSAGE_ID,
    REAL_TOPIC,
    REPLAY_ID_PROPERTY,
    REPLAY_OF_PROPERTY,
    RETRY_TOPIC,
    TAGS,
    UNIQ_KEY,
    Message,
    StoredMessage,
)
from broker_runtime.common.topics import SCHEDULE_TOPIC, dlq_topic, retry_topic
from broker_runtime.offsets.consumer_offsets import ConsumerOffsets
from broker_runtime.store import record_codec as codec
from broker_runtime.store.message_store import MessageStore
from pipeline.readers.commitlog import segment_files

SEG = 64 * 1024
T0 = 1_700_000_000_000


def config(store_dir: Path) -> StoreConfig:
    """small_config's sizes (tiny segments: rolls and blank units happen)."""
    return StoreConfig(
        store_dir=store_dir,
        segment_size=SEG,
        cq_entries_per_file=64,
        index_hash_slots=128,
        index_max_entries=512,
        flush_interval_ms=50,
        cq_flush_interval_ms=50,
    )


def varied(n: int, start: int = 0) -> list[Message]:
    """Messages exercising every field: retry, DLQ and scheduled lineage, empty and odd
    properties, non-ASCII text, flags, hosts, empty and binary bodies."""
    out = []
    for i in range(start, start + n):
        uniq = f"UNIQ{i:08d}"
        props = {UNIQ_KEY: uniq, TAGS: f"tag{i % 3}", KEYS: f"k{i} order-{i % 7}"}
        topic = f"Topic{i % 3}"
        kind = i % 6
        if i % 12 == 6:  # a dead letter mqaudit's replay sent back: it names its origin
            props |= {REPLAY_ID_PROPERTY: "replay-1", REPLAY_OF_PROPERTY: f"DLQOFF{i:08d}"}
        if kind == 1:
            topic = retry_topic("groupA")
            props |= {RETRY_TOPIC: "Topic0", ORIGIN_MESSAGE_ID: f"UNIQ{i - 1:08d}"}
        elif kind == 2:
            topic = dlq_topic("groupA")
            props |= {RETRY_TOPIC: "Topic1", ORIGIN_MESSAGE_ID: f"UNIQ{i - 2:08d}"}
        elif kind == 3:
            topic = SCHEDULE_TOPIC
            props |= {REAL_TOPIC: retry_topic("groupB"), DELAY: str(3 + i % 5)}
        elif kind == 4:
            props = {"clé": "välue ✓", "empty": ""}
        elif kind == 5:
            props = {}
        body = b"" if i % 11 == 0 else os.urandom(50 + (i * 37) % 700)
        out.append(
            Message(
                topic=topic,
                body=body,
                properties=props,
                queue_id=i % 4,
                flag=i % 5,
                sys_flag=(i % 2) * 4,
                born_timestamp=T0 + i * 1000,
                born_host=(f"10.0.{i % 256}.{(i * 7) % 256}", 40000 + i % 1000),
                reconsume_times=i % 17,
                prepared_transaction_offset=i * 3,
            )
        )
    return out


def write_store(
    store_dir: Path, msgs: list[Message], offsets: dict[tuple[str, str, int], int] | None = None
) -> None:
    store = MessageStore(config(store_dir), disk_ratio=lambda _p: 0.0)
    try:
        for i in range(0, len(msgs), 16):
            store.put_messages(msgs[i : i + 16])
        store.wait_dispatched(None)
        if offsets:
            co = ConsumerOffsets(store_dir)
            for (topic, group, qid), off in offsets.items():
                co.commit(topic, group, qid, off)
            co.persist()
    finally:
        store.shutdown()


def stored(store_dir: Path) -> list[StoredMessage]:
    """Every message unit of the store's log, decoded by the broker's own codec."""
    out = []
    for path in segment_files(store_dir):
        data = path.read_bytes()
        base, pos = int(path.name), 0
        while pos < len(data):
            try:
                size = codec.check_unit(data, pos, len(data), check_crc=False)
            except codec.RecordError:
                break
            if size < 0:
                break
            m = codec.decode(data, pos)
            assert m.phys_offset == base + pos
            out.append(m)
            pos += size
    return out


def unit(props: bytes, topic: bytes = b"T", body: bytes = b"body", phys: int = 0) -> bytes:
    """One message unit with raw TOPIC and PROPERTIES bytes (what the codec would refuse)."""
    size = codec.record_size(len(body), len(topic), len(props))
    host = bytes([10, 0, 0, 1])
    header = codec.HEADER.pack(
        size, codec.MESSAGE_MAGIC, codec.body_crc(body), 1, 0, 7, phys, 0, 5, host, 9876, 6,
        host, -1, 0, 0, len(body),
    )  # fmt: skip
    return header + body + bytes([len(topic)]) + topic + len(props).to_bytes(2, "big") + props
