"""`pipeline ingest --broker-conf`: an Apache RocketMQ broker's config names its store root,
broker and cluster (the store itself names neither)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.readers.commitlog import Broker
from pipeline.readers.layout import read_broker_conf


def _conf(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "broker.conf"
    path.write_text(text)
    return path


def test_names_id_and_root_come_from_the_config(tmp_path: Path) -> None:
    root = tmp_path / "store"
    (root / "commitlog").mkdir(parents=True)
    conf = _conf(
        tmp_path,
        "# a broker\nbrokerClusterName = payments\nbrokerName=broker-b\nbrokerId=1\n"
        f"storePathRootDir={root}\nstorePathCommitLog={root}/commitlog\nlistenPort=10911\n",
    )
    real = read_broker_conf(conf)
    assert real.cluster == "payments"
    assert real.broker == Broker("broker-b", 1, str(root.resolve()), "payments")


def test_defaults_and_relative_root(tmp_path: Path) -> None:
    (tmp_path / "s" / "commitlog").mkdir(parents=True)
    real = read_broker_conf(_conf(tmp_path, "brokerName=b1\nstorePathRootDir=s\n"))
    assert real.cluster == "DefaultCluster"  # RocketMQ's default
    assert real.broker == Broker("b1", 0, str((tmp_path / "s").resolve()))


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("storePathRootDir=s\n", "no brokerName"),
        ("brokerName=b\nbrokerId=x\nstorePathRootDir=s\n", "not an integer"),
        ("brokerName=b\nstorePathRootDir=s\nstorePathCommitLog=/elsewhere\n", "storePathCommitLog"),
        ("brokerName=b\nstorePathRootDir=nothing-here\n", "not a store root"),
        ("brokerName=b c\nstorePathRootDir=s\n", "b c"),
    ],
)
def test_bad_configs_are_refused_clearly(tmp_path: Path, text: str, error: str) -> None:
    (tmp_path / "s" / "commitlog").mkdir(parents=True)
    with pytest.raises((ValueError, FileNotFoundError), match=error):
        read_broker_conf(_conf(tmp_path, text))
