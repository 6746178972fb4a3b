"""JSON as Apache RocketMQ writes it with fastjson: map keys that are integers go unquoted.

RocketMQ's consumerOffset.json is `{"offsetTable":{"T@g":{0:3,1:1}}}` and delayOffset.json
`{"offsetTable":{2:2,3:3}}` (fastjson's default for a `Map<Integer, Long>`), which strict
JSON parsers refuse. `loads` quotes such keys and parses the rest as JSON; text that is
JSON already is parsed as it is. No JSON library on PyPI reads these keys (JSON5 allows
unquoted identifiers, not numbers), hence this small shim.
"""

from __future__ import annotations

import json
import re
from typing import Any

# A string literal (kept as it is), or a bare integer key after `{` or `,`.
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|(?<=[{,])(\s*)(-?\d+)(\s*:)')


def _quote_key(m: re.Match[str]) -> str:
    if m.group(2) is None:
        return m.group(0)
    return f'{m.group(1)}"{m.group(2)}"{m.group(3)}'


def loads(text: str | bytes) -> Any:
    """Parse JSON, or fastjson's output with unquoted integer keys; ValueError otherwise."""
    if isinstance(text, bytes):
        text = text.decode()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return json.loads(_TOKEN.sub(_quote_key, text))
