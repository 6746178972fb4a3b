"""The gates over a lake the real ingest wrote from real broker stores and ledgers."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from broker_runtime.store import record_codec as codec
from expectations.context import GateContext
from expectations.gates import GateFailed, run_all_gates
from expectations.suites import INGESTED_TABLES
from pipeline.delta_io import DeltaIO
from pipeline.lake import INGESTED_TABLES as TABLES
from pipeline.lake import table_path
from pipeline.readers.commitlog import segment_files
from tests.unit.pipeline.stores import stored
from tests.unit.pipeline.test_ingest import ingest, make_cluster

pytestmark = pytest.mark.slow


def _overwrite(store: Path, offset: int, data: bytes) -> None:
    path = [p for p in segment_files(store) if int(p.name) <= offset][-1]
    with open(path, "r+b") as f:
        f.seek(offset - int(path.name))
        f.write(data)


def test_ingested_cluster_passes_but_damage_fails_messages_and_quarantine(
    spark: SparkSession, gates: GateContext, tmp_path: Path
) -> None:
    data = make_cluster(tmp_path)  # two brokers, a slave, offsets and both ledgers
    store = data / "brokers" / "broker-b" / "master"
    msgs = stored(store)
    crc_victim, magic_victim, last = msgs[10], msgs[30], msgs[-1]
    body = crc_victim.phys_offset + codec.HEADER_SIZE
    _overwrite(store, body, bytes([crc_victim.body[0] ^ 0x55]))
    _overwrite(store, magic_victim.phys_offset + 4, b"\x0b\xad\xf0\x0d")
    _overwrite(store, last.phys_offset + last.total_size, b"\x00\x00\x01\x00")  # torn tail
    lake = tmp_path / "lake"
    ingest(spark, data, lake)
    io = DeltaIO(spark)
    tables = {t: io.read(table_path(lake, t), TABLES[t]) for t in INGESTED_TABLES}

    with pytest.raises(GateFailed) as caught:
        run_all_gates(tables, context=gates, run_name="ingested", progress=None)
    summary = caught.value.summary
    assert summary is not None
    failed = {t: r["failures"] for t, r in summary["tables"].items() if not r["success"]}
    assert set(failed) == {"messages", "quarantine"}, caught.value
    (crc,) = failed["messages"]
    assert (crc["expectation"], crc["columns"]) == ("expect_column_values_to_be_in_set", ["crc_ok"])
    assert [(r["broker"], r["phys_offset"]) for r in crc["rows"]] == [
        ("broker-b", crc_victim.phys_offset)
    ]
    # bad CRC and bad magic are certain damage; the torn tail may be a write in flight.
    (damage,) = failed["quarantine"]
    assert damage["parameters"] == {"max_value": "max_quarantine_rows"}
    assert damage["observed_value"] == 2
