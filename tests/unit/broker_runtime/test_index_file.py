"""IndexFile / IndexService: RocketMQ's on-disk layout, queries, rolling, recovery."""

from __future__ import annotations

import itertools
import os
import struct
from pathlib import Path

import pytest

from broker_runtime.common.java_hash import java_string_hash
from broker_runtime.store.index_file import (
    HEADER_SIZE,
    IndexFile,
    file_name_for,
    file_size,
    index_key_hash,
)
from broker_runtime.store.index_service import IndexService

T0 = 1_700_000_000_000
Entry = tuple[str, int, int, str | None, str | None]


def header(path: Path) -> tuple[int, ...]:
    return struct.unpack(">qqqqii", path.read_bytes()[:HEADER_SIZE])


def raw_entry(path: Path, slots: int, index: int) -> tuple[int, ...]:
    at = HEADER_SIZE + slots * 4 + index * 20
    return struct.unpack(">iqii", path.read_bytes()[at : at + 20])


def raw_slot(path: Path, slot: int) -> int:
    at = HEADER_SIZE + slot * 4
    return int(struct.unpack(">i", path.read_bytes()[at : at + 4])[0])


def messages(n: int, *, start: int = 0, size: int = 100, step_ms: int = 1000) -> list[Entry]:
    """Message i: phys i*size, stored T0 + i*step_ms, UNIQ_KEY U{i}, KEYS "K{i} G{i % 3}"."""
    return [("T", i * size, T0 + i * step_ms, f"U{i}", f"K{i} G{i % 3}") for i in range(start, n)]


def svc(tmp_path: Path, slots: int = 64, num: int = 256) -> IndexService:
    return IndexService(tmp_path, hash_slot_num=slots, index_num=num)


def everything(s: IndexService, key: str) -> list[int]:
    return s.query("T", key, 10_000, 0, 2**62)


def test_key_hash_is_rocketmq_index_key_hash() -> None:
    assert index_key_hash("TopicTest#key") == 85128477
    assert index_key_hash("TopicTest#ORDER_1") == 1111208162  # |negative|
    assert java_string_hash("polygenelubricants") == -(2**31)
    assert index_key_hash("polygenelubricants") == 0  # Math.abs overflow, mapped to 0


def test_file_name_is_local_time_millis() -> None:
    assert len(file_name_for(T0 + 123)) == 17
    assert file_name_for(T0 + 123).endswith("123")
    assert file_name_for(T0 + 7) < file_name_for(T0 + 8) < file_name_for(T0 + 1000)


def test_exact_bytes(tmp_path: Path) -> None:
    f = IndexFile.create(tmp_path / "f", 64, 256)
    assert os.path.getsize(tmp_path / "f") == 40 + 64 * 4 + 256 * 20
    assert f.put_key("TopicTest#key", 4096, T0)
    assert f.put_key("TopicTest#key", 8192, T0 + 2500)
    f.flush()
    path = tmp_path / "f"
    # beginTimestamp, endTimestamp, beginPhyOffset, endPhyOffset, hashSlotCount, indexCount
    assert header(path) == (T0, T0 + 2500, 4096, 8192, 2, 3)
    slot = 85128477 % 64
    assert raw_slot(path, slot) == 2
    assert raw_entry(path, 64, 1) == (85128477, 4096, 0, 0)
    assert raw_entry(path, 64, 2) == (85128477, 8192, 2, 1)  # timeDiff in whole seconds
    assert path.read_bytes()[40 + slot * 4 : 44 + slot * 4] == b"\x00\x00\x00\x02"
    assert path.read_bytes()[36:40] == b"\x00\x00\x00\x03"
    f.close()


def test_default_dimensions_make_a_sparse_file(tmp_path: Path) -> None:
    s = IndexService(tmp_path)
    s.build([("T", 0, T0, "u", None)])
    (path,) = (tmp_path / "index").iterdir()
    assert path.stat().st_size == file_size(5_000_000, 20_000_000) == 420_000_040
    assert path.stat().st_blocks * 512 < 10_000_000
    assert s.query("T", "u", 10, 0, 2**62) == [0]
    s.close()


def test_put_query_round_trip(tmp_path: Path) -> None:
    s = svc(tmp_path)
    s.build(messages(50))
    assert everything(s, "U7") == [700]
    assert everything(s, "K49") == [4900]
    assert everything(s, "G1") == [i * 100 for i in range(49, 0, -1) if i % 3 == 1]
    assert s.query("T", "G1", 3, 0, 2**62) == [4900, 4600, 4300]
    assert everything(s, "missing") == []
    assert s.query("Other", "K7", 10, 0, 2**62) == []
    assert s.query("T", "K7", 0, 0, 2**62) == []
    assert s.max_indexed_phys_offset() == 4900
    s.close()


