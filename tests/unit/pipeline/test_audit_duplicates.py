"""audit_duplicates on hand-built commitlog rows and message logs: every cause, and the
look-alikes that are not duplicates."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from broker_runtime.common import findings
from broker_runtime.common.constants import DEFAULT_CLUSTER
from broker_runtime.workload import truth
from broker_runtime.workload.journal import Delivery
from pipeline.transforms.duplicates import audit_duplicates, explain_deliveries
from tests.unit.pipeline.audit_helpers import T0, assert_rows, delivery, log, messages, msg

pytestmark = pytest.mark.slow

RETRY = {"topic": "%RETRY%g1", "is_retry": True, "consumer_group": "g1"}


def _commitlog() -> list[dict[str, object]]:
    rows = []
    for broker_id in (0, 1):  # every unit below is on the master and its slave
        rows += [
            msg(0, "K1", 0, broker_id=broker_id),
            msg(400, "K1", 0, queue_id=1, broker_id=broker_id),  # resent: stored twice
            msg(800, "K2", 1, broker_id=broker_id),  # once (the slave copy is no duplicate)
            msg(1200, "K3", 2, broker_id=broker_id),
            # K3's retry, schedule and dead-letter copies carry its UNIQ_KEY by design
            msg(1600, "K3", 0, broker_id=broker_id, **RETRY, reconsume_times=1),
            msg(2000, "K3", 0, broker_id=broker_id, topic="SCHEDULE_TOPIC_XXXX", is_scheduled=True),
            msg(2400, "K3", 0, broker_id=broker_id, topic="%DLQ%g1", is_dlq=True),
        ]
    # K2's dead letter replayed into TopicA: a copy derived from a stored one, no resend
    rows.append(msg(3200, "K2", 4, origin_msg_id="OFF00000800"))
    # K4 resent to another broker group
    rows += [msg(2800, "K4", 3), msg(0, "K4", 0, broker="broker-b", phys_offset=0)]
    return rows


def test_stored_twice_counts_each_replica_set_once(spark: SparkSession) -> None:
    df = audit_duplicates(messages(spark, _commitlog()), log(spark, []), T0)
    assert_rows(
        df,
        ["msg_id", "group", "kind", "cause", "count", "broker", "as_of_ms", "detail"],
        [
            (
                "K1",
                None,
                "stored_twice",
                "producer_resend",
                2,
                "broker-a",
                T0,
                "copies at broker-a/TopicA/0@0, broker-a/TopicA/1@0",
            ),
            (
                "K4",
                None,
                "stored_twice",
                "producer_resend",
                2,
                "broker-a,broker-b",
                T0,
                "copies at broker-a/TopicA/0@3, broker-b/TopicA/0@0",
            ),
        ],
    )


def _deliveries() -> list[dict[str, object]]:
    return [
        # R1: failed, then the retry copy was consumed
        delivery(1, "R1", outcome="RECONSUME_LATER"),
        delivery(2, "R1", reconsume_times=1, **{"topic": "%RETRY%g1"}),
        # R2: failed twice, still retrying: nothing to report
        delivery(3, "R2", outcome="FAILED"),
        delivery(4, "R2", outcome="RECONSUME_LATER", topic="%RETRY%g1", reconsume_times=1),
        # P1: both stored copies delivered (another queue position)
        delivery(5, "P1", queue_offset=7),
        delivery(6, "P1", queue_id=1, queue_offset=0),
        # P1 reached group g2 once: no duplicate there
        delivery(7, "P1", group="g2", queue_offset=7),
        # O1: c2 took O1 while c1 still took messages from queue 0 (c1 got O2 after it,
        # and c2 went on with O3): two owners at once
        delivery(8, "O1", queue_offset=8),
        delivery(9, "O1", client="c2", queue_offset=8, received_at=T0 + 8500),
        delivery(10, "O2", queue_offset=9, received_at=T0 + 8700),
        delivery(11, "O3", client="c2", queue_offset=10, received_at=T0 + 8900),
        # C1: c1 died holding it (no outcome); c3 took the queue over later
        delivery(20, "C1", queue_offset=9, outcome=None, finished_at=None),
        delivery(30, "C1", client="c3", queue_offset=9),
        # A1: consumed, offset not committed, the same client pulled it again
        delivery(40, "A1", client="c4", queue_offset=10),
        delivery(41, "A1", client="c4", queue_offset=10),
        # P2: the first copy failed, the resent copy was delivered (not a retry of the first)
        delivery(50, "P2", queue_offset=12, outcome="RECONSUME_LATER"),
        delivery(51, "P2", queue_id=1, queue_offset=3),
        # H1: handed from c5 to c6 with its offset not committed; c5 took the queue back
        # only after c6 had left it: not two owners at once
        delivery(60, "H1", client="c5", queue_offset=20),
        delivery(61, "H1", client="c6", queue_offset=20),
        delivery(62, "H2", client="c6", queue_offset=21),
        delivery(70, "H3", client="c5", queue_offset=22),
        # S1: once
        delivery(42, "S1", client="c4", queue_offset=11),
        # B1: c8 took B1 while c7 was still busy with B2 from the same queue (received
        # before, finished after) and took nothing from it afterwards: two owners at once
        delivery(80, "B1", client="c7", queue_id=3, queue_offset=0),
        delivery(81, "B2", client="c7", queue_id=3, queue_offset=1, finished_at=T0 + 83_000),
        delivery(82, "B1", client="c8", queue_id=3, queue_offset=0),
        # E1: as B1, but c9 finishes E2 in the very millisecond c10 receives E1: still busy
        delivery(90, "E1", client="c9", queue_id=4, queue_offset=0),
        delivery(91, "E2", client="c9", queue_id=4, queue_offset=1, finished_at=T0 + 92_000),
        delivery(92, "E1", client="c10", queue_id=4, queue_offset=0),
        # F1: c11 takes F3 from the queue in the very millisecond c12 takes its last from it
        delivery(100, "F1", client="c11", queue_id=5, queue_offset=0),
        delivery(101, "F1", client="c12", queue_id=5, queue_offset=0),
        delivery(102, "F2", client="c12", queue_id=5, queue_offset=1),
        delivery(103, "F3", client="c11", queue_id=5, queue_offset=2, received_at=T0 + 102_000),
    ]


def test_each_extra_delivery_gets_its_cause(spark: SparkSession) -> None:
    rows = _deliveries()
    explained = explain_deliveries(log(spark, rows))
    first = explained.filter("seq = 1")  # a first delivery has no cause
    assert first.count() == len({(r["group"], r["msg_id"]) for r in rows})
    assert first.filter("cause IS NOT NULL").count() == 0
    steps = explained.filter("seq > 1")
    assert_rows(
        steps,
        ["msg_id", "group", "seq", "cause"],
        [
            ("R1", "g1", 2, "retry_after_failure"),
            ("R2", "g1", 2, "retry_after_failure"),
            ("P1", "g1", 2, "producer_resend"),
            ("P2", "g1", 2, "producer_resend"),
            ("O1", "g1", 2, "rebalance_overlap"),
            ("H1", "g1", 2, "offset_not_committed"),
            ("C1", "g1", 2, "redelivery_after_restart"),
            ("A1", "g1", 2, "offset_not_committed"),
            ("B1", "g1", 2, "rebalance_overlap"),
            ("E1", "g1", 2, "rebalance_overlap"),
            ("F1", "g1", 2, "rebalance_overlap"),
        ],
    )


# audit_duplicates of _deliveries(): msg_id, group, kind, cause, count, consumed, clients.
FOUND = [
    ("R1", "g1", "retried_then_ok", "retry_after_failure", 2, 1, "c1"),
    ("P1", "g1", "delivered_twice", "producer_resend", 2, 2, "c1"),
    ("P1", "g1", "duplicate_effect", "producer_resend", 2, 2, "c1"),
    ("P2", "g1", "delivered_twice", "producer_resend", 2, 1, "c1"),
    ("O1", "g1", "delivered_twice", "rebalance_overlap", 2, 2, "c1,c2"),
    ("O1", "g1", "duplicate_effect", "rebalance_overlap", 2, 2, "c1,c2"),
    ("H1", "g1", "delivered_twice", "offset_not_committed", 2, 2, "c5,c6"),
    ("H1", "g1", "duplicate_effect", "offset_not_committed", 2, 2, "c5,c6"),
    ("C1", "g1", "delivered_twice", "redelivery_after_restart", 2, 1, "c1,c3"),
    ("A1", "g1", "delivered_twice", "offset_not_committed", 2, 2, "c4"),
    ("A1", "g1", "duplicate_effect", "offset_not_committed", 2, 2, "c4"),
    ("B1", "g1", "delivered_twice", "rebalance_overlap", 2, 2, "c7,c8"),
    ("B1", "g1", "duplicate_effect", "rebalance_overlap", 2, 2, "c7,c8"),
    ("E1", "g1", "delivered_twice", "rebalance_overlap", 2, 2, "c10,c9"),
    ("E1", "g1", "duplicate_effect", "rebalance_overlap", 2, 2, "c10,c9"),
    ("F1", "g1", "delivered_twice", "rebalance_overlap", 2, 2, "c11,c12"),
    ("F1", "g1", "duplicate_effect", "rebalance_overlap", 2, 2, "c11,c12"),
]
COLUMNS = ["msg_id", "group", "kind", "cause", "count", "consumed", "clients"]


def test_delivered_twice_and_duplicate_effects(spark: SparkSession) -> None:
    df = audit_duplicates(messages(spark, []), log(spark, _deliveries()), T0)
    assert_rows(df, COLUMNS, FOUND)


def test_clusters_whose_ledgers_number_rows_alike_stay_apart(spark: SparkSession) -> None:
    """Each cluster's ledger numbers its rows from 1: the same ids, groups and messages in a
    second cluster give each cluster the same rows, none counted twice."""
    rows = _deliveries() + [r | {"cluster": "other"} for r in _deliveries()]
    df = audit_duplicates(messages(spark, []), log(spark, rows), T0)
    expected = [(c, *r) for c in (DEFAULT_CLUSTER, "other") for r in FOUND]
    assert_rows(df, ["cluster", *COLUMNS], expected)


def test_the_workload_truth_explains_deliveries_by_the_same_rules(spark: SparkSession) -> None:
    """truth.json's Python rules (broker_runtime.workload.truth) and the audit's columns
    give every (group, message) the same kind, cause and count on the same deliveries."""
    rows = _deliveries()
    found = audit_duplicates(messages(spark, []), log(spark, rows), T0)
    audit = {
        (r["msg_id"], r["group"], r["kind"], r["cause"], r["count"])
        for r in found.filter(found.kind != findings.DUPLICATE_EFFECT).collect()
    }
    from_rules = {
        (f["msg_id"], f["group"], f["kind"], f["cause"], f["count"])
        for group, ds in _as_deliveries(rows).items()
        for f in truth.delivery_findings(group, "TopicA", ds)
    }
    assert from_rules == audit


def _as_deliveries(rows: list[dict[str, object]]) -> dict[str, list[Delivery]]:
    """message_log rows as the workload's journal deliveries, per group in receipt order."""
    per_group: dict[str, list[Delivery]] = {}
    for r in sorted(rows, key=lambda r: (r["received_at"], r["id"])):  # type: ignore[arg-type]
        per_group.setdefault(str(r["group"]), []).append(
            Delivery(
                0, str(r["msg_id"]), str(r["client_id"]), str(r["topic"]), str(r["broker"]),
                int(r["queue_id"]), int(r["queue_offset"]), int(r["reconsume_times"]),
                int(r["received_at"]), r["outcome"], r["finished_at"],
            )  # type: ignore[arg-type]
        )  # fmt: skip
    return per_group


