"""What a DLQ replay (or a loss repair) is asked to do, checked before anything is read or sent.

The replay DAG's typed Params catch wrong types; `parse_request` catches the rest (names the
broker would refuse, unparsable times, an empty selection, from after to) and reports every
problem at once, so that a bad request fails in its first task with one readable message.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from broker_runtime.common.clock import parse_time_ms
from broker_runtime.common.topics import (
    InvalidNameError,
    group_of,
    is_dlq_topic,
    is_retry_topic,
    validate_group,
    validate_topic,
)

MAX_MESSAGES_LIMIT = 100_000
SYSTEMS = ("rocketmq", "rabbitmq")
RABBIT_NAME_MAX = 255  # bytes: AMQP's short string, the longest queue or exchange name
MAX_RATE = 10_000.0

# Param name -> default; the replay DAG declares the same names.
DEFAULTS: dict[str, Any] = {
    "group": None,
    "topic": None,
    "from_time": None,
    "to_time": None,
    "msg_ids": [],
    "max_messages": 100,
    "messages_per_second": 50.0,
    "dry_run": True,
    "force": False,
    "system": "rocketmq",
    "cluster": None,  # the lake's only cluster (or the replaying data dir's)
}


class ReplayParamError(ValueError):
    """The replay request is not valid; the message lists every problem."""

    def __init__(self, problems: list[str], what: str = "replay") -> None:
        self.problems = problems
        super().__init__(f"bad {what} parameters:\n" + "\n".join(f"  - {p}" for p in problems))


@dataclass(frozen=True)
class ReplayRequest:
    """A checked request; times are epoch ms, both bounds inclusive."""

    group: str
    topic: str | None = None
    from_ms: int | None = None
    to_ms: int | None = None
    msg_ids: tuple[str, ...] = ()
    max_messages: int = DEFAULTS["max_messages"]
    messages_per_second: float = DEFAULTS["messages_per_second"]
    dry_run: bool = True
    force: bool = False
    # rabbitmq: `group` is the queue the messages died in, `topic` the exchange they were
    # published to (as the audit's dead_lettered rows say), the times when a consumer of the
    # dead-letter queue logged them.
    system: str = "rocketmq"
    cluster: str | None = None  # None: the lake's only cluster (pipeline.lake.one_cluster)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able (an XCom value); `from_dict` reads it back."""
        out = asdict(self)
        out["msg_ids"] = list(self.msg_ids)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReplayRequest:
        return cls(**{**data, "msg_ids": tuple(data.get("msg_ids") or ())})

    def describe(self) -> str:
        rabbit = self.system == "rabbitmq"
        parts = [f"{'RabbitMQ queue' if rabbit else 'group'} {self.group}"]
        if self.topic is not None:
            parts.append(f"{'exchange' if rabbit else 'topic'} {self.topic!r}")
        if self.from_ms is not None or self.to_ms is not None:
            parts.append(f"stored in [{self.from_ms}, {self.to_ms}] ms")
        if self.msg_ids:
            parts.append(f"{len(self.msg_ids)} msg id(s)")
        mode = "DRY RUN" if self.dry_run else "REAL"
        force = ", forced" if self.force else ""
        return (
            f"{mode}{force}: {', '.join(parts)}; at most {self.max_messages} message(s) "
            f"at {self.messages_per_second:g}/s"
        )


def _time(name: str, value: object, problems: list[str]) -> int | None:
    if value is None or value == "":
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            problems.append(f"{name}: epoch ms must be >= 0, got {value}")
            return None
        return value
    if isinstance(value, str):
        try:
            return parse_time_ms(value.strip())
        except ValueError as e:
            problems.append(f"{name}: {e}")
            return None
    problems.append(f"{name}: give epoch ms or an ISO 8601 time, got {type(value).__name__}")
    return None


def _group(value: object, problems: list[str]) -> str:
    if value is None or value == "":
        problems.append("group: required (the consumer group whose dead letters to replay)")
        return ""
    try:
        group = validate_group(value)
    except InvalidNameError as e:
        problems.append(f"group: {e}")
        return ""
    owner = group_of(group)
    if owner is not None:
        problems.append(f"group: give the consumer group ({owner}), not its topic {group}")
    return group


def _topic(value: object, problems: list[str]) -> str | None:
    if value is None or value == "":
        return None
    try:
        topic = validate_topic(value)
    except InvalidNameError as e:
        problems.append(f"topic: {e}")
        return None
    if is_retry_topic(topic) or is_dlq_topic(topic):
        problems.append(f"topic: give the original topic the messages were sent to, not {topic}")
    return topic


def _msg_ids(value: object, problems: list[str]) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):  # one id, or a comma/space separated list from a form
        value = [v for v in value.replace(",", " ").split() if v]
    if not isinstance(value, list | tuple):
        problems.append(f"msg_ids: give a list of message ids, got {type(value).__name__}")
        return ()
    bad = [v for v in value if not isinstance(v, str) or not v or any(c.isspace() for c in v)]
    if bad:
        problems.append(f"msg_ids: ids must be non-empty strings without spaces, got {bad[:3]}")
        return ()
    ids = tuple(dict.fromkeys(value))
    if len(ids) > MAX_MESSAGES_LIMIT:
        problems.append(f"msg_ids: at most {MAX_MESSAGES_LIMIT} ids, got {len(ids)}")
    return ids


def _rabbit_name(name: str, value: object, problems: list[str], *, required: bool) -> str | None:
    """A RabbitMQ queue (required) or exchange name ("" is the default exchange)."""
    if value is None or (required and value == ""):
        if required:
            problems.append(f"{name}: required (the RabbitMQ queue the messages died in)")
        return None
    if not isinstance(value, str):
        problems.append(f"{name}: a string, got {type(value).__name__}")
        return None
    if len(value.encode()) > RABBIT_NAME_MAX:
        problems.append(f"{name}: at most {RABBIT_NAME_MAX} bytes, got {len(value.encode())}")
    return value


