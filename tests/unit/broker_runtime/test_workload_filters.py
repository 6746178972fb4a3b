"""The SQL92 filter groups' truth (broker_runtime/workload/filters.py): each Python rule says
what its expression says, on hand-picked messages and on every combination of edge values;
the witnesses make every fault land on every queue; findings from journaled deliveries."""

from __future__ import annotations

import itertools

import pytest

from broker_runtime.common import findings as K
from broker_runtime.common.sql_filter import compile_sql
from broker_runtime.workload import filters as FL
from broker_runtime.workload import truth as T
from broker_runtime.workload.journal import Delivery

GROUPS = {g.suffix: g for g in FL.FILTER_GROUPS}
AMOUNTS = (0, 50, 149, 150, 199, 200, 299, 300, 600, 601, 700, 701, 799, 800, 950, 951, 999)


def P(amount: int, region: str | None = None, vip: bool | None = None, note: str | None = None,
      tag: str | None = None) -> FL.Props:  # fmt: skip
    return FL.Props(amount, region, vip, note, tag)


@pytest.mark.parametrize(
    ("group", "props", "matches"),
    [
        ("sql-range", P(200, "eu"), True),  # BETWEEN is inclusive
        ("sql-range", P(600, "us"), True),
        ("sql-range", P(601, "us"), False),
        ("sql-range", P(400, "apac"), False),
        ("sql-range", P(400), False),  # region absent: IN is null
        ("sql-vip", P(10, "eu", True), True),
        ("sql-vip", P(10, "eu", False), False),
        ("sql-vip", P(10, None, None, "o'k"), True),  # '' is one quote; vip null OR TRUE
        ("sql-vip", P(10, "eu", None, "o'k"), False),
        ("sql-vip", P(10, None, None, "ok"), False),
        ("sql-vip", P(951), True),
        ("sql-vip", P(950), False),
        ("sql-stale-all", P(100, "eu"), True),  # AND binds tighter than OR
        ("sql-stale-all", P(100, "eu", None, "ok"), True),
        ("sql-stale-all", P(500, "eu", None, "o'k"), True),  # note <> 'ok'
        ("sql-stale-all", P(500, "eu", None, "ok"), False),  # NOT BETWEEN 300 AND 700
        ("sql-stale-all", P(500, "eu"), False),  # note absent: <> is null
        ("sql-stale-all", P(100), False),  # region absent: NOT IN is null
        ("sql-stale-all", P(100, "us", None, "ok"), False),
        ("sql-stale-all", P(701, "apac", None, "o'k"), True),
        ("sql-stale-tag", P(150, None, False), True),
        ("sql-stale-tag", P(799, None, True), True),
        ("sql-stale-tag", P(800, None, True), False),
        ("sql-stale-tag", P(149, None, True), False),
        ("sql-stale-tag", P(500), False),  # vip absent
    ],
)
def test_each_rule_and_its_expression_on_hand_picked_messages(
    group: str, props: FL.Props, matches: bool
) -> None:
    g = GROUPS[group]
    assert g.rule(props) is matches
    assert compile_sql(g.expression).matches(props.properties()) is matches


def test_each_rule_says_what_its_expression_says_on_every_combination_of_edge_values() -> None:
    combos = [
        P(a, r, v, n)
        for a, r, v, n in itertools.product(AMOUNTS, FL.REGIONS, (True, False, None), FL.NOTES)
    ]
    for g in FL.FILTER_GROUPS:
        sql = compile_sql(g.expression)
        wrong = [p for p in combos if sql.matches(p.properties()) != g.rule(p)]
        assert not wrong, (g.suffix, wrong[:3])
        assert 0 < sum(map(g.rule, combos)) < len(combos)  # neither nothing nor everything


def test_the_properties_are_sent_as_strings_absent_where_none() -> None:
    assert P(5, None, False, "o'k").properties() == {"amount": "5", "vip": "false", "note": "o'k"}
    assert P(7, "eu", True).properties() == {"amount": "7", "region": "eu", "vip": "true"}


def test_the_draw_is_the_seeds_and_starts_with_a_witness_of_each_fault_per_queue() -> None:
    assert FL.draw(1, 30) == FL.draw(1, 30) != FL.draw(2, 30)
    values = FL.draw(3, 30)
    stale_all, stale_tag = GROUPS["sql-stale-all"], GROUPS["sql-stale-tag"]
    assert stale_all.stale == "*" and stale_tag.stale == "TagA"
    for q in range(FL.QUEUES):  # message i goes to queue i % QUEUES
        on_q = values[q :: FL.QUEUES]
        assert any(not stale_all.rule(p) for p in on_q)  # delivered_but_excluded by `*`
        assert any(stale_tag.rule(p) and p.tag != "TagA" for p in on_q)  # skipped by TagA
        assert any(not stale_tag.rule(p) and p.tag == "TagA" for p in on_q)  # delivered by TagA
    with pytest.raises(ValueError, match="at least 8"):
        FL.draw(1, 7)


def _d(msg: str, reconsume: int = 0, topic: str = "T-sql") -> Delivery:
    return Delivery(0, msg, "c1", topic, "broker-a", 0, 0, reconsume, 1, "CONSUMED", 2)


def test_findings_from_deliveries_name_each_fault_with_its_cause_and_count() -> None:
    g = GROUPS["sql-stale-tag"]
    sent = {
        "IN_GOT": P(500, vip=True),  # matches, delivered: fine
        "IN_LOST": P(500, vip=False),  # matches, never delivered
        "OUT_GOT": P(10, vip=True, tag="TagA"),  # excluded, delivered twice first-hand
        "OUT_NOT": P(10),  # excluded, not delivered: fine
        "IN_RETRY": P(300, vip=True),  # delivered only as a retry: delivered, not skipped
    }
    ds = [_d("IN_GOT"), _d("OUT_GOT"), _d("OUT_GOT"), _d("OUT_GOT", 1), _d("IN_RETRY", 1)]
    found = FL.filter_findings(g, "G", "T-sql", sent, ds)
    assert found == [
        T.finding(K.FILTERED_WRONGLY, "IN_LOST", "G", 1, "T-sql", K.MATCHED_BUT_SKIPPED),
        T.finding(K.FILTERED_WRONGLY, "OUT_GOT", "G", 2, "T-sql", K.DELIVERED_BUT_EXCLUDED),
    ]
    doc = FL.described([(g, "G")], sent)
    assert doc["groups"]["G"] == {
        "expression": g.expression,
        "stale_subscription": "TagA",
        "expected": ["IN_GOT", "IN_LOST", "IN_RETRY"],
    }
    assert doc["messages"]["OUT_GOT"] == {"properties": {"amount": "10", "vip": "true"},
                                          "tag": "TagA"}  # fmt: skip


def test_a_filter_finding_needs_its_group_in_truth() -> None:
    f = T.finding(K.FILTERED_WRONGLY, "M", "G", 1, "T-sql", K.MATCHED_BUT_SKIPPED)
    entry = T.scenario_entry(
        description="d", data_dir="/x", topic="T", groups=["G"], messages=1, injected={},
        findings=[f], stats={},
    )  # fmt: skip
    doc = {"seed": 1, "messages": 1, "scenarios": {"s": entry}}
    T.validate(doc)
    assert entry["expected"][K.FILTERED_WRONGLY] == 1
    entry["findings"] = [{**f, "group": None}]
    with pytest.raises(ValueError, match="group mismatch"):
        T.validate(doc)
