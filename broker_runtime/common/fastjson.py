"""JSON as Apache RocketMQ writes it with fastjson (its bodies and its state files such as
consumerOffset.json and delayOffset.json): a map whose keys are not strings is written with
the keys as they are, which is not JSON.

    {"offsetTable":{{"brokerName":"b","queueId":0,"topic":"T"}:{"maxOffset":3}}} # MessageQueue keys
    {"brokerAddrs":{0:"127.0.0.1:10911"}}                                      # Long keys

The official clients and mqadmin read TopicStatsTable, ConsumeStats and ResetOffsetBody only in
that shape, and the real broker and name server write it. Here a queue-keyed map is a list of
rows (the queue's fields with the value's, or the value under `offset` when it is a number, as
ResetOffsetBody's), which is what `loads` gives back and `dumps_queue_table` takes.

No JSON library on PyPI reads these keys: json5 and demjson read unquoted identifier keys,
neither reads number or object keys.
"""

from __future__ import annotations

import json
import re
from typing import Any

QUEUE_KEY = ("brokerName", "queueId", "topic")  # MessageQueue's fields, as fastjson orders them
SCALAR = "offset"  # the row field of a Map<MessageQueue, Long>'s value

_WS = (" ", "\t", "\n", "\r")
_NUMBER_KEY = re.compile(r"-?\d+")
_decoder = json.JSONDecoder()


def _dump(data: object) -> str:
    return json.dumps(data, separators=(",", ":"))


def dumps_queue_table(rows: list[dict[str, Any]], scalar: bool = False, **top: object) -> bytes:
    """A body {"offsetTable": Map<MessageQueue, V>, **top} as fastjson writes it. Each row holds
    the queue's topic, brokerName and queueId; V is the row's other fields, or (`scalar`) the
    row's `offset`."""
    entries = []
    for row in rows:
        key = {k: row[k] for k in QUEUE_KEY}
        val = row[SCALAR] if scalar else {k: v for k, v in row.items() if k not in key}
        entries.append(f"{_dump(key)}:{_dump(val)}")
    head = "".join(f"{_dump(k)}:{_dump(v)}," for k, v in top.items())
    return f'{{{head}"offsetTable":{{{",".join(entries)}}}}}'.encode()


def loads(text: str | bytes) -> Any:
    """JSON, or fastjson's dialect: number keys become strings, a map with object keys a list
    of rows (see the module's docstring). ValueError names the position of what is wrong."""
    if isinstance(text, bytes):
        text = text.decode()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    value, end = _value(text, 0)
    if _skip(text, end) != len(text):
        raise ValueError(f"extra data at character {end}")
    return value


def _skip(text: str, i: int) -> int:
    while text[i : i + 1] in _WS:
        i += 1
    return i


def _value(text: str, i: int) -> tuple[Any, int]:
    i = _skip(text, i)
    c = text[i : i + 1]
    if c == "{":
        return _object(text, i + 1)
    if c == "[":
        return _array(text, i + 1)
    try:
        value, end = _decoder.raw_decode(text, i)
    except json.JSONDecodeError as e:
        raise ValueError(f"bad value at character {i}: {e.msg}") from None
    return value, end


def _array(text: str, i: int) -> tuple[list[Any], int]:
    out: list[Any] = []
    i = _skip(text, i)
    if text[i : i + 1] == "]":
        return out, i + 1
    while True:
        item, i = _value(text, i)
        out.append(item)
        i = _skip(text, i)
        c = text[i : i + 1]
        if c == "]":
            return out, i + 1
        if c != ",":
            raise ValueError(f"expected , or ] at character {i}")
        i += 1


def _key(text: str, i: int) -> tuple[Any, int]:
    c = text[i : i + 1]
    if c == '"':
        return _value(text, i)
    if c == "{":
        key, end = _object(text, i + 1)
        if not isinstance(key, dict) or not set(QUEUE_KEY) <= set(key):
            raise ValueError(f"an object key at character {i} is not a MessageQueue")
        return key, end
    m = _NUMBER_KEY.match(text, i)
    if m is None:
        raise ValueError(f"expected a key at character {i}")
    return m.group(), m.end()


def _object(text: str, i: int) -> tuple[dict[str, Any] | list[dict[str, Any]], int]:
    pairs: list[tuple[Any, Any]] = []
    i = _skip(text, i)
    if text[i : i + 1] == "}":
        return {}, i + 1
    while True:
        key, i = _key(text, _skip(text, i))
        i = _skip(text, i)
        if text[i : i + 1] != ":":
            raise ValueError(f"expected : at character {i}")
        value, i = _value(text, i + 1)
        pairs.append((key, value))
        i = _skip(text, i)
        c = text[i : i + 1]
        if c == "}":
            break
        if c != ",":
            raise ValueError(f"expected , or }} at character {i}")
        i += 1
    if all(isinstance(k, dict) for k, _ in pairs):
        return [{**k, **v} if isinstance(v, dict) else {**k, SCALAR: v} for k, v in pairs], i + 1
    if any(isinstance(k, dict) for k, _ in pairs):
        raise ValueError("a map mixes object keys with others")
    return dict(pairs), i + 1
