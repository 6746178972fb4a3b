"""`mqaudit store bench|verify|dump|recover`, run as real subprocesses on real store dirs."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from broker_runtime.store import record_codec as codec
from broker_runtime.store.checkpoint import Checkpoint
from broker_runtime.store.mapped_file import segment_name
from tests.conftest import REPO, mqaudit_cmd

MESSAGES, SIZE, SEGMENT = 3000, 256, 262144
HEADER_FIELDS = {
    "total_size",
    "magic",
    "body_crc",
    "queue_id",
    "flag",
    "queue_offset",
    "phys_offset",
    "sys_flag",
    "born_timestamp",
    "born_host",
    "store_timestamp",
    "store_host",
    "reconsume_times",
    "prepared_transaction_offset",
    "topic",
    "properties",
    "body",
    "msg_id",
    "crc_ok",
}


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def mqaudit(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        mqaudit_cmd(*map(str, args)), env=_env(), capture_output=True, text=True, timeout=120
    )


def bench(store: Path) -> subprocess.CompletedProcess[str]:
    return mqaudit(
        "store", "bench", "--store", store, "--messages", str(MESSAGES), "--size", str(SIZE),
        "--topics", "2", "--queues", "2", "--flush", "async", "--segment-size", str(SEGMENT),
    )  # fmt: skip


def one_json_line(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout
    out: dict[str, Any] = json.loads(lines[0])
    return out


def json_lines(proc: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in proc.stdout.splitlines()]


def new_store(path: Path) -> Path:
    proc = bench(path)
    assert proc.returncode == 0, proc.stderr
    return path


@pytest.fixture(scope="module")
def benched(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A store written by `store bench` (read-only for the tests using it) and its JSON."""
    store = tmp_path_factory.mktemp("cli") / "store"
    proc = bench(store)
    assert proc.returncode == 0, proc.stderr
    return store, one_json_line(proc)


def test_bench_prints_one_json_result(benched: tuple[Path, dict[str, Any]]) -> None:
    store, result = benched
    for key in ("messages_per_s", "mb_per_s", "ratio_to_disk", "disk_mb_per_s", "seconds"):
        assert isinstance(result[key], int | float) and result[key] > 0, key
    assert (result["messages"], result["size"], result["topics"], result["queues"]) == (
        MESSAGES,
        SIZE,
        2,
        2,
    )
    assert result["flush"] == "async"
    assert result["api"] == "MessageStore.put_messages, 1 message(s) per call"
    assert result["cpu_us_per_message"] > 0 and len(result["load_avg_1m"]) == 2
    segments = sorted((store / "commitlog").iterdir())
    assert len(segments) >= 4  # 3000 x ~400 bytes in 256 KiB segments
    assert {p.stat().st_size for p in segments} == {SEGMENT}
    assert not (store / "abort").exists()  # the bench stops the store cleanly


def test_verify_a_clean_store(benched: tuple[Path, dict[str, Any]]) -> None:
    store, _ = benched
    proc = mqaudit("store", "verify", "--store", store)
    assert proc.returncode == 0, proc.stderr
    report = one_json_line(proc)
    assert report["messages"] == MESSAGES
    assert (report["topics"], report["queues"]) == (2, 4)
    assert (report["bad_crcs"], report["torn_tail_bytes"]) == (0, 0)
    assert report["consume_queue_entries"] == MESSAGES
    assert report["consume_queue_mismatches"] == report["consume_queue_missing"] == 0
    assert report["consistent"] is True
    assert report["problems"] == []


