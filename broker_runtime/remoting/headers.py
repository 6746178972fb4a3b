"""Typed request and response headers, with RocketMQ's field names on the wire.

Each class mirrors a RocketMQ `*RequestHeader` / `*ResponseHeader`: attributes are
snake_case here and camelCase in `extFields` (`queue_offset` <-> `queueOffset`), values are
strings on the wire. `decode` names a missing or malformed field in its error, which the
processor table turns into an error response.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from typing import Any, ClassVar, Self, get_type_hints

from broker_runtime.remoting.command import HeaderError, RemotingCommand


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def _base(hint: Any) -> type:
    """int, bool or str: what a field's annotation (`int | None` and the like) holds."""
    kinds = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    return kinds[0] if kinds[0] in (int, bool) else str


# Source templates of the per-class codecs: `raw` is the wire string, then the value; the
# parse step's `else`/`elif` continues the template's `if raw is None`.
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
    elif raw == "true":
        raw = True
    elif raw == "false":
        raw = False
    else:
        raise HeaderError(f"header field {wire!r} has a bad value: {{raw!r}}")
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
        wire, base = _camel(f.name), _base(hints[f.name])
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
    subscription: str | None = None  # with FLAG_SUBSCRIPTION: "*", "TAGA || TAGB" or SQL92
    expression_type: str | None = None  # TAG or SQL92 (RocketMQ's ExpressionType)
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
