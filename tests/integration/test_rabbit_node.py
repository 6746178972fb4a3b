"""The test RabbitMQ node (tests/rabbitmq.py): it starts, routes, and stops by PID."""

from __future__ import annotations

import os

import pika
import pytest

from tests.rabbitmq import RabbitNode, rabbitmq_node

pytestmark = pytest.mark.integration


def test_node_answers_amqp_and_management(rabbit_node: RabbitNode, rabbit_vhost: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(rabbit_node.amqp_url(rabbit_vhost)))
    try:
        ch = conn.channel()
        ch.queue_declare("q1")
        ch.confirm_delivery()
        ch.basic_publish("", "q1", b"hello", mandatory=True)
        method, _, body = ch.basic_get("q1", auto_ack=True)
        assert method is not None and body == b"hello"
    finally:
        conn.close()
    overview = rabbit_node.api("GET", "/overview")
    assert overview["node"] == rabbit_node.node
    queues = rabbit_node.api("GET", f"/queues/{rabbit_vhost}")
    assert [q["name"] for q in queues] == ["q1"]


def test_node_stops_by_pid() -> None:
    with rabbitmq_node() as node:
        pid = int((node.root / "pid").read_text().strip())
        os.kill(pid, 0)  # the beam is alive
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
