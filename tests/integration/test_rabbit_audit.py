"""The audit of a real RabbitMQ: faults made on the broker, found in the lake's audit tables.

The RabbitMQ workload (broker_runtime/workload/rabbit.py) runs in one virtual host per seed:
a consumer that dies holding deliveries, nacks with requeue, republishes, rejects and TTL
expiries into a dead-letter exchange, expiries and max-length drops without one, a queue
nobody consumes, unroutable mandatory publishes, a binding removed while publishing (the
topology snapshotted as it changes). Its ledgers and the topologies (management API,
before, during and after) are ingested into one lake, the audit runs, and per virtual host its
RabbitMQ rows must be exactly the workload's truth: recall and precision 1.0 per kind.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from pyspark.sql import SparkSession

from broker_runtime.rabbit.topology import Snapshot, fetch_snapshot
from broker_runtime.workload.rabbit import DLX, EXCHANGE, run_rabbit_faults
from pipeline.delta_io import DeltaIO
from pipeline.jobs.audit import run_audit
from pipeline.jobs.rabbit import append_snapshots, ingest_topology
from pipeline.lake import AUDIT_TABLES, table_path
from pipeline.steps import INGEST, RunInputs
from tests.rabbitmq import RabbitNode

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]  # Spark at load 20: minutes

SEEDS = (1, 2, 3)


@pytest.fixture(scope="module")
def audited(rabbit_node: RabbitNode, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from tests.conftest import local_spark

    vhosts = {seed: f"audit{seed}-{uuid.uuid4().hex[:8]}" for seed in SEEDS}
    for vhost in vhosts.values():
        rabbit_node.add_vhost(vhost)
    root = tmp_path_factory.mktemp("rabbit-audit")
    data, lake = root / "data", root / "lake"
    lake.mkdir()
    spark: SparkSession = local_spark("mqaudit-rabbit-audit")
    api = rabbit_node.api_url
    try:
        # Before the exchanges exist (too old for every publish), and after.
        ingest_topology(spark, lake, api, list(vhosts.values()), progress=False)
        snaps: list[Snapshot] = []

        def snapshot_of(vhost: str) -> Any:
            return lambda: snaps.append(fetch_snapshot(api, vhost))

        truth = {
            vhosts[seed]: run_rabbit_faults(
                rabbit_node.amqp_url(vhosts[seed]), data, seed, snapshot_of(vhosts[seed])
            )
            for seed in SEEDS
        }
        assert append_snapshots(spark, lake, snaps) > 0  # the topology as it changed
        # As mq_audit's ingest step takes it: the topology and the ledgers, no RocketMQ broker.
        inputs = RunInputs(lake, (data,), rabbit_api=api, rabbit_vhosts=",".join(vhosts.values()))
        ingested = INGEST.run(replace(inputs, progress=False), spark)
        assert ingested["rabbit_topology"] > 0 and ingested["brokers"] == []
        appended = ingested["appended"]
        summary = run_audit(lake, spark, progress=False)
        io = DeltaIO(spark)
        rows = {
            name: [
                r.asDict()
                for r in io.read(table_path(lake, name), schema).collect()
                if r["system"] == "rabbitmq"
            ]
            for name, schema in AUDIT_TABLES.items()
        }
        yield truth, rows, summary, appended, vhosts
    finally:  # the session stays: it is the worker's, which later files' fixtures hold
        for vhost in vhosts.values():
            rabbit_node.delete_vhost(vhost)


def _key(r: dict[str, Any]) -> tuple[str, str, str | None, str]:
    return (r["kind"], r["cause"], r["group"], r["msg_id"])


@pytest.mark.parametrize("seed", SEEDS)
def test_findings_are_the_faults_made(audited: Any, seed: int) -> None:
    truth, rows, _, _, vhosts = audited
    vhost = vhosts[seed]
    found = {
        _key(r)
        for name in ("audit_duplicates", "audit_losses", "audit_dead_letters")
        for r in rows[name]
        if r["broker"] == vhost
    }
    expected = {_key(t) for t in truth[vhost]}
    for kind in {k for k, *_ in expected}:  # recall and precision 1.0 per kind
        assert {e for e in found if e[0] == kind} == {e for e in expected if e[0] == kind}, kind
    assert found == expected
    assert len({k for k, *_ in expected}) == 7  # every kind the workload makes


def test_nothing_else_is_found(audited: Any) -> None:
    _, rows, _, appended, vhosts = audited
    assert {r["broker"] for n in rows for r in rows[n]} == set(vhosts.values())
    assert not any(rows[n] for n in ("audit_lag", "resend_candidates", "consistency"))
    assert appended["message_stub"] > 0 and appended["message_log"] > 0


def test_finding_rows_name_exchange_vhost_and_death(audited: Any) -> None:
    _, rows, summary, _, vhosts = audited
    vhost = vhosts[1]
    by = {(r["kind"], r["msg_id"]): r for n in rows for r in rows[n]}
    moved = by[("never_delivered", "rebind-1-0-a")]  # routed to `copy` while bound
    assert (moved["group"], moved["topic"]) == ("copy", "events")
    assert not any(m.startswith("rebind-1-0-b") for _, m in by)  # published after the unbind
    lost = by[("never_delivered", "idle-1-0")]
    assert (lost["topic"], lost["broker"], lost["group"]) == (EXCHANGE, vhost, "idle")
    dead = by[("dead_lettered", "reject-1-0")]
    assert (dead["topic"], dead["original_topic"], dead["retries"]) == (DLX, EXCHANGE, 1)
    assert '"routing-keys": ["order.4.ship"]' in dead["death"]
    assert (dead["deliveries"], dead["last_outcome"]) == (1, "CONSUMED")
    twice = by[("delivered_twice", "crash-1-0")]
    assert twice["count"] == 2 and "(redelivered)" in twice["detail"]
    assert set(summary["tables"]["audit_losses"]["kinds"]["unroutable"]) == {"no_route"}
