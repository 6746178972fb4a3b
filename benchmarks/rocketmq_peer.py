"""Apache RocketMQ as a peer of cluster_bench.py: its own name server and broker (4.9.7) and
its official Java clients, which drive Apache RocketMQ's broker and this one alike.

The processes and the Java programs are the interop harness's (tests/interop/rocketmq.py,
tests/interop/java/mqinterop): one Maven project builds the client programs and pins the
broker, so they have one home, and this module only drives them.
- Broker: one master, ASYNC_FLUSH, ASYNC_MASTER without a slave, 1 GiB CommitLog files
  (RocketMQ's defaults; the interop tests' 64 MiB files suit their small stores), in the JVM
  the harness starts (-Xms256m -Xmx512m, Java 17), in a session of its own as this broker's
  nodes and the other peers are (peers.py says why). This broker's peer cluster gets the
  same: one group, one name server, no slave, async flush, its 1 GiB default files.
- Producer: the official DefaultMQProducer in one JVM, `Producer --mode sync --threads N`
  (N threads sharing one producer, as an application does) or `--mode batch --batch 64`;
  `--warmup` sends before the clock, then `--seconds` of sends, each waiting for its
  acknowledgement. The JVM's start is not timed.
- Consumer: DefaultMQPushConsumer with the client's defaults (pulls of 32 messages, one
  message per listener call), from the first offset, until it has every message.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import peers

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.interop import rocketmq as apache  # noqa: E402 - after the path is set

BROKER = {"mappedFileSizeCommitLog": str(1 << 30)}  # the rest: the harness's defaults
CLUSTER = "interop"  # the harness's brokerClusterName
FOREVER = str(2**31 - 1)  # --count: the clock ends a run


def available() -> str | None:
    """Why Apache RocketMQ cannot run here, or None when it can."""
    missing = [tool for tool in ("java", "mvn") if shutil.which(tool) is None]
    return f"{' and '.join(missing)} not installed" if missing else None


@contextlib.contextmanager
def real_cluster(work: Path) -> Iterator[tuple[str, int]]:
    """Apache RocketMQ's name server and broker on loopback: the name server's address and
    the broker's pid."""
    apache.classpath()  # builds the Java programs first, when they are newer than the build
    with (
        apache.real_namesrv(work / "namesrv") as ns,
        apache.real_broker(work / "broker", ns.addr, **BROKER) as broker,
    ):
        peers.log(f"Apache RocketMQ: name server {ns.addr} (pid {ns.pid}), "
                  f"broker {broker.addr} (pid {broker.pid})")  # fmt: skip
        yield ns.addr, broker.pid


def queue_offsets(ns: str, topic: str) -> list[tuple[int, int]]:
    """(min, max) offset of each queue of `topic`, as the official `mqadmin topicStatus`
    prints them (no rows while the topic has no route)."""
    out = apache.mqadmin(ns, "topicStatus", "-t", topic)
    rows = [line.split() for line in out.splitlines() if line and not line.startswith("#")]
    return [(int(r[2]), int(r[3])) for r in rows if len(r) >= 4 and r[1].isdigit()]


def create_topic(ns: str, topic: str, queues: int = 4) -> None:
    """`topic` on the real broker (the official `mqadmin updateTopic`), once its route has
    every queue."""
    n = str(queues)
    apache.mqadmin(ns, "updateTopic", "-c", CLUSTER, "-t", topic, "-r", n, "-w", n)
    deadline = time.monotonic() + 60
    while len(queue_offsets(ns, topic)) < queues:
        if time.monotonic() > deadline:
            raise RuntimeError(f"topic {topic} has no route at {ns} after 60 s")
        time.sleep(0.2)


def stored_count(ns: str, topic: str) -> int:
    return sum(high - low for low, high in queue_offsets(ns, topic))


def java_producer(ns: str, topic: str, producers: int, batch: int, size: int,
                  seconds: float) -> peers.Run:  # fmt: skip
    """One run of the official producer: `producers` threads of sync sends, or (batch > 1)
    one thread sending batches."""
    mode = ["--mode", "sync", "--threads", str(producers)]
    if batch > 1:
        mode = ["--mode", "batch", "--batch", str(batch)]
    rows = apache.java(
        "Producer", "--namesrv", ns, "--topic", topic, "--count", FOREVER, "--size", str(size),
        "--quiet", "true", "--warmup", str(peers.WARM_UP), "--seconds", str(seconds), *mode,
        timeout=seconds + 300,
    )  # fmt: skip
    errors = [r["error"] for r in rows if "error" in r]
    if errors:
        peers.log(f"official producer: {len(errors)} failed send(s), the first: {errors[0]}")
    done = rows[-1]
    if not done.get("sent"):
        raise RuntimeError(f"the official producer sent nothing to {ns}: {errors[:1]}")
    start = done["start_ms"] / 1000
    return peers.Run(done["sent"], start, start + done["timed_s"], done["p50_ms"], done["p99_ms"])


def java_consume(ns: str, count: int, group: str, topic: str) -> peers.Run:
    """The official push consumer getting `count` messages of `topic`: from its start to
    the last delivery."""
    rows = apache.java(
        "PushConsumer", "--namesrv", ns, "--group", group, "--topic", topic,
        "--expect", str(count), "--quiet", "true", "--idle-ms", "30000",
        timeout=600 + count / 1000,
    )  # fmt: skip
    done = rows[-1]
    if done["succeeded"] < count:
        raise RuntimeError(f"the official consumer got {done['succeeded']} of {count} messages")
    start = done["start_ms"] / 1000
    return peers.Run(count, start, start + done["seconds"])
