"""`make bench` (cluster part): this broker vs RabbitMQ vs Redis Streams, side by side.

Each system runs on loopback in a temporary directory, started and stopped here (RabbitMQ
is installed with apt-get when missing). Producers are separate processes, each sending
1 KiB messages one at a time and waiting for the acknowledgement (RabbitMQ: persistent
messages and a publisher confirm per publish; Redis: XADD; this broker: a sync send), for
`--seconds`; batch sends are 64 messages per request (Redis: a pipeline of 64 XADDs). Then
one consumer reads everything back (XREADGROUP + XACK, basic_consume + ack, push consumer).
Last, `--messages` go end to end through this broker and every one is checked off.
Figures and ratios are printed; the goals are reported, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from broker_runtime.common import aio  # noqa: E402 - after the path is set

TOPIC, GROUP, QUEUE, STREAM = "Bench", "bench-group", "bench", "bench"
BATCH = 64
RABBIT_BIN = Path("/usr/lib/rabbitmq/bin")


def log(text: str) -> None:
    print(f"[bench] {text}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def mqaudit(*args: str) -> str:
    cmd = [sys.executable, "-m", "broker_runtime.cli.main", *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT).stdout


# -- the three systems ----------------------------------------------------------------------
@contextlib.contextmanager
def our_cluster(work: Path, slaves: bool) -> Iterator[str]:
    data = work / "cluster"
    args = ["up", "--data-dir", str(data), "--groups", "broker-a,broker-b", "--detach"]
    mqaudit("cluster", *args, "--slaves" if slaves else "--no-slaves")
    try:
        ns: str = json.loads((data / "cluster.json").read_text())["namesrv_addr"]
        mqaudit("admin", "topic-create", "--namesrv", ns, "--topic", TOPIC, "--queues", "4")
        time.sleep(1.5)  # brokers register the topic with the name servers
        yield ns
    finally:
        mqaudit("cluster", "down", "--data-dir", str(data))


@contextlib.contextmanager
def redis_server(work: Path) -> Iterator[int]:
    port = free_port()
    work.mkdir(parents=True)
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(work),
         "--save", "", "--appendonly", "yes", "--appendfsync", "everysec"],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        import redis

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
    proc = subprocess.Popen([str(RABBIT_BIN / "rabbitmq-server")], env=env, stdout=out, stderr=out)
    try:
        import pika

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


# -- producer processes ---------------------------------------------------------------------
def _timed(send: Callable[[], None], per_call: int, start_at: float, seconds: float) -> Any:
    for _ in range(20):  # warm up: connections, routes
        send()
    time.sleep(max(0.0, start_at - time.time()))
    lat: list[float] = []
    end = start_at + seconds
    while time.time() < end:
        t = time.perf_counter()
        send()
        lat.append(time.perf_counter() - t)
    return len(lat) * per_call, time.time(), lat


def ours_producer(ns: str, batch: int, size: int, start_at: float, seconds: float) -> Any:
    from broker_runtime.client.model import new_message
    from broker_runtime.client.producer import Producer

    async def main() -> Any:
        async with Producer(ns, "bench-producer") as p:
            body = b"x" * size

            async def send_one() -> None:
                if batch == 1:
                    await p.send(new_message(TOPIC, body))
                else:
                    await p.send_batch([new_message(TOPIC, body) for _ in range(batch)])

            for _ in range(20):
                await send_one()
            await asyncio.sleep(max(0.0, start_at - time.time()))
            lat: list[float] = []
            end = start_at + seconds
            while time.time() < end:
                t = time.perf_counter()  # uvloop's loop.time() counts whole milliseconds
                await send_one()
                lat.append(time.perf_counter() - t)
            return len(lat) * batch, time.time(), lat

    return aio.run(main())


def redis_producer(port: int, batch: int, size: int, start_at: float, seconds: float) -> Any:
    import redis

    r, body = redis.Redis("127.0.0.1", port), b"x" * size
    if batch == 1:
        return _timed(lambda: r.xadd(STREAM, {"b": body}), 1, start_at, seconds)
    pipe = r.pipeline(transaction=False)

    def send() -> None:
        for _ in range(batch):
            pipe.xadd(STREAM, {"b": body})
        pipe.execute()

    return _timed(send, batch, start_at, seconds)


def rabbit_producer(port: int, batch: int, size: int, start_at: float, seconds: float) -> Any:
    import pika

    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = conn.channel()
    ch.queue_declare(QUEUE, durable=True)
    ch.confirm_delivery()  # basic_publish now waits for the broker's confirm
    props, body = pika.BasicProperties(delivery_mode=2), b"x" * size
    result = _timed(lambda: ch.basic_publish("", QUEUE, body, props), 1, start_at, seconds)
    conn.close()
    return result


def run_producers(fn: Callable[..., Any], target: Any, producers: int, batch: int,
                  size: int, seconds: float) -> dict[str, float]:  # fmt: skip
    start_at = time.time() + 2.0 + 0.2 * producers
    with mp.get_context("fork").Pool(producers) as pool:
        args = [(target, batch, size, start_at, seconds)] * producers
        results = pool.starmap(fn, args)
    count = sum(r[0] for r in results)
    lat = sorted(x for r in results for x in r[2])
    elapsed = max(r[1] for r in results) - start_at
    return {
        "messages": count,
        "msgs_per_s": round(count / elapsed),
        "p50_ms": round(lat[len(lat) // 2] * 1000, 3),
        "p99_ms": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000, 3),
    }


# -- consumers ------------------------------------------------------------------------------
def bench_consumer(ns: str, group: str, topic: str, listener: Any) -> Any:
    """A push consumer from the first offset, with bigger pulls and consume batches."""
    from broker_runtime.client.model import ConsumeFromWhere
    from broker_runtime.client.push_consumer import PushConsumer

    c = PushConsumer(
        ns, group, listener, consume_from=ConsumeFromWhere.FIRST_OFFSET, batch_max=32,
        pull_batch_size=256, pull_threshold_for_queue=4000,
    )  # fmt: skip
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


def redis_consume(port: int, count: int) -> float:
    import redis

    r = redis.Redis("127.0.0.1", port)
    r.xgroup_create(STREAM, GROUP, id="0")
    got, t = 0, time.perf_counter()
    while got < count:
        for _, entries in r.xreadgroup(GROUP, "c1", {STREAM: ">"}, count=256, block=5000):
            r.xack(STREAM, GROUP, *[e[0] for e in entries])
            got += len(entries)
    return time.perf_counter() - t


def rabbit_consume(port: int, count: int) -> float:
    import pika

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
    from broker_runtime.client.model import new_message
    from broker_runtime.client.producer import Producer

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
GOALS = [  # (figure, over, at least): ratios of msgs/s between two cases
    ("ours send x{n}", "rabbitmq send x{n}", 3.0),
    ("ours send x{n}", "redis send x{n}", 0.5),
    ("ours batch64 x1", "redis pipeline64 x1", 0.5),
]


def stored_count(ns: str) -> int:
    rows = json.loads(mqaudit("admin", "topic-status", "--namesrv", ns, "--topic", TOPIC, "--json"))
    return sum(r["maxOffset"] - r["minOffset"] for r in rows)


def report(figures: dict[str, dict[str, Any]], producers: list[int]) -> list[dict[str, Any]]:
    print(f"\n{'case':24} {'msgs/s':>10} {'p50 ms':>8} {'p99 ms':>8}")
    for name, f in figures.items():
        if "p50_ms" in f or name.endswith("consume"):
            p50, p99 = f.get("p50_ms", ""), f.get("p99_ms", "")
            print(f"{name:24} {f['msgs_per_s']:>10,} {p50!s:>8} {p99!s:>8}")
    verdicts = []
    for a, b, goal in GOALS:
        for n in producers if "{n}" in a else [1]:
            fa, fb = figures.get(a.format(n=n)), figures.get(b.format(n=n))
            if fa is None or fb is None:
                continue
            ratio = fa["msgs_per_s"] / fb["msgs_per_s"]
            verdicts.append(
                {"ours": a.format(n=n), "peer": b.format(n=n), "ratio": round(ratio, 2),
                 "goal": goal, "met": ratio >= goal}
            )  # fmt: skip
    e2e = figures.get("ours end-to-end")
    if e2e is not None:
        print(f"\nend to end: {e2e['messages']:,} messages in {e2e['end_to_end_s']} s "
              f"({e2e['end_to_end_msgs_per_s']:,} msg/s), lost {e2e['lost']}, "
              f"duplicates {e2e['duplicates']}")  # fmt: skip
        verdicts.append({"ours": "end-to-end lost", "ratio": e2e["lost"], "goal": 0,
                         "met": e2e["lost"] == 0})  # fmt: skip
    print()
    for v in verdicts:
        peer = f" / {v['peer']}" if "peer" in v else ""
        print(f"{v['ours'] + peer:45} {v['ratio']:>8}  goal {v['goal']}: "
              f"{'met' if v['met'] else 'NOT met'}")  # fmt: skip
    return verdicts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="per send case")
    ap.add_argument("--size", type=int, default=1024, help="body bytes")
    ap.add_argument("--producers", default="1,8", help="producer process counts")
    ap.add_argument("--messages", type=int, default=1_000_000, help="end to end (0: skip)")
    ap.add_argument("--slaves", action="store_true", help="run this broker with slaves")
    ap.add_argument("--skip", default="", help="peers to leave out: rabbitmq,redis")
    ap.add_argument("--out", type=Path, default=ROOT / "bench-out" / "cluster_bench.json")
    args = ap.parse_args()
    producers = [int(x) for x in args.producers.split(",")]
    skip = set(filter(None, args.skip.split(",")))
    figures: dict[str, dict[str, Any]] = {}

    def case(name: str, result: dict[str, Any]) -> None:
        figures[name] = result
        print(json.dumps({"case": name, **result}), flush=True)

    def sends(prefix: str, fn: Callable[..., Any], target: Any, batch_name: str | None) -> None:
        for n in producers:
            log(f"{prefix}: {n} producer(s), one acknowledged send at a time")
            case(f"{prefix} send x{n}", run_producers(fn, target, n, 1, args.size, args.seconds))
        if batch_name:
            log(f"{prefix}: 1 producer, {BATCH} messages per request")
            case(batch_name, run_producers(fn, target, 1, BATCH, args.size, args.seconds))

    def consume(prefix: str, count: int, seconds: float) -> None:
        case(f"{prefix} consume", {"messages": count, "msgs_per_s": round(count / seconds)})

    work = Path(tempfile.mkdtemp(prefix="cluster-bench-"))
    try:
        log(f"this broker: 2 groups, {'with' if args.slaves else 'no'} slaves, async flush")
        with our_cluster(work / "ours", args.slaves) as ns:
            sends("ours", ours_producer, ns, "ours batch64 x1")
            count = stored_count(ns)
            consume("ours", count, ours_consume(ns, count))
            if args.messages > 0:
                log(f"this broker: {args.messages:,} messages end to end")
                case("ours end-to-end", end_to_end(ns, args.messages, args.size))
        if "redis" not in skip:
            log("Redis Streams (appendonly, fsync every second)")
            with redis_server(work / "redis") as port:
                sends("redis", redis_producer, port, "redis pipeline64 x1")
                import redis

                count = int(redis.Redis("127.0.0.1", port).xlen(STREAM))
                consume("redis", count, redis_consume(port, count))
        if "rabbitmq" not in skip and ensure_rabbitmq():
            log("RabbitMQ (durable queue, persistent messages, publisher confirms)")
            with rabbitmq_server(work / "rabbitmq") as port:
                sends("rabbitmq", rabbit_producer, port, None)
                import pika

                conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
                count = conn.channel().queue_declare(QUEUE, durable=True).method.message_count
                conn.close()
                consume("rabbitmq", count, rabbit_consume(port, count))
        elif "rabbitmq" not in skip:
            log("RabbitMQ could not be installed: its cases are left out")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    verdicts = report(figures, producers)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"figures": figures, "goals": verdicts}, indent=2))
    print(f"\nfigures written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
