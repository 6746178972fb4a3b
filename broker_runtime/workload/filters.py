"""SQL92 filter groups of the transactions scenario, and their truth: pure, by seed.

Each group subscribes with a SQL92 expression (MessageSelector.bySql) and has the same rule
written again in plain Python (`rule`, over the typed values drawn for a message). The truth's
expected deliveries come from those rules, never from the broker's evaluator
(broker_runtime/common/sql_filter.py): that is what makes the audit's check non-circular.
tests/unit/broker_runtime/test_workload_filters.py holds each rule to its expression.

The messages carry user properties `amount` (0..999), `region` (eu, us, apac or absent),
`vip` (true, false or absent), `note` (`o'k`, `ok` or absent) and a tag (TagA, TagB or none).
A property the broker compares with a number is converted as Java's `Integer.valueOf`; an
absent one is null, and null makes a comparison, BETWEEN or IN null, which is no match.

Two groups have a second consumer instance deployed with a stale tag subscription
(RocketMQ's "inconsistent subscriptions in one group"). Each instance's pulls are filtered by
its own subscription, while the broker keeps the group's SQL92 one in consumerFilter.json:
- stale `*`: the instance receives, from its queues, messages the expression excludes
  (`filtered_wrongly`, cause `delivered_but_excluded`);
- stale `TagA`: the broker skips, on its queues, the messages without TagA, and the group's
  offset passes them: those the expression matches are `matched_but_skipped`; the TagA ones
  it excludes are delivered (`delivered_but_excluded`).
Message i goes to queue i % 4 and the first eight carry fixed properties (`WITNESSES`), so
that every queue has a message of each fault whichever queues a stale instance holds.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from broker_runtime.common.findings import (
    DELIVERED_BUT_EXCLUDED,
    FILTERED_WRONGLY,
    MATCHED_BUT_SKIPPED,
)
from broker_runtime.workload.journal import Delivery
from broker_runtime.workload.truth import Finding, finding

QUEUES = 4  # the filter topic's queues; message i is sent to queue i % QUEUES
REGIONS = ("eu", "us", "apac", None)
NOTES = ("o'k", "ok", None, None)
TAGS = ("TagA", "TagB", None)


@dataclass(frozen=True)
class Props:
    """One message's values, typed; None where the property is absent."""

    amount: int
    region: str | None
    vip: bool | None
    note: str | None
    tag: str | None

    def properties(self) -> dict[str, str]:
        """The user properties as sent (strings, as RocketMQ keeps them)."""
        out = {"amount": str(self.amount)}
        if self.region is not None:
            out["region"] = self.region
        if self.vip is not None:
            out["vip"] = "true" if self.vip else "false"
        if self.note is not None:
            out["note"] = self.note
        return out


@dataclass(frozen=True)
class FilterGroup:
    suffix: str  # the group is the scenario's group name + "-" + suffix
    expression: str
    rule: Callable[[Props], bool]  # the expression, in Python
    stale: str | None = None  # a second instance's (stale) tag subscription


FILTER_GROUPS: tuple[FilterGroup, ...] = (
    FilterGroup(
        "sql-range",
        "amount BETWEEN 200 AND 600 AND region IN ('eu', 'us')",
        lambda p: 200 <= p.amount <= 600 and p.region in ("eu", "us"),
    ),
    FilterGroup(
        "sql-vip",
        "vip = TRUE OR (note = 'o''k' AND region IS NULL) OR amount > 950",
        lambda p: p.vip is True or (p.note == "o'k" and p.region is None) or p.amount > 950,
    ),
    FilterGroup(
        "sql-stale-all",
        "region NOT IN ('apac', 'us') AND amount NOT BETWEEN 300 AND 700 OR note <> 'ok'",
        lambda p: (
            (p.region is not None and p.region not in ("apac", "us") and not 300 <= p.amount <= 700)
            or (p.note is not None and p.note != "ok")
        ),
        stale="*",
    ),
    FilterGroup(
        "sql-stale-tag",
        "vip IS NOT NULL AND amount >= 150 AND amount < 800",
        lambda p: p.vip is not None and 150 <= p.amount < 800,
        stale="TagA",
    ),
)

# Messages 0..3 (one per queue): excluded by sql-stale-all; matching sql-stale-tag without
# TagA. Messages 4..7: TagA, excluded by sql-stale-tag.
WITNESSES: tuple[Props, ...] = (
    *(Props(500, "apac", True, None, "TagB") for _ in range(QUEUES)),
    *(Props(50, "eu", None, "ok", "TagA") for _ in range(QUEUES)),
)


def draw(seed: int, n: int) -> list[Props]:
    """The values of the filter topic's `n` messages (n >= the witnesses)."""
    if n < len(WITNESSES):
        raise ValueError(f"{n} filter messages: at least {len(WITNESSES)} are needed")
    rng = random.Random(f"{seed}:sql-filters")
    drawn = [
        Props(
            rng.randrange(1000),
            rng.choice(REGIONS),
            rng.choice((True, False, None)),
            rng.choice(NOTES),
            rng.choice(TAGS),
        )
        for _ in range(n - len(WITNESSES))
    ]
    return [*WITNESSES, *drawn]


def expected_deliveries(group: FilterGroup, sent: Mapping[str, Props]) -> list[str]:
    """The msg_ids the group must receive: those its rule matches."""
    return sorted(mid for mid, p in sent.items() if group.rule(p))


def filter_findings(
    group: FilterGroup,
    name: str,
    topic: str,
    sent: Mapping[str, Props],
    deliveries: Iterable[Delivery],
) -> list[Finding]:
    """`filtered_wrongly` of one group, from what its instances received (their journals):
    a message its rule excludes, delivered (count: first deliveries, as the audit counts);
    a message its rule matches, never delivered (count 1; the scenario has seen the group's
    offsets pass every message)."""
    ds = list(deliveries)
    first = Counter(d.msg_id for d in ds if d.reconsume_times == 0)
    got = {d.msg_id for d in ds}
    out = []
    for mid, p in sorted(sent.items()):
        if not group.rule(p) and first[mid]:
            out.append(
                finding(FILTERED_WRONGLY, mid, name, first[mid], topic, DELIVERED_BUT_EXCLUDED)
            )
        elif group.rule(p) and mid not in got:
            out.append(finding(FILTERED_WRONGLY, mid, name, 1, topic, MATCHED_BUT_SKIPPED))
    return out


def described(
    groups: Sequence[tuple[FilterGroup, str]], sent: Mapping[str, Props]
) -> dict[str, Any]:
    """truth.json's `injected.sql_filters`: per group its expression, its stale instance's
    subscription and the msg_ids it must receive; per msg_id the properties and tag sent."""
    return {
        "groups": {
            name: {
                "expression": g.expression,
                "stale_subscription": g.stale,
                "expected": expected_deliveries(g, sent),
            }
            for g, name in groups
        },
        "messages": {
            mid: {"properties": p.properties(), "tag": p.tag} for mid, p in sorted(sent.items())
        },
    }
