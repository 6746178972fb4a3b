"""Several processes writing one ledger at once: nothing lost, no update lost, one claim wins.

The worker half of this file runs as `python -m tests.integration.test_ledger_concurrency`
in each process; all of them wait for a start file so that their writes overlap.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from broker_runtime.ledger.consumer import ConsumerLedger, Receipt
from broker_runtime.ledger.dedup import Claim, SqlDedupStore
from broker_runtime.ledger.producer import Confirmation, ProducerLedger, StubRecord, body_hash
from broker_runtime.ledger.redis_dedup import RedisDedupStore
from broker_runtime.ledger.schema import Outcome, message_log, message_stub
from tests.conftest import REPO

WORKERS = 4
BATCHES = 25
BATCH = 20
SHARED = [f"shared-{i}" for i in range(5)]  # stubs every worker resends, to contend on rows
CLAIM_KEYS = [f"claim-{i}" for i in range(60)]


def _wait_for(go: Path) -> None:
    deadline = time.monotonic() + 60
    while not go.exists():
        if time.monotonic() > deadline:
            raise SystemExit("no start signal")
        time.sleep(0.005)


def _ledger_worker(url: str, worker: int) -> dict[str, Any]:
    producer = ProducerLedger.open(None, url)
    consumer = ConsumerLedger.open(None, url)
    resent = 0
    for b in range(BATCHES):
        ids = [f"w{worker}-{b}-{i}" for i in range(BATCH)]
        producer.record_before_send([StubRecord(m, "orders", body_hash(m.encode())) for m in ids])
        offsets = [b * BATCH + i for i in range(BATCH)]
        producer.confirm(
            [Confirmation(m, "broker-a", worker, o) for m, o in zip(ids, offsets, strict=True)]
        )
        receipts = [
            Receipt(m, "orders", "g", f"c{worker}", "broker-a", worker, o)
            for m, o in zip(ids, offsets, strict=True)
        ]
        log_ids = consumer.record_received(receipts)
        consumer.record_outcome([(i, Outcome.CONSUMED) for i in log_ids])
        producer.mark_resent(SHARED)
        resent += 1
    producer.close()
    consumer.close()
    return {"resent": resent}


def _claim_worker(url: str, worker: int) -> dict[str, Any]:
    store: SqlDedupStore | RedisDedupStore
    if url.startswith("redis"):
        store = RedisDedupStore.from_url(url)
    else:
        store = SqlDedupStore.open(None, url)
    won = []
    for key in CLAIM_KEYS:
        claim = store.claim("g", key, int(time.time() * 1000), 60_000)
        if claim is Claim.ACQUIRED:
            won.append(key)
    store.close()
    return {"won": won}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["ledger", "claim"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--worker", type=int, required=True)
    parser.add_argument("--go", type=Path, required=True)
    args = parser.parse_args()
    _wait_for(args.go)
    work = _ledger_worker if args.mode == "ledger" else _claim_worker
    print(json.dumps(work(args.url, args.worker)))


def run_workers(mode: str, url: str, tmp_path: Path) -> list[dict[str, Any]]:
    """Start WORKERS processes, release them together, return what each printed."""
    go = tmp_path / f"go-{mode}"
    argv = [sys.executable, "-m", "tests.integration.test_ledger_concurrency", mode, "--url", url]
    procs = [
        subprocess.Popen([*argv, "--worker", str(w), "--go", str(go)], cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for w in range(WORKERS)
    ]  # fmt: skip
    time.sleep(0.5)  # let them import and open their engines
    go.touch()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err.decode()[-3000:]
        results.append(json.loads(out))
    return results


@pytest.mark.integration
def test_concurrent_writers_lose_nothing(ledger_url: str, tmp_path: Path) -> None:
    producer = ProducerLedger.open(None, ledger_url)
    producer.record_before_send([StubRecord(m, "orders", body_hash(m.encode())) for m in SHARED])
    results = run_workers("ledger", ledger_url, tmp_path)
    assert all(r["resent"] == BATCHES for r in results)
    with producer.engine.connect() as conn:
        stubs = conn.execute(
            select(message_stub.c.status, func.count()).group_by(message_stub.c.status)
        ).all()
        per_worker = WORKERS * BATCHES * BATCH
        assert dict(stubs) == {"CONFIRMED": per_worker, "UNCONFIRMED": len(SHARED)}
        # Every worker's read-modify-write of the shared stubs landed: none overwrote another.
        counts = conn.execute(
            select(message_stub.c.send_count).where(message_stub.c.msg_id.in_(SHARED))
        ).scalars()
        assert set(counts) == {1 + WORKERS * BATCHES}
        logged = conn.execute(
            select(message_log.c.outcome, func.count()).group_by(message_log.c.outcome)
        ).all()
        assert dict(logged) == {"CONSUMED": per_worker}
    producer.close()


@pytest.mark.integration
def test_exactly_one_process_wins_each_claim(ledger_url: str, tmp_path: Path) -> None:
    SqlDedupStore.open(None, ledger_url).close()  # create the tables before the race
    won = [k for r in run_workers("claim", ledger_url, tmp_path) for k in r["won"]]
    assert sorted(won) == sorted(CLAIM_KEYS)


@pytest.mark.integration
def test_exactly_one_process_wins_each_claim_in_redis(redis_url: str, tmp_path: Path) -> None:
    won = [k for r in run_workers("claim", redis_url, tmp_path) for k in r["won"]]
    assert sorted(won) == sorted(CLAIM_KEYS)


if __name__ == "__main__":
    main()
