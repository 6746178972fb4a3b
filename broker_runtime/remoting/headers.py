"""Typed request and response headers, with RocketMQ's field names on the wire.

Each class mirrors a RocketMQ `*RequestHeader` / `*ResponseHeader`: attributes are
snake_case here and camelCase in `extFields` (`queue_offset` <-> `queueOffset`; a field's
`wire` metadata names one that RocketMQ spells otherwise), values are strings on the wire.
`decode` names a missing or malformed field in its error, which the processor table turns
into an error response.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from typing import Any, ClassVar, Self, get_type_hints

from broker_runtime.common.topics import AUTO_CREATE_TOPIC
from broker_runtime.remoting.command import HeaderError, RemotingCommand
from broker_runtime.remoting.protocol import RequestCode


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def _base(hint: Any) -> type:
    """int, bool or str: what a field's annotation (`int | None` and the like) holds."""
    kinds = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    return kinds[0] if kinds[0] in (int, bool) else str


# Source templates of the per-class codecs: `raw` is the wire string, then the value; the
# parse step's `else` continues the template's `if raw is None`. A bool is Java's
# Boolean.parseBoolean: "true" in any case, anything else false (never an error).
_REQUIRED = """
    raw = get({wire!r})
    if raw is None:
        raise HeaderError("missing header field {wire!r}")
"""
_OPTIONAL = """
    raw = get({wire!r})
    if raw is None:
        raw = D{i}
"""
_PARSE = {
    int: """
    else:
        try:
            raw = int(raw)
        except ValueError:
            raise HeaderError(f"header field {wire!r} has a bad value: {{raw!r}}") from None
""",
    bool: """
    else:
        raw = raw == "true" or raw.lower() == "true"
""",
}
_WIRE = {str: "x", int: "'%d' % x", bool: "'true' if x else 'false'"}


def _compile(cls: type) -> tuple[Callable[..., Any], Callable[..., dict[str, object]]]:
    """decode(cmd) and fields(header) written out for one header class, as dataclasses
    writes __init__: a loop over the fields was the most of a send's header costs."""
    hints = get_type_hints(cls)
    decode, fields, args = ["def decode(cmd):\n    get = cmd.ext_fields.get"], [], []
    ns: dict[str, Any] = {"cls": cls, "HeaderError": HeaderError}
    for i, f in enumerate(dataclasses.fields(cls)):
        wire, base = f.metadata.get("wire") or _camel(f.name), _base(hints[f.name])
        if f.default is dataclasses.MISSING:
            decode.append(_REQUIRED.format(wire=wire).strip("\n"))
        else:
            ns[f"D{i}"] = f.default
            decode.append(_OPTIONAL.format(wire=wire, i=i).strip("\n"))
        if base is not str:
            decode.append(_PARSE[base].format(wire=wire).strip("\n"))
        decode.append(f"    v{i} = raw")
        args.append(f"v{i}")
        fields.append(f"    x = self.{f.name}\n    if x is not None:\n")
        fields.append(f"        out[{wire!r}] = {_WIRE[base]}\n")
    decode.append(f"    return cls({', '.join(args)})")
    source = "\n".join(decode) + "\n\ndef fields(self):\n    out = {}\n"
    source += "".join(fields) + "    return out\n"
    exec(source, ns)
    return ns["decode"], ns["fields"]


class Header:
    """Base of the typed headers: `decode(cmd)` and `fields()` for `request(...)`."""

    __slots__ = ()
    CODE: ClassVar[int] = -1

    @classmethod
    def decode(cls, cmd: RemotingCommand) -> Self:
        codec = _CODECS.get(cls) or _codec(cls)
        header: Self = codec[0](cmd)
        return header

    def fields(self) -> dict[str, object]:
        """The set fields by wire name, as strings (what `request(...)` sends as is)."""
        codec = _CODECS.get(type(self)) or _codec(type(self))
        return codec[1](self)


_CODECS: dict[type, tuple[Callable[..., Any], Callable[..., dict[str, object]]]] = {}


def _codec(cls: type) -> tuple[Callable[..., Any], Callable[..., dict[str, object]]]:
    _CODECS[cls] = codec = _compile(cls)
    return codec


