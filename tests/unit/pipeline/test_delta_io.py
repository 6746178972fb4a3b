"""Delta I/O on both backends: backend choice, idempotent appends, partition overwrite,
upserts, odd values, and each backend reading, appending to and merging into the other's
tables."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from pipeline import spark_session
from pipeline.delta_io import DeltaIO, choose_backend, history, txn_version
from pipeline.delta_native import _add, _write_operation
from pipeline.schemas import arrow_schema, struct_of
from pipeline.spark_session import (
    BACKEND_ENV,
    delta_conf,
    delta_packages,
    native_delta_available,
    resolved_jars,
)

SCHEMA = struct_of("k:long, part:str, v:str, m:map")


class _Conf:
    def __init__(self, extensions: str | None) -> None:
        self.extensions = extensions

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.extensions if key == "spark.sql.extensions" else default


class _Jvm:
    """Stands in for py4j's JVM view: Class.forName succeeds or raises like py4j does."""

    def __init__(self, has_delta: bool) -> None:
        self.has_delta = has_delta
        self.java = self
        self.lang = self
        self.Thread = self
        self.Class = self

    def currentThread(self) -> _Jvm:
        return self

    def getContextClassLoader(self) -> object:
        return object()

    def forName(self, name: str, init: bool, loader: object) -> object:
        if not self.has_delta:
            raise RuntimeError(f"java.lang.ClassNotFoundException: {name}")
        return name


class _Spark:
    def __init__(self, has_delta: bool, extensions: str | None) -> None:
        self._jvm = _Jvm(has_delta)
        self.conf = _Conf(extensions)


EXT = "io.delta.sql.DeltaSparkSessionExtension"