def test_the_workload_truth_uses_the_audits_vocabulary() -> None:
    audited = {kind for kinds in findings.KINDS.values() for kind in kinds}
    assert set(findings.TRUTH_KINDS) <= audited
    assert truth.default_cause(findings.DEAD_LETTERED, 1) == findings.SENT_TO_DLQ_DIRECTLY


def test_a_retry_after_a_duplicate_keeps_the_duplicate_cause(spark: SparkSession) -> None:
    rows = [
        delivery(1, "M", client="c4"),
        delivery(2, "M", client="c4", outcome="RECONSUME_LATER"),  # redelivered, then failed
        delivery(3, "M", client="c4", topic="%RETRY%g1", reconsume_times=1),
    ]
    df = audit_duplicates(messages(spark, []), log(spark, rows), T0)
    assert_rows(
        df,
        ["msg_id", "kind", "cause", "count", "consumed", "detail"],
        [
            (
                "M",
                "delivered_twice",
                "offset_not_committed",
                3,
                2,
                "3 deliveries: #2 offset_not_committed, #3 retry_after_failure",
            ),
            (
                "M",
                "duplicate_effect",
                "offset_not_committed",
                2,
                2,
                "CONSUMED 2 times; 3 deliveries: #2 offset_not_committed, #3 retry_after_failure",
            ),
        ],
    )


