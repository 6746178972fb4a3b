"""Subscription expressions, as RocketMQ's FilterAPI parses them: tags (`*` or
`TAGA || TAGB`) or SQL92 over message properties (`MessageSelector.bySql`).

The broker filters by the tag hash codes in the ConsumeQueue; two tags can share a hash, so
the client checks the tag strings again (PullAPIWrapper.processPullResult). A SQL92
expression is compiled here when subscribing, so a bad one fails at once with its position
(SqlFilterError); only the broker filters by it (its switch enable_property_filter).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from broker_runtime.common.constants import SQL92, TAG
from broker_runtime.common.java_hash import tags_code
from broker_runtime.common.sql_filter import compile_sql

SUB_ALL = "*"


class SubscriptionError(ValueError):
    """An expression that names no tag (for example `||`)."""


@dataclass(frozen=True)
class Subscription:
    topic: str
    expression: str  # normalised: "*" or "A || B"
    tags: frozenset[str]  # empty for "*"
    codes: frozenset[int]
    expression_type: str = TAG
    # When it was built (RocketMQ's SubscriptionData.subVersion), sent with each heartbeat.
    sub_version: int = field(default_factory=lambda: time.time_ns() // 1_000_000, compare=False)

    @property
    def all(self) -> bool:
        return not self.tags

    def matches(self, tags: str | None) -> bool:
        """Whether a message with TAGS `tags` belongs to this subscription (no tags: only `*`)."""
        return not self.tags or (tags is not None and tags in self.tags)

    def matches_code(self, code: int) -> bool:
        """The broker's side of the check: the ConsumeQueue's tag hash code."""
        return not self.codes or code in self.codes


def parse(topic: str, expression: str | None, expression_type: str = TAG) -> Subscription:
    """Parse `expression`; as tags, None, "" and "*" subscribe to every message."""
    if expression_type == SQL92:
        compile_sql(expression or "")
        return Subscription(topic, expression or "", frozenset(), frozenset(), SQL92)
    if expression_type != TAG:
        raise SubscriptionError(f"unknown expression type {expression_type!r} (TAG or SQL92)")
    text = (expression or "").strip()
    if text in ("", SUB_ALL):
        return Subscription(topic, SUB_ALL, frozenset(), frozenset())
    tags = [t.strip() for t in text.split("||")]
    kept = list(dict.fromkeys(t for t in tags if t))
    if not kept:
        raise SubscriptionError(f"tag expression {expression!r} names no tag")
    if SUB_ALL in kept:
        return Subscription(topic, SUB_ALL, frozenset(), frozenset())
    return Subscription(
        topic, " || ".join(kept), frozenset(kept), frozenset(tags_code(t) for t in kept)
    )
