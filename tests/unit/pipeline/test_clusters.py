"""One lake for several clusters: rows keyed by cluster and broker, so two clusters whose
brokers have the same names (and even the same messages) stay apart, in the ingest, its
checkpoints and the audit; data dirs that name one cluster twice are refused; a lake written
before rows named their cluster is refused until `migrate-lake` names it."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from broker_runtime.store.message_store import MessageStore
from pipeline.cli import main as pipeline_main
from pipeline.delta_io import DeltaIO, history
from pipeline.jobs.audit import run_audit
from pipeline.jobs.migrate import UnkeyedLake, migrate_lake, unkeyed
from pipeline.lake import AUDIT_TABLES, TABLES, clusters, one_cluster, table_path
from pipeline.schemas import arrow_schema
from tests.unit.pipeline.stores import config, varied
from tests.unit.pipeline.test_ingest import RANGE, make_cluster, rows

pytestmark = pytest.mark.slow
AS_OF = 1_800_000_000_000
FINDINGS = ["audit_duplicates", "audit_losses", "audit_lag", "audit_dead_letters", "consistency"]


def named(data: Path, cluster: str) -> Path:
    """Give make_cluster's data dir a cluster.json naming `cluster` (same brokers)."""
    nodes = [
        {"role": "master", "broker": "broker-a"},
        {"role": "slave", "broker": "broker-a"},
        {"role": "master", "broker": "broker-b"},
    ]
    (data / "cluster.json").write_text(json.dumps({"cluster_name": cluster, "nodes": nodes}))
    return data


def ingest(spark: SparkSession, dirs: list[Path], lake: Path) -> dict[str, Any]:
    from pipeline.jobs.ingest import run_ingest

    return run_ingest(dirs, lake, spark, range_bytes=RANGE, progress=False)


def findings(spark: SparkSession, lake: Path, cluster: str) -> list[tuple[Any, ...]]:
    """A cluster's audit rows, every column but `cluster` and the run's clock."""
    out = []
    for name in FINDINGS:
        df = DeltaIO(spark).read(table_path(lake, name), AUDIT_TABLES[name])
        keep = [c for c in df.columns if c not in ("cluster", "as_of_ms")]
        out += [(name, *r) for r in df.filter(df["cluster"] == cluster).select(*keep).collect()]
    return sorted(out, key=repr)


def test_two_clusters_with_the_same_brokers_and_messages_stay_apart(
    spark: SparkSession, tmp_path: Path
) -> None:
    east = named(make_cluster(tmp_path / "east"), "east")
    west = named(make_cluster(tmp_path / "west"), "west")  # the same stores, byte for byte
    both, alone = tmp_path / "both", tmp_path / "alone"

    first = ingest(spark, [east, west], both)
    assert first["messages"] == 2 * (150 + 150 + 60)
    assert {(b["cluster"], b["broker"]) for b in first["brokers"]} == {
        (c, b) for c in ("east", "west") for b in ("broker-a", "broker-b")
    }
    assert clusters(both) == ["east", "west"]
    for table, n in (("messages", 360), ("message_stub", 20), ("message_log", 30)):
        got = rows(spark, both, table)
        assert sorted(r["cluster"] for r in got) == ["east"] * n + ["west"] * n, table

    # New data in one cluster: the next run reads only that (checkpoints are per cluster).
    b = west / "brokers" / "broker-b" / "master"
    store = MessageStore(config(b), disk_ratio=lambda _p: 0.0)
    store.put_messages(varied(40, start=5000))
    store.wait_dispatched(None)
    store.shutdown()
    again = ingest(spark, [east, west], both)
    assert again["messages"] == 40
    assert {(r["cluster"], r["broker"]) for r in rows(spark, both, "messages")
            if r["ingest_run"] == again["run"]} == {("west", "broker-b")}  # fmt: skip

    # Each cluster's findings are those of its audit alone: the other cluster changes nothing.
    ingest(spark, [east], alone)
    run_audit(both, spark, AS_OF, progress=False)
    run_audit(alone, spark, AS_OF, progress=False)
    assert findings(spark, both, "east") == findings(spark, alone, "east") != []


def test_one_cluster_named_twice_and_an_unnamed_remediation_target_are_refused(
    spark: SparkSession, tmp_path: Path
) -> None:
    one = named(make_cluster(tmp_path / "one"), "payments")
    two = named(make_cluster(tmp_path / "two"), "payments")
    with pytest.raises(ValueError, match="all cluster payments: each needs its own name"):
        ingest(spark, [one, two], tmp_path / "lake")
    with pytest.raises(ValueError, match="a cluster name is for one data dir"):
        from pipeline.jobs.ingest import run_ingest

        run_ingest([one, two], tmp_path / "lake", spark, cluster="x", progress=False)
    assert not (tmp_path / "lake" / "messages").exists()  # refused before anything is written
    assert one_cluster(tmp_path, "orders") == "orders"
    with pytest.raises(ValueError, match="holds no cluster's data yet"):
        one_cluster(tmp_path / "lake")


def _old_table(lake: Path, name: str, data: list[dict[str, Any]]) -> None:
    """A table as mqaudit wrote it before rows named their cluster."""
    schema = StructType([f for f in TABLES[name].schema.fields if f.name != "cluster"])
    write_deltalake(table_path(lake, name), pa.Table.from_pylist(data, arrow_schema(schema)))


@pytest.mark.parametrize("backend", ["embedded", "native"])
def test_an_old_lake_is_refused_until_migrated_once(
    spark: SparkSession, tmp_path: Path, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MQAUDIT_DELTA_BACKEND", backend)  # the migration commits with either
    assert DeltaIO(spark).backend == backend
    data = make_cluster(tmp_path)
    lake = tmp_path / "old"
    stub = {"msg_id": "K1", "topic": "T", "status": "CONFIRMED", "send_count": 1, "broker": "b"}
    _old_table(lake, "message_stub", [stub, {**stub, "msg_id": "K2"}])
    _old_table(lake, "ingest_checkpoint", [{"run": 1, "status": "done", "broker": "b"}])
    assert unkeyed(lake) == ["message_stub", "ingest_checkpoint"]
    for job in (lambda: ingest(spark, [data], lake), lambda: run_audit(lake, spark)):
        with pytest.raises(UnkeyedLake, match=r"migrate-lake --lake .* --cluster NAME"):
            job()
    before = len(history(table_path(lake, "message_stub")))

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        args = ["migrate-lake", "--lake", str(lake), "--cluster", "payments"]
        assert pipeline_main(args) == 0
    assert json.loads(out.getvalue())["tables"] == {"message_stub": 2, "ingest_checkpoint": 1}
    assert unkeyed(lake) == [] and clusters(lake) == ["payments"]
    assert [r["cluster"] for r in rows(spark, lake, "message_stub")] == ["payments"] * 2
    assert len(history(table_path(lake, "message_stub"))) == before + 2  # history kept
    assert migrate_lake(lake, "payments", spark)["tables"] == {}  # once is enough
    with pytest.raises(ValueError, match="'no spaces' has characters outside"):
        migrate_lake(lake, "no spaces", spark)