@pytest.mark.parametrize(
    ("has_delta", "extensions", "native"),
    [(True, EXT, True), (False, EXT, False), (True, None, False), (True, "other.Ext", False)],
)
def test_native_backend_needs_the_classes_and_the_extension(
    has_delta: bool, extensions: str | None, native: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    spark: Any = _Spark(has_delta, extensions)
    assert native_delta_available(spark) is native
    assert choose_backend(spark) == ("native" if native else "embedded")


def test_backend_can_be_forced_and_a_bad_value_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    spark: Any = _Spark(False, None)
    monkeypatch.setenv(BACKEND_ENV, "native")
    assert choose_backend(spark) == "native"
    monkeypatch.setenv(BACKEND_ENV, "embedded")
    assert choose_backend(_Spark(True, EXT)) == "embedded"
    monkeypatch.setenv(BACKEND_ENV, "fast")
    with pytest.raises(ValueError, match="embedded or native"):
        choose_backend(spark)


def test_sessions_get_the_cached_delta_jars_or_fall_back_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    packages = delta_packages()
    assert packages.startswith("io.delta:delta-spark_") and ":" in packages
    ivy = tmp_path / "ivy"
    with caplog.at_level("WARNING", logger=spark_session.__name__):
        assert delta_conf({"spark.jars.ivy": str(ivy)}) == {}  # nothing cached there
    assert [r.getMessage() for r in caplog.records] == [
        f"Delta Lake jars ({packages}) are not in the Ivy cache {ivy} ('make delta-jars' "
        "fetches them): using the embedded delta-rs backend"
    ]
    for coord in packages.split(","):
        group, artifact, version = coord.split(":")
        jar = ivy / "cache" / group / artifact / "jars" / f"{artifact}-{version}.jar"
        jar.parent.mkdir(parents=True)
        jar.touch()
    conf = delta_conf({"spark.jars.ivy": str(ivy)})
    assert conf["spark.jars.packages"] == packages
    assert conf["spark.sql.extensions"] == EXT
    # Embedded forced: the cached jars still load (the process's next session may want
    # them), and where there are none, nothing is said.
    monkeypatch.setenv(BACKEND_ENV, "embedded")
    assert delta_conf({"spark.jars.ivy": str(ivy)})["spark.jars.packages"] == packages
    caplog.clear()
    with caplog.at_level("WARNING", logger=spark_session.__name__):
        assert delta_conf({"spark.jars.ivy": str(tmp_path / "empty")}) == {}
    assert caplog.records == []
    monkeypatch.setenv(BACKEND_ENV, "native")  # forced: fetched if missing, never skipped
    assert delta_conf({"spark.jars.ivy": str(tmp_path / "empty")})["spark.jars.packages"]


def test_a_session_names_the_jars_resolved_before_while_they_are_all_there(
    tmp_path: Path,
) -> None:
    packages = "io.delta:delta-spark_4.2_2.13:4.4.0"
    jars = [tmp_path / "jars" / f"{n}.jar" for n in ("delta-spark", "delta-storage")]
    assert resolved_jars(packages, tmp_path) is None  # never resolved here
    listed = tmp_path / "mqaudit-resolved-delta-spark_4.2_2.13-4.4.0.txt"
    listed.write_text("\n".join([packages, *(f"file://{j}" for j in jars)]) + "\n")
    assert resolved_jars(packages, tmp_path) is None  # the jars are gone
    jars[0].parent.mkdir()
    for jar in jars:
        jar.touch()
    assert resolved_jars(packages, tmp_path) == ",".join(f"file://{j}" for j in jars)
    assert resolved_jars(packages.replace("4.4.0", "4.4.1"), tmp_path) is None  # other version
    listed.write_text("io.delta:delta-spark_4.2_2.13:4.3.0\n" + f"file://{jars[0]}\n")
    assert resolved_jars(packages, tmp_path) is None  # a list for other coordinates


@pytest.mark.slow
def test_the_test_session_has_delta_lake_and_uses_the_native_backend(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    assert native_delta_available(spark)
    assert DeltaIO(spark).backend == "native"


@pytest.mark.slow
def test_the_session_starts_its_jvm_with_the_default_driver_heap(spark: SparkSession) -> None:
    # Spark's 1g ran out building a broadcast join with two audits in one session.
    heap = spark._jvm.java.lang.Runtime.getRuntime().maxMemory()  # type: ignore[union-attr]
    assert spark.conf.get("spark.driver.memory") == spark_session.DEFAULT_DRIVER_MEMORY
    assert heap > 1.5 * 2**30, heap


def _df(spark: SparkSession, rows: list[tuple[Any, ...]]) -> Any:
    return spark.createDataFrame(rows, SCHEMA)


ODD = "%RETRY%g/x=y z:ü"  # characters Spark escapes in partition directory names


@pytest.mark.slow
def test_append_with_a_txn_happens_once_and_reads_back(
    io: DeltaIO, spark: SparkSession, tmp_path: Path
) -> None:
    path = str(tmp_path / "t")
    rows = [(1, ODD, "a", {"x": "1"}), (2, "plain", None, {}), (3, None, "c", None)]
    assert io.append(_df(spark, rows), path, SCHEMA, ["part"], txn=("app", 1)) == 3
    assert io.append(_df(spark, rows), path, SCHEMA, ["part"], txn=("app", 1)) == -1
    assert len(history(path)) == 1 and txn_version(path, "app") == 1
    got = sorted((tuple(r) for r in io.read(path, SCHEMA).collect()), key=lambda r: r[0])
    assert got == rows
    assert DeltaTable(path).metadata().partition_columns == ["part"]
    assert io.append(_df(spark, []), path, SCHEMA, ["part"], txn=("app", 2)) == 0
    assert len(history(path)) == 1  # no rows: no commit


@pytest.mark.slow
def test_overwrite_partitions_replaces_only_that_partition(
    io: DeltaIO, spark: SparkSession, tmp_path: Path
) -> None:
    path = str(tmp_path / "t")
    io.append(_df(spark, [(1, "a", "old", None), (2, "b", "keep", None)]), path, SCHEMA, ["part"])
    io.overwrite_partitions(
        _df(spark, [(3, "a", "new", None)]), path, SCHEMA, ["part"], {"part": "a"}
    )
    got = sorted((r["k"], r["part"], r["v"]) for r in io.read(path, SCHEMA).collect())
    assert got == [(2, "b", "keep"), (3, "a", "new")]


@pytest.mark.slow
def test_merge_upsert_updates_inserts_deletes_and_skips_no_change(
    io: DeltaIO, spark: SparkSession, tmp_path: Path
) -> None:
    schema = struct_of("k:long, v:str, final:bool")
    path = str(tmp_path / "t")
    first = [(1, "a", True), (2, "b", False), (3, "c", False)]
    assert io.merge_upsert(spark.createDataFrame(first, schema), path, schema, ["k"]) == 3
    version = len(history(path))
    assert io.merge_upsert(spark.createDataFrame(first, schema), path, schema, ["k"]) == 0
    assert len(history(path)) == version
    second = spark.createDataFrame([(1, "A", True), (3, "c", False), (4, "d", True)], schema)
    n = io.merge_upsert(second, path, schema, ["k"], delete_unmatched=lambda p: f"NOT {p}final")
    assert n == 2  # k=1 changed, k=4 new; k=2 (not final, gone from the source) deleted
    got = sorted(tuple(r) for r in io.read(path, schema).collect())
    assert got == [(1, "A", True), (3, "c", False), (4, "d", True)]


def _made(task: dict[str, Any]) -> Any:
    """Rows a worker makes for a task: k in [lo, hi), in two batches, partitions mixed."""

    ks = list(range(task["lo"], task["hi"]))
    for half in (ks[: len(ks) // 2], ks[len(ks) // 2 :]):
        rows = [
            {"k": k, "part": [ODD, "plain", None][k % 3], "v": f"v{k}", "m": [("x", str(k))]}
            for k in half
        ]
        yield pa.RecordBatch.from_pylist(rows, schema=arrow_schema(SCHEMA))


@pytest.mark.slow
def test_rows_made_in_the_workers_are_appended_once_and_read_back(
    io: DeltaIO, tmp_path: Path
) -> None:
    path = str(tmp_path / "t")
    tasks = [{"lo": 0, "hi": 10}, {"lo": 10, "hi": 13}, {"lo": 13, "hi": 13}]
    assert io.append_generated(tasks, _made, path, SCHEMA, ["part"], txn=("app", 1)) == 13
    assert io.append_generated(tasks, _made, path, SCHEMA, ["part"], txn=("app", 1)) == -1
    assert len(history(path)) == 1 and txn_version(path, "app") == 1
    want = [(k, [ODD, "plain", None][k % 3], f"v{k}", {"x": str(k)}) for k in range(13)]
    got = sorted((tuple(r) for r in io.read(path, SCHEMA).collect()), key=lambda r: r[0])
    assert got == want
    small = sorted(io.read_small(path, SCHEMA).to_pylist(), key=lambda r: r["k"])
    assert [(r["k"], r["part"], r["v"], dict(r["m"])) for r in small] == want
    table = DeltaTable(path)
    assert table.metadata().partition_columns == ["part"]
    assert sorted(table.get_add_actions(flatten=True).column("partition.part").to_pylist(),
                  key=str) == sorted([ODD, ODD, "plain", "plain", None, None], key=str)  # fmt: skip
    assert io.append_generated([], _made, path, SCHEMA, ["part"], txn=("app", 2)) == 0
    assert len(history(path)) == 1  # no rows: no commit


@pytest.mark.slow
def test_native_commits_of_one_version_both_land_and_write_no_checksum_side_files(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The lake's file settings (spark_session.DELTA_SQL_CONF and FILE_IO_CONF): of two
    transactions that read the same version, the second commits after the first instead of
    writing over its version file; checksums do not list the files; no `.name.crc` files."""
    io, path = DeltaIO(spark, "native"), str(tmp_path / "t")
    io.append(_df(spark, [(1, "a", "x", None)]), path, SCHEMA)
    jvm: Any = spark._jvm
    log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path)
    first, second = log.startTransaction(), log.startTransaction()
    for transaction, k in ((first, 2), (second, 3)):
        staged = io.stage_files(_df(spark, [(k, "a", "y", None)]), path, SCHEMA)
        adds = [json.dumps({"add": _add(f)}) for f in staged.files]
        parsed = [jvm.org.apache.spark.sql.delta.actions.Action.fromJson(a) for a in adds]
        transaction.commit(jvm.PythonUtils.toSeq(parsed), _write_operation(jvm, "Append", ()))
    assert [h["version"] for h in history(path)] == [2, 1, 0]
    assert sorted(r["k"] for r in io.read(path, SCHEMA).collect()) == [1, 2, 3]
    checksums = sorted((tmp_path / "t" / "_delta_log").glob("*.crc"))
    assert [c.stem[-1] for c in checksums] == ["0", "1", "2"]
    assert all("allFiles" not in json.loads(c.read_text()) for c in checksums)
    assert not list(tmp_path.rglob(".*.crc"))


@pytest.mark.slow
def test_small_tables_are_written_from_the_driver_and_older_ones_gain_columns(
    io: DeltaIO, tmp_path: Path
) -> None:
    old, new = struct_of("k:long, v:str"), struct_of("k:long, v:str, added:long")
    path = str(tmp_path / "t")
    io.ensure_table(path, old)
    assert io.append_rows([{"k": 1, "v": "a"}], path, old) == 1
    io.ensure_table(path, new)  # a table made before `added` existed
    assert [f.name for f in DeltaTable(path).schema().fields] == ["k", "v", "added"]
    assert io.append_rows([{"k": 2, "v": "b", "added": 7}], path, new) == 1
    want = [{"k": 1, "v": "a", "added": None}, {"k": 2, "v": "b", "added": 7}]
    assert sorted(io.read_small(path, new).to_pylist(), key=lambda r: r["k"]) == want
    assert sorted((r.asDict() for r in io.read(path, new).collect()), key=lambda r: r["k"]) == want
    io.replace_rows([{"k": 3, "v": "c", "added": 1}], path, new)
    assert io.read_small(path, new).to_pylist() == [{"k": 3, "v": "c", "added": 1}]
    assert len(history(path)) == 5  # create, append, add column, append, overwrite


@pytest.mark.slow
@pytest.mark.parametrize(("first", "second"), [("native", "embedded"), ("embedded", "native")])
def test_each_backend_appends_to_and_merges_into_the_others_tables(
    spark: SparkSession, tmp_path: Path, first: str, second: str
) -> None:
    a, b = DeltaIO(spark, first), DeltaIO(spark, second)
    path = str(tmp_path / "t")
    rows = [(1, ODD, "a", {"x": "1"}), (2, None, "b", None)]
    assert a.append(_df(spark, rows[:1]), path, SCHEMA, ["part"], txn=("app", 1)) == 1
    assert b.append(_df(spark, rows[1:]), path, SCHEMA, ["part"], txn=("app", 2)) == 1
    assert a.append(_df(spark, rows), path, SCHEMA, ["part"], txn=("app", 2)) == -1  # b's txn
    assert txn_version(path, "app") == 2
    for io in (a, b):
        assert (
            sorted((tuple(r) for r in io.read(path, SCHEMA).collect()), key=lambda r: r[0]) == rows
        )
        small = sorted(io.read_small(path, SCHEMA).to_pylist(), key=lambda r: r["k"])
        assert [(r["k"], r["part"], r["v"]) for r in small] == [r[:3] for r in rows]
        first_version = io.read(path, SCHEMA, version=0).collect()
        assert [tuple(r) for r in first_version] == rows[:1]
    schema = struct_of("k:long, v:str, final:bool")
    keyed = str(tmp_path / "keyed")
    start = [(1, "a", True), (2, "b", False)]
    assert a.merge_upsert(spark.createDataFrame(start, schema), keyed, schema, ["k"]) == 2
    change = spark.createDataFrame([(1, "A", True), (3, "c", True)], schema)
    assert (
        b.merge_upsert(change, keyed, schema, ["k"], delete_unmatched=lambda p: f"NOT {p}final")
        == 2
    )
    assert a.merge_upsert(change, keyed, schema, ["k"]) == 0  # b's result is a's no-op
    want = [(1, "A", True), (3, "c", True)]
    for io in (a, b):
        assert sorted(tuple(r) for r in io.read(keyed, schema).collect()) == want
    ops = [h["operation"] for h in reversed(history(keyed))]
    assert len(ops) == 2 and ops[-1] == "MERGE", ops  # the first write's commit is kept
    # Between the two commits, by their log files' times (what both backends go by).
    log = [tmp_path / "keyed" / "_delta_log" / f"{v:020d}.json" for v in (0, 1)]
    at = datetime.fromtimestamp(sum(f.stat().st_mtime for f in log) / 2, UTC)
    for io in (a, b):
        assert sorted(tuple(r) for r in io.read(keyed, schema, timestamp=at).collect()) == start
