"""Fixtures of the interop tests: a real Apache RocketMQ name server + broker per module, and
mqaudit's own cluster for the official clients and mqadmin."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.integration.cluster_fixtures import Cluster, running_cluster
from tests.interop.rocketmq import JavaServer, classpath, real_broker, real_namesrv

# mqaudit's cluster as the official clients meet it: delay levels of 1 s, as the real broker's
# in these tests (a retry waits for level 3 + reconsumeTimes).
MQAUDIT_SETTINGS = {"store.message_delay_level": " ".join(["1s"] * 18)}


@pytest.fixture(scope="session")
def interop_classpath() -> str:
    """Built once per session (skips, or fails under CI=true, without java and mvn)."""
    return classpath()


@dataclass
class RealRocketMQ:
    namesrv: JavaServer
    broker: JavaServer

    @property
    def namesrv_addr(self) -> str:
        return self.namesrv.addr


@pytest.fixture(scope="module")
def real_rocketmq(
    interop_classpath: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RealRocketMQ]:
    """Apache RocketMQ 4.9's name server and one broker (broker-r of cluster `interop`), its
    SQL92 filter on (enablePropertyFilter)."""
    home = tmp_path_factory.mktemp("rocketmq")
    with (
        real_namesrv(home / "namesrv") as ns,
        real_broker(home / "broker", ns.addr, enablePropertyFilter="true") as broker,
    ):
        yield RealRocketMQ(ns, broker)


@pytest.fixture(scope="module")
def mqaudit_cluster(
    interop_classpath: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """mqaudit's cluster (`mqaudit cluster up`): one name server, broker-a's master."""
    data = tmp_path_factory.mktemp("mqaudit")
    with running_cluster(data, name_servers=1, slaves=False, settings=MQAUDIT_SETTINGS) as c:
        yield c
