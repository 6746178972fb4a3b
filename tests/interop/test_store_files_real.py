"""Files, Apache RocketMQ -> mqaudit: two real 4.9 brokers of one cluster take an official
Java workload with delays, retries and dead letters (java_workload.py); `mqaudit store
verify` and `store dump` read their stores message by message as the Java side sent and
consumed them, and `pipeline ingest --broker-conf` (names from each broker's own config, no
ledgers) + `audit` put both store roots into one lake.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.interop import java_workload as jw
from tests.interop import store_checks as sc
from tests.interop.java_workload import DLQ, GROUP, TOPIC, Workload
from tests.interop.rocketmq import JavaServer, broker_settings, real_namesrv, start_broker

# JVMs boot in ~10 s on an idle machine, minutes at a load of 40: fixture set-up counts too.
pytestmark = [pytest.mark.integration, pytest.mark.interop, pytest.mark.timeout(600)]

BROKERS = ("broker-r1", "broker-r2")


@pytest.fixture(scope="module")
def workload(
    interop_classpath: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Workload]:
    tmp = tmp_path_factory.mktemp("rocketmq-to-mq")
    with real_namesrv(tmp / "namesrv") as ns:
        brokers: list[JavaServer] = []
        try:
            for name in BROKERS:
                settings = broker_settings(tmp / name, ns.addr, brokerName=name)
                brokers.append(start_broker(tmp / name, settings))
            sent = jw.run(ns.addr)
        finally:
            for b in brokers:
                b.stop()  # clean: flushed, abort removed, consumerOffset.json written
        stores = {b.settings["brokerName"]: Path(b.settings["storePathRootDir"]) for b in brokers}
        yield Workload(stores, [b.conf for b in brokers], *sent)


def test_store_verify_and_dump_read_what_the_java_side_sent(workload: Workload) -> None:
    assert {r["broker"] for r in workload.plain + workload.delayed} == set(BROKERS)  # both used
    jw.check_stores(workload)


@pytest.mark.slow
@pytest.mark.timeout(900)  # two Spark jobs: ~3 min (ingest) + ~7 min (audit) at load 20
def test_ingest_and_audit_several_real_brokers_into_one_lake(
    workload: Workload, tmp_path: Path
) -> None:
    from pipeline.delta_io import DeltaIO
    from pipeline.jobs.audit import run_audit
    from pipeline.jobs.ingest import run_ingest
    from pipeline.lake import AUDIT_TABLES, INGESTED_TABLES, table_path
    from tests.conftest import local_spark

    spark = local_spark()
    lake = tmp_path / "lake"
    stored = {name: len(sc.dump(store)) for name, store in workload.stores.items()}
    summary = run_ingest(None, lake, spark, broker_confs=workload.confs, progress=False)
    assert summary["messages"] == sum(stored.values()) and not summary["quarantine"]
    io = DeltaIO(spark)

    def table(name: str, schema: Any = None) -> list[dict[str, Any]]:
        df = io.read(table_path(lake, name), schema or INGESTED_TABLES[name])
        return [r.asDict() for r in df.collect()]

    messages = table("messages")
    assert Counter(r["broker"] for r in messages) == Counter(stored)
    # Each row names the cluster its broker's config gives (brokerClusterName).
    assert {r["cluster"] for r in [*messages, *table("consume_queue")]} == {"interop"}
    sent = {a["msgId"]: a for a in workload.plain + workload.delayed}
    for r in messages:
        if r["topic"] == TOPIC:
            assert sent[r["uniq_key"]]["broker"] == r["broker"]
    offsets = {
        (r["broker"], r["topic"], r["queue_id"]): r["committed_offset"]
        for r in table("consumer_offsets")
        if r["consumer_group"] == GROUP
    }
    for ack in workload.plain:  # the group committed past every plain message
        assert offsets[(ack["broker"], TOPIC, ack["queueId"])] > ack["queueOffset"]

    audit = run_audit(lake, spark, progress=False)
    assert audit["tables"]["consistency"]["rows"] == 0, audit
    dead = table("audit_dead_letters", AUDIT_TABLES["audit_dead_letters"])
    failed = {d["msgId"]: d for d in workload.deliveries if d["answer"] == "RECONSUME_LATER"}
    assert sorted(r["msg_id"] for r in dead) == sorted(failed)
    for r in dead:
        assert (r["group"], r["topic"], r["original_topic"]) == (GROUP, DLQ, TOPIC)
        assert r["cluster"] == "interop"
        assert r["broker"] == sent[r["msg_id"]]["broker"]
