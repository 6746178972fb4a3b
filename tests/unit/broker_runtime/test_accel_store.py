"""The store on the C kernels and on the pure-Python ones: the same files, byte for byte.

The pure path runs in a subprocess with MQAUDIT_STORE_PURE=1, which is also how the whole store
suite is run once more against it (`test_store_suite_passes_on_the_pure_path`).
"""

from __future__ import annotations

import errno
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from broker_runtime.common.clock import FakeClock
from broker_runtime.common.config import StoreConfig
from broker_runtime.common.message import KEYS, TAGS, UNIQ_KEY, Message
from broker_runtime.store import accel, mapped_file
from broker_runtime.store.message_store import MessageStore
from tests.conftest import REPO
from tests.unit.broker_runtime.accel_helpers import c_kernels, c_path_in_use

c_kernels()  # skips this module when the extension is not built


def pure_env() -> dict[str, str]:
    env = dict(os.environ)
    env[accel.PURE_ENV] = "1"
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _message(rng: random.Random, i: int) -> Message:
    props = {UNIQ_KEY: f"U{i:08X}", TAGS: rng.choice(["a", "TagB", "\u00e9t\u00e9", "\U0001f600"])}
    if i % 3 == 0:
        props[KEYS] = rng.choice(["k1 k2", " order-7  x ", "\u4e2d \U0001f600", ""])
    body: bytes | bytearray = rng.randbytes(rng.randrange(0, 3000))
    if i % 17 == 0:
        body = bytearray(body)  # not the C kernel's case: `prepare` takes it
    return Message(
        topic=rng.choice(["TopicA", "TopicB", "%RETRY%g"]),
        body=body,
        properties=props,
        queue_id=rng.randrange(4),
        flag=rng.randrange(-5, 5),
        born_timestamp=1_700_000_000_000 + i,
        born_host=rng.choice([("10.0.0.1", 5000), ("10.0.0.2", 6000)]),
    )


def write_store(root: str) -> dict[str, Any]:
    """Puts a fixed series of messages, batches and refusals; returns what the caller saw."""
    config = StoreConfig(
        store_dir=Path(root),
        segment_size=64 * 1024,  # rolls with blank units
        cq_entries_per_file=64,
        index_hash_slots=128,
        index_max_entries=512,  # several index files
    )
    rng, clock = random.Random(7), FakeClock()
    seen: dict[str, Any] = {"results": [], "errors": []}
    with MessageStore(config, clock=clock, disk_ratio=lambda _path: 0.0) as store:
        i = 0
        while i < 1500:
            batch = [_message(rng, i + k) for k in range(rng.choice([1, 1, 7, 64]))]
            if rng.random() < 0.05:  # one bad message: nothing of the batch is stored
                batch.insert(len(batch) // 2, Message("TopicA", b"x", {"k": "a\x01b"}))
            try:
                seen["results"] += [list(r) for r in store.put_messages(batch)]
                i += len(batch)
            except ValueError as e:
                seen["errors"].append(f"{type(e).__name__}: {e}")
            clock.advance(rng.choice([0, 1, 400, 1500]))
        store.wait_dispatched()
    return seen


def files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_same_bytes_on_disk_as_the_pure_path(tmp_path: Path) -> None:
    c_path_in_use()
    code = (
        "import json, sys\n"
        "from broker_runtime.store import accel\n"
        "from tests.unit.broker_runtime.test_accel_store import write_store\n"
        "assert accel.IMPLEMENTATION == 'python'\n"
        "print(json.dumps(write_store(sys.argv[1])))\n"
    )
    pure = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "pure")],
        env=pure_env(), cwd=REPO, capture_output=True, text=True, timeout=240, check=True,
    )  # fmt: skip
    assert accel.IMPLEMENTATION == "c"
    seen = write_store(str(tmp_path / "c"))
    assert json.loads(pure.stdout) == seen
    assert len(seen["results"]) >= 1500 and seen["errors"]
    c_files, pure_files = files(tmp_path / "c"), files(tmp_path / "pure")
    assert sorted(c_files) == sorted(pure_files)
    assert sum(name.startswith("index/") for name in c_files) >= 2
    for name, data in c_files.items():
        assert data == pure_files[name], name


def test_pure_env_selects_python() -> None:
    code = "from broker_runtime.store import accel; print(accel.IMPLEMENTATION)"
    out = subprocess.run(
        [sys.executable, "-c", code], env=pure_env(), capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "python"


# The store's own tests (the broker's, which use the store too, run on the default path).
STORE_SUITE = [
    "tests/unit/broker_runtime/test_store_*.py",
    "tests/unit/broker_runtime/test_recovery_*.py",
    "tests/unit/broker_runtime/test_record_codec_*.py",
    "tests/unit/broker_runtime/test_index_file.py",
    "tests/unit/broker_runtime/test_cleanup.py",
    "tests/unit/broker_runtime/test_java_hash.py",
    "tests/unit/broker_runtime/test_offsets_and_names.py",
    "tests/unit/broker_runtime/test_ha_replica.py",
    "tests/integration/test_store_crash.py",
]


@pytest.mark.slow
def test_store_suite_passes_on_the_pure_path() -> None:
    """Every store test once more, with the C kernels switched off."""
    files = sorted({str(p.relative_to(REPO)) for g in STORE_SUITE for p in REPO.glob(g)})
    assert len(files) >= 10
    out = subprocess.run(
        [sys.executable, "-m", "pytest", *files, "-q", "-p", "no:cacheprovider"],
        env=pure_env(), cwd=REPO, capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert " passed" in out.stdout


@pytest.mark.parametrize("size", [0, 1, 4096, 300_000])  # the big one lets go of the GIL
def test_pwrite_all_matches_python(tmp_path: Path, size: int) -> None:
    C = c_kernels()
    data = random.Random(size).randbytes(size)
    written = {}
    for name, pwrite_all in (("c", C.pwrite_all), ("python", mapped_file._pwrite_all)):
        path = tmp_path / name
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            pwrite_all(fd, b"head", 0)
            pwrite_all(fd, memoryview(data), 7)
        finally:
            os.close(fd)
        written[name] = path.read_bytes()
        with pytest.raises(OSError) as e:
            pwrite_all(fd, data or b"x", 0)  # closed: EBADF, as os.pwrite says
        assert e.value.errno == errno.EBADF
    assert written["c"] == written["python"] == (b"head\0\0\0" + data if data else b"head")
