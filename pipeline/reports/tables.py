"""The audit tables a report shows, read from the lake and collected (they are summaries)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from pipeline.delta_files import read_arrow
from pipeline.lake import AUDIT_TABLES, table_path

Tables = dict[str, pd.DataFrame]


def load_tables(lake: str | Path, names: tuple[str, ...] = tuple(AUDIT_TABLES)) -> Tables:
    """Each named audit table as pandas (empty with its columns when the table is missing),
    read with pyarrow on the driver: a Spark job per table cost more than the read."""
    root = str(Path(lake).resolve())
    return {
        name: read_arrow(table_path(root, name), AUDIT_TABLES[name]).to_pandas() for name in names
    }
