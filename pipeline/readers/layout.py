"""Which broker store directories a data dir holds (or Apache RocketMQ broker configs name),
and where its ledgers are."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import javaproperties

from broker_runtime.cluster.layout import CLUSTER_FILE
from broker_runtime.common.constants import DEFAULT_CLUSTER
from broker_runtime.common.topics import validate_group
from pipeline.readers.commitlog import Broker

ROLES = {"master": 0, "slave": 1}


@dataclass(frozen=True)
class LedgerSources:
    """SQLAlchemy URL per ledger table; None when that ledger does not exist (yet)."""

    message_stub: str | None
    message_log: str | None


def cluster_of(data_dir: Path, cluster: str | None = None) -> str:
    """The cluster a data dir belongs to: `cluster` if given, else its cluster.json's
    `cluster_name`, else RocketMQ's default. A legal name (it ends up in SQL predicates)."""
    name = cluster
    doc = data_dir / CLUSTER_FILE
    if name is None and doc.is_file():
        data = json.loads(doc.read_text())
        name = data.get("cluster_name") if isinstance(data, dict) else None
    return validate_group(name or DEFAULT_CLUSTER)


def discover_brokers(
    data_dir: Path, broker_name: str | None = None, cluster: str | None = None
) -> list[Broker]:
    """The store dirs of DIR: from DIR/cluster.json, else DIR/brokers/<group>/{master,slave};
    each of the cluster `cluster_of(DIR, cluster)`.

    A bare store dir (one with commitlog/) is one broker named `broker_name` (default: the
    directory's name), broker id 0. Broker names must be legal group names (they end up in
    partition paths and SQL predicates): InvalidNameError otherwise.
    """
    name = cluster_of(data_dir, cluster)
    return [
        Broker(validate_group(b.name), b.broker_id, b.store_dir, name)
        for b in _brokers(data_dir, broker_name)
    ]


def _brokers(data_dir: Path, broker_name: str | None) -> list[Broker]:
    if not data_dir.is_dir():
        raise FileNotFoundError(f"data dir {data_dir} does not exist")
    if (data_dir / "commitlog").is_dir():
        return [Broker(broker_name or data_dir.resolve().name, 0, str(data_dir.resolve()))]
    doc = data_dir / CLUSTER_FILE
    if doc.is_file():
        return _from_cluster_json(data_dir, json.loads(doc.read_text()))
    found = []
    for group in sorted(p for p in (data_dir / "brokers").glob("*") if p.is_dir()):
        for role, broker_id in ROLES.items():
            store = group / role
            if store.is_dir():
                found.append(Broker(group.name, broker_id, str(store.resolve())))
    return found


def _from_cluster_json(data_dir: Path, doc: Any) -> list[Broker]:
    nodes = doc.get("nodes", []) if isinstance(doc, dict) else doc
    found = []
    for node in nodes:
        role = node.get("role")
        if role not in ROLES:
            continue  # name servers
        group = node.get("broker") or node.get("group") or node.get("broker_name")
        if not group:
            raise ValueError(f"{data_dir / CLUSTER_FILE}: a {role} node has no broker group")
        broker_id = int(node.get("broker_id", ROLES[role]))
        store = node.get("store_dir") or str(data_dir / "brokers" / group / role)
        path = Path(store) if Path(store).is_absolute() else data_dir / store
        found.append(Broker(str(group), broker_id, str(path.resolve())))
    return sorted(found, key=lambda b: (b.name, b.broker_id))


@dataclass(frozen=True)
class RealBroker:
    """An Apache RocketMQ broker as its config file (`mqbroker -c FILE`) describes it."""

    cluster: str  # brokerClusterName
    broker: Broker


def read_broker_conf(path: Path) -> RealBroker:
    """brokerClusterName, brokerName, brokerId and storePathRootDir of a RocketMQ broker
    config (Java properties, as BrokerStartup reads them).

    The store names neither its broker nor its cluster, so they come from here. brokerName
    has no usable default (RocketMQ takes the host name) and must be set; the cluster
    defaults to RocketMQ's `DefaultCluster`, the id to 0, the root to ~/store. A relative
    path is taken relative to the config file. mqaudit reads the CommitLog at
    storePathRootDir/commitlog: a storePathCommitLog elsewhere is refused (ValueError).
    """
    with open(path, encoding="latin-1") as f:  # java.util.Properties' own encoding
        conf = javaproperties.load(f)
    name = conf.get("brokerName", "").strip()
    if not name:
        raise ValueError(f"{path}: no brokerName (RocketMQ would take the host's name): set it")
    try:
        broker_id = int(conf.get("brokerId", "0").strip())  # Integer.parseInt, as the broker
    except ValueError:
        raise ValueError(f"{path}: brokerId {conf['brokerId']!r} is not an integer") from None
    root = Path(path).parent / Path(conf.get("storePathRootDir", "~/store").strip()).expanduser()
    commitlog = conf.get("storePathCommitLog", "").strip()
    if commitlog and (Path(path).parent / commitlog).resolve() != (root / "commitlog").resolve():
        raise ValueError(
            f"{path}: storePathCommitLog {commitlog} is not storePathRootDir/commitlog; "
            "mqaudit reads the CommitLog there (link or copy it into the root)"
        )
    if not (root / "commitlog").is_dir():
        raise FileNotFoundError(f"{path}: {root} has no commitlog/ directory: not a store root")
    cluster = validate_group(conf.get("brokerClusterName", DEFAULT_CLUSTER).strip())
    broker = Broker(validate_group(name), broker_id, str(root.resolve()), cluster)
    return RealBroker(cluster, broker)


def ledger_sources(data_dir: Path | None, ledger_url: str | None = None) -> LedgerSources:
    """`ledger_url` (PostgreSQL: both tables) or DIR/ledger/{producer,consumer}.db (none
    without a data dir: real RocketMQ brokers have no ledgers)."""
    if ledger_url:
        return LedgerSources(ledger_url, ledger_url)
    if data_dir is None:
        return LedgerSources(None, None)
    ledger = Path(data_dir) / "ledger"

    def sqlite(name: str) -> str | None:
        path = ledger / name
        return f"sqlite:///{path.resolve()}" if path.is_file() else None

    return LedgerSources(sqlite("producer.db"), sqlite("consumer.db"))