@st.composite
def group_log(draw: st.DrawFn, group: str, first_id: int) -> list[dict[str, object]]:
    """One group's deliveries of 3 messages by 3 clients from 2 queues at distinct times,
    with resent copies, retries, failures, deaths and slow consumers."""
    times = draw(st.lists(st.integers(0, 40), min_size=2, max_size=12, unique=True))
    rows = []
    for i, t in enumerate(times):
        m = draw(st.integers(0, 2))
        outcome = draw(st.sampled_from(["CONSUMED", "CONSUMED", "RECONSUME_LATER", "FAILED", None]))
        where = draw(st.sampled_from(["copy", "copy", "copy", "resent", "retry"]))
        over: dict[str, object] = {"queue_id": m % 2, "queue_offset": m}
        if where == "resent":  # another stored copy of the message
            over["queue_offset"] = 100 + m
        elif where == "retry":
            over.update(topic=f"%RETRY%{group}", queue_id=0, reconsume_times=1)
        client = draw(st.sampled_from(["c1", "c2", "c3"]))
        finished = None if outcome is None else T0 + 100 * (t + draw(st.integers(0, 25)))
        at = T0 + 100 * t
        row = delivery(first_id + i, f"M{m}", client, group=group, received_at=at, **over)
        rows.append(row | {"outcome": outcome, "finished_at": finished})
    return rows


