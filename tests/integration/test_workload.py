"""`mqaudit workload --scenario all` against a real cluster, its truth.json checked against
what the broker files and the ledgers show, scenario by scenario: copies stored twice and
dead letters in the commitlogs; duplicate and retried deliveries in the consumer ledger,
where they came from (the held queue, the queue whose acks were lost, the queues two
consumers owned at once); acknowledged messages missing from every commitlog after the
ASYNC master's power cut, none after the SYNC one's; the rebalance with the lock off and on."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker_runtime.common.message import UNIQ_KEY
from broker_runtime.common.topics import dlq_topic
from broker_runtime.store import inspection
from broker_runtime.store import record_codec as codec
from broker_runtime.workload.plan import SCENARIOS
from broker_runtime.workload.truth import validate
from tests.conftest import mqaudit_cmd
from tests.integration.cluster_fixtures import Cluster, kill_leftovers, running_cluster

pytestmark = pytest.mark.integration


Run = tuple[Path, dict[str, Any], dict[str, Any]]  # the data dir, truth.json, the summary


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """One workload run of every scenario: the main cluster's beside four on clusters of
    their own (each taken down by PID here too, should the run have been cut short)."""
    with running_cluster(
        tmp_path_factory.mktemp("workload") / "c",
        name_servers=1,
        groups=("broker-a", "broker-b"),
        slaves=False,
        settings={"store.delay_time_scale": "0.1"},
    ) as c:
        doc, summary = run_workload(c, "all", len(SCENARIOS) * 60, seed=3)
        yield c.data_dir, doc, summary


def run_workload(
    c: Cluster, scenarios: str, messages: int, seed: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    truth = c.data_dir / f"truth-{seed}.json"
    argv = ["workload", "--data-dir", str(c.data_dir), "--messages", str(messages)]
    argv += ["--scenario", scenarios, "--truth", str(truth), "--seed", str(seed)]
    try:
        out = subprocess.run(mqaudit_cmd(*argv), capture_output=True, text=True, timeout=280)
    finally:  # the clusters the workload started, should it have been cut short
        for own in sorted((c.data_dir / "scenarios").glob("*")):
            kill_leftovers(own)
    assert out.returncode == 0, out.stderr[-4000:]
    assert "workload: [" in out.stderr  # progress
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    doc = json.loads(truth.read_text())
    validate(doc)
    return doc, summary


def messages(store: Path) -> Iterator[Any]:
    """Every message in a store's commitlog, read from its files."""
    for _phys, view, pos in inspection.units(store):
        yield codec.decode(view, pos)


def copies_in_logs(root: Path, role: str = "master") -> Counter[tuple[str, str]]:
    """(topic, UNIQ_KEY) -> copies, over the commitlogs of every `role` node under `root`."""
    return Counter(
        (m.topic, m.properties[UNIQ_KEY])
        for store in sorted((root / "brokers").glob(f"*/{role}"))
        for m in messages(store)
        if UNIQ_KEY in m.properties
    )


def dead_letters(root: Path, group: str) -> dict[str, int]:
    """UNIQ_KEY -> reconsume times of the group's dead letters in the masters' commitlogs."""
    return {
        m.properties[UNIQ_KEY]: m.reconsume_times
        for store in sorted((root / "brokers").glob("*/master"))
        for m in messages(store)
        if m.topic == dlq_topic(group)
    }


def log_rows(root: Path, group: str) -> dict[str, list[tuple[str, str | None]]]:
    """msg_id -> [(topic pulled, outcome)] of the group's deliveries, in order."""
    out: dict[str, list[tuple[str, str | None]]] = {}
    for msg_id, row in log_deliveries(root, group):
        out.setdefault(msg_id, []).append((row["topic"], row["outcome"]))
    return out


def log_deliveries(root: Path, group: str) -> list[tuple[str, dict[str, Any]]]:
    """(msg_id, the whole message_log row) of the group's deliveries, in order."""
    with sqlite3.connect(root / "ledger" / "consumer.db") as db:
        db.row_factory = sqlite3.Row
        rows = db.execute(
            'SELECT * FROM message_log WHERE "group" = ? ORDER BY id', (group,)
        ).fetchall()
    return [(r["msg_id"], dict(r)) for r in rows]


