"""The numbers a report opens with, and its tables of worst items (pure, over pandas)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from broker_runtime.common import findings
from pipeline.reports.tables import Tables

TOP = 1_000  # rows per table in the HTML (paged there); the tables in the lake have all
NO_GROUP = "(no consumer group)"  # producer-side findings: lost after ack, stored twice


def _by(df: pd.DataFrame, column: str) -> dict[str, int]:
    if df.empty:
        return {}
    return {str(k): int(v) for k, v in df.groupby(column).size().sort_index().items()}


def latest_lag(lag: pd.DataFrame) -> pd.DataFrame:
    """Each group and queue at its latest snapshot."""
    if lag.empty:
        return lag
    keys = ["group", "topic", "cluster", "broker", "queue_id"]
    last = lag.groupby(keys)["snapshot_ts"].transform("max")
    return lag[lag["snapshot_ts"] == last]


def of_system(df: pd.DataFrame, system: str) -> pd.DataFrame:
    """The rows of one system (rows without `system` are RocketMQ's, as in the lake)."""
    if "system" not in df.columns:
        return df if system == findings.ROCKETMQ else df.iloc[0:0]
    return df[df["system"].fillna(findings.ROCKETMQ) == system]


def of_cluster(df: pd.DataFrame, cluster: str) -> pd.DataFrame:
    """The rows of one cluster."""
    return df[df["cluster"] == cluster] if "cluster" in df.columns else df.iloc[0:0]


def clusters_of(tables: Tables) -> list[str]:
    """The clusters the tables have rows of."""
    found = {c for t in tables.values() if "cluster" in t.columns for c in t["cluster"].dropna()}
    return sorted(map(str, found))


def finding_counts(
    tables: Tables, system: str | None = None, cluster: str | None = None
) -> dict[str, Any]:
    """The findings counted as the summary counts them (duplicates and losses by kind,
    duplicates by cause, dead letters and those waiting, resend candidates), of every
    system or of `system`'s rows only, of every cluster or of `cluster`'s only."""

    def rows(name: str) -> pd.DataFrame:
        df = tables[name] if system is None else of_system(tables[name], system)
        return df if cluster is None else of_cluster(df, cluster)

    dup, dlq = rows("audit_duplicates"), rows("audit_dead_letters")
    return {
        "duplicates": _by(dup, "kind"),
        "duplicate_causes": _by(dup, "cause"),
        "losses": _by(rows("audit_losses"), "kind"),
        "dead_letters": len(dlq),
        "dead_letters_waiting": len(_waiting(dlq)),
        "resend_candidates": len(rows("resend_candidates")),
    }


def _waiting(dlq: pd.DataFrame) -> pd.DataFrame:
    """Dead letters not replayed yet."""
    return dlq[~dlq["replayed"].astype(bool)] if not dlq.empty else dlq


def system_summary(summary: dict[str, Any], system: str) -> dict[str, Any]:
    """A summary whose finding counts (those of `finding_counts`) are one system's; a summary
    written before it counted by system is taken whole."""
    return {**summary, **summary.get("systems", {}).get(system, {})}


def summarize(tables: Tables) -> dict[str, Any]:
    """Counts per table and kind, the lag picture now, and whether anything needs a person."""
    now = latest_lag(tables["audit_lag"])
    waiting = _waiting(tables["audit_dead_letters"])
    as_of = [int(t["as_of_ms"].max()) for t in tables.values() if not t.empty]
    statuses = _by(now, "status")
    counts = finding_counts(tables)
    duplicates, losses_by_kind = counts["duplicates"], counts["losses"]
    consistency = _by(tables["consistency"], "kind")
    lag_status = {s: statuses.get(s, 0) for s in findings.LAG_STATUSES}
    manual = len(tables["manual_handling"])
    out: dict[str, Any] = {
        "as_of_ms": max(as_of) if as_of else None,
        **counts,
        "lag_status": lag_status,
        "lag_max_messages": int(now["lag_messages"].max()) if not now.empty else 0,
        "lag_max_ms": int(now["lag_ms"].max()) if now["lag_ms"].notna().any() else 0,
        "dead_letter_max_age_ms": int(waiting["age_ms"].max()) if not waiting.empty else 0,
        "manual_handling": manual,
        "consistency": consistency,
        "systems": {system: finding_counts(tables, system) for system in findings.SYSTEMS},
        "clusters": {
            c: {
                **finding_counts(tables, cluster=c),
                "systems": {s: finding_counts(tables, s, c) for s in findings.SYSTEMS},
            }
            for c in clusters_of(tables)
        },
    }
    problems = []
    if losses_by_kind:
        problems.append(f"{sum(losses_by_kind.values())} lost message(s)")
    if duplicates.get(findings.DUPLICATE_EFFECT):
        problems.append(f"{duplicates[findings.DUPLICATE_EFFECT]} message(s) processed twice")
    stuck = lag_status["STALLED"] + lag_status["STOPPED"]
    if stuck:
        problems.append(f"{stuck} queue(s) stalled or stopped")
    if manual:
        problems.append(f"{manual} stub(s) need manual handling")
    if consistency:
        problems.append(f"{sum(consistency.values())} consistency finding(s)")
    out["problems"] = problems
    return out


# attention()'s counts, the most urgent first.
ATTENTION = (
    "lost",
    "processed_twice",
    "dead_letters_waiting",
    "stuck_queues",
    "delivered_twice",
    "stored_twice",
)


def attention(tables: Tables) -> list[dict[str, Any]]:
    """Per cluster and group, what needs a person: lost, processed twice, delivered twice,
    dead letters not replayed, queues stalled or stopped now, the largest lag now. Groups
    with none of these are left out; the worst first."""
    counts: dict[tuple[str, str], dict[str, int]] = {}

    def add(df: pd.DataFrame, column: str) -> None:
        if df.empty:
            return
        keys = df[["cluster", "group"]].fillna({"group": NO_GROUP, "cluster": ""})
        for (cluster, group), n in keys.value_counts().items():
            counts.setdefault((str(cluster), str(group)), {})[column] = int(n)

    dup, dlq = tables["audit_duplicates"], tables["audit_dead_letters"]
    add(tables["audit_losses"], "lost")
    add(dup[dup["kind"] == findings.DUPLICATE_EFFECT], "processed_twice")
    add(dup[dup["kind"] == findings.DELIVERED_TWICE], "delivered_twice")
    add(dup[dup["kind"] == findings.STORED_TWICE], "stored_twice")
    add(dlq[~dlq["replayed"].astype(bool)] if not dlq.empty else dlq, "dead_letters_waiting")
    now = latest_lag(tables["audit_lag"])
    add(now[now["status"].isin(["STALLED", "STOPPED"])] if not now.empty else now, "stuck_queues")
    rows = []
    for (cluster, group), c in counts.items():
        mine = (now["group"] == group) & (now["cluster"] == cluster) if not now.empty else None
        lag = now[mine] if mine is not None else now
        rows.append(
            {
                "cluster": cluster,
                "group": group,
                **{k: c.get(k, 0) for k in ATTENTION},
                "lag_messages": int(lag["lag_messages"].sum()) if not lag.empty else 0,
            }
        )
    return sorted(rows, key=lambda r: (*(-r[k] for k in ATTENTION), r["cluster"], r["group"]))


def _records(df: pd.DataFrame, columns: list[str]) -> list[dict[str, Any]]:
    """Rows as dicts with None for missing values (what the templates test for)."""
    part = df[columns].astype(object)
    return [dict(r) for r in part.where(part.notna(), None).to_dict("records")]


def worst(tables: Tables, top: int = TOP) -> dict[str, list[dict[str, Any]]]:
    """The rows a person looks at first, per table."""
    lag = latest_lag(tables["audit_lag"])
    lag = lag.assign(_ms=lag["lag_ms"].fillna(-1)).sort_values(
        ["lag_messages", "_ms"], ascending=False
    )
    dup = tables["audit_duplicates"].sort_values(["count", "last_ts"], ascending=False)
    dlq = tables["audit_dead_letters"].sort_values("age_ms", ascending=False)
    losses = tables["audit_losses"].sort_values(["kind", "first_ts"])
    resend = tables["resend_candidates"].sort_values("next_resend_at")
    manual = tables["manual_handling"].sort_values("updated_at")
    consistency = tables["consistency"].sort_values("count", ascending=False)
    where = ["topic", "cluster", "broker", "queue_id", "queue_offset"]
    stub = ["msg_id", "cause", "topic", "cluster", "broker", "queue_id", "queue_offset"]
    stub.append("send_count")
    return {
        "lag": _records(
            lag.head(top),
            [
                "group",
                "topic",
                "cluster",
                "broker",
                "queue_id",
                "snapshot_ts",
                "lag_messages",
                "lag_ms",
                "status",
                "cause",
                "msg_id",
            ],
        ),
        "duplicates": _records(
            dup.head(top), ["kind", "cause", "msg_id", "group", "count", *where, "detail"]
        ),
        "dead_letters": _records(
            dlq.head(top),
            [
                "group",
                "msg_id",
                "topic",
                "original_topic",
                "count",
                "retries",
                "age_ms",
                "replayed",
            ],
        ),
        "losses": _records(
            losses.head(top), ["kind", "cause", "msg_id", "group", *where, "detail"]
        ),
        "resend_candidates": _records(resend.head(top), [*stub, "next_resend_at"]),
        "manual_handling": _records(manual.head(top), [*stub, "in_message_log"]),
        "consistency": _records(
            consistency.head(top), ["kind", "cause", "count", "group", *where, "detail"]
        ),
    }
