"""Fixtures of the interop tests: a real Apache RocketMQ name server + broker per module."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.interop.rocketmq import JavaServer, classpath, real_broker, real_namesrv


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
    """Apache RocketMQ 4.9's name server and one broker (broker-r of cluster `interop`)."""
    home = tmp_path_factory.mktemp("rocketmq")
    with real_namesrv(home / "namesrv") as ns, real_broker(home / "broker", ns.addr) as broker:
        yield RealRocketMQ(ns, broker)
