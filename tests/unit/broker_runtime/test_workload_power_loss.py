"""The simulated power cut on real store files: the log cut back to the last recorded fsync,
then the store's own recovery brings its queues in line (what the master-crash scenarios do
to a killed master)."""

from __future__ import annotations

import dataclasses

import pytest

from broker_runtime.common.config import StoreConfig
from broker_runtime.common.message import UNIQ_KEY, Message
from broker_runtime.store.checkpoint import Checkpoint
from broker_runtime.workload.power_loss import (
    checkpoint_flushed,
    cut_commitlog,
    last_fsync,
    unit_end,
)
from broker_runtime.workload.scenarios.master_crash import stored_keys
from tests.unit.broker_runtime.store_helpers import all_messages, assert_consistent, opened

TOPIC = "PowerTopic"


def put(cfg: StoreConfig, first: int, n: int) -> list[tuple[int, int]]:
    """Messages first..first+n-1 on queue 0; their (log offset, size)."""
    with opened(cfg) as store:
        results = store.put_messages(
            [
                Message(TOPIC, f"m{i:04d}".encode() * 250, {UNIQ_KEY: f"K{i:04d}"})
                for i in range(first, first + n)
            ]
        )
        return [(r.phys_offset, r.size) for r in results]


def test_a_cut_at_the_last_recorded_fsync_loses_exactly_what_came_after(
    small_config: StoreConfig,
) -> None:
    early = put(small_config, 0, 80)  # spans more than one 64 KiB segment
    flushed_at = checkpoint_flushed(small_config.store_dir)
    assert flushed_at == early[-1][0] + early[-1][1]  # a clean stop flushed everything
    late = put(small_config, 80, 40)
    assert unit_end(small_config.store_dir, late[3][0]) == late[3][0] + late[3][1]

    # As if the power went after the late puts reached only the page cache: the checkpoint
    # still names the earlier flush and the store was not shut down.
    store_dir = small_config.store_dir
    cp = Checkpoint.load(store_dir / "checkpoint")
    assert cp is not None
    Checkpoint(*dataclasses.astuple(cp)[:3], flushed_at, flushed_at).save(store_dir / "checkpoint")
    (store_dir / "abort").touch()
    cut = last_fsync(store_dir)
    assert cut == flushed_at
    cut_commitlog(store_dir, cut)

    with opened(small_config) as store:
        assert store.recovery.unclean_shutdown
        keys = [m.properties[UNIQ_KEY] for m in all_messages(store, TOPIC, 0)]
        assert keys == [f"K{i:04d}" for i in range(80)]
        assert store.commit_log.max_offset == flushed_at
    assert_consistent(small_config)
    assert stored_keys(store_dir, TOPIC) == {f"K{i:04d}" for i in range(80)}


def test_answered_sync_flush_puts_move_the_cut_past_them(small_config: StoreConfig) -> None:
    sync = small_config
    placed = put(sync, 0, 10)
    before = checkpoint_flushed(sync.store_dir)
    # Under SYNC_FLUSH an answered put was fsynced: the cut never goes below its end.
    assert last_fsync(sync.store_dir, [placed[4][0]]) == max(before, placed[4][0] + placed[4][1])
    Checkpoint().save(sync.store_dir / "checkpoint")
    assert last_fsync(sync.store_dir, [placed[4][0]]) == placed[4][0] + placed[4][1]
    assert last_fsync(sync.store_dir) == 0


def test_unit_end_refuses_an_offset_with_no_message(small_config: StoreConfig) -> None:
    placed = put(small_config, 0, 3)
    end = placed[-1][0] + placed[-1][1]
    with pytest.raises(ValueError, match="no message"):
        unit_end(small_config.store_dir, end)
    with pytest.raises(ValueError, match="in no segment"):
        unit_end(small_config.store_dir, 10 << 30)


def test_cutting_in_a_later_segment_keeps_file_sizes(small_config: StoreConfig) -> None:
    put(small_config, 0, 80)
    files = sorted((small_config.store_dir / "commitlog").iterdir())
    assert len(files) >= 2
    sizes = [f.stat().st_size for f in files]
    cut_commitlog(small_config.store_dir, int(files[1].name) + 100)
    assert [f.stat().st_size for f in files] == sizes
    assert files[1].read_bytes()[100:] == bytes(sizes[1] - 100)
    assert files[0].read_bytes().rstrip(b"\0")  # the first segment is untouched
