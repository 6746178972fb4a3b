"""The RabbitMQ node of the tests (broker_runtime/rabbit/node.py), and a vhost per test.

Each test gets a virtual host of its own (`rabbit_vhost`), so tests share the session's node
without seeing each other's exchanges and queues. Without the binaries the tests skip,
except under CI=true, where they fail: `make system-deps` installs `rabbitmq-server`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from broker_runtime.rabbit.node import RABBIT_BIN, RabbitNode, rabbitmq_available
from broker_runtime.rabbit.node import rabbitmq_node as _node
from tests.db_servers import _unavailable

__all__ = ["RabbitNode", "rabbitmq_node"]


@contextmanager
def rabbitmq_node() -> Iterator[RabbitNode]:
    """A node in a temporary directory; skips (fails under CI=true) without RabbitMQ."""
    if not rabbitmq_available():
        _unavailable(f"RabbitMQ ({RABBIT_BIN}/rabbitmq-server)")
        return
    with _node() as node:
        yield node


@pytest.fixture(scope="session")
def rabbit_node() -> Iterator[RabbitNode]:
    with rabbitmq_node() as node:
        yield node


@pytest.fixture
def rabbit_vhost(rabbit_node: RabbitNode) -> Iterator[str]:
    """A fresh virtual host for one test, deleted after it."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    rabbit_node.add_vhost(name)
    try:
        yield name
    finally:
        rabbit_node.delete_vhost(name)
