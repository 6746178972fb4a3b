"""Subscriptions a pull is filtered by: tags (`*` or `TAGA || TAGB`) or SQL92 expressions.

Tags are matched by tag hash code, then by the tag itself: the ConsumeQueue stores each
message's tag hash code, so most non-matching messages are skipped without reading the
CommitLog; a hash collision is caught by comparing the tag. A SQL92 expression
(`MessageSelector.bySql`, broker switch `enable_property_filter`) is evaluated over each
message's properties (broker_runtime/common/sql_filter.py), so every entry is read.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker_runtime.common.constants import SQL92, TAG
from broker_runtime.common.java_hash import tags_code
from broker_runtime.common.message import StoredMessage
from broker_runtime.common.sql_filter import SqlFilter, compile_sql

SUB_ALL = "*"


@dataclass(frozen=True, slots=True)
class TagFilter:
    tags: frozenset[str]  # empty: every message matches
    codes: frozenset[int]

    @property
    def matches_all(self) -> bool:
        return not self.tags

    def code_matches(self, code: int) -> bool:
        return not self.tags or code in self.codes

    def tag_matches(self, tag: str | None) -> bool:
        return not self.tags or (tag is not None and tag in self.tags)

    def unit_matches(self, msg: StoredMessage) -> bool:
        return self.tag_matches(msg.tags)


@dataclass(frozen=True, slots=True)
class SqlSubscription:
    sql: SqlFilter
    matches_all = False

    def code_matches(self, code: int) -> bool:
        return True  # the ConsumeQueue knows no properties

    def unit_matches(self, msg: StoredMessage) -> bool:
        return self.sql.matches(msg.properties)


Subscription = TagFilter | SqlSubscription


def parse_subscription(expression: str | None, expression_type: str | None = TAG) -> Subscription:
    """FilterAPI.buildSubscriptionData: a tag expression, or a SQL92 one (SqlFilterError when
    it does not compile); an unknown type is a ValueError."""
    if expression_type == SQL92:
        return SqlSubscription(compile_sql(expression or ""))
    if expression_type not in (None, "", TAG):
        raise ValueError(f"unknown expression type {expression_type!r} (TAG or SQL92)")
    if expression is None or expression.strip() in ("", SUB_ALL):
        return TagFilter(frozenset(), frozenset())
    tags = frozenset(t.strip() for t in expression.split("||") if t.strip())
    if not tags:
        return TagFilter(frozenset(), frozenset())
    return TagFilter(tags, frozenset(tags_code(t) for t in tags))
