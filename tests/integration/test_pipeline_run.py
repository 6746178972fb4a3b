"""`mqaudit pipeline run` and `validate` over a small real cluster data dir.

A gate on the ingested tables that fails stops the run before the audit (exit 1, the
expectation named); the same lake then passes with the bound raised, through `validate`
(as spark-submit runs it) and through a whole run that writes the audit and both reports.
"""

from __future__ import annotations

import io
import json
import re
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from broker_runtime.cli.main import main
from broker_runtime.ledger.producer import ProducerLedger
from dags import spark_app
from pipeline.delta_io import table_exists
from pipeline.lake import AUDIT_TABLES, table_path
from tests.conftest import local_spark
from tests.integration.audit_data import build_data_dir

# A whole run in-process (ingest, gates, audit, report) on the native backend: minutes under load.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.native_delta,
    pytest.mark.timeout(900),
]


@pytest.fixture(scope="module")
def spark() -> SparkSession:
    # The session the other pipeline tests share when they run in this process.
    return local_spark()


def _last_json_line(out: str) -> dict[str, Any]:
    lines = out.strip().splitlines()
    assert lines, "nothing on stdout"
    summary: dict[str, Any] = json.loads(lines[-1])
    return summary


@dataclass(frozen=True)
class Dirs:
    data_dir: Path
    lake: Path
    out: Path
    docs: Path

    def run(self) -> list[str]:
        return [
            *("pipeline", "run", "--data-dir", str(self.data_dir), "--lake", str(self.lake)),
            *("--out", str(self.out), "--docs", str(self.docs), "--quiet"),
        ]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> Dirs:
    root = tmp_path_factory.mktemp("run")
    data_dir = build_data_dir(root)
    ledger = ProducerLedger.open(data_dir)
    assert ledger.mark_resent(["U3"]) == {"U3": 2}  # U3 sent twice
    ledger.close()
    return Dirs(data_dir, root / "lake", root / "out", root / "docs")


@pytest.fixture(scope="module")
def failed_run(spark: SparkSession, dirs: Dirs) -> tuple[int, str, str]:
    """A run whose stub gate allows one send: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main([*dirs.run(), "--max-send-count", "1"])
    return code, out.getvalue(), err.getvalue()


def test_a_failed_gate_stops_the_run_before_the_audit(
    dirs: Dirs, failed_run: tuple[int, str, str]
) -> None:
    code, out, err = failed_run
    assert code == 1, err
    assert "gate failed" in err and "table 'message_stub'" in err
    assert re.search(r"expect_column_values_to_be_between \[send_count\].*max_send_count", err)
    assert '"msg_id": "U3"' in err  # the failing row
    assert err.count("table '") == 1, err  # nothing but the stub bound failed
    summary = _last_json_line(out)
    assert (summary["ok"], summary["failed_step"]) == (False, "validate")
    assert summary["ingested_messages"] > 0 and Path(summary["data_docs"]).is_file()
    assert summary["backend"] == "native"  # this file runs on the default backend
    assert not any(table_exists(table_path(dirs.lake, t)) for t in AUDIT_TABLES)  # no audit
    assert not dirs.out.exists()


def test_validate_as_spark_submit_runs_it_passes_with_the_bound_raised(
    dirs: Dirs, failed_run: tuple[int, str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    validate = ["validate", "--lake", str(dirs.lake), "--docs", str(dirs.docs), "--quiet"]
    assert spark_app.main([*validate, "--max-send-count", "2", "--run-name", "again"]) == 0
    gates = json.loads(capsys.readouterr().out)
    assert gates["success"] and gates["run_name"] == "again"
    assert gates["tables"]["message_stub"]["params"]["max_send_count"] == 2


def test_a_passing_run_writes_the_audit_and_every_report(
    dirs: Dirs, failed_run: tuple[int, str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(dirs.run()) == 0  # the default max send count; nothing new to ingest
    summary = _last_json_line(capsys.readouterr().out)
    assert summary["ok"] and summary["ingested_messages"] == 0
    for key in ("report", "dlq_report", "dead_letters_csv", "data_docs"):
        assert Path(summary[key]).is_file(), key
    # Every plot with something to show: one offset snapshot is no lag over time.
    assert len(summary["plots"]) == 3 and all(Path(p).is_file() for p in summary["plots"])
    assert summary["audit_rows"]["audit_losses"] == 1  # L1
    assert summary["audit_rows"]["audit_dead_letters"] == 1  # U2
    assert summary["audit_gates"]["audit_losses"] is False  # a finding, reported
    assert "1 lost message(s)" in summary["problems"]
    html = Path(summary["report"]).read_text()
    link = re.search(r'href="([^"]+)">Great Expectations Data Docs', html)
    assert link and (dirs.out / link.group(1)).resolve() == Path(summary["data_docs"]).resolve()
    assert "g1,U2,TopicA," in Path(summary["dead_letters_csv"]).read_text()


def test_run_refuses_bad_arguments_before_spark(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = ["pipeline", "run", "--data-dir", str(tmp_path / "none"), "--lake", str(tmp_path)]
    assert main([*missing, "--out", str(tmp_path / "out")]) == 2
    assert "does not exist" in capsys.readouterr().err
    bad = ["pipeline", "run", "--data-dir", str(tmp_path), "--lake", str(tmp_path / "lake")]
    assert main([*bad, "--out", str(tmp_path / "out"), "--max-send-count", "0"]) == 2
    assert "max_send_count must be >= 1" in capsys.readouterr().err
    assert main(["pipeline", "validate", "--lake", str(tmp_path / "no"), "--docs", "d"]) == 2
