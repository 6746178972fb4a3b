"""The peers of cluster_bench.py: Redis Streams and RabbitMQ, each started on loopback in a
temporary directory and stopped again, with their producer and consumer drivers.

Redis: `redis-server` with appendonly and `appendfsync everysec`; a send is one XADD with
redis-py (a pipeline of XADDs for a batch); the consumer is XREADGROUP + XACK.
RabbitMQ: `rabbitmq-server` (installed with apt-get when missing), a durable queue,
persistent messages (delivery_mode 2) and a publisher confirm per publish with pika, which
RabbitMQ gives once the message is on disk; the consumer is basic_consume with acks.

Both servers run in sessions of their own, as `mqaudit cluster up` starts this broker's
nodes: with the kernel's autogroup scheduling (sched_autogroup_enabled) a session is a
scheduling group, and a server sharing the producers' group is woken differently from one
in its own (measured here: a broker in the producers' session did up to 2x more sends/s
under load). Same footing for all three.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pika
import redis

GROUP, QUEUE, STREAM = "bench-group", "bench", "bench"
RABBIT_BIN = Path("/usr/lib/rabbitmq/bin")
WARM_UP = 20  # sends before the clock starts: connections, routes


def log(text: str) -> None:
    print(f"[bench] {text}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# (producers ready, start time): made before the producers fork, inherited by each of them.
_start_line: tuple[Any, Any] | None = None


def new_start_line() -> None:
    """Before forking a case's producers: they start the clock together once all are ready."""
    global _start_line
    ctx = mp.get_context("fork")
    _start_line = (ctx.Value("i", 0), ctx.Value("d", 0.0))


def wait_for_start(producers: int) -> float:
    """In a producer, warmed up: the start time, once the last of `producers` is ready too
    (a slow start of one, on a loaded machine, would otherwise eat into the timed run)."""
    assert _start_line is not None, "new_start_line() before the producers fork"
    ready, start = _start_line
    with ready.get_lock():
        ready.value += 1
        if ready.value == producers:
            start.value = time.time() + 0.1
    while start.value == 0.0:
        time.sleep(0.005)
    time.sleep(max(0.0, start.value - time.time()))
    return float(start.value)


Timed = tuple[int, float, float, list[float]]  # messages, start, end, latencies


def timed(send: Callable[[], None], per_call: int, producers: int, seconds: float) -> Timed:
    """Calling `send` back to back for `seconds`, from the common start."""
    for _ in range(WARM_UP):
        send()
    start = wait_for_start(producers)
    lat: list[float] = []
    end = start + seconds
    while time.time() < end:
        t = time.perf_counter()
        send()
        lat.append(time.perf_counter() - t)
    return len(lat) * per_call, start, time.time(), lat


class Run(NamedTuple):
    """One timed run of a case: messages acknowledged, its start and end (epoch seconds),
    the latency of a send (a batch's send for a batch) at the 50th and 99th percentiles."""

    messages: int
    start: float
    end: float
    p50_ms: float = 0.0
    p99_ms: float = 0.0

    @property
    def seconds(self) -> float:
        return self.end - self.start


def run_producers(fn: Callable[..., Timed], target: Any, producers: int, batch: int,
                  size: int, seconds: float) -> Run:  # fmt: skip
    """`fn(target, batch, size, producers, seconds)` in each of `producers` forked processes."""
    new_start_line()
    with mp.get_context("fork").Pool(producers) as pool:
        results: list[Timed] = pool.starmap(
            fn, [(target, batch, size, producers, seconds)] * producers
        )
    lat = sorted(x for r in results for x in r[3])
    return Run(
        sum(r[0] for r in results), results[0][1], max(r[2] for r in results),
        lat[len(lat) // 2] * 1000, lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000,
    )  # fmt: skip


# -- Redis Streams ----------------------------------------------------------------------------
@contextlib.contextmanager
def redis_server(work: Path) -> Iterator[int]:
    port = free_port()
    work.mkdir(parents=True)
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(work),
         "--save", "", "--appendonly", "yes", "--appendfsync", "everysec"],
        stdout=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        for _ in range(100):
            with contextlib.suppress(redis.ConnectionError):
                redis.Redis("127.0.0.1", port).ping()
                break
            time.sleep(0.1)
        else:
            raise RuntimeError(f"redis-server did not answer on port {port}")
        yield port
    finally:
        proc.terminate()
        proc.wait(30)


