"""This broker's side of cluster_bench.py: its cluster, started and stopped with `mqaudit
cluster`, and its clients as the benchmark's drivers: SyncProducer and the asyncio Producer
in forked producer processes, a push consumer reading everything back, and the end-to-end
run that checks off every message. The producer and consumer drivers take any name server:
they drive Apache RocketMQ's broker too (rocketmq_peer.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing as mp
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import peers

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# The client is imported here, before producer processes fork: on a loaded machine, 8 of
# them each importing it would still be at it when the clock starts.
from broker_runtime.client.admin import MQAdmin  # noqa: E402 - after the path is set
from broker_runtime.client.model import MQClientError, new_message  # noqa: E402
from broker_runtime.client.producer import Producer  # noqa: E402
from broker_runtime.client.sync import SyncProducer  # noqa: E402
from broker_runtime.common import aio  # noqa: E402
from broker_runtime.remoting.connection import RemotingError  # noqa: E402

TOPIC, GROUP = "Bench", peers.GROUP
BATCH = 64
ROUTE_TIMEOUT_S = 60.0


def mqaudit(*args: str) -> str:
    cmd = [sys.executable, "-m", "broker_runtime.cli.main", *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT).stdout


def create_topic(ns: str, topic: str, queues: int = 4) -> None:
    """`topic` on every master the name server knows, once its route has all their queues."""

    async def main() -> None:
        async with MQAdmin(ns) as admin:
            masters = await admin.topic_create(topic, queues)
            deadline = time.monotonic() + ROUTE_TIMEOUT_S
            while time.monotonic() < deadline:
                with contextlib.suppress(MQClientError, RemotingError):
                    if len(await admin.topic_status(topic)) >= queues * len(masters):
                        return
                await asyncio.sleep(0.2)
            raise RuntimeError(f"topic {topic} has no route at {ns} after {ROUTE_TIMEOUT_S} s")

    aio.run(main())


def stored_count(ns: str, topic: str = TOPIC) -> int:
    """Messages in `topic` on all brokers: the sum of each queue's max - min offset."""

    async def main() -> list[dict[str, Any]]:
        async with MQAdmin(ns) as admin:
            return await admin.topic_status(topic)

    return sum(r["maxOffset"] - r["minOffset"] for r in aio.run(main()))


def broker_pids(work: Path) -> list[int]:
    """The broker processes (masters and slaves) of the cluster `our_cluster(work)` runs."""
    nodes = json.loads((work / "cluster" / "cluster.json").read_text())["nodes"]
    return [int(n["pid"]) for n in nodes if n["role"] != "namesrv"]


@contextlib.contextmanager
def our_cluster(work: Path, slaves: bool, flush: str = "async", *more: str) -> Iterator[str]:
    """A cluster, two groups unless `more` says otherwise (`mqaudit cluster up` arguments)."""
    data = work / "cluster"
    args = ["up", "--data-dir", str(data), "--groups", "broker-a,broker-b", "--detach", *more]
    mqaudit("cluster", *args, "--slaves" if slaves else "--no-slaves", "--flush", flush)
    try:
        ns: str = json.loads((data / "cluster.json").read_text())["namesrv_addr"]
        create_topic(ns, TOPIC)
        yield ns
    finally:
        mqaudit("cluster", "down", "--data-dir", str(data))


# -- producer processes ---------------------------------------------------------------------
def ours_producer(ns: str, batch: int, size: int, producers: int, seconds: float) -> Any:
    """SyncProducer: blocking sends from the calling thread, as pika's and redis-py's are."""
    with SyncProducer(Producer(ns, "bench-producer")) as p:
        body = b"x" * size
        if batch == 1:
            return peers.timed(lambda: p.send(new_message(TOPIC, body)), 1, producers, seconds)

        def send_batch() -> None:
            p.send_batch([new_message(TOPIC, body) for _ in range(batch)])

        return peers.timed(send_batch, batch, producers, seconds)


def ours_asyncio_producer(ns: str, batch: int, size: int, producers: int, seconds: float) -> Any:
    """The asyncio Producer, awaiting each send (batch 1 only)."""

    async def main() -> peers.Timed:
        async with Producer(ns, "bench-producer") as p:
            body = b"x" * size
            for _ in range(peers.WARM_UP):
                await p.send(new_message(TOPIC, body))
            start = peers.wait_for_start(producers)  # blocks the loop: nothing else runs yet
            lat: list[float] = []
            end = start + seconds
            while time.time() < end:
                t = time.perf_counter()  # uvloop's loop.time() counts whole milliseconds
                await p.send(new_message(TOPIC, body))
                lat.append(time.perf_counter() - t)
            return len(lat), start, time.time(), lat

    return aio.run(main())


