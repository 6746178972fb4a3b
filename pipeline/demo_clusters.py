"""The demo's audit of the clusters the fault workload started for itself, each into a lake
of its own, in one Spark session.

The workload runs the rebalance and master-crash scenarios on clusters of their own under
DATA_DIR/scenarios/<name>/ (they need other broker settings). Their brokers are named like
the main cluster's, so they cannot share its lake (ingest checkpoints and rows are keyed by
broker name); the mq_audit DAG audits the main cluster, this the others, and the demo's
summary counts both.

    python -m pipeline.demo_clusters --lakes DIR --out FILE [--spark-conf JSON] DATA_DIR...

FILE gets `{name: {"data_dir", "lake", "messages", "kinds": {table: {kind: {cause: n}}},
"seconds"}}`, one entry per DATA_DIR (named by its directory).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from broker_runtime.common.progress import reporter, show_progress
from pipeline.jobs.audit import run_audit
from pipeline.jobs.ingest import run_ingest
from pipeline.spark_session import build_spark


def audit_clusters(
    data_dirs: Sequence[Path], lakes: Path, spark_conf: dict[str, str] | None = None
) -> dict[str, Any]:
    """Ingest and audit each data dir into LAKES/<its name>; what each audit found."""
    spark = build_spark("mqaudit-demo-clusters", conf=spark_conf)
    out: dict[str, Any] = {}
    for data_dir in data_dirs:
        started = time.monotonic()
        lake = lakes / data_dir.name
        reporter("clusters")(f"{data_dir.name}: ingest and audit into {lake}")
        ingested = run_ingest(data_dir, lake, spark)
        audited = run_audit(lake, spark)
        out[data_dir.name] = {
            "data_dir": str(data_dir),
            "lake": str(lake),
            "messages": ingested["messages"],
            "kinds": {name: t["kinds"] for name, t in audited["tables"].items()},
            "seconds": round(time.monotonic() - started, 1),
        }
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.demo_clusters")
    parser.add_argument("--lakes", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--spark-conf", default="{}", help="JSON object of Spark settings")
    parser.add_argument("data_dirs", type=Path, nargs="+")
    args = parser.parse_args(argv)
    show_progress()
    result = audit_clusters(args.data_dirs, args.lakes, json.loads(args.spark_conf))
    args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
