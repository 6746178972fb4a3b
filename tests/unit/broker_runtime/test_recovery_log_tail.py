"""Store recovery on real files, the end of the log: torn tails, bad CRCs, garbage, stray segments.

Each test writes a store, stops it, damages the files the way a crash or a bad disk would,
then opens the store again (MessageStore runs recovery) and checks the report and the data.
"""

from __future__ import annotations

import random
import struct
from pathlib import Path

import pytest

from broker_runtime.common.config import StoreConfig
from broker_runtime.store import inspection
from broker_runtime.store import record_codec as codec
from broker_runtime.store.mapped_file import segment_name
from tests.unit.broker_runtime.recovery_helpers import (
    QUEUES,
    TOPIC,
    assert_intact,
    assert_new_put_lands_at,
    end_of,
    flip_bits,
    key_of,
    log_file,
    mark_unclean,
    read_log,
    saved_as,
    write_log,
    write_store,
)
from tests.unit.broker_runtime.store_helpers import SEG, assert_consistent, opened, recovered

# -- torn tails --------------------------------------------------------------------------------


def test_last_message_cut_in_half_is_truncated(small_config: StoreConfig) -> None:
    n = 30
    results = write_store(small_config, n)
    last = results[-1]
    unit = read_log(small_config, last.phys_offset, last.size)
    half = last.size // 2
    write_log(small_config, last.phys_offset + half, bytes(last.size - half))  # lost 2nd half
    mark_unclean(small_config)

    with recovered(small_config) as store:
        r = store.recovery
        kept = unit[:half].rstrip(b"\0")
        assert r.unclean_shutdown is True
        assert r.stop_reason in ("bad_lengths", "bad_crc")
        assert r.log_end == last.phys_offset == store.commit_log.max_offset
        assert r.truncated_bytes == len(kept) > 0
        torn = saved_as(small_config, last.phys_offset, "torn")
        assert r.saved == [str(torn)]
        assert torn.read_bytes() == kept
        path, pos = log_file(small_config, last.phys_offset)
        assert path.read_bytes()[pos:] == bytes(SEG - pos)  # zeroed on disk
        assert r.consume_queue_entries_dropped == 1
        assert r.index_truncated is True

        assert store.message_at(last.phys_offset) is None
        assert store.query_by_key(TOPIC, key_of(n - 1)) == []
        assert store.max_offset(TOPIC, (n - 1) % QUEUES) == last.queue_offset
        assert_intact(store, results, n - 1)
        assert_new_put_lands_at(store, n + 1, last.phys_offset, last.queue_offset)  # same queue


