"""Typed request and response headers, with RocketMQ's field names on the wire.

Each class mirrors a RocketMQ `*RequestHeader` / `*ResponseHeader`: attributes are
snake_case here and camelCase in `extFields` (`queue_offset` <-> `queueOffset`), values are
strings on the wire. `decode` names a missing or malformed field in its error, which the
processor table turns into an error response.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Self, get_type_hints

from broker_runtime.remoting.command import HeaderError, RemotingCommand


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


_SCHEMAS: dict[type, list[tuple[str, str, Any, Any]]] = {}


def _schema(cls: type) -> list[tuple[str, str, Any, Any]]:
    """(attribute, wire name, type, default) per field, computed once per class."""
    schema = _SCHEMAS.get(cls)
    if schema is None:
        hints = get_type_hints(cls)
        schema = [
            (f.name, _camel(f.name), hints[f.name], f.default) for f in dataclasses.fields(cls)
        ]
        _SCHEMAS[cls] = schema
    return schema


def _parse(raw: str, kind: Any, wire: str) -> object:
    try:
        if kind in (int, int | None):
            return int(raw)
        if kind in (bool, bool | None):
            if raw not in ("true", "false"):
                raise ValueError(raw)
            return raw == "true"
    except ValueError:
        raise HeaderError(f"header field {wire!r} has a bad value: {raw!r}") from None
    return raw


class Header:
    """Base of the typed headers: `decode(cmd)` and `fields()` for `request(...)`."""

    __slots__ = ()
    CODE: ClassVar[int] = -1

    @classmethod
    def decode(cls, cmd: RemotingCommand) -> Self:
        values: dict[str, object] = {}
        for name, wire, kind, default in _schema(cls):
            raw = cmd.ext_fields.get(wire)
            if raw is None:
                if default is dataclasses.MISSING:
                    raise HeaderError(f"missing header field {wire!r}")
                values[name] = default
            else:
                values[name] = _parse(raw, kind, wire)
        return cls(**values)

    def fields(self) -> dict[str, object]:
        return {
            wire: getattr(self, name)
            for name, wire, _, _ in _schema(type(self))
            if getattr(self, name) is not None
        }


@dataclasses.dataclass(slots=True)
class SendMessageRequestHeader(Header):
    producer_group: str
    topic: str
    queue_id: int
    born_timestamp: int
    properties: str = ""  # k\x01v\x02..., as stored
    sys_flag: int = 0
    flag: int = 0
    reconsume_times: int = 0
    max_reconsume_times: int | None = None
    batch: bool = False


@dataclasses.dataclass(slots=True)
class SendMessageResponseHeader(Header):
    msg_id: str  # the offset msg id (store host + phys offset); UNIQ_KEY is the client's id
    queue_id: int
    queue_offset: int
    phys_offset: int = 0
    batch_count: int = 1


@dataclasses.dataclass(slots=True)
class PullMessageRequestHeader(Header):
    consumer_group: str
    topic: str
    queue_id: int
    queue_offset: int
    max_msg_nums: int = 32
    sys_flag: int = 0
    commit_offset: int = -1  # piggy-backed offset commit, as RocketMQ's FLAG_COMMIT_OFFSET
    suspend_timeout_millis: int = 0  # > 0: long polling
    subscription: str = "*"  # tag expression: "*" or "TAGA || TAGB"
    client_id: str | None = None


@dataclasses.dataclass(slots=True)
class PullMessageResponseHeader(Header):
    next_begin_offset: int
    min_offset: int
    max_offset: int
    suggest_which_broker_id: int = 0


@dataclasses.dataclass(slots=True)
class QueueOffsetHeader(Header):
    """Query/update consumer offset; `commit_offset` only on update."""

    consumer_group: str
    topic: str
    queue_id: int
    commit_offset: int | None = None


@dataclasses.dataclass(slots=True)
class OffsetResponseHeader(Header):
    offset: int


@dataclasses.dataclass(slots=True)
class TopicQueueHeader(Header):
    """GET_MAX_OFFSET / GET_MIN_OFFSET / SEARCH_OFFSET_BY_TIMESTAMP (with `timestamp`)."""

    topic: str
    queue_id: int
    timestamp: int | None = None


@dataclasses.dataclass(slots=True)
class ConsumerSendMsgBackRequestHeader(Header):
    offset: int  # the commitlog offset of the message that failed
    group: str
    delay_level: int = 0  # 0: the broker picks 3 + reconsumeTimes
    origin_msg_id: str | None = None
    origin_topic: str | None = None
    max_reconsume_times: int = 16


@dataclasses.dataclass(slots=True)
class ViewMessageRequestHeader(Header):
    offset: int


@dataclasses.dataclass(slots=True)
class QueryMessageRequestHeader(Header):
    topic: str
    key: str
    max_num: int = 32
    begin_timestamp: int = 0
    end_timestamp: int = 2**62


@dataclasses.dataclass(slots=True)
class TopicHeader(Header):
    """GET_ROUTEINFO_BY_TOPIC, GET_CONSUMER_LIST_BY_GROUP (with `consumer_group`) and others."""

    topic: str | None = None
    consumer_group: str | None = None


@dataclasses.dataclass(slots=True)
class CreateTopicRequestHeader(Header):
    topic: str
    read_queue_nums: int = 4
    write_queue_nums: int = 4
    perm: int = 6  # PermName: 4 read | 2 write


@dataclasses.dataclass(slots=True)
class RegisterBrokerRequestHeader(Header):
    broker_name: str
    broker_addr: str
    cluster_name: str
    ha_server_addr: str
    broker_id: int


@dataclasses.dataclass(slots=True)
class ResetOffsetRequestHeader(Header):
    group: str
    topic: str
    timestamp: int


@dataclasses.dataclass(slots=True)
class RegisterBrokerResponseHeader(Header):
    """What a name server tells a registering broker: its group's master (for slaves)."""

    ha_server_addr: str | None = None
    master_addr: str | None = None


@dataclasses.dataclass(slots=True)
class UnregisterBrokerRequestHeader(Header):
    broker_name: str
    broker_addr: str
    cluster_name: str
    broker_id: int


@dataclasses.dataclass(slots=True)
class UnregisterClientRequestHeader(Header):
    client_id: str
    producer_group: str | None = None
    consumer_group: str | None = None