# -- consumers ------------------------------------------------------------------------------
def bench_consumer(ns: str, group: str, topic: str, listener: Any) -> Any:
    """A push consumer from the first offset, with bigger pulls and consume batches."""
    from broker_runtime.client.consumer_options import ConsumerOptions
    from broker_runtime.client.model import ConsumeFromWhere
    from broker_runtime.client.push_consumer import PushConsumer

    options = ConsumerOptions(consume_from=ConsumeFromWhere.FIRST_OFFSET, pull_batch_size=256)
    c = PushConsumer(
        ns, group, listener, options, batch_max=32, pull_threshold_for_queue=4000
    )  # fmt: skip
    c.subscribe(topic)
    return c


def ours_consume(ns: str, count: int, group: str = GROUP) -> peers.Run:
    """A push consumer getting `count` messages (everything of the send cases): from its
    start to the last delivery."""
    from broker_runtime.client.consume_service import ConsumeContext
    from broker_runtime.client.model import ConsumeStatus, ReceivedMessage

    async def main() -> peers.Run:
        got = [0]
        done = asyncio.Event()

        async def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeStatus:
            got[0] += len(msgs)
            if got[0] >= count:
                done.set()
            return ConsumeStatus.CONSUME_SUCCESS

        c = bench_consumer(ns, group, TOPIC, listener)
        start = time.time()
        await c.start()
        await asyncio.wait_for(done.wait(), 120 + count / 500)
        end = time.time()
        await c.shutdown()
        return peers.Run(count, start, end)

    return aio.run(main())


# -- end to end through this broker ---------------------------------------------------------
def e2e_consumer(ns: str, total: int, conn: Any) -> None:
    """Check off every sequence number; report when all arrived or nothing came for 60 s."""
    from broker_runtime.client.consume_service import ConsumeContext
    from broker_runtime.client.model import ConsumeStatus, ReceivedMessage

    async def main() -> dict[str, float]:
        seen = bytearray(total)
        state = {"unique": 0, "dups": 0, "last": time.monotonic()}
        done = asyncio.Event()

        async def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeStatus:
            for m in msgs:
                seq = int.from_bytes(m.body[:8], "big")
                if seen[seq]:
                    state["dups"] += 1
                else:
                    seen[seq] = 1
                    state["unique"] += 1
            state["last"] = time.monotonic()
            if state["unique"] >= total:
                done.set()
            return ConsumeStatus.CONSUME_SUCCESS

        c = bench_consumer(ns, "e2e-group", "E2E", listener)
        await c.start()
        conn.send("ready")
        while not done.is_set() and time.monotonic() - state["last"] < 60:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), 1)
        finished = time.time()
        await c.shutdown()
        return {**state, "finished": finished, "lost": total - state["unique"]}

    conn.send(aio.run(main()))


def e2e_producer(ns: str, first: int, last: int, size: int) -> int:
    async def main() -> int:
        pad = b"x" * max(0, size - 8)
        async with Producer(ns, "e2e-producer") as p:
            for start in range(first, last, BATCH):
                seqs = range(start, min(start + BATCH, last))
                await p.send_batch([new_message("E2E", s.to_bytes(8, "big") + pad) for s in seqs])
        return last - first

    return aio.run(main())


def end_to_end(ns: str, total: int, size: int, producers: int = 4) -> dict[str, Any]:
    create_topic(ns, "E2E")
    ctx = mp.get_context("fork")
    ours, theirs = ctx.Pipe()
    consumer = ctx.Process(target=e2e_consumer, args=(ns, total, theirs))
    consumer.start()
    ours.recv()  # the consumer is subscribed before the first message
    start = time.time()
    step = -(-total // producers)
    with ctx.Pool(producers) as pool:
        pool.starmap(
            e2e_producer, [(ns, i, min(i + step, total), size) for i in range(0, total, step)]
        )
    produced = time.time()
    result = ours.recv()
    consumer.join()
    return {
        "messages": total,
        "produce_msgs_per_s": round(total / (produced - start)),
        "end_to_end_s": round(result["finished"] - start, 1),
        "end_to_end_msgs_per_s": round(total / (result["finished"] - start)),
        "lost": result["lost"],
        "duplicates": result["dups"],
    }
