"""A HotSpot archive of the JVM classes a pipeline run loads (pipeline.jvm maps it).

A new Spark session spends most of its start, and much of its first queries, loading and
verifying the classes of Spark, Delta Lake and their libraries, the same ones every time,
and then compiling the same hot methods. Set-up (`make`, after the Delta jars) runs one
small `pipeline run` (a generated store of a few messages: ingest, gates, audit, reports)
in a local session with the recording on, so the archive holds what the pipeline uses. On
JDK 25 and later (the JDK local sessions run on where there is one, pipeline.jvm) it is an
ahead-of-time cache (`-XX:AOTCacheOutput`: the classes loaded and linked, and the methods'
profiles); on older JDKs a dynamic class-data-sharing archive (`-XX:ArchiveClassesAtExit`,
JDK 13+: the classes loaded). Later JVMs map the file instead.

The JVM checks an archive itself: made by another JDK build, or on a class path whose jars
changed since, it is not used (HotSpot warns and loads the classes as usual). The class
path also starts with SPARK_CONF_DIR and the other directories Spark's launcher puts first,
and the driver's extra class path (pipeline.local_fs's jar), so a session uses the archive
only when those and its JDK are what they were at recording (pipeline.jvm's `launch_env`;
it adds the options to a session);
otherwise it starts as it would without one. MQAUDIT_CLASS_ARCHIVE=off turns it off.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pyspark import SparkContext

from broker_runtime.common.config import StoreConfig
from broker_runtime.common.message import KEYS, TAGS, UNIQ_KEY, Message
from broker_runtime.ledger.producer import Confirmation, ProducerLedger, StubRecord
from broker_runtime.store.message_store import MessageStore
from pipeline.jvm import (
    CLASS_ARCHIVE_RECORD_ENV,
    class_archive_env_file,
    class_archive_path,
    launch_env,
    local_java_home,
)
from pipeline.local_fs import CLASS_PATH_KEY
from pipeline.run import run_pipeline
from pipeline.spark_session import build_spark
from pipeline.steps import RunInputs

RECORD_MESSAGES = 40
CLASS_PATH_FILE = "class-path"  # the recording session's driver class path, in its work dir


def write_small_store(data: Path) -> None:
    """A data dir of RECORD_MESSAGES messages (two topics, keys and tags) on one broker
    (DATA/brokers/broker-a/master) and their stubs, confirmed, in the producer ledger."""
    born = int(time.time() * 1000)
    messages = [
        Message(
            f"SetupTopic{i % 2}",
            b"x" * 64,
            {UNIQ_KEY: f"{i:032X}", TAGS: f"Tag{i % 2}", KEYS: f"k{i}"},
            i % 4,
            0,
            0,
            born,
        )
        for i in range(RECORD_MESSAGES)
    ]
    ledger = ProducerLedger.open(data)
    try:
        ledger.record_before_send([StubRecord.of(m) for m in messages])
        store = MessageStore(StoreConfig(store_dir=data / "brokers" / "broker-a" / "master"))
        stored = store.put_messages(messages)
        store.wait_dispatched(None)
        store.shutdown()
        ledger.confirm(
            [
                Confirmation(m.uniq_key or "", "broker-a", r.queue_id, r.queue_offset)
                for m, r in zip(messages, stored, strict=True)
            ]
        )
    finally:
        ledger.close()


def _record_run(work: Path) -> None:
    """The recording session's workload: a small store through `pipeline run`, then the JVM
    stopped and waited for (it writes the archive as it exits)."""
    data = work / "data"
    write_small_store(data)
    spark = build_spark("mqaudit-class-archive")
    # The driver's class path before Spark's jars, which a session must share to map it.
    (work / CLASS_PATH_FILE).write_text(spark.sparkContext.getConf().get(CLASS_PATH_KEY, ""))
    inputs = RunInputs(
        lake=work / "lake", data_dirs=(data,), out=work / "out", cluster="setup", progress=False
    )
    run_pipeline(inputs, spark)
    spark.stop()
    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    if gateway is None or proc is None:
        raise RuntimeError("the Spark JVM was not started by this process")
    gateway.shutdown()
    proc.stdin.close()  # the gateway server exits when its stdin closes
    proc.wait(timeout=600)


def build(archive: Path | None = None) -> int:
    """Set-up: record the archive (in a child process, so that its JVM is the first and
    only one); 0 when it was written."""
    archive = archive or class_archive_path()
    archive.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mqaudit-cds-") as tmp:
        recording = Path(tmp) / "classes.jsa"
        env = {**os.environ, CLASS_ARCHIVE_RECORD_ENV: str(recording)}
        child = [sys.executable, "-m", "pipeline.class_archive", "record", tmp]
        done = subprocess.run(child, env=env, stdout=subprocess.DEVNULL, check=False)
        if done.returncode != 0 or not recording.is_file():
            print(f"class-archive: recording failed (exit {done.returncode})", file=sys.stderr)
            return 1
        class_path = (Path(tmp) / CLASS_PATH_FILE).read_text()
        partial = archive.with_name(f"{archive.name}.{os.getpid()}.tmp")
        shutil.move(recording, partial)
        partial.replace(archive)  # a session starting now maps the old file or this one
    env = launch_env(local_java_home(), class_path)  # the recording session's: a local one
    class_archive_env_file(archive).write_text(json.dumps(env, indent=1) + "\n")
    size = archive.stat().st_size / 2**20
    print(f"class-archive: {archive} ({size:.0f} MiB, {time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    if (
        sys.argv[1:2] == ["record"]
        and len(sys.argv) == 3
        and os.environ.get(CLASS_ARCHIVE_RECORD_ENV)
    ):
        _record_run(Path(sys.argv[2]))
    elif sys.argv[1:] == ["build"]:
        sys.exit(build())
    else:
        sys.exit("usage: python -m pipeline.class_archive build")
