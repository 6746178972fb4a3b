"""Tag subscriptions: `*` or `TAGA || TAGB`, matched by tag hash code, then by the tag itself.

The ConsumeQueue stores each message's tag hash code, so most non-matching messages are
skipped without reading the CommitLog; a hash collision is caught by comparing the tag.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker_runtime.common.java_hash import tags_code

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


def parse_subscription(expression: str | None) -> TagFilter:
    """FilterAPI.buildSubscriptionData for TAG expressions."""
    if expression is None or expression.strip() in ("", SUB_ALL):
        return TagFilter(frozenset(), frozenset())
    tags = frozenset(t.strip() for t in expression.split("||") if t.strip())
    if not tags:
        return TagFilter(frozenset(), frozenset())
    return TagFilter(tags, frozenset(tags_code(t) for t in tags))