def stubs(root: Path) -> dict[str, str]:
    """msg_id -> status of the producer ledger's stubs under `root`."""
    with sqlite3.connect(root / "ledger" / "producer.db") as db:
        return dict(db.execute("SELECT msg_id, status FROM message_stub").fetchall())


def of_kind(entry: dict[str, Any], kind: str) -> dict[str, int]:
    return {f["msg_id"]: f["count"] for f in entry["findings"] if f["kind"] == kind}


def test_truth_matches_the_broker_files_and_the_ledgers(run: Run) -> None:
    root, doc, summary = run
    assert set(doc["scenarios"]) == set(SCENARIOS)
    assert summary["scenarios"] == {n: {k: v for k, v in s["expected"].items() if v}
                                    for n, s in doc["scenarios"].items()}  # fmt: skip
    copies = copies_in_logs(root)

    resend = doc["scenarios"]["producer_resend"]
    topic, group = resend["topic"], resend["groups"][0]
    twice = {k: n for (t, k), n in copies.items() if t == topic and n >= 2}
    assert twice and of_kind(resend, "stored_twice") == twice
    log = log_rows(root, group)
    assert of_kind(resend, "delivered_twice") == {m: len(r) for m, r in log.items() if len(r) > 1}
    assert set(twice) == set(of_kind(resend, "delivered_twice"))
    # The sends cut off from the broker: their stubs UNCONFIRMED in the producer ledger, and
    # no commitlog holds them.
    with sqlite3.connect(root / "ledger" / "producer.db") as db:
        unconfirmed = {r[0] for r in db.execute(
            "SELECT msg_id FROM message_stub WHERE status = 'UNCONFIRMED' AND topic = ?",
            (topic,))}  # fmt: skip
    assert unconfirmed and of_kind(resend, "resend_due") == dict.fromkeys(unconfirmed, 1)
    assert set(resend["injected"]["unreachable_msg_ids"]) == unconfirmed
    assert not unconfirmed & {k for (t, k) in copies if t == topic}

    crash = doc["scenarios"]["consumer_crash_unacked"]
    log = log_rows(root, crash["groups"][0])
    dup = {m: len(r) for m, r in log.items() if len(r) > 1}
    assert dup and of_kind(crash, "delivered_twice") == dup
    unfinished = [m for m, r in log.items() for _, outcome in r if outcome is None]
    assert unfinished == [crash["injected"]["held_msg_id"]]  # killed while holding it

    failures = doc["scenarios"]["consumer_failures"]
    group = failures["groups"][0]
    dead = dead_letters(root, group)
    assert dead and of_kind(failures, "dead_lettered") == dead
    assert set(dead.values()) == {failures["injected"]["max_reconsume_times"] + 1}
    log = log_rows(root, group)
    retried = {
        m: len(r) for m, r in log.items()
        if len(r) > 1 and r[-1][1] == "CONSUMED"
        and all(o == "RECONSUME_LATER" for _, o in r[:-1])
    }  # fmt: skip
    assert retried and of_kind(failures, "retried_then_ok") == retried

    crashed = doc["scenarios"]["master_crash_async"]
    own = Path(crashed["data_dir"])
    assert own == root / "scenarios" / "master_crash_async"
    with sqlite3.connect(own / "ledger" / "producer.db") as db:
        confirmed = {r[0] for r in db.execute(
            "SELECT msg_id FROM message_stub WHERE status = 'CONFIRMED'")}  # fmt: skip
    stored = {  # the slave's copy counts as stored too
        k for role in ("master", "slave") for (t, k) in copies_in_logs(own, role)
        if t == crashed["topic"]
    }  # fmt: skip
    lost = confirmed - stored
    assert lost and set(of_kind(crashed, "lost_after_ack")) == lost
    assert set(crashed["injected"]["lost_msg_ids"]) == lost


