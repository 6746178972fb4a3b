"""The demo's summary counts the transaction and filter findings of the workload's
transactions cluster (audited in the one lake) against truth.json, kind by kind."""

from __future__ import annotations

import json
from pathlib import Path

from broker_runtime.common import findings as K
from pipeline.demo_summary import build_summary, format_summary
from tests.unit.pipeline.test_demo_summary import _finding, _site, edit_report


def test_transaction_findings_are_counted_against_the_truth(tmp_path: Path) -> None:
    reports, truth, run = _site(tmp_path)
    doc = json.loads(truth.read_text())
    doc["scenarios"]["transactions"] = {
        "data_dir": str(tmp_path / "cluster" / "scenarios" / "transactions"),
        "findings": [
            _finding(K.HALF_STUCK, "h", None),
            _finding(K.COMMITTED_TWICE, "t", None),
            _finding(K.COMMITTED_NEVER_CONSUMED, "n1"),
            _finding(K.COMMITTED_NEVER_CONSUMED, "n2"),
        ],
    }
    truth.write_text(json.dumps(doc))
    transactions = {K.HALF_STUCK: 1, K.COMMITTED_TWICE: 1, K.COMMITTED_NEVER_CONSUMED: 1}
    edit_report(run, transactions=transactions)
    s = build_summary(reports, truth, None, {}, tmp_path)
    check = s["truth_check"]
    assert check[K.HALF_STUCK] == {"truth": 1, "found": 1, "match": True}
    assert check[K.COMMITTED_TWICE] == {"truth": 1, "found": 1, "match": True}
    assert check[K.COMMITTED_NEVER_CONSUMED] == {"truth": 2, "found": 1, "match": False}
    assert s["transactions"] == {
        K.COMMITTED_NEVER_CONSUMED: 1,
        K.COMMITTED_TWICE: 1,
        K.HALF_STUCK: 1,
    }
    text = format_summary(s)
    assert "committed_never_consumed 1/2 MISMATCH" in text
    assert "transactions:   committed_never_consumed 1, committed_twice 1, half_stuck 1" in text


def test_filter_findings_are_counted_against_the_truth_by_cause(tmp_path: Path) -> None:
    reports, truth, run = _site(tmp_path)
    doc = json.loads(truth.read_text())
    doc["scenarios"]["transactions"] = {
        "data_dir": str(tmp_path / "cluster" / "scenarios" / "transactions"),
        "findings": [_finding(K.FILTERED_WRONGLY, m, "g-sql") for m in ("e1", "e2", "s1")],
    }
    truth.write_text(json.dumps(doc))
    edit_report(run, filters={K.DELIVERED_BUT_EXCLUDED: 2, K.MATCHED_BUT_SKIPPED: 1})
    s = build_summary(reports, truth, None, {}, tmp_path)
    assert s["truth_check"][K.FILTERED_WRONGLY] == {"truth": 3, "found": 3, "match": True}
    assert s["filters"] == {K.DELIVERED_BUT_EXCLUDED: 2, K.MATCHED_BUT_SKIPPED: 1}
    text = format_summary(s)
    assert "filtered_wrongly 3/3" in text
    assert "filtered wrongly: delivered_but_excluded 2, matched_but_skipped 1 (by cause)" in text