@st.composite
def many_logs(draw: st.DrawFn) -> list[dict[str, object]]:
    return [r for g in range(40) for r in draw(group_log(f"g{g}", 1000 * g))]


# Few examples of many groups each (a Spark job per example), not shrunk (a shrink step is a
# Spark job too): the assertion's set difference names the deliveries that disagree.
@settings(
    max_examples=2,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(rows=many_logs())
def test_generated_logs_get_the_causes_the_truth_rules_give(
    spark: SparkSession, rows: list[dict[str, object]]
) -> None:
    """Every extra delivery of generated logs (40 groups an example, one Spark job): the
    audit's Spark columns and truth.json's Python rules, two implementations of the module
    docstring's rules, name the same cause."""
    audit = {
        (r["group"], r["msg_id"], r["seq"], r["cause"])
        for r in explain_deliveries(log(spark, rows)).filter("seq > 1").collect()
    }
    rules = set()
    for group, ds in _as_deliveries(rows).items():
        queues = truth.QueueActivity(ds)
        by_msg: dict[str, list[Delivery]] = {}
        for d in ds:
            by_msg.setdefault(d.msg_id, []).append(d)
        for msg_id, seq in by_msg.items():
            for n, (a, b) in enumerate(itertools.pairwise(seq), start=2):
                rules.add((group, msg_id, n, truth.cause_of(a, b, queues)))
    assert audit == rules