def test_keys_split_on_spaces_and_empty_keys_skipped(tmp_path: Path) -> None:
    s = svc(tmp_path)
    s.build([("T", 0, T0, None, "  a  b "), ("T", 10, T0, None, ""), ("T", 20, T0, None, None)])
    assert (everything(s, "a"), everything(s, "b")) == ([0], [0])
    assert s.files[0].index_count == 3
    s.close()


def test_collisions_in_tiny_slot_table(tmp_path: Path) -> None:
    s = svc(tmp_path, slots=2)
    s.build(messages(40))
    for i in (0, 13, 39):
        assert everything(s, f"K{i}") == [i * 100]
    assert everything(s, "G2") == [i * 100 for i in range(39, -1, -1) if i % 3 == 2]
    s.close()


def test_java_hash_collisions_are_returned_for_the_caller_to_check(tmp_path: Path) -> None:
    s = svc(tmp_path)
    s.build([("T", 0, T0, None, "Aa"), ("T", 100, T0, None, "BB")])  # "Aa" and "BB" hash alike
    assert everything(s, "Aa") == everything(s, "BB") == [100, 0]
    s.close()


def test_time_window(tmp_path: Path) -> None:
    s = svc(tmp_path)
    s.build(messages(30, step_ms=10_000))  # message i at T0 + 10 s * i, G0 on every third
    g0 = [i for i in range(30) if i % 3 == 0]
    assert s.query("T", "G0", 100, T0 + 30_000, T0 + 90_000) == [900, 600, 300]
    assert s.query("T", "G0", 100, T0, T0) == [0]
    assert s.query("T", "G0", 100, T0 + 1, T0 + 29_999) == []
    assert s.query("T", "G0", 100, 0, T0 - 1) == []
    assert s.query("T", "G0", 100, T0 + 10**9, T0 + 2 * 10**9) == []
    assert s.query("T", "G0", 100, T0, T0 + 300_000) == [i * 100 for i in reversed(g0)]
    s.close()


def test_time_resolution_is_whole_seconds_from_begin(tmp_path: Path) -> None:
    s = svc(tmp_path)
    s.build([("T", 0, T0, None, "a"), ("T", 100, T0 + 1999, None, "a")])
    assert s.query("T", "a", 10, T0 + 1000, T0 + 1000) == [100]  # stored as begin + 1 s
    assert s.query("T", "a", 10, T0 + 1500, T0 + 3000) == []
    s.close()


def test_rolls_and_queries_across_files(tmp_path: Path) -> None:
    s = svc(tmp_path, num=8)  # 7 entries per file
    s.build(messages(20))  # 60 keys
    files = s.files
    assert len(files) == 9
    assert [f.name for f in files] == sorted(f.name for f in files)
    assert all(f.index_count == 8 for f in files[:-1]) and files[-1].index_count == 5
    for a, b in itertools.pairwise(files):
        assert a.end_phy_offset <= b.begin_phy_offset
    assert everything(s, "G0") == [i * 100 for i in range(18, -1, -3)]
    assert s.query("T", "G0", 4, 0, 2**62) == [1800, 1500, 1200, 900]
    for i in range(20):
        assert everything(s, f"U{i}") == everything(s, f"K{i}") == [i * 100]
    s.close()


def test_same_millisecond_files_get_ordered_unique_names(tmp_path: Path) -> None:
    s = svc(tmp_path, num=3)  # 2 entries per file
    s.build([("T", i, T0, None, f"k{i}") for i in range(6)])
    names = [f.name for f in s.files]
    base = file_name_for(T0)
    assert names == [base, f"{base}_000001", f"{base}_000002"]
    s.close()
    s = svc(tmp_path, num=3)
    assert [f.name for f in s.files] == names
    assert [everything(s, f"k{i}") for i in range(6)] == [[i] for i in range(6)]
    s.close()


def test_persistence_and_appending_after_reopen(tmp_path: Path) -> None:
    s = svc(tmp_path)
    s.build(messages(10))
    s.close()
    path = next((tmp_path / "index").iterdir())
    assert header(path)[4:] == (30, 31)
    s = svc(tmp_path)
    assert everything(s, "G0") == [900, 600, 300, 0]
    s.build(messages(20, start=10))
    assert len(s.files) == 1
    assert everything(s, "G0") == [1800, 1500, 1200, 900, 600, 300, 0]
    s.close()
    with pytest.raises(ValueError, match="expected"):
        IndexService(tmp_path, hash_slot_num=128, index_num=256)


