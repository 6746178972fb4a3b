"""State files as Apache RocketMQ's broker writes them (fastjson): integer map keys unquoted.

The texts below are copied from a 4.9.7 broker's store (tests/interop/test_store_files_real.py
makes such stores); before common/fastjson.py, mqaudit refused them as corrupt.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker_runtime.common import fastjson
from broker_runtime.offsets.consumer_offsets import ConsumerOffsets
from broker_runtime.offsets.delay_offsets import read_delay_offsets

CONSUMER_OFFSET_JSON = """{
\t"offsetTable":{
\t\t"StA@gA":{0:3,1:1,2:1,3:3
\t\t},
\t\t"%RETRY%gA@gA":{0:3
\t\t}
\t}
}"""
DELAY_OFFSET_JSON = """{
\t"offsetTable":{2:2,3:3
\t}
}"""


def test_rocketmq_consumer_offsets_file_is_read(tmp_path: Path) -> None:
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "consumerOffset.json").write_text(CONSUMER_OFFSET_JSON)
    offsets = ConsumerOffsets(tmp_path)
    assert offsets.table() == {"StA@gA": {0: 3, 1: 1, 2: 1, 3: 3}, "%RETRY%gA@gA": {0: 3}}
    assert offsets.query("StA", "gA", 3) == 3
    offsets.persist()  # written back as strict JSON, which RocketMQ's fastjson reads too
    written = json.loads((tmp_path / "config" / "consumerOffset.json").read_text())
    assert written == {"offsetTable": {"StA@gA": {"0": 3, "1": 1, "2": 1, "3": 3},
                                       "%RETRY%gA@gA": {"0": 3}}}  # fmt: skip


def test_rocketmq_delay_offsets_file_is_read(tmp_path: Path) -> None:
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "delayOffset.json").write_text(DELAY_OFFSET_JSON)
    assert read_delay_offsets(tmp_path) == {2: 2, 3: 3}


def test_only_bare_integer_keys_are_quoted() -> None:
    text = '{"a":"x,{1:2 \\" ,3:4","b":{-1 : 3, 7:{8:[9]}}, "c": [1, 2]}'
    assert fastjson.loads(text) == {
        "a": 'x,{1:2 " ,3:4',
        "b": {"-1": 3, "7": {"8": [9]}},
        "c": [1, 2],
    }
    assert fastjson.loads(b'{"k": 1}') == {"k": 1}
    with pytest.raises(ValueError):
        fastjson.loads("{0:")
    with pytest.raises(ValueError):
        fastjson.loads("{abc:1}")  # only integer keys: anything else stays an error
