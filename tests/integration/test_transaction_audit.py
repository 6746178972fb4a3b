"""The transaction audit against the workload's ground truth, over three seeds.

For each seed, `mqaudit workload --scenario transactions` runs (on a cluster it starts for
itself, beside a small main cluster); its cluster is ingested and audited while the next
seed's workload runs. Every finding of truth.json (kind, msg_id, group, cause, count) must be
an audit row and every fault row of the audit a finding: precision and recall 1.0 on the
transaction kinds and on the duplicates a doubled commit makes. The `transactions` table must
hold every transaction the workload ran, in the state the truth gives it, and pass its gate.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from broker_runtime.common import findings as K
from expectations.gates import run_gate
from pipeline import schemas
from pipeline.delta_io import DeltaIO
from pipeline.jobs.audit import run_audit
from pipeline.jobs.ingest import run_ingest
from pipeline.lake import AUDIT_TABLES, table_path
from pipeline.spark_session import build_spark
from tests.integration import truth_compare as C
from tests.integration.cluster_fixtures import running_cluster
from tests.integration.test_workload import run_workload

pytestmark = [pytest.mark.slow, pytest.mark.integration]

SEEDS = (1, 2, 3)
MESSAGES = 30
SCENARIO = "transactions"
Audited = tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]  # truth, rows, tx


def _workload(root: Path, seed: int) -> dict[str, Any]:
    with running_cluster(
        root / f"seed-{seed}", name_servers=1, groups=("broker-a",), slaves=False
    ) as c:
        doc, _ = run_workload(c, SCENARIO, MESSAGES, seed)
    print(f"[tx-audit] seed {seed}: workload done", file=sys.stderr, flush=True)
    return doc


def _audit(spark: Any, lake: Path, doc: dict[str, Any]) -> Audited:
    run_ingest(Path(doc["scenarios"][SCENARIO]["data_dir"]), lake, spark, progress=False)
    run_audit(lake, spark, progress=False)
    io = DeltaIO(spark)
    rows = [
        r.asDict()
        for name in C.FAULT_TABLES
        for r in io.read(table_path(lake, name), AUDIT_TABLES[name]).select(*C.COLUMNS).collect()
    ]
    tx = io.read(table_path(lake, "transactions"), schemas.TRANSACTIONS)
    assert run_gate(tx, "transactions").success
    return doc, rows, [r.asDict() for r in tx.collect()]


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Audited]]:
    root = tmp_path_factory.mktemp("tx-truth")
    spark = build_spark("mqaudit-tests", "local[2]")
    audits = ThreadPoolExecutor(1, "audit")
    try:
        pending = []
        for seed in SEEDS:
            doc = _workload(root, seed)
            pending.append(audits.submit(_audit, spark, root / f"lake-{seed}", doc))
        out = [f.result() for f in pending]
    finally:
        audits.shutdown(wait=True, cancel_futures=True)
    yield out


@pytest.mark.timeout(1800)
def test_every_transaction_fault_is_found_with_its_cause_and_nothing_else(
    audited: list[Audited],
) -> None:
    truth: dict[C.Key, int] = {}
    found: dict[C.Key, int] = {}
    for doc, rows, _ in audited:
        seed = doc["seed"]
        rows = [r for r in rows if r["kind"] != C.DUPLICATE_EFFECT]
        for side, keys in (
            (truth, C.truth_keys(doc)),
            (found, C.audit_keys(rows, C.scenario_of(doc))),
        ):
            side.update({(f"{seed}:{k[0]}", *k[1:]): n for k, n in keys.items()})
    print()
    print(C.table(f"transactions, seeds {SEEDS}", C.precision_recall(truth, found)))
    assert found == truth
    kinds = {k[1] for k in truth}
    # Every transaction kind was injected but half_stuck, which the scenario's fast check-back
    # never leaves a half message in (tests/unit/pipeline/test_audit_transactions.py has it).
    assert set(K.KINDS["audit_transactions"]) - {K.HALF_STUCK} <= kinds


@pytest.mark.timeout(1800)
def test_the_transactions_table_holds_every_transaction_in_its_state(
    audited: list[Audited],
) -> None:
    for doc, _, tx in audited:
        s = doc["scenarios"][SCENARIO]
        roles = s["injected"]["roles"]
        assert len(tx) == s["stats"]["transactions"] == s["messages"]
        states: dict[str, int] = {}
        for r in tx:
            states[r["state"]] = states.get(r["state"], 0) + 1
        ended = len(roles["rollback"]) + len(roles["check_rollback"])
        ended += len(roles["rolled_back_delivered"])
        assert states == {
            K.TX_GAVE_UP: len(roles["gave_up"]) + len(roles["abandoned"]),
            K.TX_ROLLED_BACK: ended,
            K.TX_COMMITTED: s["messages"] - sum(len(v) for v in roles.values())
            + len(roles["check_commit"]) + len(roles["committed_twice"]) + len(roles["late"]),
        }  # fmt: skip
        gave_up = [r for r in tx if r["state"] == K.TX_GAVE_UP]
        assert [r["checks"] for r in gave_up] == [s["injected"]["check_max"]] * len(gave_up)
