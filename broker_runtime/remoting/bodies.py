"""Request/response bodies: RocketMQ's JSON shapes, and the batch-send encoding.

- TopicRouteData as GET_ROUTEINFO_BY_TOPIC returns it (`queueDatas`, `brokerDatas`).
- HeartbeatData as a client sends it with HEART_BEAT (`clientID`, `consumerDataSet`, ...).
- A batch send body as RocketMQ's MessageDecoder.encodeMessages writes it: per message
  TOTALSIZE i32, MAGICCODE i32, BODYCRC i32, FLAG i32, BODY (i32 len + bytes),
  PROPERTIES (i16 len + bytes).
- A pull response body is the messages' CommitLog units back to back (as RocketMQ sends
  them); decode it with broker_runtime.store.record_codec.
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import asdict, dataclass, field
from typing import Any

from broker_runtime.common import fastjson
from broker_runtime.common.message import properties_to_string, string_to_properties
from broker_runtime.remoting.command import MAX_JSON_DEPTH, json_too_deep

PERM_READ = 4
PERM_WRITE = 2
PERM_INHERIT = 1  # a new topic may take this one's config (TBW102)
MASTER_ID = 0


class BodyError(ValueError):
    """A body that does not have the shape its request code promises."""


def _load(raw: bytes, what: str) -> dict[str, Any]:
    try:
        text = raw.decode()
    except UnicodeDecodeError as e:
        raise BodyError(f"{what} body is not JSON: {e}") from None
    if json_too_deep(text):
        raise BodyError(f"{what} body nests deeper than {MAX_JSON_DEPTH} levels")
    try:
        data = fastjson.loads(text)  # RocketMQ's own bodies may be fastjson's dialect
    except ValueError as e:
        raise BodyError(f"{what} body is not JSON: {e}") from None
    if not isinstance(data, dict):
        raise BodyError(f"{what} body is not a JSON object")
    return data


def _dump(data: object) -> bytes:
    return json.dumps(data, separators=(",", ":")).encode()


@dataclass(slots=True)
class QueueData:
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int = PERM_READ | PERM_WRITE


@dataclass(slots=True)
class BrokerData:
    cluster: str
    broker_name: str
    broker_addrs: dict[int, str]  # brokerId -> host:port

    def master_addr(self) -> str | None:
        return self.broker_addrs.get(MASTER_ID)


@dataclass(slots=True)
class TopicRouteData:
    queue_datas: list[QueueData] = field(default_factory=list)
    broker_datas: list[BrokerData] = field(default_factory=list)

    def encode(self) -> bytes:
        return _dump(
            {
                "queueDatas": [
                    {
                        "brokerName": q.broker_name,
                        "readQueueNums": q.read_queue_nums,
                        "writeQueueNums": q.write_queue_nums,
                        "perm": q.perm,
                    }
                    for q in self.queue_datas
                ],
                "brokerDatas": [
                    {
                        "cluster": b.cluster,
                        "brokerName": b.broker_name,
                        "brokerAddrs": {str(k): v for k, v in b.broker_addrs.items()},
                    }
                    for b in self.broker_datas
                ],
            }
        )

    @classmethod
    def decode(cls, raw: bytes) -> TopicRouteData:
        data = _load(raw, "route")
        try:
            return cls(
                [
                    QueueData(
                        q["brokerName"], q["readQueueNums"], q["writeQueueNums"], q.get("perm", 6)
                    )
                    for q in data.get("queueDatas", [])
                ],
                [
                    BrokerData(
                        b["cluster"],
                        b["brokerName"],
                        {int(k): v for k, v in b["brokerAddrs"].items()},
                    )
                    for b in data.get("brokerDatas", [])
                ],
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise BodyError(f"route body has a bad shape: {e!r}") from None


@dataclass(slots=True)
class SubscriptionData:
    topic: str
    sub_string: str = "*"
    expression_type: str = "TAG"  # or SQL92
    # The client's build time of this subscription (RocketMQ's subVersion); a newer one may
    # replace the broker's consumer filter. Not part of what a subscription is.
    sub_version: int = field(default=0, compare=False)


@dataclass(slots=True)
class ConsumerData:
    group_name: str
    message_model: str = "CLUSTERING"  # or BROADCASTING
    consume_type: str = "CONSUME_PASSIVELY"  # push; CONSUME_ACTIVELY = pull
    consume_from_where: str = "CONSUME_FROM_LAST_OFFSET"
    subscriptions: list[SubscriptionData] = field(default_factory=list)


@dataclass(slots=True)
class HeartbeatData:
    client_id: str
    producer_groups: list[str] = field(default_factory=list)
    consumers: list[ConsumerData] = field(default_factory=list)

    def encode(self) -> bytes:
        return _dump(
            {
                "clientID": self.client_id,
                "producerDataSet": [{"groupName": g} for g in self.producer_groups],
                "consumerDataSet": [
                    {
                        "groupName": c.group_name,
                        "messageModel": c.message_model,
                        "consumeType": c.consume_type,
                        "consumeFromWhere": c.consume_from_where,
                        "subscriptionDataSet": [
                            {
                                "topic": s.topic,
                                "subString": s.sub_string,
                                "expressionType": s.expression_type,
                                "subVersion": s.sub_version,
                            }
                            for s in c.subscriptions
                        ],
                    }
                    for c in self.consumers
                ],
            }
        )

    @classmethod
    def decode(cls, raw: bytes) -> HeartbeatData:
        data = _load(raw, "heartbeat")
        try:
            return cls(
                str(data["clientID"]),
                [str(p["groupName"]) for p in data.get("producerDataSet", [])],
                [
                    ConsumerData(
                        str(c["groupName"]),
                        str(c.get("messageModel", "CLUSTERING")),
                        str(c.get("consumeType", "CONSUME_PASSIVELY")),
                        str(c.get("consumeFromWhere", "CONSUME_FROM_LAST_OFFSET")),
                        [
                            SubscriptionData(
                                str(s["topic"]),
                                str(s.get("subString", "*")),
                                str(s.get("expressionType") or "TAG"),
                                int(s.get("subVersion") or 0),
                            )
                            for s in c.get("subscriptionDataSet", [])
                        ],
                    )
                    for c in data.get("consumerDataSet", [])
                ],
            )
        except (KeyError, TypeError, AttributeError) as e:
            raise BodyError(f"heartbeat body has a bad shape: {e!r}") from None


def encode_json(obj: object) -> bytes:
    """Any other body: plain JSON (dataclasses as dicts)."""
    return _dump(asdict(obj) if hasattr(obj, "__dataclass_fields__") else obj)  # type: ignore[call-overload]


def decode_json(raw: bytes, what: str) -> dict[str, Any]:
    return _load(raw, what)


# -- batch send --------------------------------------------------------------------------
_BATCH_HEAD = struct.Struct(">iiiii")  # total, magic, body crc, flag, body length
_I16 = struct.Struct(">h")
BATCH_MAGIC = 0  # RocketMQ writes 0 here for batch entries


def encode_batch(items: list[tuple[bytes, dict[str, str], int]]) -> bytes:
    """(body, properties, flag) per message -> one SEND_BATCH_MESSAGE body."""
    out = bytearray()
    for body, props, flag in items:
        raw_props = properties_to_string(props).encode()
        total = _BATCH_HEAD.size + len(body) + 2 + len(raw_props)
        crc = zlib.crc32(body) & 0x7FFFFFFF
        out += _BATCH_HEAD.pack(total, BATCH_MAGIC, crc, flag, len(body))
        out += body
        out += _I16.pack(len(raw_props))
        out += raw_props
    return bytes(out)


def decode_batch(raw: bytes) -> list[tuple[bytes, dict[str, str], int]]:
    """Inverse of `encode_batch`; BodyError names the offset of a malformed entry."""
    items: list[tuple[bytes, dict[str, str], int]] = []
    pos, n = 0, len(raw)
    while pos < n:
        if n - pos < _BATCH_HEAD.size + 2:
            raise BodyError(f"batch entry at byte {pos} is truncated")
        total, _magic, _crc, flag, body_len = _BATCH_HEAD.unpack_from(raw, pos)
        body_end = pos + _BATCH_HEAD.size + body_len
        if total < _BATCH_HEAD.size + 2 or pos + total > n or body_len < 0 or body_end + 2 > n:
            raise BodyError(f"batch entry at byte {pos} has bad lengths")
        (props_len,) = _I16.unpack_from(raw, body_end)
        if props_len < 0 or body_end + 2 + props_len != pos + total:
            raise BodyError(f"batch entry at byte {pos} has bad lengths")
        body = raw[pos + _BATCH_HEAD.size : body_end]
        try:
            props = string_to_properties(raw[body_end + 2 : pos + total].decode())
        except UnicodeDecodeError:
            raise BodyError(f"batch entry at byte {pos} has non-UTF-8 properties") from None
        items.append((bytes(body), props, flag))
        pos += total
    return items


# -- queue locks (LOCK_BATCH_MQ / UNLOCK_BATCH_MQ) -----------------------------------------
MessageQueueKey = tuple[str, str, int]  # topic, brokerName, queueId


def _mq_json(mq: MessageQueueKey) -> dict[str, Any]:
    return {"topic": mq[0], "brokerName": mq[1], "queueId": mq[2]}


def _mq_of(raw: Any) -> MessageQueueKey:
    if not isinstance(raw, dict):
        raise BodyError(f"a message queue is an object, got {raw!r}")
    topic, broker, qid = raw.get("topic"), raw.get("brokerName"), raw.get("queueId")
    if not isinstance(topic, str) or not isinstance(broker, str):
        raise BodyError(f"message queue {raw!r} needs string topic and brokerName")
    if isinstance(qid, bool) or not isinstance(qid, int) or qid < 0:
        raise BodyError(f"message queue {raw!r} needs a queueId >= 0")
    return topic, broker, qid


@dataclass(slots=True)
class LockBatchRequestBody:
    """RocketMQ's LockBatchRequestBody (UnlockBatchRequestBody has the same shape)."""

    consumer_group: str
    client_id: str
    mq_set: list[MessageQueueKey] = field(default_factory=list)
    only_this_broker: bool = False

    def encode(self) -> bytes:
        return _dump(
            {
                "consumerGroup": self.consumer_group,
                "clientId": self.client_id,
                "onlyThisBroker": self.only_this_broker,
                "mqSet": [_mq_json(mq) for mq in self.mq_set],
            }
        )

    @classmethod
    def decode(cls, raw: bytes) -> LockBatchRequestBody:
        data = _load(raw, "lock batch")
        group, client, mqs = data.get("consumerGroup"), data.get("clientId"), data.get("mqSet")
        if not isinstance(group, str) or not isinstance(client, str) or not client:
            raise BodyError("lock batch body needs string consumerGroup and clientId")
        if not isinstance(mqs, list):
            raise BodyError("lock batch body needs an mqSet list")
        return cls(group, client, [_mq_of(m) for m in mqs], bool(data.get("onlyThisBroker")))


def encode_lock_ok(mqs: list[MessageQueueKey]) -> bytes:
    """LockBatchResponseBody: {"lockOKMQSet": [{"topic", "brokerName", "queueId"}, ...]}."""
    return _dump({"lockOKMQSet": [_mq_json(mq) for mq in mqs]})


def decode_lock_ok(raw: bytes) -> list[MessageQueueKey]:
    data = _load(raw, "lock batch response")
    mqs = data.get("lockOKMQSet")
    if not isinstance(mqs, list):
        raise BodyError("lock batch response has no lockOKMQSet list")
    return [_mq_of(m) for m in mqs]
