"""The audit report's transactions and SQL92 filters sections, rendered from audit rows
(pandas, no Spark)."""

from __future__ import annotations

from pathlib import Path

from broker_runtime.common import findings as K
from pipeline.reports.audit_report import PLOTS, render_report
from tests.unit.pipeline.test_report import _finding, _table, _tables


def test_the_report_has_a_transactions_section_with_its_plot_and_problems(
    tmp_path: Path,
) -> None:
    tables = _tables()
    tables["audit_filters"] = _table("audit_filters", [])  # its problems: the next test's
    base = {"producer_group": "pg", "topic": "TopicA", "broker": "broker-a", "age_ms": 70_000}
    tables["audit_transactions"] = _table(
        "audit_transactions",
        [
            _finding(K.HALF_STUCK, K.NEVER_CHECKED, "H1", None, 1) | base | {"checks": 0},
            _finding(K.COMMITTED_TWICE, K.END_TRANSACTION_REPEATED, "H2", None, 2) | base,
            _finding(K.COMMITTED_NEVER_CONSUMED, K.OFFSET_NOT_REACHED, "H3", "g1", 1) | base,
            _finding(K.COMMITTED_NEVER_CONSUMED, K.OFFSET_NOT_REACHED, "H4", "g1", 1) | base,
        ],
    )
    result = render_report(tables, tmp_path / "out", "/lake")
    html = Path(result["html"]).read_text()
    plot = PLOTS["transactions"]
    assert (tmp_path / "out" / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f'src="{plot}"' in html and "<h2>Transactions</h2>" in html
    assert "<td>H1</td>" in html and "<td>never_checked</td>" in html
    s = result["summary"]
    assert s["transactions"] == {
        K.COMMITTED_NEVER_CONSUMED: 2,
        K.COMMITTED_TWICE: 1,
        K.HALF_STUCK: 1,
    }
    assert s["problems"][-3:] == [
        "2 committed message(s) never consumed (per group)",
        "1 transaction(s) committed twice",
        "1 half message(s) stuck",
    ]


def test_without_transaction_findings_the_section_says_so(tmp_path: Path) -> None:
    tables = _tables()
    tables["audit_transactions"] = _table("audit_transactions", [])
    html = Path(render_report(tables, tmp_path / "out", "/lake")["html"]).read_text()
    assert "No transaction findings." in html


def test_the_report_has_a_filters_section_with_its_plot_and_problems(tmp_path: Path) -> None:
    tables = _tables()
    base = {"topic": "TopicA", "broker": "broker-a", "queue_id": 0, "expression": "a > 1"}
    tables["audit_filters"] = _table(
        "audit_filters",
        [
            _finding(K.FILTERED_WRONGLY, K.DELIVERED_BUT_EXCLUDED, "F1", "g1", 2) | base,
            _finding(K.FILTERED_WRONGLY, K.MATCHED_BUT_SKIPPED, "F2", "g1", 1) | base,
            _finding(K.FILTERED_WRONGLY, K.MATCHED_BUT_SKIPPED, "F3", "g2", 1) | base,
        ],
    )
    result = render_report(tables, tmp_path / "out", "/lake")
    html = Path(result["html"]).read_text()
    plot = PLOTS["filters"]
    assert (tmp_path / "out" / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f'src="{plot}"' in html and "<h2>SQL92 filters</h2>" in html
    assert "<td>F1</td>" in html and "<td>a &gt; 1</td>" in html
    s = result["summary"]
    assert s["filters"] == {K.DELIVERED_BUT_EXCLUDED: 1, K.MATCHED_BUT_SKIPPED: 2}
    assert s["problems"][-2:] == [
        "1 message(s) delivered though the group's SQL92 expression excludes them",
        "2 message(s) matching a group's SQL92 expression passed without delivery",
    ]
    tables["audit_filters"] = _table("audit_filters", [])
    html = Path(render_report(tables, tmp_path / "empty", "/lake")["html"]).read_text()
    assert "No filter findings." in html and "every SQL92 group got exactly" in html