@dataclasses.dataclass(slots=True)
class SendMessageRequestHeader(Header):
    """SEND_MESSAGE's header. RocketMQ requires defaultTopic, defaultTopicQueueNums, sysFlag and
    flag too; this broker takes their defaults when they are missing."""

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
    default_topic: str = AUTO_CREATE_TOPIC  # the route a client sent by, for a new topic
    default_topic_queue_nums: int = 4  # queues the client asks a new topic to get
    unit_mode: bool = False

    def v2(self) -> SendMessageRequestHeaderV2:
        """This header with the one-letter names: the only way Apache RocketMQ's broker
        reads a SEND_BATCH_MESSAGE's ("The specified topic is blank" otherwise)."""
        return SendMessageRequestHeaderV2(
            self.producer_group, self.topic, self.default_topic, self.default_topic_queue_nums,
            self.queue_id, self.sys_flag, self.born_timestamp, self.flag, self.properties,
            self.reconsume_times, self.unit_mode, self.max_reconsume_times, self.batch,
        )  # fmt: skip

    @staticmethod
    def of(cmd: RemotingCommand) -> SendMessageRequestHeader:
        """The header of any send: SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE carry the one-letter
        SendMessageRequestHeaderV2 (RocketMQ's parseRequestHeader); a SEND_BATCH_MESSAGE with
        the long names (mqaudit's clients before 4.9 compatibility) is taken too."""
        if cmd.code == RequestCode.SEND_MESSAGE_V2 or (
            cmd.code == RequestCode.SEND_BATCH_MESSAGE and "b" in cmd.ext_fields
        ):
            return SendMessageRequestHeaderV2.decode(cmd).v1()
        return SendMessageRequestHeader.decode(cmd)


@dataclasses.dataclass(slots=True)
class SendMessageRequestHeaderV2(Header):
    """RocketMQ's SendMessageRequestHeaderV2: SendMessageRequestHeader with one-letter field
    names, as the official Java client sends every message (sendSmartMsg) and every batch."""

    a: str  # producerGroup
    b: str  # topic
    c: str  # defaultTopic
    d: int  # defaultTopicQueueNums
    e: int  # queueId
    f: int  # sysFlag
    g: int  # bornTimestamp
    h: int  # flag
    i: str = ""  # properties
    j: int = 0  # reconsumeTimes
    k: bool = False  # unitMode
    l: int | None = None  # maxReconsumeTimes  # noqa: E741 (RocketMQ's name)
    m: bool = False  # batch
    n: str | None = None  # brokerName

    def v1(self) -> SendMessageRequestHeader:
        return SendMessageRequestHeader(
            self.a, self.b, self.e, self.g, self.i, self.f, self.h, self.j, self.l, self.m,
            self.c, self.d, self.k,
        )  # fmt: skip


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
    subscription: str | None = None  # with FLAG_SUBSCRIPTION: "*", "TAGA || TAGB" or SQL92
    expression_type: str | None = None  # TAG or SQL92 (RocketMQ's ExpressionType)
    client_id: str | None = None
    sub_version: int = 0  # CFNotNull in Apache RocketMQ (its client sends the build time)


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
class QueryMessageResponseHeader(Header):
    """Where the key index stands (the newest index file's end); the official client unboxes
    both fields of every successful answer."""

    index_last_update_timestamp: int
    index_last_update_phyoffset: int


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
    client_id: str = dataclasses.field(metadata={"wire": "clientID"})  # RocketMQ's spelling
    producer_group: str | None = None
    consumer_group: str | None = None


@dataclasses.dataclass(slots=True)
class EndTransactionRequestHeader(Header):
    """END_TRANSACTION: a producer's commit (8), rollback (12) or unknown (0) for the half
    message at `commit_log_offset`, whose half-topic queue offset is `tran_state_table_offset`."""

    producer_group: str
    tran_state_table_offset: int
    commit_log_offset: int
    commit_or_rollback: int
    from_transaction_check: bool = False
    msg_id: str | None = None
    transaction_id: str | None = None


@dataclasses.dataclass(slots=True)
class CheckTransactionStateRequestHeader(Header):
    """CHECK_TRANSACTION_STATE, broker to producer: how did this transaction end? The body is
    the half message (as stored, with its real topic and queue back)."""

    tran_state_table_offset: int
    commit_log_offset: int
    msg_id: str | None = None
    transaction_id: str | None = None
    offset_msg_id: str | None = None
