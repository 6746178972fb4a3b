"""Gates over real Spark frames: good lakes pass, each defect fails the expectation it breaks."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from expectations import gates as gates_module
from expectations.context import GateContext
from expectations.gates import GateFailed, run_all_gates, run_gate
from expectations.suites import SPECS
from pipeline.lake import INGESTED_TABLES as TABLES
from tests.unit.expectations.lake import BAD_FAILURES, T0, damage, good_messages, lake, msg
from tests.unit.pipeline.audit_helpers import frame

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bad_run(spark: SparkSession, gates: GateContext) -> GateFailed:
    with pytest.raises(GateFailed) as caught:
        run_all_gates(lake(spark, bad=True), context=gates, run_name="bad-lake", progress=None)
    return caught.value


def test_good_lake_passes_every_gate_quietly(
    spark: SparkSession, gates: GateContext, docs_dir: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    tables = lake(spark, bad=False)
    capfd.readouterr()
    lines: list[str] = []
    summary = run_all_gates(tables, context=gates, run_name="good-lake", progress=lines.append)
    out, err = capfd.readouterr()
    assert summary["success"], json.dumps(summary, indent=1)
    assert set(summary["tables"]) == set(SPECS)
    assert summary["unvalidated"] == ["ingest_checkpoint"]
    assert all(t["evaluated"] > 0 and not t["failures"] for t in summary["tables"].values())
    assert {t["engine"] for t in summary["tables"].values()} == {"pandas"}  # small tables
    assert summary["docs_index"] == str(docs_dir / "index.html")
    assert (docs_dir / "index.html").is_file()
    assert json.loads(json.dumps(summary)) == summary
    assert len(lines) == len(SPECS) and lines[0].startswith("messages: passed 25")
    # No progress bars or GX chatter in a task log.
    assert out == ""
    assert "Calculating Metrics" not in err and "%|" not in err


@pytest.mark.parametrize("table", sorted(BAD_FAILURES))
def test_bad_table_fails_exactly_the_expectations_it_breaks(
    bad_run: GateFailed, table: str
) -> None:
    assert bad_run.summary is not None and not bad_run.summary["success"]
    result = bad_run.summary["tables"][table]
    assert not result["success"]
    found = {(f["expectation"], tuple(f["columns"])) for f in result["failures"]}
    assert found == BAD_FAILURES[table]
    for failure in result["failures"]:
        assert failure["error"] is None
        # Row checks show failing rows; table checks show what they counted.
        assert failure["rows"] or failure["observed_value"] is not None


def _verdicts(summary: dict[str, Any]) -> dict[str, list[tuple[Any, ...]]]:
    return {
        table: sorted(
            (f["expectation"], f["columns"], f["unexpected_count"], f["observed_value"], f["rows"])
            for f in result["failures"]
        )
        for table, result in summary["tables"].items()
    }


def test_spark_and_pandas_engines_find_the_same_failures_and_rows(
    spark: SparkSession, gates: GateContext, bad_run: GateFailed
) -> None:
    # bad_run chose pandas (small tables); Spark's engine must fail the same rows alike.
    assert bad_run.summary is not None
    assert {t["engine"] for t in bad_run.summary["tables"].values()} == {"pandas"}
    on_spark = run_all_gates(
        lake(spark, bad=True),
        context=gates,
        run_name="bad-lake-spark",
        progress=None,
        raise_on_failure=False,
        engine="spark",
    )
    assert {t["engine"] for t in on_spark["tables"].values()} == {"spark"}
    assert _verdicts(on_spark) == _verdicts(bad_run.summary)


def test_a_table_above_the_pandas_limit_goes_to_spark(
    spark: SparkSession, gates: GateContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = [msg(i * 200, 0, i) for i in range(3)]
    monkeypatch.setattr(gates_module, "PANDAS_MAX_ROWS", 3)
    small = run_gate(frame(spark, TABLES["messages"], rows), "messages", context=gates)
    monkeypatch.setattr(gates_module, "PANDAS_MAX_ROWS", 2)
    large = run_gate(frame(spark, TABLES["messages"], rows), "messages", context=gates)
    assert (small.engine, large.engine) == ("pandas", "spark")
    assert small.success and large.success
    with pytest.raises(ValueError, match="unknown gate engine 'dask'"):
        run_gate(frame(spark, TABLES["messages"], rows), "messages", context=gates, engine="dask")


def test_failure_message_names_table_expectation_parameter_and_rows(
    bad_run: GateFailed, docs_dir: Path
) -> None:
    text = str(bad_run)
    assert {r.table for r in bad_run.results} == set(BAD_FAILURES)
    assert "table 'messages' (suite 'messages'): 7 of 25 expectations failed" in text
    pair = "expect_column_pair_values_a_to_be_greater_than_b [queue_offset, prev_queue_offset]"
    assert pair in text
    assert '"phys_offset": 5200, "prev_queue_offset": 3, "queue_id": 6, "queue_offset": 2' in text
    assert "[store_before_born_ms] max_value=1000.0 ($clock_skew_ms): 1 of" in text
    assert "($max_quarantine_rows)" in text and "final" in text
    assert '"uniq_key": "U00000000"' in text  # the duplicated key's rows, by row id
    assert text.endswith(f"Data Docs: {docs_dir / 'index.html'}")
    # Data Docs hold the evidence run of the failed expectations, not only the verdict.
    pages = [p.as_posix() for p in (docs_dir / "validations").rglob("*.html")]
    assert any("/validations/messages/failed/" in p for p in pages), pages


def test_parameters_change_the_outcome(spark: SparkSession, gates: GateContext) -> None:
    skewed = msg(6000, 7, 0, store_ts=T0 + 6000 - 5000)
    df = frame(spark, TABLES["messages"], [*good_messages(), skewed, msg(6200, 8, 0, crc_ok=False)])
    with pytest.raises(GateFailed) as caught:
        run_gate(df, "messages", context=gates)
    (result,) = caught.value.results
    assert {(f.expectation, tuple(f.columns)) for f in result.failures} == {
        ("expect_column_values_to_be_between", ("store_before_born_ms",)),
        ("expect_column_values_to_be_in_set", ("crc_ok",)),
    }
    loose = {"clock_skew_ms": 10_000, "min_crc_ok_ratio": 0.9}  # 14 of 15 CRCs are good
    passed = run_gate(df, "messages", params=loose, context=gates)
    assert passed.success and passed.params["clock_skew_ms"] == 10_000


def test_quarantine_below_its_thresholds(spark: SparkSession, gates: GateContext) -> None:
    df = frame(spark, TABLES["quarantine"], [damage(0, True), damage(4096, False)])
    assert run_gate(df, "quarantine", params={"max_quarantine_rows": 1}, context=gates).success
    strict = {"max_quarantine_rows": 1, "max_pending_quarantine_rows": 0}
    result = run_gate(df, "quarantine", params=strict, context=gates, raise_on_failure=False)
    (failure,) = result.failures
    assert failure.parameters == {"max_value": "max_pending_quarantine_rows"}
    assert failure.observed_value == 1


def test_bad_input_is_refused_with_a_reason(spark: SparkSession, gates: GateContext) -> None:
    no_times = frame(spark, TABLES["messages"], good_messages()).drop("born_ts")
    with pytest.raises(ValueError, match="'messages': cannot derive its check columns"):
        run_gate(no_times, "messages", context=gates)
    empty = {"quarantine": frame(spark, TABLES["quarantine"], [])}
    with pytest.raises(ValueError, match="tables not in the lake: messages"):
        run_all_gates(empty, context=gates, params={"messages": {"clock_skew_ms": 1}})
    with pytest.raises(ValueError, match="no parameter max_rows"):
        run_gate(empty["quarantine"], "quarantine", params={"max_rows": 1}, context=gates)


def test_file_context_keeps_earlier_runs_in_data_docs(
    spark: SparkSession, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    docs, project = tmp_path / "docs", tmp_path / "gx"
    df = frame(spark, TABLES["quarantine"], [damage(4096, False)])
    caplog.set_level(logging.INFO)  # as a task log's
    for run in ("first-run", "second-run"):
        context = GateContext(docs, project_dir=project)  # each run opens the same project
        assert run_gate(df, "quarantine", context=context, run_name=run).success
    index = (docs / "index.html").read_text()
    assert "first-run" in index and "second-run" in index
    # A file context saves its config at each step: GX's INFO lines about it stay out.
    chatter = [r for r in caplog.records if r.name.startswith("great_expectations")]
    assert [r.getMessage() for r in chatter if r.levelno < logging.WARNING] == []


IMPORT_LOGS = """
import logging
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append(record)
logging.basicConfig(level=logging.INFO, handlers=[Keep()])  # as a task's
import expectations.gates
logging.getLogger("mqaudit.gate").info("a gate's own line")
print(sum(r.name.startswith("great_expectations") for r in records), len(records))
"""


def test_importing_the_gates_logs_no_gx_info_lines() -> None:
    """A task imports the gates with its root logger at INFO: GX's import-time lines (one
    for each function it documents, 200-odd) stay out; other INFO records do not."""
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_LOGS], capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == ["0", "1"], done.stdout + done.stderr[-2000:]
