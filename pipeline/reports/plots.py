"""The report's plots: pandas frames of audit rows -> PNG files (matplotlib, no pyplot state).

Each function writes one figure and returns its path, or, where there is nothing to draw,
writes none and returns the sentence that says why (the report shows it instead).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from pipeline.reports.render import timestamp

Drawn = Path | str  # the figure written, or why there is none

AGE_BUCKETS = [
    ("< 1 h", 0, 3_600_000),
    ("1 h - 1 d", 3_600_000, 86_400_000),
    ("1 d - 7 d", 86_400_000, 7 * 86_400_000),
    (">= 7 d", 7 * 86_400_000, None),
]
_DPI = 100


def _save(fig: Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=_DPI, format="png")
    return path


def _times(ms: pd.Series) -> pd.Series:
    return pd.to_datetime(ms.astype("int64"), unit="ms")  # naive, UTC


def lag_over_time(lag: pd.DataFrame, path: Path) -> Drawn:
    """Per group: messages behind (sum over queues) and oldest waiting message, per snapshot."""
    if lag.empty:
        return (
            "No consumer offset snapshots: there is no lag to show until the brokers' "
            "consumerOffset.json (or their offset history) is ingested."
        )
    per = (
        lag.assign(lag_s=lag["lag_ms"].astype("float64") / 1000.0)
        .groupby(["group", "snapshot_ts"], as_index=False)
        .agg(lag_messages=("lag_messages", "sum"), lag_s=("lag_s", "max"))
        .sort_values("snapshot_ts")
    )
    times = per["snapshot_ts"].nunique()
    first, last = timestamp(per["snapshot_ts"].min()), timestamp(per["snapshot_ts"].max())
    if times < 2:
        return (
            f"One consumer offset snapshot so far ({first}): lag over time needs two or more "
            "(each ingest adds one; a broker with offset_history_interval_ms set keeps one "
            "per interval). The table below shows the lag at that moment."
        )
    if per["lag_messages"].max() == 0:
        return (
            f"Every group was caught up at all {times} consumer offset snapshots, from "
            f"{first} to {last}: no lag to draw."
        )
    behind = per.groupby("group")["lag_messages"].max()
    per = per[per["group"].isin(behind[behind > 0].index)]  # caught up throughout: not drawn
    fig = Figure(figsize=(9, 5.5))
    top, bottom = fig.subplots(2, 1, sharex=True)
    for group, rows in per.groupby("group"):
        when = _times(rows["snapshot_ts"])
        top.plot(when, rows["lag_messages"], marker=".", label=str(group))
        bottom.plot(when, rows["lag_s"], marker=".", label=str(group))
    caught_up = len(behind) - per["group"].nunique()
    more = f" ({caught_up} more caught up throughout)" if caught_up else ""
    top.set_title(f"Consumer lag per group{more}")
    top.set_ylabel("messages behind")
    bottom.set_ylabel("oldest waiting (s)")
    top.legend(loc="upper left", fontsize="small")
    bottom.set_xlabel("snapshot time (UTC)")
    fig.autofmt_xdate()
    return _save(fig, path)


def _bars(ax: Axes, counts: pd.DataFrame, title: str, xlabel: str, stacked: bool) -> None:
    """Horizontal bars, one row per index label and one colour per column: stacked where the
    columns split the row's messages, side by side where one message may be in several."""
    rows = np.arange(len(counts.index))
    height = 0.8 if stacked else 0.8 / len(counts.columns)
    left = np.zeros(len(rows))
    for i, column in enumerate(counts.columns):
        values = counts[column].to_numpy(dtype=float)
        y = rows if stacked else rows - 0.4 + height * (i + 0.5)
        ax.barh(y, values, height=height, left=left, label=str(column))
        if stacked:
            left = left + values
    ax.set_yticks(rows, [str(i) for i in counts.index])
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.invert_yaxis()
    ax.legend(loc="lower right", fontsize="small")


def duplicates_by_cause(dup: pd.DataFrame, path: Path) -> Drawn:
    if dup.empty:
        return "No duplicates: nothing stored twice, delivered twice or retried."
    fig = Figure(figsize=(9, 4.5))
    ax = fig.subplots()
    counts = dup.groupby(["cause", "kind"]).size().unstack("kind", fill_value=0)
    _bars(ax, counts, "Duplicates by cause", "messages (per group for deliveries)", False)
    return _save(fig, path)


def losses_by_cause(losses: pd.DataFrame, path: Path) -> Drawn:
    if losses.empty:
        return "No losses: every acknowledged message is stored and every group received it."
    fig = Figure(figsize=(9, 4))
    ax = fig.subplots()
    counts = losses.groupby(["cause", "kind"]).size().unstack("kind", fill_value=0)
    _bars(ax, counts, "Losses by cause", "messages", True)
    return _save(fig, path)


def age_bucket(age_ms: pd.Series) -> pd.Series:
    """The AGE_BUCKETS label of each age."""
    labels = pd.Series(AGE_BUCKETS[-1][0], index=age_ms.index)
    for label, lo, hi in reversed(AGE_BUCKETS[:-1]):
        labels = labels.where(~((age_ms >= lo) & (age_ms < hi)), label)
    return labels


def dead_letters_by_group_and_age(dlq: pd.DataFrame, path: Path) -> Drawn:
    if dlq.empty:
        return "No dead letters: no group gave up on a message."
    fig = Figure(figsize=(9, 4.5))
    ax = fig.subplots()
    bucketed = dlq.assign(age=age_bucket(dlq["age_ms"].astype("int64")))
    counts = bucketed.groupby(["group", "age"]).size().unstack("age", fill_value=0)
    order = [b[0] for b in AGE_BUCKETS if b[0] in counts.columns]
    _bars(ax, counts[order], "Dead letters by group and age", "messages in %DLQ%", True)
    return _save(fig, path)
