"""What tests/integration/test_audit_truth.py compares: findings as comparable keys (from
truth.json, from the audit tables, from truth.py's rules over the raw consumer ledger), the
raw data counted without the pipeline, and precision/recall tables."""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker_runtime.common.findings import ROCKETMQ
from broker_runtime.common.message import UNIQ_KEY
from broker_runtime.common.topics import (
    SCHEDULE_TOPIC,
    TRANS_SYSTEM_TOPICS,
    group_of,
    is_dlq_topic,
    is_retry_topic,
)
from broker_runtime.offsets import offset_history
from broker_runtime.offsets.consumer_offsets import TOPIC_GROUP_SEPARATOR, ConsumerOffsets
from broker_runtime.workload import truth as T
from broker_runtime.workload.journal import Delivery
from broker_runtime.workload.truth_compare import Key
from broker_runtime.workload.truth_compare import precision_recall as precision_recall
from pipeline.lake import system_rows
from tests.integration.test_workload import messages


def scenario_of(doc: Mapping[str, Any]) -> dict[str, str]:
    """Topic or group name -> the scenario it belongs to."""
    out = {}
    for name, s in doc["scenarios"].items():
        out[s["topic"]] = name
        out.update(dict.fromkeys(s["groups"], name))
    return out


def truth_keys(doc: Mapping[str, Any]) -> dict[Key, int]:
    """Every finding of truth.json -> its count."""
    return {
        (name, f["kind"], f["msg_id"], f["group"], f.get("cause")): f["count"]
        for name, s in doc["scenarios"].items()
        for f in s["findings"]
    }


def audit_keys(rows: Iterable[Mapping[str, Any]], owners: Mapping[str, str]) -> dict[Key, int]:
    """Audit rows -> count, keyed like truth (scenario by group, else topic; "?" for none)."""
    out = {}
    for r in rows:
        scenario = owners.get(r["group"] or "") or owners.get(r["topic"] or "", "?")
        out[(scenario, r["kind"], r["msg_id"], r["group"], r["cause"])] = int(r["count"])
    return out


def without_cause(keys: Iterable[Key]) -> set[tuple[str, str, str, str | None]]:
    return {k[:4] for k in keys}


# The audit tables that hold the workload's fault findings, and the columns a finding is named by.
FAULT_TABLES = (
    "audit_duplicates",
    "audit_losses",
    "audit_dead_letters",
    "consistency",
    "audit_transactions",
    "audit_filters",
    "resend_candidates",
)
COLUMNS = ["msg_id", "group", "kind", "cause", "count", "topic"]
DUPLICATE_EFFECT = "duplicate_effect"  # a consequence of delivered_twice, not a fault of its own
# Scenarios where two consumers take from one queue at about the same time: which of the
# concurrent causes a duplicate gets turns on milliseconds (see test_audit_truth).
CONCURRENT = {"namesrv_split", "rebalance_lock_off", "rebalance_lock_on"}
CAUSES_WHEN_CONCURRENT = {"rebalance_overlap", "offset_not_committed", "redelivery_after_restart"}
# A committed offset going back where two consumers of a group commit one queue at once: the
# one that lost it in a rebalance without the lock (or from a stale route) acks what it had
# pulled after the new owner committed further. Whether a snapshot of the offsets falls
# between the two commits is timing, so these are held against the offset files themselves
# (`RawCounts.offsets_went_back`), not the truth.
WENT_BACK = ("offset_regression", "committed_offset_went_back")
WENT_BACK_IN = {"namesrv_split", "rebalance_lock_off"}


def is_went_back(row: dict[str, Any]) -> bool:
    return (row["kind"], row["cause"]) == WENT_BACK


def went_back_counts(rows: Iterable[dict[str, Any]]) -> Counter[tuple[str, str, int]]:
    """The WENT_BACK rows as `RawCounts.offsets_went_back` counts them."""
    return Counter((r["group"], r["topic"], r["count"]) for r in rows if is_went_back(r))


def lake_fault_rows(lake: Path, system: str = ROCKETMQ) -> list[dict[str, Any]]:
    """A lake's fault findings (FAULT_TABLES, COLUMNS) of one system (RocketMQ's: the
    workload's), read with pyarrow, without Spark."""
    return system_rows(lake, FAULT_TABLES, system, COLUMNS)


def concurrent(k: Key) -> bool:
    """Whether the finding's scenario (possibly named `seed:scenario`) is a concurrent one."""
    return k[0].rsplit(":", 1)[-1] in CONCURRENT


def assert_same_findings(truth: dict[Key, int], found: dict[Key, int]) -> None:
    """Every finding of the truth is an audit row and every audit row a finding: with its
    cause and count in the deterministic scenarios; with its count, and a cause among the
    concurrent ones, in the others."""
    det_t = {k: n for k, n in truth.items() if not concurrent(k)}
    det_f = {k: n for k, n in found.items() if not concurrent(k)}
    assert det_f == det_t  # keys with causes, and counts
    assert without_cause(found) == without_cause(truth)
    assert {k[4] for k in set(truth) ^ set(found)} <= CAUSES_WHEN_CONCURRENT
    assert {k[:4]: n for k, n in found.items()} == {k[:4]: n for k, n in truth.items()}


# -- the raw data, read without the pipeline ---------------------------------------------------