def test_verify_fails_on_a_flipped_body_byte(tmp_path: Path) -> None:
    store = new_store(tmp_path / "store")
    path = store / "commitlog" / segment_name(0)
    at = codec.HEADER_SIZE + 10  # the body of the first message
    with path.open("r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0xFF]))
    proc = mqaudit("store", "verify", "--store", store)
    assert proc.returncode == 1, proc.stderr
    report = one_json_line(proc)
    assert report["bad_crcs"] == 1
    assert report["messages"] == MESSAGES
    assert report["consistent"] is False
    assert [p["kind"] for p in report["problems"]] == ["bad_crc"]
    assert report["problems"][0]["where"] == f"{segment_name(0)}+0"


def test_dump_with_a_limit(benched: tuple[Path, dict[str, Any]]) -> None:
    store, _ = benched
    proc = mqaudit("store", "dump", "--store", store, "--limit", "5")
    assert proc.returncode == 0, proc.stderr
    records = json_lines(proc)
    assert len(records) == 5
    offsets = [r["phys_offset"] for r in records]
    assert offsets[0] == 0
    assert offsets == sorted(offsets)
    for r in records:
        assert set(r) >= HEADER_FIELDS, HEADER_FIELDS - set(r)
        assert r["magic"] == "0xdaa320a7"
        body = base64.b64decode(r["body"], validate=True)
        assert len(body) == SIZE
        assert codec.body_crc(body) == r["body_crc"]
        assert r["crc_ok"] is True
        assert r["total_size"] == codec.record_size(
            SIZE, len(r["topic"]), sum(len(k) + len(v) + 2 for k, v in r["properties"].items())
        )
        assert r["topic"] in ("BenchTopic0", "BenchTopic1")
        assert set(r["properties"]) == {"UNIQ_KEY", "TAGS"}
        assert r["store_host"] == "127.0.0.1:10911"
        assert len(r["msg_id"]) == 32 and r["msg_id"].endswith(f"{r['phys_offset']:016X}")
    assert [r["queue_offset"] for r in records] == [0, 0, 0, 0, 1]  # 2 topics x 2 queues


def test_dump_filters_by_topic(benched: tuple[Path, dict[str, Any]]) -> None:
    store, _ = benched
    proc = mqaudit("store", "dump", "--store", store, "--topic", "BenchTopic1")
    assert proc.returncode == 0, proc.stderr
    records = json_lines(proc)
    assert len(records) == MESSAGES // 2
    assert {r["topic"] for r in records} == {"BenchTopic1"}
    limited = json_lines(mqaudit("store", "dump", "--store", store, "--topic", "BenchTopic1",
                                 "--limit", "3"))  # fmt: skip
    assert limited == records[:3]
    none = mqaudit("store", "dump", "--store", store, "--topic", "NoSuchTopic")
    assert (none.returncode, none.stdout) == (0, "")


def test_recover_prints_the_report(tmp_path: Path) -> None:
    store = new_store(tmp_path / "store")
    proc = mqaudit("store", "recover", "--store", store)
    assert proc.returncode == 0, proc.stderr
    clean = one_json_line(proc)
    assert clean["unclean_shutdown"] is False
    assert (clean["truncated_bytes"], clean["saved"]) == (0, [])
    assert clean["stop_reason"] == "eof"

    cp = Checkpoint.load(store / "checkpoint")
    assert cp is not None
    end = cp.phys_flushed_offset
    assert end == clean["log_end"]
    garbage = b"\xa5" * 300
    with (store / "commitlog" / segment_name(end - end % SEGMENT)).open("r+b") as f:
        f.seek(end % SEGMENT)
        f.write(garbage)
    (store / "abort").touch()
    proc = mqaudit("store", "recover", "--store", store)
    assert proc.returncode == 0, proc.stderr
    report = one_json_line(proc)
    assert report["unclean_shutdown"] is True
    assert report["truncated_bytes"] == len(garbage)
    assert report["stop_reason"] == "bad_magic"
    assert report["log_end"] == end
    assert report["saved"] == [str(store / "recovery" / f"{segment_name(end)}.torn")]
    assert (store / "recovery" / f"{segment_name(end)}.torn").read_bytes() == garbage
    assert not (store / "abort").exists()
    verify = mqaudit("store", "verify", "--store", store)
    assert verify.returncode == 0, verify.stdout
    assert one_json_line(verify)["messages"] == MESSAGES


def test_bench_refuses_a_non_empty_dir(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    (store / "keep.txt").write_text("not a store")
    proc = bench(store)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "not empty" in proc.stderr and str(store) in proc.stderr
    assert sorted(p.name for p in store.iterdir()) == ["keep.txt"]


@pytest.mark.parametrize("args", [("--messages", "0"), ("--size", "-1")])
def test_bench_rejects_non_positive_numbers(tmp_path: Path, args: tuple[str, str]) -> None:
    proc = mqaudit("store", "bench", "--store", tmp_path / "store", *args)
    assert proc.returncode != 0
    assert "must be positive" in proc.stderr
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize("command", ["verify", "dump", "recover"])
def test_commands_need_a_commitlog(tmp_path: Path, command: str) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    for target in (empty, tmp_path / "missing"):
        proc = mqaudit("store", command, "--store", target)
        assert proc.returncode != 0
        assert proc.stdout == ""
        assert "no commitlog" in proc.stderr and str(target) in proc.stderr
    assert list(empty.iterdir()) == []  # nothing created


def test_recover_opens_a_store_with_its_own_file_sizes(tmp_path: Path) -> None:
    from broker_runtime.common.config import StoreConfig
    from broker_runtime.common.message import Message
    from broker_runtime.store.message_store import MessageStore

    config = StoreConfig(
        store_dir=tmp_path / "s",
        segment_size=64 * 1024,
        cq_entries_per_file=32,
        index_hash_slots=16,
        index_max_entries=64,
    )
    with MessageStore(config) as store:
        store.put_messages([Message("T", b"x" * 500, {"KEYS": f"k{i}"}) for i in range(300)])
    (config.store_dir / "abort").touch()  # as if the broker had died
    proc = mqaudit("store", "recover", "--store", config.store_dir)
    assert proc.returncode == 0, proc.stderr
    report = one_json_line(proc)
    assert report["unclean_shutdown"] is True
    assert report["truncated_bytes"] == 0
    with pytest.raises(ValueError, match="other file sizes"):
        MessageStore(StoreConfig(store_dir=config.store_dir, segment_size=64 * 1024))
    assert mqaudit("store", "verify", "--store", config.store_dir).returncode == 0
