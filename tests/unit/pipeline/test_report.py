"""The audit and DLQ reports rendered from audit rows (pandas, no Spark): every plot with
something to show is written and referenced (else a sentence says why not), what needs
attention leads per group, the summary has the right numbers and says what each counts,
each message has its lookup command, the CSV has every dead letter."""

from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from broker_runtime.common import findings
from broker_runtime.common.constants import DEFAULT_CLUSTER
from pipeline.lake import AUDIT_TABLES
from pipeline.reports.audit_report import PLOTS, render_report
from pipeline.reports.dlq_report import render_dlq_report
from pipeline.reports.render import duration, timestamp
from pipeline.reports.summary import attention
from pipeline.reports.tables import Tables

T0 = 1_700_000_000_000
H = 3_600_000
AS_OF = T0 + 10 * 24 * H


def _table(name: str, rows: list[dict[str, Any]]) -> pd.DataFrame:
    columns = AUDIT_TABLES[name].fieldNames()
    stray = {k for r in rows for k in r} - set(columns)
    assert not stray, stray
    rows = [{"cluster": DEFAULT_CLUSTER, **r, "as_of_ms": AS_OF} for r in rows]
    return pd.DataFrame(rows, columns=columns)


def _finding(kind: str, cause: str, msg_id: str | None, group: str | None, count: int, **more: Any):
    return {"kind": kind, "cause": cause, "msg_id": msg_id, "group": group, "count": count} | more


def _lag(group: str, ts: int, behind: int, status: str) -> dict[str, Any]:
    return _finding("lag", "x", None, group, behind) | {
        "topic": "TopicA",
        "broker": "broker-a",
        "queue_id": 0,
        "snapshot_ts": ts,
        "lag_messages": behind,
        "lag_ms": behind * 1000,
        "status": status,
    }


def _dead(msg_id: str, group: str, age_ms: int, replayed: bool) -> dict[str, Any]:
    chain = [{"reconsume_times": 1, "store_ts": T0, "broker": "broker-a", "queue_offset": 0}]
    return _finding("dead_lettered", "max_reconsume_times", msg_id, group, 17) | {
        "original_topic": "TopicA",
        "topic": f"%DLQ%{group}",
        "first_ts": T0,
        "last_ts": AS_OF - age_ms,
        "age_ms": age_ms,
        "retries": 1,
        "retry_chain": chain,
        "deliveries": 17,
        "replayed": replayed,
    }


def _tables() -> Tables:
    return {
        "audit_duplicates": _table(
            "audit_duplicates",
            [
                _finding("stored_twice", "producer_resend", "K1", None, 2),
                _finding("delivered_twice", "rebalance_overlap", "K2", "g1", 2),
                _finding("duplicate_effect", "rebalance_overlap", "K2", "g1", 2),
                _finding("retried_then_ok", "retry_after_failure", "K3", "g1", 3),
            ],
        ),
        "audit_losses": _table(
            "audit_losses",
            [
                _finding("lost_after_ack", "absent_from_commitlog", "L1", None, 1, topic="TopicA"),
                _finding("never_delivered", "offset_passed_without_delivery", "L2", "g1", 1),
            ],
        ),
        "audit_lag": _table(
            "audit_lag",
            [
                _lag("g1", T0, 5, "OK"),
                _lag("g1", T0 + 60_000, 9, "STALLED"),
                _lag("g2", T0, 0, "OK"),
                _lag("g2", T0 + 60_000, 0, "OK"),
            ],
        ),
        "audit_dead_letters": _table(
            "audit_dead_letters",
            [
                _dead("D1", "g1", 2 * H, False),
                _dead("D2", "g1", 9 * 24 * H, True),
                _dead("D3", "g2", 30_000, False),
            ],
        ),
        "resend_candidates": _table(
            "resend_candidates", [_finding("resend_due", "never_acknowledged", "U1", None, 1)]
        ),
        "manual_handling": _table("manual_handling", []),
        "consistency": _table(
            "consistency", [_finding("queue_offset_gap", "offsets_missing", None, None, 2)]
        ),
        "audit_transactions": _table(
            "audit_transactions",
            [_finding("check_gave_up", "transaction_check_max", "T1", None, 3, age_ms=H)],
        ),
        "audit_filters": _table(
            "audit_filters",
            [_finding("filtered_wrongly", "matched_but_skipped", "S1", "g1", 1, topic="TopicA")],
        ),
    }