def test_the_queue_lock_holds_back_the_new_owner_fewer_duplicates(run: Run) -> None:
    _root, doc, summary = run
    dups = summary["rebalance_duplicate_deliveries"]
    assert dups["lock_off"] > 0 and dups["lock_on"] < dups["lock_off"]
    for name in ("rebalance_lock_off", "rebalance_lock_on"):
        entry = doc["scenarios"][name]
        own = Path(entry["data_dir"])
        log = log_rows(own, entry["groups"][0])
        twice = {m: len(r) for m, r in log.items() if len(r) > 1}
        assert of_kind(entry, "delivered_twice") == twice, name
        assert sum(n - 1 for n in twice.values()) == entry["stats"]["duplicate_deliveries"]
    broker = doc["scenarios"]["rebalance_lock_on"]["stats"]["broker"]
    assert broker["queueAccessLock"] == "True" and int(broker["accessLockRefusedPulls"]) > 0
    assert broker["accessLockTransfers"].get("acked", 0) >= 1  # the old owner's acks, no timeout
    assert doc["scenarios"]["rebalance_lock_off"]["stats"]["broker"]["queueAccessLock"] == "False"


def test_acks_lost_then_a_crash_redeliver_that_queue_from_the_last_ack(run: Run) -> None:
    root, doc, _ = run
    entry = doc["scenarios"]["ack_lost"]
    injected = entry["injected"]
    assert injected["acks_lost"] > 0
    rows = log_deliveries(root, entry["groups"][0])
    per_msg = Counter(m for m, _ in rows)
    twice = {m: n for m, n in per_msg.items() if n > 1}
    assert twice and of_kind(entry, "delivered_twice") == twice
    lossy = tuple(injected["queue"])
    again = {
        m for m, r in rows
        if (r["topic"], r["broker"], r["queue_id"]) == lossy
        and r["queue_offset"] >= injected["committed_at_kill"]
    }  # fmt: skip
    assert set(twice) == again  # every one past the last ack that arrived, nothing else
    clients = {m: {r["client_id"] for mm, r in rows if mm == m} for m in twice}
    assert all(len(c) == 2 for c in clients.values())  # consumed by a, again by b


def test_two_route_views_put_two_consumers_on_one_queue(run: Run) -> None:
    root, doc, _ = run
    entry = doc["scenarios"]["namesrv_split"]
    injected = entry["injected"]
    both = {(b, q) for _t, b, q in injected["queues_owned_twice"]}
    assert both and injected["stale_view"] != injected["fresh_view"]
    rows = log_deliveries(root, entry["groups"][0])
    per_msg = Counter(m for m, _ in rows)
    twice = {m: n for m, n in per_msg.items() if n > 1}
    assert twice and of_kind(entry, "delivered_twice") == twice
    for m in twice:
        mine = [r for mm, r in rows if mm == m]
        assert {(r["broker"], r["queue_id"]) for r in mine} <= both
        assert {r["client_id"] for r in mine} == {
            injected["stale_consumer"], injected["fresh_consumer"]
        }  # fmt: skip


def test_a_sync_master_loses_nothing_it_acknowledged(run: Run) -> None:
    _root, doc, _ = run
    entry = doc["scenarios"]["master_crash_sync"]
    own = Path(entry["data_dir"])
    assert entry["injected"]["lost_msg_ids"] == []
    assert {f["kind"] for f in entry["findings"]} == {"resend_due"}  # nothing lost
    status = stubs(own)
    stored = {
        k for role in ("master", "slave") for (t, k) in copies_in_logs(own, role)
        if t == entry["topic"]
    }  # fmt: skip
    confirmed = {m for m, s in status.items() if s == "CONFIRMED"}
    assert confirmed and confirmed <= stored
    # The replication stall happened: the master stored what it could not replicate and
    # did not acknowledge it (those stubs stay UNCONFIRMED), and nothing was cut.
    statuses = entry["stats"]["statuses"]
    unconfirmed = {m for m, s in status.items() if s == "UNCONFIRMED"}
    assert statuses.get("SLAVE_NOT_AVAILABLE", 0) == len(unconfirmed) > 0
    assert unconfirmed <= stored
    assert of_kind(entry, "resend_due") == dict.fromkeys(unconfirmed, 1)  # the resend's work
    injected = entry["injected"]
    assert injected["master_log_cut_at"] == injected["master_log_end_at_power_loss"]
