"""Crash tests of the store: a real writer process is SIGKILLed in the middle of puts.

`crash_writer.py` puts messages from several threads and durably logs every acknowledged one
(key, topic, queue, log offset, size). After the kill the store is reopened here, which runs
recovery, and every acknowledged message must be readable exactly once with its body intact.

A SIGKILL loses nothing the process handed to the kernel, so a second test models a power
loss instead: everything the checkpoint does not claim as flushed is cut from the log (later
segments deleted, the rest zeroed) and the ConsumeQueues lose or keep their tails.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from broker_runtime.common.config import FlushMode, StoreConfig
from broker_runtime.common.message import UNIQ_KEY, Message, StoredMessage
from broker_runtime.store import inspection
from broker_runtime.store import record_codec as codec
from broker_runtime.store.checkpoint import Checkpoint
from broker_runtime.store.consume_queue import ENTRY, ENTRY_SIZE
from broker_runtime.store.message_store import MessageStore
from tests.conftest import PYTHON
from tests.integration.crash_writer import TOPICS, body_for, store_config

pytestmark = pytest.mark.integration

WRITER = Path(__file__).with_name("crash_writer.py")
SEGMENT = 256 * 1024


@dataclass(frozen=True)
class Ack:
    key: str
    topic: str
    queue_id: int
    phys: int
    size: int

    @property
    def end(self) -> int:
        return self.phys + self.size


def read_acks(path: Path) -> dict[str, Ack]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}
    acks: dict[str, Ack] = {}
    for line in data.split(b"\n")[:-1]:  # a line the kill cut short has no newline: skipped
        key, topic, queue_id, phys, size = line.decode().split()
        assert key not in acks, f"the writer acknowledged {key} twice"
        acks[key] = Ack(key, topic, int(queue_id), int(phys), int(size))
    return acks


def kill_writer_when(
    tmp_path: Path,
    env: dict[str, str],
    flush: FlushMode,
    ready: Callable[[dict[str, Ack]], bool],
    timeout_s: float = 20.0,
) -> dict[str, Ack]:
    """Run the writer until `ready(acks)`, SIGKILL it mid-put; returns the final acks."""
    argv = [
        PYTHON,
        str(WRITER),
        "--store",
        str(tmp_path / "store"),
        "--acks",
        str(tmp_path / "acks"),
        "--flush",
        flush.value,
        "--segment-size",
        str(SEGMENT),
        "--max-seconds",
        str(timeout_s + 10),
    ]
    with subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as proc:
        try:
            deadline = time.monotonic() + timeout_s
            while not ready(read_acks(tmp_path / "acks")):
                if proc.poll() is not None:
                    err = proc.stderr.read().decode() if proc.stderr else ""
                    pytest.fail(f"writer exited early ({proc.returncode}): {err}")
                if time.monotonic() > deadline:
                    pytest.fail(f"writer not ready after {timeout_s} s")
                time.sleep(0.005)
            assert proc.poll() is None, "the writer must still be putting when it is killed"
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == -signal.SIGKILL
    return read_acks(tmp_path / "acks")


def open_store(config: StoreConfig) -> MessageStore:
    return MessageStore(config, disk_ratio=lambda _path: 0.0)


def read_all(store: MessageStore) -> list[StoredMessage]:
    """Every message of every queue through get_messages; queue offsets must have no gaps."""
    out: list[StoredMessage] = []
    for topic, queue_id in sorted(store.queues()):
        offset = store.min_offset(topic, queue_id)
        end = store.max_offset(topic, queue_id)
        got: list[StoredMessage] = []
        while offset < end:
            r = store.get_messages(topic, queue_id, offset, 500)
            assert r.next_offset > offset
            got += r.messages
            offset = r.next_offset
        qos = [m.queue_offset for m in got]
        assert qos == list(range(store.min_offset(topic, queue_id), end)), (topic, queue_id)
        assert all((m.topic, m.queue_id) == (topic, queue_id) for m in got)
        out += got
    return out


def check_messages_intact(msgs: list[StoredMessage]) -> dict[str, StoredMessage]:
    """Each message once, CRC right, body the one the writer derived from its key."""
    counts = Counter(m.uniq_key for m in msgs)
    twice = [k for k, n in counts.items() if n > 1]
    assert not twice, f"{len(twice)} keys read more than once, e.g. {twice[:5]}"
    for m in msgs:
        assert m.topic in TOPICS
        assert m.uniq_key is not None
        assert codec.body_crc(m.body) == m.body_crc, m.uniq_key
        assert m.body == body_for(m.uniq_key), m.uniq_key
    return {m.uniq_key: m for m in msgs if m.uniq_key is not None}


def check_acked_readable(store: MessageStore, acks: dict[str, Ack]) -> None:
    """Every ack readable once via get_messages (`read_all`) and via the key index."""
    by_key = check_messages_intact(read_all(store))
    missing = sorted(set(acks) - set(by_key))
    assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {missing[:5]}"
    for key, ack in acks.items():
        m = by_key[key]
        assert (m.topic, m.queue_id, m.phys_offset, m.total_size) == (
            ack.topic,
            ack.queue_id,
            ack.phys,
            ack.size,
        )
        found = store.query_by_key(ack.topic, key)
        assert [f.phys_offset for f in found] == [ack.phys], key
        assert found[0].body == body_for(key)


def put_one_more(store: MessageStore) -> None:
    """A put after recovery lands past the recovered end and is readable."""
    end = store.commit_log.max_offset
    key = "AFTER-CRASH000"
    msg = Message(topic=TOPICS[0], body=body_for(key), properties={UNIQ_KEY: key}, queue_id=0)
    qo = store.max_offset(TOPICS[0], 0)
    r = store.put_message(msg)
    assert r.phys_offset in (end, end - end % SEGMENT + SEGMENT)  # there, or a roll
    assert r.queue_offset == qo
    assert store.wait_dispatched(10)
    assert [m.phys_offset for m in store.query_by_key(TOPICS[0], key)] == [r.phys_offset]
    got = store.get_messages(TOPICS[0], 0, qo, 10).messages
    assert [m.uniq_key for m in got] == [key]


@pytest.mark.parametrize("kill_after", [600, 2000, 4500])
def test_sigkill_mid_put_loses_no_acknowledged_message(
    tmp_path: Path, cli_env: dict[str, str], kill_after: int
) -> None:
    acks = kill_writer_when(tmp_path, cli_env, FlushMode.SYNC, lambda a: len(a) >= kill_after)
    assert len(acks) >= kill_after
    config = store_config(tmp_path / "store", FlushMode.SYNC, SEGMENT)

    store = open_store(config)
    try:
        assert store.recovery.unclean_shutdown is True
        assert store.wait_dispatched(10)
        assert store.dispatcher.error is None
        assert store.recovery.log_end == store.commit_log.max_offset
        assert store.commit_log.max_offset >= max(a.end for a in acks.values())
        check_acked_readable(store, acks)
        put_one_more(store)
    finally:
        store.shutdown()
    report = inspection.verify(config.store_dir)
    assert report.consistent, report.as_dict()
    assert report.messages >= len(acks) + 1

    store = open_store(config)  # a second start after the clean stop has nothing to repair
    try:
        r = store.recovery
        assert (r.unclean_shutdown, r.truncated_bytes, r.saved) == (False, 0, [])
        assert r.consume_queue_entries_dropped == 0
        assert store.wait_dispatched(10)
        assert len(read_all(store)) == report.messages
    finally:
        store.shutdown()


def _simulate_power_loss(store_dir: Path, flushed: int) -> int:
    """Cut the log back to `flushed`; return how many ConsumeQueue entries were kept past it.

    Log segments starting after `flushed` vanish, the rest of the log after it reads as zeros.
    Queues with an even id lose their ConsumeQueue entries past `flushed` (zeroed), queues with
    an odd id keep them: they then point past the end of the log.
    """
    for path in sorted((store_dir / "commitlog").iterdir()):
        start = int(path.name)
        if start > flushed:
            path.unlink()
        elif flushed < start + SEGMENT:
            with path.open("r+b") as f:
                f.seek(flushed - start)
                f.write(bytes(start + SEGMENT - flushed))
    kept_past = 0
    for path in sorted((store_dir / "consumequeue").glob("*/*/" + "[0-9]" * 20)):
        data = bytearray(path.read_bytes())
        lose = int(path.parent.name) % 2 == 0
        for i, (phys, size, _tags) in enumerate(ENTRY.iter_unpack(bytes(data))):
            if size == 0 or phys + size <= flushed:
                continue
            if lose:
                data[i * ENTRY_SIZE : (i + 1) * ENTRY_SIZE] = bytes(ENTRY_SIZE)
            else:
                kept_past += 1
        path.write_bytes(bytes(data))
    return kept_past


def test_power_loss_cuts_back_to_the_checkpoint(tmp_path: Path, cli_env: dict[str, str]) -> None:
    store_dir = tmp_path / "store"

    def ready(acks: dict[str, Ack]) -> bool:
        cp = Checkpoint.load(store_dir / "checkpoint")
        if len(acks) < 3000 or cp is None or cp.phys_flushed_offset <= SEGMENT:
            return False
        return any(a.end > cp.phys_flushed_offset for a in acks.values())

    acks = kill_writer_when(tmp_path, cli_env, FlushMode.ASYNC, ready)
    cp = Checkpoint.load(store_dir / "checkpoint")
    assert cp is not None
    flushed = cp.phys_flushed_offset
    assert any(a.end > flushed for a in acks.values()), "nothing to lose: kill came too late"
    kept_past = _simulate_power_loss(store_dir, flushed)

    config = store_config(store_dir, FlushMode.ASYNC, SEGMENT)
    store = open_store(config)
    try:
        r = store.recovery
        assert r.unclean_shutdown is True
        assert r.log_end == store.commit_log.max_offset == flushed
        assert r.consume_queue_entries_dropped == kept_past
        assert store.wait_dispatched(10)
        msgs = read_all(store)
        by_key = check_messages_intact(msgs)
        assert all(m.phys_offset + m.total_size <= flushed for m in msgs)
        durable = {k: a for k, a in acks.items() if a.end <= flushed}
        lost = {k: a for k, a in acks.items() if a.end > flushed}
        assert lost and durable
        check_acked_readable(store, durable)
        assert not set(lost) & set(by_key)
        for key, ack in list(lost.items())[:200]:
            assert store.query_by_key(ack.topic, key) == []
            assert store.message_at(ack.phys) is None
        assert store.message_at(flushed) is None
        put_one_more(store)
    finally:
        store.shutdown()
    report = inspection.verify(store_dir)
    assert report.consistent, report.as_dict()
    assert report.messages == len(msgs) + 1