def test_rebuild_is_idempotent(tmp_path: Path) -> None:
    s = svc(tmp_path, num=5)
    s.build(messages(10))
    counts = [f.index_count for f in s.files]
    s.build(messages(10))
    s.build(messages(10, start=9))  # the message at max_indexed_phys_offset comes again
    assert [f.index_count for f in s.files] == counts
    assert everything(s, "K9") == [900]
    s.close()


def test_message_straddling_two_files_keeps_all_its_keys(tmp_path: Path) -> None:
    s = svc(tmp_path, num=3)  # 2 entries per file: message 0's 3 keys straddle 2 files
    s.build(messages(1))
    assert len(s.files) == 2
    s.close()
    newest = max((tmp_path / "index").iterdir())
    newest.unlink()  # e.g. lost in a crash before its first header write
    s = svc(tmp_path, num=3)
    assert len(s.files) == 1 and s.rebuild_from_offset() == 0
    s.build(messages(1))
    assert [f.index_count for f in s.files] == [3, 2]
    assert everything(s, "U0") == everything(s, "K0") == everything(s, "G0") == [0]
    s.close()


def test_truncate_from_and_rebuild(tmp_path: Path) -> None:
    s = svc(tmp_path, num=10)  # 9 entries, i.e. 3 messages, per file
    s.build(messages(30))
    s.truncate_from(1300)  # the CommitLog now ends before message 13
    ends = [f.end_phy_offset for f in s.files]
    assert ends == [200, 500, 800, 1100]  # the file holding 1200..1400 was deleted whole
    assert s.rebuild_from_offset() == s.max_indexed_phys_offset() == 1100
    assert everything(s, "K12") == everything(s, "K13") == []
    s.build(messages(13, start=s.rebuild_from_offset() // 100))
    reference = svc(tmp_path / "ref", num=10)
    reference.build(messages(13))
    for key in ("G0", "G1", "G2", "K11", "K12", "U12", "K13"):
        assert everything(s, key) == everything(reference, key)
    assert [f.index_count for f in s.files] == [f.index_count for f in reference.files]
    s.truncate_from(0)
    assert s.files == [] and s.rebuild_from_offset() == 0
    s.close()
    reference.close()


def test_delete_expired_keeps_the_newest(tmp_path: Path) -> None:
    s = svc(tmp_path, num=10)
    s.build(messages(12))  # 4 files, ends 200, 500, 800, 1100
    assert s.delete_expired(200) == 0
    assert s.delete_expired(501) == 2
    assert [f.end_phy_offset for f in s.files] == [800, 1100]
    assert everything(s, "G0") == [900, 600]
    assert s.delete_expired(10**9) == 1
    assert [f.end_phy_offset for f in s.files] == [1100]
    assert len(list((tmp_path / "index").iterdir())) == 1
    s.close()


def test_crash_mid_batch_slots_repaired(tmp_path: Path) -> None:
    s = svc(tmp_path, slots=4)
    s.build(messages(10))
    path = s.files[0].path
    committed = path.read_bytes()[:HEADER_SIZE]
    s.build(messages(20, start=10))
    s.close()
    with path.open("r+b") as fh:  # the batch's header write never happened
        fh.write(committed)
    s = svc(tmp_path, slots=4)
    assert s.max_indexed_phys_offset() == 900
    assert everything(s, "G1") == [700, 400, 100]
    s.build(messages(20, start=9))
    reference = svc(tmp_path / "ref", slots=4)
    reference.build(messages(20))
    for key in ("G0", "G1", "G2", "K3", "K15", "U19"):
        assert everything(s, key) == everything(reference, key)
    s.close()
    reference.close()
    assert path.read_bytes() == next((tmp_path / "ref" / "index").iterdir()).read_bytes()


def test_empty_newest_file_dropped_and_foreign_files_ignored(tmp_path: Path) -> None:
    s = svc(tmp_path)
    s.build(messages(3))
    s.close()
    IndexFile.create(tmp_path / "index" / "29991231235959999", 64, 256).close()
    (tmp_path / "index" / "notes.txt").write_text("x")
    s = svc(tmp_path)
    assert len(s.files) == 1 and s.max_indexed_phys_offset() == 200
    assert not (tmp_path / "index" / "29991231235959999").exists()
    assert (tmp_path / "index" / "notes.txt").exists()
    s.close()


def test_closed_service_refuses_writes(tmp_path: Path) -> None:
    s = svc(tmp_path)
    s.close()
    with pytest.raises(RuntimeError):
        s.build(messages(1))
