"""truth.json from journaled facts: delivery causes, kinds and counts, the file's shape, and
the journal read back incrementally."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from broker_runtime.common import findings as K
from broker_runtime.workload import truth as T
from broker_runtime.workload.consumer_proc import message_index
from broker_runtime.workload.journal import Delivery, JournalReader, JournalWriter

TOPIC = "T"


def d(
    msg: str,
    client: str,
    at: int,
    outcome: str | None = "CONSUMED",
    *,
    topic: str = TOPIC,
    queue: int = 0,
    offset: int = 0,
    broker: str = "broker-a",
    done: int | None = None,
) -> Delivery:
    finished = None if outcome is None else (done if done is not None else at + 1)
    return Delivery(0, msg, client, topic, broker, queue, offset, 0, at, outcome, finished)


def kinds(findings: list[T.Finding]) -> dict[str, tuple[str, int, str | None]]:
    return {f["msg_id"]: (f["kind"], f["count"], f.get("cause")) for f in findings}


def test_one_delivery_each_is_no_finding() -> None:
    assert T.delivery_findings("g", TOPIC, [d("m1", "c1", 1), d("m2", "c1", 2)]) == []


def test_failures_then_success_is_retried_then_ok() -> None:
    ds = [
        d("m", "c1", 10, "RECONSUME_LATER", offset=5),
        d("m", "c1", 20, "FAILED", topic="%RETRY%g", offset=0),
        d("m", "c1", 30, "CONSUMED", topic="%RETRY%g", offset=1),
    ]
    assert kinds(T.delivery_findings("g", TOPIC, ds)) == {
        "m": (K.RETRIED_THEN_OK, 3, K.RETRY_AFTER_FAILURE)
    }


def test_failures_only_make_no_delivery_finding() -> None:
    ds = [d("m", "c1", t, "RECONSUME_LATER") for t in (1, 2, 3, 4)]  # dead-lettered
    assert T.delivery_findings("g", TOPIC, ds) == []


def test_a_restart_after_an_unfinished_delivery() -> None:
    ds = [d("held", "a", 10, None, offset=3), d("held", "b", 50, offset=3)]
    assert kinds(T.delivery_findings("g", TOPIC, ds)) == {
        "held": (K.DELIVERED_TWICE, 2, K.REDELIVERY_AFTER_RESTART)
    }


def test_consumed_again_because_the_offset_was_not_committed() -> None:
    ds = [d("m", "a", 10, offset=4), d("unrelated", "a", 12), d("m", "b", 50, offset=4)]
    assert kinds(T.delivery_findings("g", TOPIC, ds)) == {
        "m": (K.DELIVERED_TWICE, 2, K.OFFSET_NOT_COMMITTED)
    }


def test_two_clients_on_one_queue_at_once_is_a_rebalance_overlap() -> None:
    ds = [d("m", "a", 10, offset=4, done=40), d("m", "b", 20, offset=4, done=25)]
    assert kinds(T.delivery_findings("g", TOPIC, ds))["m"][2] == K.REBALANCE_OVERLAP


def test_a_client_that_left_before_the_duplicate_came_is_no_overlap() -> None:
    # a finished m and left the queue; b got m (offset not committed), then a came back
    # only after b had left: never two owners at once
    ds = [
        d("m", "a", 10, offset=4),
        d("m", "b", 20, offset=4),
        d("n", "b", 30, offset=5),
        d("o", "a", 40, offset=6),
    ]
    assert kinds(T.delivery_findings("g", TOPIC, ds))["m"][2] == K.OFFSET_NOT_COMMITTED


def test_the_old_owner_taking_more_after_the_duplicate_is_an_overlap() -> None:
    # a was done with m when b got it, but a took n from the queue afterwards while b was
    # still taking from it (b got o later): both held the queue
    ds = [
        d("m", "a", 10, offset=4),
        d("m", "b", 20, offset=4),
        d("n", "a", 30, offset=5),
        d("o", "b", 40, offset=6),
    ]
    assert kinds(T.delivery_findings("g", TOPIC, ds))["m"][2] == K.REBALANCE_OVERLAP


def test_a_resent_copy_after_a_failure_is_a_producer_resend() -> None:
    ds = [d("m", "a", 10, "RECONSUME_LATER", offset=4), d("m", "a", 20, queue=1, offset=0)]
    assert kinds(T.delivery_findings("g", TOPIC, ds))["m"] == (
        K.DELIVERED_TWICE, 2, K.PRODUCER_RESEND,
    )  # fmt: skip


def test_another_stored_copy_is_a_producer_resend() -> None:
    ds = [d("m", "a", 10, offset=4), d("m", "a", 11, broker="broker-b", offset=9)]
    assert kinds(T.delivery_findings("g", TOPIC, ds))["m"] == (
        K.DELIVERED_TWICE, 2, K.PRODUCER_RESEND,
    )  # fmt: skip


def test_a_retry_then_a_duplicate_is_delivered_twice_with_the_duplicate_cause() -> None:
    ds = [
        d("m", "a", 10, "RECONSUME_LATER"),
        d("m", "a", 20, None, topic="%RETRY%g"),
        d("m", "b", 90, topic="%RETRY%g"),
    ]
    assert kinds(T.delivery_findings("g", TOPIC, ds))["m"] == (
        K.DELIVERED_TWICE, 3, K.REDELIVERY_AFTER_RESTART,
    )  # fmt: skip


def test_stored_twice_counts_distinct_positions_of_the_topic() -> None:
    copies = {
        "once": [(TOPIC, "broker-a", 0, 1), (TOPIC, "broker-a", 0, 1)],  # seen twice, one copy
        "twice": [(TOPIC, "broker-a", 0, 2), (TOPIC, "broker-b", 3, 0)],
        "retried": [(TOPIC, "broker-a", 1, 0), ("%RETRY%g", "broker-a", 0, 0)],
    }
    assert kinds(T.stored_twice_findings(copies, TOPIC)) == {
        "twice": (K.STORED_TWICE, 2, K.PRODUCER_RESEND)
    }


def _doc() -> dict[str, Any]:
    findings = [
        T.finding(K.DELIVERED_TWICE, "m1", "g", 2, TOPIC, K.OFFSET_NOT_COMMITTED),
        T.finding(K.STORED_TWICE, "m2", None, 2, TOPIC, K.PRODUCER_RESEND),
        T.finding(K.LOST_AFTER_ACK, "m3", None, 1, TOPIC),
        T.finding(K.RESEND_DUE, "m4", None, 1, TOPIC),
    ]
    entry = T.scenario_entry(
        description="x", data_dir="/d", topic=TOPIC, groups=["g"], messages=10,
        injected={}, findings=findings, stats={"duplicate_deliveries": 1},
    )  # fmt: skip
    return {
        "seed": 1, "messages": 10, "run_id": "r", "data_dir": "/d", "started_at": 1000,
        "finished_at": 3500, "scenarios": {"rebalance_lock_off": entry},
    }  # fmt: skip


def test_a_truth_document_validates_and_summarises() -> None:
    doc = _doc()
    T.validate(json.loads(json.dumps(doc)))
    entry = doc["scenarios"]["rebalance_lock_off"]
    assert entry["expected"] == {
        "stored_twice": 1, "delivered_twice": 1, "retried_then_ok": 0, "dead_lettered": 0,
        "lost_after_ack": 1, "resend_due": 1, "half_stuck": 0, "check_gave_up": 0,
        "rolled_back_but_delivered": 0, "committed_twice": 0, "committed_never_consumed": 0,
    }  # fmt: skip
    assert [f["kind"] for f in entry["findings"]] == ["delivered_twice", "lost_after_ack",
                                                      "resend_due", "stored_twice"]  # fmt: skip
    resend = next(f for f in entry["findings"] if f["kind"] == K.RESEND_DUE)
    assert resend["cause"] == K.NEVER_ACKNOWLEDGED  # as the audit names it
    assert T.summary(doc) == {
        "run_id": "r", "seed": 1, "messages": 10, "seconds": 2.5,
        "scenarios": {"rebalance_lock_off": {"stored_twice": 1, "delivered_twice": 1,
                                             "lost_after_ack": 1, "resend_due": 1}},
        "rebalance_duplicate_deliveries": {"lock_off": 1},
    }  # fmt: skip


@pytest.mark.parametrize(
    ("break_it", "message"),
    [
        (lambda s: s["findings"][0].update(kind="lost"), "unknown kind"),
        (lambda s: s["findings"][0].update(count=0), "bad count"),
        (lambda s: s["findings"][1].update(group="g"), "group mismatch"),
        (lambda s: s["findings"].pop(), "expected counts"),
        (lambda s: s.pop("data_dir"), "no 'data_dir'"),
    ],
)
def test_a_broken_truth_document_is_refused(break_it: Any, message: str) -> None:
    doc = copy.deepcopy(_doc())
    break_it(doc["scenarios"]["rebalance_lock_off"])
    with pytest.raises(ValueError, match=message):
        T.validate(doc)


@pytest.mark.parametrize(
    ("kind", "group", "ok"),
    [
        ("half_stuck", None, True),
        ("half_stuck", "g", False),  # a half message is no consumer group's
        ("committed_twice", None, True),
        ("committed_never_consumed", "g", True),
        ("committed_never_consumed", None, False),  # never consumed by whom?
        ("rolled_back_but_delivered", "g", True),
    ],
)
def test_transaction_findings_name_a_group_only_where_one_consumed(
    kind: str, group: str | None, ok: bool
) -> None:
    doc = copy.deepcopy(_doc())
    entry = doc["scenarios"]["rebalance_lock_off"]
    entry["findings"].append(T.finding(kind, "TX1", group, 1, TOPIC, "c"))
    entry["expected"] = T.expected(entry["findings"])
    if ok:
        T.validate(doc)
    else:
        with pytest.raises(ValueError, match="group mismatch"):
            T.validate(doc)


def test_the_journal_is_read_as_it_grows_partial_lines_wait(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    w = JournalWriter(path)
    r = JournalReader(path)
    w.write("start", client="c1")
    w.write("recv", d=0, i=7, id="M7", t=TOPIC, b="broker-a", q=1, o=3, r=0)
    st = r.poll()
    assert st.client == "c1" and len(st.deliveries) == 1 and st.deliveries[0].outcome is None
    with open(path, "ab") as f:
        f.write(b'{"e": "done", "ts": 5, "d": 0, "out": "CONS')  # half a line so far
    assert r.poll().deliveries[0].outcome is None
    with open(path, "ab") as f:
        f.write(b'UMED"}\n')
    w.write("owns", q=[[TOPIC, "broker-a", 1]])
    w.write("ack_lost", q=[TOPIC, "broker-a", 1], o=9)
    st = r.poll()
    assert st.deliveries[0].outcome == "CONSUMED" and st.consumed() == {7}
    assert st.owns == {(TOPIC, "broker-a", 1)}
    assert st.acks_lost == [((TOPIC, "broker-a", 1), 9)]
    w.close()


def test_message_index_is_read_from_the_body() -> None:
    assert message_index(b"run:scenario:41:....") == 41
    assert message_index(b"not a workload body") == -1
