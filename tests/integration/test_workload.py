"""`mqaudit workload` against a real cluster, its truth.json checked against what the broker
files and the ledgers show: copies stored twice and dead letters in the commitlogs,
duplicate and retried deliveries in the consumer ledger, acknowledged messages missing from
every commitlog after the master's power cut, and the rebalance with the lock off and on."""

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
from broker_runtime.store import inspect
from broker_runtime.store import record_codec as codec
from broker_runtime.workload.truth import validate
from tests.conftest import mqaudit_cmd
from tests.integration.cluster_fixtures import Cluster, running_cluster

pytestmark = pytest.mark.integration


SCENARIOS = (
    "consumer_crash_unacked,producer_resend,consumer_failures,"
    "rebalance_lock_off,rebalance_lock_on,master_crash_async"
)
Run = tuple[Path, dict[str, Any], dict[str, Any]]  # the data dir, truth.json, the summary


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """One workload run: the main cluster's scenarios beside three on clusters of their own."""
    with running_cluster(
        tmp_path_factory.mktemp("workload") / "c",
        name_servers=1,
        groups=("broker-a", "broker-b"),
        slaves=False,
        settings={"store.delay_time_scale": "0.1"},
    ) as c:
        doc, summary = run_workload(c, SCENARIOS, 6 * 60, seed=3)
        yield c.data_dir, doc, summary


def run_workload(
    c: Cluster, scenarios: str, messages: int, seed: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    truth = c.data_dir / f"truth-{seed}.json"
    argv = ["workload", "--data-dir", str(c.data_dir), "--messages", str(messages)]
    argv += ["--scenario", scenarios, "--truth", str(truth), "--seed", str(seed)]
    out = subprocess.run(mqaudit_cmd(*argv), capture_output=True, text=True, timeout=280)
    assert out.returncode == 0, out.stderr[-4000:]
    assert "[workload" in out.stderr  # progress
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    doc = json.loads(truth.read_text())
    validate(doc)
    return doc, summary


def messages(store: Path) -> Iterator[Any]:
    """Every message in a store's commitlog, read from its files."""
    log = inspect.open_log(store)
    try:
        for _phys, view, pos in inspect.units(log):
            yield codec.decode(view, pos)
    finally:
        log.close()


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
    with sqlite3.connect(root / "ledger" / "consumer.db") as db:
        rows = db.execute(
            'SELECT msg_id, topic, outcome FROM message_log WHERE "group" = ? ORDER BY id',
            (group,),
        ).fetchall()
    out: dict[str, list[tuple[str, str | None]]] = {}
    for msg_id, topic, outcome in rows:
        out.setdefault(msg_id, []).append((topic, outcome))
    return out


def of_kind(entry: dict[str, Any], kind: str) -> dict[str, int]:
    return {f["msg_id"]: f["count"] for f in entry["findings"] if f["kind"] == kind}


def test_truth_matches_the_broker_files_and_the_ledgers(run: Run) -> None:
    root, doc, summary = run
    assert set(doc["scenarios"]) == set(SCENARIOS.split(","))
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
