"""What an ingest reads: the brokers of its data dirs and broker configs, each data dir's
ledgers, each named by its cluster (checked before Spark starts); and the `quarantine` row
of what of them could not be read."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker_runtime.common.constants import DEFAULT_CLUSTER
from pipeline.readers.commitlog import Broker
from pipeline.readers.layout import (
    LedgerSources,
    cluster_of,
    discover_brokers,
    ledger_sources,
    read_broker_conf,
)


@dataclass(frozen=True)
class Ledgers:
    """One cluster's ledgers (a data dir's, or the PostgreSQL ones of `ledger_url`)."""

    cluster: str
    sources: LedgerSources


def paths(data_dirs: str | Path | Sequence[str | Path] | None) -> list[Path]:
    if data_dirs is None:
        return []
    if isinstance(data_dirs, str | Path):
        return [Path(data_dirs)]
    return [Path(d) for d in data_dirs]


def find_brokers(
    dirs: list[Path],
    broker_name: str | None,
    cluster: str | None,
    confs: Sequence[str | Path],
    required: bool = True,
) -> list[Broker]:
    """The brokers to read; bad paths fail here, before Spark starts."""
    found = [b for d in dirs for b in discover_brokers(d, broker_name, cluster)]
    found += [read_broker_conf(Path(c)).broker for c in confs]
    seen: dict[tuple[str, str, int], str] = {}
    for b in found:
        other = seen.setdefault(b.replica, b.store_dir)
        if other != b.store_dir:
            raise ValueError(
                f"broker {b.name}/{b.broker_id} of cluster {b.cluster} twice: {other} and "
                f"{b.store_dir} (give each cluster its own name: cluster_name in cluster.json)"
            )
    if not found and required:
        raise ValueError("nothing to ingest: give a data dir or broker configs")
    return found


def check_names(dirs: list[Path], cluster: str | None) -> None:
    """Each data dir a cluster of its own name (refused otherwise, before anything is read:
    their ledgers' row ids would collide, and so would brokers of the same name)."""
    if cluster is not None and len(dirs) > 1:
        raise ValueError("a cluster name is for one data dir: each of several names its own")
    names = [cluster_of(d, cluster) for d in dirs]
    for name in sorted({n for n in names if names.count(n) > 1}):
        twice = [str(d) for d, n in zip(dirs, names, strict=True) if n == name]
        raise ValueError(f"data dirs {twice} are all cluster {name}: each needs its own name")


def find_ledgers(
    dirs: list[Path], cluster: str | None, ledger_url: str | None, brokers: list[Broker]
) -> list[Ledgers]:
    """Each data dir's ledgers as its cluster's; `ledger_url` as the first one's (or, with
    broker configs only, as their one cluster's)."""
    out = [
        Ledgers(cluster_of(d, cluster), ledger_sources(d, ledger_url if i == 0 else None))
        for i, d in enumerate(dirs)
    ]
    if not dirs and ledger_url:
        clusters = sorted({b.cluster for b in brokers}) or [cluster or DEFAULT_CLUSTER]
        if len(clusters) > 1:
            raise ValueError(f"--ledger-url: whose ledgers, of clusters {clusters}?")
        out.append(Ledgers(clusters[0], ledger_sources(None, ledger_url)))
    return out


def quarantine_row(
    b: Broker,
    file: str,
    position: int,
    log_offset: int,
    length: int,
    reason: str,
    detail: str,
    final: bool = True,
) -> dict[str, Any]:
    """A `quarantine` row: what of which broker's file could not be ingested, and why."""
    return {
        "cluster": b.cluster,
        "broker": b.name,
        "broker_id": b.broker_id,
        "file": file,
        "position": position,
        "log_offset": log_offset,
        "length": length,
        "reason": reason,
        "detail": detail,
        "final": final,
    }