def redis_producer(port: int, batch: int, size: int, producers: int, seconds: float) -> Timed:
    r, body = redis.Redis("127.0.0.1", port), b"x" * size
    if batch == 1:
        return timed(lambda: r.xadd(STREAM, {"b": body}), 1, producers, seconds)
    pipe = r.pipeline(transaction=False)

    def send() -> None:
        for _ in range(batch):
            pipe.xadd(STREAM, {"b": body})
        pipe.execute()

    return timed(send, batch, producers, seconds)


def redis_stored(port: int) -> int:
    return int(redis.Redis("127.0.0.1", port).xlen(STREAM))


def redis_consume(port: int, count: int) -> float:
    r = redis.Redis("127.0.0.1", port)
    r.xgroup_create(STREAM, GROUP, id="0")
    got, t = 0, time.perf_counter()
    while got < count:
        for _, entries in r.xreadgroup(GROUP, "c1", {STREAM: ">"}, count=256, block=5000):
            r.xack(STREAM, GROUP, *[e[0] for e in entries])
            got += len(entries)
    return time.perf_counter() - t


# -- RabbitMQ ---------------------------------------------------------------------------------
def ensure_rabbitmq() -> bool:
    if (RABBIT_BIN / "rabbitmq-server").exists():
        return True
    log("installing rabbitmq-server with apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "rabbitmq-server"],
    ):
        if subprocess.run(cmd, env=env, capture_output=True).returncode != 0:
            return False
    return (RABBIT_BIN / "rabbitmq-server").exists()


@contextlib.contextmanager
def rabbitmq_server(work: Path) -> Iterator[int]:
    port, dist, epmd = free_port(), free_port(), free_port()
    (work / "home").mkdir(parents=True)
    (work / "rabbitmq.conf").write_text(f"listeners.tcp.default = {port}\n")
    (work / "enabled_plugins").write_text("[].\n")
    node = f"bench{port}@localhost"
    env = {
        **os.environ, "HOME": str(work / "home"), "RABBITMQ_NODENAME": node,
        "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1", "RABBITMQ_NODE_PORT": str(port),
        "RABBITMQ_DIST_PORT": str(dist), "ERL_EPMD_PORT": str(epmd),
        "RABBITMQ_MNESIA_BASE": str(work / "mnesia"), "RABBITMQ_LOG_BASE": str(work / "log"),
        "RABBITMQ_CONFIG_FILE": str(work / "rabbitmq"), "RABBITMQ_PID_FILE": str(work / "pid"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(work / "enabled_plugins"),
    }  # fmt: skip
    out = open(work / "server.log", "wb")
    proc = subprocess.Popen(
        [str(RABBIT_BIN / "rabbitmq-server")], env=env, stdout=out, stderr=out,
        start_new_session=True,
    )  # fmt: skip
    try:
        for _ in range(600):
            with contextlib.suppress(Exception):
                pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port)).close()
                break
            time.sleep(0.1)
        else:
            raise RuntimeError(f"RabbitMQ did not answer on port {port}: see {work}/server.log")
        yield port
    finally:
        subprocess.run([str(RABBIT_BIN / "rabbitmqctl"), "-n", node, "stop"], env=env,
                       capture_output=True, timeout=120)  # fmt: skip
        subprocess.run(["epmd", "-port", str(epmd), "-kill"], capture_output=True, env=env)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(30)
        if proc.poll() is None:
            proc.kill()
        out.close()


def rabbit_producer(port: int, batch: int, size: int, producers: int, seconds: float) -> Timed:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = conn.channel()
    ch.queue_declare(QUEUE, durable=True)
    ch.confirm_delivery()  # basic_publish now waits for the broker's confirm
    props, body = pika.BasicProperties(delivery_mode=2), b"x" * size
    result = timed(lambda: ch.basic_publish("", QUEUE, body, props), 1, producers, seconds)
    conn.close()
    return result


def rabbit_stored(port: int) -> int:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    count = int(conn.channel().queue_declare(QUEUE, durable=True).method.message_count)
    conn.close()
    return count


def rabbit_consume(port: int, count: int) -> float:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=256)
    got, t = 0, time.perf_counter()
    for method, _, _ in ch.consume(QUEUE, inactivity_timeout=30):
        if method is None:
            break
        got += 1
        if got % 64 == 0 or got >= count:
            ch.basic_ack(method.delivery_tag, multiple=True)
        if got >= count:
            break
    elapsed = time.perf_counter() - t
    ch.cancel()
    conn.close()
    return elapsed