def parse_request(params: Mapping[str, object]) -> ReplayRequest:
    """Check `params` (the DAG's Params or the CLI's options); ReplayParamError if bad."""
    problems: list[str] = []
    p = _with_defaults(params, DEFAULTS, problems)
    system = p["system"] if p["system"] is not None else DEFAULTS["system"]
    if system not in SYSTEMS:
        problems.append(f"system: one of {list(SYSTEMS)}, got {system!r}")
    if system == "rabbitmq":
        group = _rabbit_name("group", p["group"], problems, required=True) or ""
        topic = _rabbit_name("topic", p["topic"], problems, required=False)
    else:
        group = _group(p["group"], problems)
        topic = _topic(p["topic"], problems)
    from_ms = _time("from_time", p["from_time"], problems)
    to_ms = _time("to_time", p["to_time"], problems)
    msg_ids = _msg_ids(p["msg_ids"], problems)
    if from_ms is not None and to_ms is not None and from_ms > to_ms:
        problems.append(f"from_time ({from_ms}) is after to_time ({to_ms})")
    if (
        from_ms is None
        and to_ms is None
        and not msg_ids
        and not any(x.startswith(("from_time", "to_time", "msg_ids")) for x in problems)
    ):
        problems.append(
            "give a time range (from_time and/or to_time) or msg_ids: replaying a whole "
            "dead-letter queue must be asked for explicitly (e.g. from_time=0)"
        )
    max_messages, rate = _limits(p, problems)
    cluster = _cluster(p, problems)
    if problems:
        raise ReplayParamError(problems)
    return ReplayRequest(
        group=group,
        topic=topic,
        from_ms=from_ms,
        to_ms=to_ms,
        msg_ids=msg_ids,
        max_messages=max_messages,
        messages_per_second=rate,
        dry_run=bool(p["dry_run"]),
        force=bool(p["force"]),
        system=str(system),
        cluster=cluster,
    )


def _with_defaults(
    params: Mapping[str, object], defaults: Mapping[str, Any], problems: list[str]
) -> dict[str, object]:
    """`params` over `defaults`; a parameter `defaults` does not name is a problem."""
    unknown = sorted(set(params) - set(defaults))
    if unknown:
        problems.append(f"unknown parameter(s) {unknown}; known: {sorted(defaults)}")
    return {**defaults, **params}


def _limits(p: Mapping[str, object], problems: list[str]) -> tuple[int, float]:
    """max_messages and messages_per_second, checked; dry_run and force are booleans."""
    max_messages = p["max_messages"]
    if not (isinstance(max_messages, int) and not isinstance(max_messages, bool)) or not (
        1 <= max_messages <= MAX_MESSAGES_LIMIT
    ):
        problems.append(
            f"max_messages: an integer in [1, {MAX_MESSAGES_LIMIT}], got {max_messages!r}"
        )
        max_messages = 0
    rate = p["messages_per_second"]
    if not isinstance(rate, int | float) or isinstance(rate, bool) or not 0 < rate <= MAX_RATE:
        problems.append(f"messages_per_second: a number in (0, {MAX_RATE:g}], got {rate!r}")
        rate = 0.0
    for flag in ("dry_run", "force"):
        if not isinstance(p[flag], bool):
            problems.append(f"{flag}: true or false, got {p[flag]!r}")
    return int(max_messages), float(rate)


def _cluster(p: Mapping[str, object], problems: list[str]) -> str | None:
    """The `cluster` parameter: None, or a legal cluster name."""
    if p["cluster"] is None:
        return None
    try:
        return validate_group(p["cluster"])
    except ValueError as e:
        problems.append(f"cluster: {e}")
        return None


# Param name -> default; the repair DAG declares the same names.
REPAIR_DEFAULTS: dict[str, Any] = {
    k: DEFAULTS[k]
    for k in ("msg_ids", "max_messages", "messages_per_second", "dry_run", "force", "cluster")
}


@dataclass(frozen=True)
class RepairRequest:
    """A checked repair of lost_after_ack losses: all of the last audit's, or `msg_ids`."""

    msg_ids: tuple[str, ...] = ()
    max_messages: int = DEFAULTS["max_messages"]
    messages_per_second: float = DEFAULTS["messages_per_second"]
    dry_run: bool = True
    force: bool = False
    cluster: str | None = None  # None: the lake's only cluster (pipeline.lake.one_cluster)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "msg_ids": list(self.msg_ids)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RepairRequest:
        return cls(**{**data, "msg_ids": tuple(data.get("msg_ids") or ())})

    def describe(self) -> str:
        which = f"{len(self.msg_ids)} msg id(s)" if self.msg_ids else "every lost_after_ack loss"
        mode = "DRY RUN" if self.dry_run else "REAL"
        force = ", forced" if self.force else ""
        return (
            f"{mode}{force}: {which} of the last audit; at most {self.max_messages} "
            f"message(s) at {self.messages_per_second:g}/s"
        )


def parse_repair_request(params: Mapping[str, object]) -> RepairRequest:
    """Check a repair's `params` (the DAG's Params or the CLI's options); ReplayParamError."""
    problems: list[str] = []
    p = _with_defaults(params, REPAIR_DEFAULTS, problems)
    msg_ids = _msg_ids(p["msg_ids"], problems)
    max_messages, rate = _limits(p, problems)
    cluster = _cluster(p, problems)
    if problems:
        raise ReplayParamError(problems, "repair")
    return RepairRequest(msg_ids, max_messages, rate, bool(p["dry_run"]), bool(p["force"]), cluster)