def _query(db: Path, sql: str) -> list[Any]:
    """Rows of `sql` on a SQLite ledger, read only; none where that ledger was never made."""
    if not db.is_file():
        return []
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return conn.execute(sql).fetchall()


def ledger_deliveries(data_dir: Path) -> dict[str, list[Delivery]]:
    """group -> its message_log rows as deliveries, in the order the audit numbers them."""
    rows = _query(
        data_dir / "ledger" / "consumer.db",
        "SELECT msg_id, client_id, topic, broker, queue_id, queue_offset, reconsume_times,"
        ' received_at, outcome, finished_at, "group" FROM message_log ORDER BY received_at, id',
    )
    out: dict[str, list[Delivery]] = {}
    for *fields, group in rows:
        out.setdefault(group, []).append(Delivery(0, *fields))
    return out


def rules_on_ledger(data_dir: Path, owners: Mapping[str, str]) -> dict[Key, int]:
    """truth.py's delivery rules applied to the ledger's rows: what the audit must say."""
    out: dict[Key, int] = {}
    for group, ds in ledger_deliveries(data_dir).items():
        scenario = owners.get(group, "?")
        for f in T.delivery_findings(group, "", ds):
            out[(scenario, f["kind"], f["msg_id"], group, f["cause"])] = f["count"]
    return out


@dataclass
class RawCounts:
    """Counted from one cluster data dir's files: sqlite3 on its ledgers, the store's own
    reader on its commitlogs."""

    delivered_more_than_once: set[tuple[str, str]]  # (group, msg_id)
    consumed_more_than_once: set[tuple[str, str]]
    failed_every_time: set[tuple[str, str]]  # delivered more than once, never CONSUMED
    stored_twice: set[str]
    in_dlq: set[tuple[str, str]]
    acked_not_stored: set[str]  # CONFIRMED stubs with an offset, in no commitlog
    offsets_went_back: Counter[tuple[str, str, int]]  # (group, topic, by how many) per step back


def _units(data_dir: Path, role: str) -> Iterable[Any]:
    for store in sorted((data_dir / "brokers").glob(f"*/{role}")):
        yield from messages(store)


def raw_counts(data_dir: Path) -> RawCounts:
    per_msg = _query(
        data_dir / "ledger" / "consumer.db",
        "SELECT \"group\", msg_id, COUNT(*), SUM(outcome = 'CONSUMED') FROM message_log"
        ' GROUP BY "group", msg_id',
    )
    stubs = _query(
        data_dir / "ledger" / "producer.db",
        "SELECT msg_id FROM message_stub WHERE status = 'CONFIRMED' AND queue_offset IS NOT NULL",
    )
    confirmed = {r[0] for r in stubs}
    first_hand: Counter[tuple[str, str]] = Counter()
    stored, dlq = set(), set()
    for role in ("master", "slave"):
        for m in _units(data_dir, role):
            key = m.properties.get(UNIQ_KEY)
            if key is None:
                continue
            stored.add(key)
            if role != "master":
                continue
            if is_dlq_topic(m.topic):
                dlq.add((str(group_of(m.topic)), key))
            elif not is_retry_topic(m.topic) and m.topic not in (
                SCHEDULE_TOPIC,
                *TRANS_SYSTEM_TOPICS,
            ):
                first_hand[(m.topic, key)] += 1
    return RawCounts(
        delivered_more_than_once={(g, m) for g, m, n, _ in per_msg if n > 1},
        consumed_more_than_once={(g, m) for g, m, _, c in per_msg if (c or 0) > 1},
        failed_every_time={(g, m) for g, m, n, c in per_msg if n > 1 and not c},
        stored_twice={k for (_, k), n in first_hand.items() if n > 1},
        in_dlq=dlq,
        acked_not_stored=confirmed - stored,
        offsets_went_back=_offsets_went_back(data_dir),
    )


def _offsets_went_back(data_dir: Path) -> Counter[tuple[str, str, int]]:
    """Each time a group's committed offset of a queue went back between two snapshots of a
    master (its config/offsetHistory, then consumerOffset.json now): (group, topic, by how
    many messages)."""
    out: Counter[tuple[str, str, int]] = Counter()
    for store in sorted((data_dir / "brokers").glob("*/master")):
        entries = [e for e in offset_history.read(store) if not isinstance(e, ValueError)]
        series = [(e.timestamp, e.offsets) for e in entries]
        now = store / "config" / "consumerOffset.json"
        if now.exists():
            series.append((now.stat().st_mtime_ns // 1_000_000, ConsumerOffsets(store).table()))
        last: dict[tuple[str, int], int] = {}
        for _, table in sorted(series, key=lambda s: s[0]):
            for key, queues in table.items():
                for qid, offset in queues.items():
                    prev = last.get((key, qid))
                    if prev is not None and offset < prev:
                        topic, _, group = key.partition(TOPIC_GROUP_SEPARATOR)
                        out[(group, topic, prev - offset)] += 1
                    last[(key, qid)] = offset
    return out


def describe(raw: RawCounts) -> str:
    return ", ".join(f"{k} {len(v)}" for k, v in vars(raw).items())


# -- precision and recall (broker_runtime.workload.truth_compare) --------------------------


def table(title: str, rows: list[tuple[str, ...]]) -> str:
    head = ("kind", "cause", "truth", "found", "both", "precision", "recall")
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows, strict=True)]
    lines = [title, "  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)
