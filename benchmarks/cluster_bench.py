"""`make bench` (cluster part): this broker vs RabbitMQ vs Redis Streams, side by side.

Each system runs on loopback in a temporary directory, started and stopped here (the peers:
peers.py), all of them at once. Producers are separate processes, each sending 1 KiB
messages one at a time and waiting for the acknowledgement, for `--seconds`; batch sends
are 64 messages per request (Redis: a pipeline of 64 XADDs). The systems take turns at each
case, `--rounds` times in alternating order, so that a shared machine's load weighs on all
of them alike. Every producer is a blocking client, as the peers' pika and redis-py are:
ours is SyncProducer; the asyncio Producer awaiting each send is measured too ("ours
asyncio"). What an acknowledgement means:
- this broker: a sync send, answered once the message is in the CommitLog; the cluster runs
  with ASYNC flush (RocketMQ's default: the log is flushed every 500 ms, as Redis's
  `appendfsync everysec`), no slaves unless `--slaves`. The single sends are repeated on a
  SYNC-flush cluster (answered after the fdatasync, group commit), for the comparison with
  RabbitMQ, which confirms a persistent message once it is on disk.
- Redis: XADD (appendonly, fsync every second); RabbitMQ: durable queue, persistent
  messages, a publisher confirm per publish.
Then one consumer reads everything back (XREADGROUP + XACK, basic_consume + ack, push
consumer). Last, `--messages` go end to end through this broker and every one is checked
off. Figures (with the 1-minute load average when each case ended) and ratios are printed;
the goals are reported, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import peers
from cluster_goals import report
from peers import log

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# The client is imported here, before producer processes fork: on a loaded machine, 8 of
# them each importing it would still be at it when the clock starts.
from broker_runtime.client.consumer_options import ConsumerOptions  # noqa: E402
from broker_runtime.client.model import new_message  # noqa: E402 - after the path is set
from broker_runtime.client.producer import Producer  # noqa: E402
from broker_runtime.client.sync import SyncProducer  # noqa: E402
from broker_runtime.common import aio  # noqa: E402

TOPIC, GROUP = "Bench", peers.GROUP
BATCH = 64


def mqaudit(*args: str) -> str:
    cmd = [sys.executable, "-m", "broker_runtime.cli.main", *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT).stdout


@contextlib.contextmanager
def our_cluster(work: Path, slaves: bool, flush: str = "async") -> Iterator[str]:
    data = work / "cluster"
    args = ["up", "--data-dir", str(data), "--groups", "broker-a,broker-b", "--detach"]
    mqaudit("cluster", *args, "--slaves" if slaves else "--no-slaves", "--flush", flush)
    try:
        ns: str = json.loads((data / "cluster.json").read_text())["namesrv_addr"]
        mqaudit("admin", "topic-create", "--namesrv", ns, "--topic", TOPIC, "--queues", "4")
        time.sleep(1.5)  # brokers register the topic with the name servers
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


Run = tuple[int, float, list[float]]  # messages, seconds, latencies of one timed run


def run_producers(fn: Callable[..., Any], target: Any, producers: int, batch: int,
                  size: int, seconds: float) -> Run:  # fmt: skip
    peers.new_start_line()
    with mp.get_context("fork").Pool(producers) as pool:
        results: list[peers.Timed] = pool.starmap(
            fn, [(target, batch, size, producers, seconds)] * producers
        )
    lat = [x for r in results for x in r[3]]
    return sum(r[0] for r in results), max(r[2] for r in results) - results[0][1], lat


def summarize(runs: list[Run], loads: list[float]) -> dict[str, Any]:
    """The runs of one case as one figure: all messages over all timed seconds."""
    count, elapsed = sum(r[0] for r in runs), sum(r[1] for r in runs)
    lat = sorted(x for r in runs for x in r[2])
    return {
        "messages": count,
        "msgs_per_s": round(count / elapsed),
        "p50_ms": round(lat[len(lat) // 2] * 1000, 3),
        "p99_ms": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000, 3),
        "load1": round(sum(loads) / len(loads), 2),
    }


# -- consumers ------------------------------------------------------------------------------
def bench_consumer(ns: str, group: str, topic: str, listener: Any) -> Any:
    """A push consumer from the first offset, with bigger pulls and consume batches."""
    from broker_runtime.client.model import ConsumeFromWhere
    from broker_runtime.client.push_consumer import PushConsumer

    c = PushConsumer(
        ns,
        group,
        listener,
        options=ConsumerOptions(consume_from=ConsumeFromWhere.FIRST_OFFSET, pull_batch_size=256),
        batch_max=32,
        pull_threshold_for_queue=4000,
    )
    c.subscribe(topic)
    return c


def ours_consume(ns: str, count: int) -> float:
    """Seconds for a push consumer to get `count` messages (everything of the send cases)."""
    from broker_runtime.client.consume_service import ConsumeContext
    from broker_runtime.client.model import ConsumeStatus, ReceivedMessage

    async def main() -> float:
        got = [0]
        done = asyncio.Event()

        async def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeStatus:
            got[0] += len(msgs)
            if got[0] >= count:
                done.set()
            return ConsumeStatus.CONSUME_SUCCESS

        c = bench_consumer(ns, GROUP, TOPIC, listener)
        t = time.perf_counter()
        await c.start()
        await asyncio.wait_for(done.wait(), 600)
        elapsed = time.perf_counter() - t
        await c.shutdown()
        return elapsed

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
    mqaudit("admin", "topic-create", "--namesrv", ns, "--topic", "E2E", "--queues", "4")
    time.sleep(1.5)
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


# -- the run --------------------------------------------------------------------------------
def stored_count(ns: str) -> int:
    rows = json.loads(mqaudit("admin", "topic-status", "--namesrv", ns, "--topic", TOPIC, "--json"))
    return sum(r["maxOffset"] - r["minOffset"] for r in rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="per send case and round")
    ap.add_argument("--rounds", type=int, default=2, help="of each send case, order reversed")
    ap.add_argument("--size", type=int, default=1024, help="body bytes")
    ap.add_argument("--producers", default="1,8", help="producer process counts")
    ap.add_argument("--messages", type=int, default=1_000_000, help="end to end (0: skip)")
    ap.add_argument("--slaves", action="store_true", help="run this broker with slaves")
    ap.add_argument("--skip", default="", help="cases to leave out: rabbitmq,redis,syncflush")
    ap.add_argument("--out", type=Path, default=ROOT / "bench-out" / "cluster_bench.json")
    args = ap.parse_args()
    producers = [int(x) for x in args.producers.split(",")]
    skip = set(filter(None, args.skip.split(",")))
    figures: dict[str, dict[str, Any]] = {}

    def case(name: str, result: dict[str, Any]) -> None:
        figures[name] = {"load1": round(os.getloadavg()[0], 2), **result}
        print(json.dumps({"case": name, **figures[name]}), flush=True)

    def side_by_side(cases: list[tuple[str, Callable[..., Any], Any]], n: int, batch: int) -> None:
        """Every system's run of one case in turn, `--rounds` times, each round in the
        reverse order of the last: the load of a shared machine drifts, and so it drifts
        alike for all of them."""
        runs: dict[str, list[Run]] = {name: [] for name, _, _ in cases}
        loads: dict[str, list[float]] = {name: [] for name, _, _ in cases}
        for r in range(args.rounds):
            for name, fn, target in cases if r % 2 == 0 else cases[::-1]:
                log(f"{name}: {n} producer(s), {batch} message(s) per request, round {r + 1}")
                runs[name].append(run_producers(fn, target, n, batch, args.size, args.seconds))
                loads[name].append(os.getloadavg()[0])
        for name, _, _ in cases:
            case(name, summarize(runs[name], loads[name]))

    def consume(prefix: str, count: int, seconds: float) -> None:
        case(f"{prefix} consume", {"messages": count, "msgs_per_s": round(count / seconds)})

    work = Path(tempfile.mkdtemp(prefix="cluster-bench-"))
    log(f"load average at the start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    try:
        with contextlib.ExitStack() as systems:
            log(f"this broker: 2 groups, {'with' if args.slaves else 'no'} slaves, async flush")
            ns = systems.enter_context(our_cluster(work / "ours", args.slaves))
            sends: list[tuple[str, Callable[..., Any], Any]] = [
                ("ours", ours_producer, ns),
                ("ours asyncio", ours_asyncio_producer, ns),
            ]
            batches: list[tuple[str, Callable[..., Any], Any]] = [
                ("ours batch64 x1", ours_producer, ns)
            ]
            if "syncflush" not in skip:
                log("this broker again, SYNC flush: a send is answered after the fdatasync")
                ns_sync = systems.enter_context(our_cluster(work / "sync", args.slaves, "sync"))
                sends.append(("ours syncflush", ours_producer, ns_sync))
            if "redis" not in skip:
                log("Redis Streams (appendonly, fsync every second)")
                redis_port = systems.enter_context(peers.redis_server(work / "redis"))
                sends.append(("redis", peers.redis_producer, redis_port))
                batches.append(("redis pipeline64 x1", peers.redis_producer, redis_port))
            rabbit = "rabbitmq" not in skip and peers.ensure_rabbitmq()
            if rabbit:
                log("RabbitMQ (durable queue, persistent messages, publisher confirms)")
                rabbit_port = systems.enter_context(peers.rabbitmq_server(work / "rabbitmq"))
                sends.append(("rabbitmq", peers.rabbit_producer, rabbit_port))
            elif "rabbitmq" not in skip:
                log("RabbitMQ could not be installed: its cases are left out")
            for n in producers:
                side_by_side([(f"{name} send x{n}", fn, t) for name, fn, t in sends], n, 1)
            side_by_side(batches, 1, BATCH)
            count = stored_count(ns)
            consume("ours", count, ours_consume(ns, count))
            if "redis" not in skip:
                count = peers.redis_stored(redis_port)
                consume("redis", count, peers.redis_consume(redis_port, count))
            if rabbit:
                count = peers.rabbit_stored(rabbit_port)
                consume("rabbitmq", count, peers.rabbit_consume(rabbit_port, count))
            if args.messages > 0:
                log(f"this broker: {args.messages:,} messages end to end")
                case("ours end-to-end", end_to_end(ns, args.messages, args.size))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    verdicts = report(figures, producers)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"figures": figures, "goals": verdicts}, indent=2))
    print(f"\nfigures written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
