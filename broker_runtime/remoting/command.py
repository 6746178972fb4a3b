"""RemotingCommand: one request or response, as RocketMQ's remoting layer carries it.

The header is RocketMQ's JSON header (`code`, `language`, `version`, `opaque`, `flag`,
`remark`, `extFields`); `extFields` values are strings on the wire, as in Java.
"""

from __future__ import annotations

import importlib
import itertools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType

FLAG_RESPONSE = 1  # RemotingCommand.RPC_TYPE bit
FLAG_ONEWAY = 2  # RemotingCommand.RPC_ONEWAY bit

_opaques = itertools.count(1)
_esc: Callable[[str], str] = json.encoder.encode_basestring_ascii
_decoder = json.JSONDecoder()
_scan: Callable[[str, int], tuple[object, int]] = _decoder.scan_once  # type: ignore[attr-defined]
_HEAD = (
    '{"code":%d,"language":%s,"version":%d,"opaque":%d,"flag":%d,"serializeTypeCurrentRPC":"JSON"'
)


def _load_native() -> ModuleType | None:
    """The C twins of encode_header and decode_header's parse (_header.c), when built from
    these sources; they do the common case and hand the rest back (None)."""
    try:
        mod = importlib.import_module("broker_runtime.remoting._header")
    except ImportError:
        return None
    return mod if getattr(mod, "ABI", None) == _HEADER_ABI else None


_HEADER_ABI = 1  # must equal _header.c's ABI
_native = _load_native()


# JSON from peers nests this deep at most (a header 2 levels, route and heartbeat bodies about
# 5): json's parser recurses per level, and 50,000 levels raised RecursionError.
MAX_JSON_DEPTH = 64
_STRING_OR_BRACKET = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def json_too_deep(text: str, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether `text` nests arrays and objects more than `limit` deep (strings skipped)."""
    if text.count("[") + text.count("{") <= limit:
        return False  # the usual case, decided without a scan
    depth = 0
    for m in _STRING_OR_BRACKET.finditer(text):
        c = m.group()
        if c == "[" or c == "{":
            depth += 1
            if depth > limit:
                return True
        elif c == "]" or c == "}":
            depth -= 1
    return False


class HeaderError(ValueError):
    """A header that is not a RocketMQ JSON header (the frame itself was well formed)."""


@dataclass(slots=True)
class RemotingCommand:
    code: int
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    ext_fields: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    version: int = 0
    language: str = "PYTHON"

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)

    def field(self, name: str) -> str:
        """A required header field; a missing one is the sender's error, said by name."""
        try:
            return self.ext_fields[name]
        except KeyError:
            raise HeaderError(f"missing header field {name!r}") from None

    def int_field(self, name: str) -> int:
        value = self.field(name)
        try:
            return int(value)
        except ValueError:
            raise HeaderError(f"header field {name!r} is not an integer: {value!r}") from None

    def encode_header(self) -> bytes:
        """The JSON header, written out field by field: what json.dumps makes of it."""
        if _native is not None:
            out: bytes | None = _native.encode(
                self.code, self.language, self.version, self.opaque, self.flag, self.remark,
                self.ext_fields,
            )  # fmt: skip
            if out is not None:
                return out
        return self.encode_header_py()

    def encode_header_py(self) -> bytes:
        """encode_header in Python (the C twin's reference, and its fallback).

        Strings go through json's own C escaper (ASCII only, as Java's fastjson reads it);
        json.dumps would build a new encoder per call, a third of a small request's cost.
        """
        # %d: an IntEnum code is written as its number, as json.dumps writes it.
        head = _HEAD % (self.code, _esc(self.language), self.version, self.opaque, self.flag)
        if self.remark is not None:
            head += ',"remark":' + _esc(self.remark)
        ext = self.ext_fields
        if ext:
            try:
                head += ',"extFields":{' + ",".join(
                    [_esc(k) + ":" + _esc(v) for k, v in ext.items()]
                )
            except TypeError:  # a value someone set to a non-string: as Java would send it
                head += ',"extFields":{' + ",".join(
                    [_esc(str(k)) + ":" + _esc(_wire_str(v)) for k, v in ext.items()]
                )
            head += "}"
        return (head + "}").encode()

    @classmethod
    def decode_header(cls, data: bytes | bytearray, body: bytes) -> RemotingCommand:
        if _native is not None:
            parts = _native.decode(data)
            if parts is not None:
                code, opaque, flag, remark, ext, version, language = parts
                return cls(code, opaque, flag, remark, ext, body, version, language)
        return cls.decode_header_py(data, body)

    @classmethod
    def decode_header_py(cls, data: bytes | bytearray, body: bytes) -> RemotingCommand:
        """decode_header in Python (the C twin's reference, and what it leaves here)."""
        try:
            text = data.decode()
            if json_too_deep(text):
                raise HeaderError(f"header nests deeper than {MAX_JSON_DEPTH} levels")
            header = _json(text)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise HeaderError(f"header is not JSON: {e}") from None
        if type(header) is not dict:
            raise HeaderError("header is not a JSON object")
        get = header.get
        code, opaque, flag = get("code"), get("opaque", 0), get("flag", 0)
        if type(code) is not int or type(opaque) is not int or type(flag) is not int:
            raise HeaderError("header code, opaque and flag must be integers")
        ext = get("extFields")
        if ext is None:
            ext = {}
        elif type(ext) is not dict:
            raise HeaderError("extFields is not an object")
        else:
            for v in ext.values():
                if type(v) is not str:  # every client sends strings; be lenient with the rest
                    ext = {str(k): _wire_str(v) for k, v in ext.items()}
                    break
        remark = get("remark")
        version = get("version", 0)
        language = get("language", "JAVA")
        return cls(
            code,
            opaque,
            flag,
            remark if type(remark) is str else None,
            ext,
            body,
            version if type(version) is int else 0,
            language if type(language) is str else str(language),
        )


def _json(text: str) -> object:
    """json.loads, without its two whitespace matches for a header that has none."""
    try:
        value, end = _scan(text, 0)
    except StopIteration:
        end = -1
    if end != len(text):  # blanks around it, more after it, or not JSON: json.loads decides
        value = _decoder.decode(text)
    return value


def _wire_str(value: object) -> str:
    """Java sends every extField as a string; be lenient with numbers and booleans."""
    kind = type(value)
    if kind is str:
        return value  # type: ignore[return-value]
    if kind is int:  # the common case on the send path: str() is ~10x json.dumps
        return str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return value if isinstance(value, str) else json.dumps(value)


def wire_fields(fields: dict[str, object] | None) -> dict[str, str]:
    """extFields as they go on the wire: strings, None values left out."""
    if not fields:
        return {}
    return {k: v if type(v) is str else _wire_str(v) for k, v in fields.items() if v is not None}


def request(
    code: int, fields: dict[str, object] | None = None, body: bytes = b""
) -> RemotingCommand:
    """A new request with a process-unique opaque (its correlation id)."""
    return RemotingCommand(
        code=int(code),
        opaque=next(_opaques),
        ext_fields=wire_fields(fields),
        body=body,
    )


def response_to(
    req: RemotingCommand,
    code: int = 0,
    remark: str | None = None,
    fields: dict[str, object] | None = None,
    body: bytes = b"",
) -> RemotingCommand:
    """The response to `req`: same opaque, the response flag set."""
    return RemotingCommand(
        code=int(code),
        opaque=req.opaque,
        flag=FLAG_RESPONSE,
        remark=remark,
        ext_fields=wire_fields(fields),
        body=body,
    )