def test_audit_report_has_summary_plots_and_docs_link(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.html").write_text("<html></html>")
    result = render_report(_tables(), tmp_path / "out", "/lake", docs)
    html = Path(result["html"]).read_text()
    for name in PLOTS.values():
        png = tmp_path / "out" / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f'src="{name}"' in html
    assert html.index("Needs attention") < html.index("Summary") < html.index("<img")
    assert 'href="../docs/index.html"' in html
    s = result["summary"]
    assert s["as_of_ms"] == AS_OF
    assert s["duplicates"] == {
        "delivered_twice": 1,
        "duplicate_effect": 1,
        "retried_then_ok": 1,
        "stored_twice": 1,
    }
    assert s["losses"] == {"lost_after_ack": 1, "never_delivered": 1}
    assert s["lag_status"] == {"OK": 1, "WARN": 0, "STALLED": 1, "STOPPED": 0}
    assert (s["lag_max_messages"], s["lag_max_ms"]) == (9, 9000)
    assert (s["dead_letters"], s["dead_letters_waiting"]) == (3, 2)
    assert s["dead_letter_max_age_ms"] == 2 * H
    assert (s["resend_candidates"], s["manual_handling"]) == (1, 0)
    assert s["problems"] == [
        "2 lost message(s)",
        "1 message(s) processed twice",
        "1 queue(s) stalled or stopped",
        "1 consistency finding(s)",
        "1 transaction(s) given up by the check-back",
        "1 message(s) matching a group's SQL92 expression passed without delivery",
    ]
    assert "2 lost message(s)" in html
    assert re.search(r"<td>L1</td>", html)
    # Each message's lookup, as `mqaudit admin query-msg` takes it (a dead letter in its DLQ).
    assert "mqaudit admin query-msg --data-dir DATA_DIR --id L1 --topic TopicA" in html
    assert "--id D1 --topic %DLQ%g1" in html
    assert findings.COUNTS["duplicate_effect"] in html  # the numbers say what they count
    assert html.count('<table class="paged') == 9  # attention + 8 finding tables with rows


def test_attention_per_group_worst_first() -> None:
    rows = attention(_tables())
    assert [r["group"] for r in rows] == ["g1", "(no consumer group)", "g2"]
    g1 = rows[0]
    assert (g1["lost"], g1["processed_twice"], g1["delivered_twice"]) == (1, 1, 1)
    assert (g1["dead_letters_waiting"], g1["stuck_queues"], g1["lag_messages"]) == (1, 1, 9)
    assert (rows[1]["lost"], rows[1]["stored_twice"]) == (1, 1)
    assert rows[2]["dead_letters_waiting"] == 1 and rows[2]["lost"] == 0


def test_a_lag_plot_with_nothing_to_show_is_a_sentence(tmp_path: Path) -> None:
    tables = _tables()
    lag = tables["audit_lag"]
    one = lag[lag["snapshot_ts"] == T0]
    caught_up = lag.assign(lag_messages=0, lag_ms=0, status="OK")
    for rows, says in ((one, "One consumer offset snapshot so far"), (caught_up, "caught up")):
        result = render_report({**tables, "audit_lag": rows}, tmp_path / says)
        html = Path(result["html"]).read_text()
        assert says in html and 'src="lag_over_time.png"' not in html
        assert not (tmp_path / says / "lag_over_time.png").exists()
        assert len(result["plots"]) == len(PLOTS) - 1


def test_empty_tables_draw_no_plot_and_say_so(tmp_path: Path) -> None:
    empty = {name: _table(name, []) for name in AUDIT_TABLES}
    result = render_report(empty, tmp_path, docs_dir=tmp_path / "no-docs")
    assert result["plots"] == [] and not list(tmp_path.glob("*.png"))
    html = Path(result["html"]).read_text()
    assert "<img" not in html
    for sentence in ("No consumer offset snapshots", "No duplicates:", "No dead letters:"):
        assert sentence in html
    assert "No losses, no duplicate effects" in html
    assert "No Data Docs at" in html
    assert result["summary"]["problems"] == []


def test_dlq_report_csv_and_html(tmp_path: Path) -> None:
    result = render_dlq_report(_tables()["audit_dead_letters"], tmp_path, "/lake")
    with open(result["csv"], newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["msg_id"] for r in rows] == ["D2", "D1", "D3"]  # oldest first
    assert rows[0]["chain"] == f"#1 {timestamp(T0)}"
    assert rows[0]["replayed"] == "True"
    html = Path(result["html"]).read_text()
    assert 'src="dead_letters_by_group_age.png"' in html and 'href="dead_letters.csv"' in html
    assert (tmp_path / "dead_letters_by_group_age.png").is_file()
    assert (result["dead_letters"], result["not_replayed"]) == (3, 2)


@pytest.mark.parametrize(
    ("ms", "text"),
    [(None, ""), (999, "999 ms"), (61_000, "1 m 1 s"), (90_061_000, "1 d 1 h")],
)
def test_durations_read_as_words(ms: int | None, text: str) -> None:
    assert duration(ms) == text