def test_half_a_unit_after_the_last_message_is_truncated(small_config: StoreConfig) -> None:
    n = 30
    results = write_store(small_config, n)
    end = end_of(results)
    unit = read_log(small_config, results[-1].phys_offset, results[-1].size)  # a valid unit
    half = unit[: len(unit) // 2]
    write_log(small_config, end, half)
    mark_unclean(small_config)

    with recovered(small_config) as store:
        r = store.recovery
        assert r.stop_reason in ("bad_lengths", "bad_crc")
        assert r.log_end == end
        assert r.truncated_bytes == len(half.rstrip(b"\0")) > 0
        torn = saved_as(small_config, end, "torn")
        assert r.saved == [str(torn)]
        assert torn.read_bytes() == half.rstrip(b"\0")
        assert r.consume_queue_entries_dropped == 0  # it was never dispatched
        assert store.message_at(end) is None
        assert_intact(store, results, n)
        assert_new_put_lands_at(store, n, end, results[-2].queue_offset + 1)


# -- bad CRCs ----------------------------------------------------------------------------------


@pytest.mark.parametrize("unclean", [True, False], ids=["abort-file", "clean-stop"])
def test_bad_crc_in_the_last_message_truncates_from_it(
    small_config: StoreConfig, unclean: bool
) -> None:
    n = 30
    results = write_store(small_config, n)
    last = results[-1]
    flip_bits(small_config, last.phys_offset + codec.HEADER_SIZE + 7, 0x20)  # a body byte
    damaged = read_log(small_config, last.phys_offset, last.size)
    if unclean:
        mark_unclean(small_config)

    with recovered(small_config) as store:
        r = store.recovery
        assert r.unclean_shutdown is unclean
        assert r.stop_reason == "bad_crc"
        assert r.log_end == last.phys_offset
        assert r.truncated_bytes == last.size
        torn = saved_as(small_config, last.phys_offset, "torn")
        assert torn.read_bytes() == damaged
        assert r.consume_queue_entries_dropped == 1
        assert store.message_at(last.phys_offset) is None
        assert store.query_by_key(TOPIC, key_of(n - 1)) == []
        assert_intact(store, results, n - 1)
        assert_new_put_lands_at(store, n + 1, last.phys_offset, last.queue_offset)  # same queue


def test_bad_crc_before_the_checkpoint_is_never_read_as_valid(small_config: StoreConfig) -> None:
    n = 500  # ~2.5 segments: the checkpoint is in the third, the damage in the first
    results = write_store(small_config, n)
    victim = 17
    bad = results[victim]
    assert bad.phys_offset < SEG <= results[-1].phys_offset - SEG
    flip_bits(small_config, bad.phys_offset + codec.HEADER_SIZE + 3, 0x01)

    report = inspection.verify(Path(small_config.store_dir))
    assert report.bad_crcs == 1
    assert report.consistent is False
    assert report.messages == n  # the scan of `verify` goes on past a bad CRC
    assert [p.kind for p in report.problems] == ["bad_crc"]
    assert report.problems[0].where == f"{segment_name(0)}+{bad.phys_offset}"

    mark_unclean(small_config)
    with opened(small_config) as store:
        r = store.recovery
        assert r.scanned_from >= SEG  # the damage lies before what recovery checks
        assert (r.truncated_bytes, r.saved, r.consume_queue_entries_dropped) == (0, [], 0)
        assert r.log_end == results[-1].phys_offset + results[-1].size
        assert store.message_at(bad.phys_offset) is None
        assert store.query_by_key(TOPIC, key_of(victim)) == []
        assert store.message_at(results[victim + 1].phys_offset) is not None
        # get_messages does not check CRCs (neither does RocketMQ's getMessage), but what it
        # returns carries the stored BODYCRC, so a reader can see the body does not match.
        got = store.get_messages(TOPIC, victim % QUEUES, bad.queue_offset, 1).messages
        assert [m.phys_offset for m in got] == [bad.phys_offset]
        assert codec.body_crc(got[0].body) != got[0].body_crc


# -- what follows the last message ----------------------------------------------------------------


@pytest.mark.parametrize("gap", [0, 40], ids=["right-after", "after-zeros"])
def test_garbage_after_the_last_message_never_yields_a_message(
    small_config: StoreConfig, gap: int
) -> None:
    n = 30
    results = write_store(small_config, n)
    end = end_of(results)
    rng = random.Random(20240611)
    garbage = bytes(rng.randrange(1, 256) for _ in range(1000))
    write_log(small_config, end + gap, garbage)
    mark_unclean(small_config)

    with opened(small_config) as store:
        r = store.recovery
        assert r.stop_reason == ("bad_magic" if gap == 0 else "eof")
        assert r.log_end == end
        assert r.truncated_bytes == gap + len(garbage)
        torn = saved_as(small_config, end, "torn")
        assert r.saved == [str(torn)]
        assert torn.read_bytes() == bytes(gap) + garbage
        assert read_log(small_config, end, gap + len(garbage)) == bytes(gap + len(garbage))
        assert sum(1 for _ in store.commit_log.scan(0)) == n
        assert store.message_at(end) is None
        assert store.message_at(end + gap) is None
        assert_intact(store, results, n)
        assert_new_put_lands_at(store, n, end, results[-2].queue_offset + 1)
    assert sum(1 for _ in inspection.dump(Path(small_config.store_dir))) == n + 1
    assert_consistent(small_config)


@pytest.mark.parametrize("torn", [False, True], ids=["clean-end", "torn-end"])
def test_segment_after_the_end_of_the_log_is_moved_aside(
    small_config: StoreConfig, torn: bool
) -> None:
    n = 30
    results = write_store(small_config, n)
    end = end_of(results)
    assert end < SEG
    unit = bytearray(read_log(small_config, results[0].phys_offset, results[0].size))
    tail = b""
    if torn:  # the log ends in half a unit, which is cut together with what follows
        tail = bytes(unit[: len(unit) // 2])
        write_log(small_config, end, tail)
    # A following segment holding a valid-looking message (its PHYSICALOFFSET says SEG).
    struct.pack_into(">q", unit, 28, SEG)
    stray = Path(small_config.store_dir) / "commitlog" / segment_name(SEG)
    stray.write_bytes(bytes(unit) + bytes(SEG - len(unit)))
    mark_unclean(small_config)

    with recovered(small_config) as store:
        r = store.recovery
        moved = saved_as(small_config, SEG, "segment")
        torn_file = saved_as(small_config, end, "torn")
        assert r.saved == [str(moved)] + ([str(torn_file)] if torn else [])
        assert not stray.exists()
        assert moved.read_bytes()[: len(unit)] == unit
        assert r.truncated_bytes == len(unit) + len(tail)
        if torn:
            assert torn_file.read_bytes() == tail
        assert r.log_end == end == store.commit_log.max_offset
        assert [f.file_from_offset for f in store.commit_log.segments.files] == [0]
        assert store.message_at(SEG) is None
        assert_intact(store, results, n)
        assert_new_put_lands_at(store, n, end, results[-2].queue_offset + 1)
