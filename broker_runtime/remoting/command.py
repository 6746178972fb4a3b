"""RemotingCommand: one request or response, as RocketMQ's remoting layer carries it.

The header is RocketMQ's JSON header (`code`, `language`, `version`, `opaque`, `flag`,
`remark`, `extFields`); `extFields` values are strings on the wire, as in Java.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Any

FLAG_RESPONSE = 1  # RemotingCommand.RPC_TYPE bit
FLAG_ONEWAY = 2  # RemotingCommand.RPC_ONEWAY bit

_opaques = itertools.count(1)


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
        header: dict[str, Any] = {
            "code": self.code,
            "language": self.language,
            "version": self.version,
            "opaque": self.opaque,
            "flag": self.flag,
            "serializeTypeCurrentRPC": "JSON",
        }
        if self.remark is not None:
            header["remark"] = self.remark
        if self.ext_fields:
            header["extFields"] = self.ext_fields
        return json.dumps(header, separators=(",", ":")).encode()

    @classmethod
    def decode_header(cls, data: bytes, body: bytes) -> RemotingCommand:
        try:
            header = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise HeaderError(f"header is not JSON: {e}") from None
        if not isinstance(header, dict):
            raise HeaderError("header is not a JSON object")
        code, opaque, flag = header.get("code"), header.get("opaque", 0), header.get("flag", 0)
        if not all(type(v) is int for v in (code, opaque, flag)):
            raise HeaderError("header code, opaque and flag must be integers")
        assert isinstance(code, int) and isinstance(opaque, int) and isinstance(flag, int)
        ext = header.get("extFields") or {}
        if not isinstance(ext, dict):
            raise HeaderError("extFields is not an object")
        remark = header.get("remark")
        return cls(
            code=code,
            opaque=opaque,
            flag=flag,
            remark=remark if isinstance(remark, str) else None,
            ext_fields=ext
            if all(type(v) is str for v in ext.values())  # as every client sends them
            else {str(k): _wire_str(v) for k, v in ext.items()},
            body=body,
            version=header.get("version", 0) if isinstance(header.get("version"), int) else 0,
            language=str(header.get("language", "JAVA")),
        )


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
    return {k: _wire_str(v) for k, v in (fields or {}).items() if v is not None}


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
