"""The C header codec (_header.c) against its Python reference in command.py.

Whatever the C twin answers must be what the Python code makes of the same command or bytes;
where it hands back None, the Python code does the work (and raises what it raises). The
common headers must take the C path, or the twin would be dead weight.
"""

from __future__ import annotations

import json
import os
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker_runtime.remoting import command
from broker_runtime.remoting.command import RemotingCommand, request, response_to
from broker_runtime.remoting.headers import SendMessageRequestHeader, SendMessageResponseHeader
from broker_runtime.remoting.protocol import RequestCode
from tests.fuzz import targets


@pytest.fixture(scope="module")
def native() -> ModuleType:
    """The built extension; a skip when it is not built, a failure under CI."""
    if command._native is None:
        if os.environ.get("CI") == "true":
            pytest.fail("broker_runtime.remoting._header is not built (or from other sources)")
        pytest.skip("broker_runtime.remoting._header is not built")
    return command._native


def fields(cmd: RemotingCommand) -> tuple[Any, ...]:
    return (cmd.code, cmd.opaque, cmd.flag, cmd.remark, cmd.ext_fields, cmd.version, cmd.language)


def send_request() -> RemotingCommand:
    h = SendMessageRequestHeader(
        producer_group="orders-producer",
        topic="Orders",
        queue_id=3,
        born_timestamp=1_795_361_865_990,
        properties="UNIQ_KEY\x017F0000010F2A000000000001\x02KEYS\x01o-1 o-2\x02TAGS\x01paid\x02",
    )
    return request(RequestCode.SEND_MESSAGE, h.fields(), b"body")


def test_the_send_path_headers_take_the_c_path(native: ModuleType) -> None:
    req = send_request()
    out = SendMessageResponseHeader("7F00000100002A9F0000000000001234", 3, 41, 9_000, 1)
    resp = response_to(req, 0, None, fields=out.fields())
    for cmd in (req, resp):
        raw = cmd.encode_header_py()
        assert native.encode(cmd.code, cmd.language, cmd.version, cmd.opaque, cmd.flag,
                             cmd.remark, cmd.ext_fields) == raw  # fmt: skip
        parts = native.decode(raw)
        assert parts is not None
        assert parts == fields(RemotingCommand.decode_header_py(raw, b""))


text = st.text(max_size=12)  # any code point, surrogates and controls included
wire_ints = st.integers(-(2**63), 2**63 - 1)


@settings(max_examples=400)
@given(
    code=st.integers(-(2**70), 2**70) | st.booleans(),
    language=text | st.integers(),
    version=wire_ints,
    opaque=wire_ints | st.integers(2**63, 2**80),
    flag=wire_ints,
    remark=st.none() | text,
    ext=st.dictionaries(text, text | st.integers() | st.none(), max_size=6),
)
def test_encode_is_the_python_encoders_output_or_none(
    native: ModuleType,
    code: int,
    language: Any,
    version: int,
    opaque: int,
    flag: int,
    remark: str | None,
    ext: dict[str, Any],
) -> None:
    cmd = RemotingCommand(code, opaque, flag, remark, ext, b"", version, language)
    got = native.encode(code, language, version, opaque, flag, remark, ext)
    try:
        want = cmd.encode_header_py()
    except TypeError:  # a language that is not a string: Python refuses, C leaves it
        assert got is None
        return
    simple = (
        all(type(v) is str for v in ext.values())
        and type(language) is str
        and all(type(x) is int and -(2**63) <= x < 2**63 for x in (code, opaque, flag))
    )
    assert got == (want if simple else None)


json_scalar = (
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | text
)
json_value = st.recursive(
    json_scalar,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=6,
)
KEYS = ["code", "opaque", "flag", "remark", "version", "language", "extFields"]
header_dict = st.dictionaries(
    st.sampled_from(KEYS) | text,
    json_value | st.dictionaries(text, text, max_size=5),
    max_size=9,
)


@settings(max_examples=600)
@given(
    header=header_dict,
    ascii_only=st.booleans(),
    compact=st.booleans(),
    tail=st.sampled_from(["", " ", "x", "}"]),
)
def test_decode_is_the_python_decoders_result_or_none(
    native: ModuleType, header: dict[str, Any], ascii_only: bool, compact: bool, tail: str
) -> None:
    seps = (",", ":") if compact else (", ", ": ")
    raw = (json.dumps(header, ensure_ascii=ascii_only, separators=seps) + tail).encode(
        "utf-8", "surrogatepass"
    )
    check_decode(native, raw)


@given(st.binary(max_size=120))
def test_decode_of_any_bytes_is_the_python_result_or_none(native: ModuleType, raw: bytes) -> None:
    check_decode(native, raw)


def check_decode(native: ModuleType, raw: bytes) -> None:
    """The twin's answer is Python's or None (the fuzz target's outcome)."""
    assert command._native is native
    targets.header(raw)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"code":1,"extFields":{"k":"\\ud83d\\ude00\\ud83d\\u0041\\ude00"}}',  # pairs, lone
        b'{"code":-0,"opaque":999999999999999999,"flag":1,"remark":"a\\"b\\\\c\\/d\\n"}',
        b'{"code":1,"extFields":null,"language":"GO","version":true,"remark":5}',
        b'{"code":1,"code":2,"extFields":{"a":"1","a":"2"}}',  # the last one wins, as in json
        b'{"code":1,"unknown":[1,2],"extFields":{}}',  # not the fast subset: Python decides
        b'{"code":01}',
        b'{"code":1}x',
    ],
)
def test_edge_cases_agree(native: ModuleType, raw: bytes) -> None:
    check_decode(native, raw)


small_ints = st.integers(-(10**18) + 1, 10**18 - 1)


@settings(max_examples=300)
@given(
    code=small_ints,
    opaque=small_ints,
    flag=small_ints,
    remark=st.none() | text,
    ext=st.dictionaries(text, text, max_size=6),
    language=text,
)
def test_headers_as_rocketmq_writes_them_take_the_c_path(
    native: ModuleType,
    code: int,
    opaque: int,
    flag: int,
    remark: str | None,
    ext: dict[str, str],
    language: str,
) -> None:
    """Compact ASCII JSON of the usual fields (what fastjson and this encoder write)."""
    cmd = RemotingCommand(code, opaque, flag, remark, ext, b"", 0, language)
    raw = cmd.encode_header_py()
    assert native.decode(raw) == fields(RemotingCommand.decode_header_py(raw, b""))


def test_every_escape_is_written_as_json_writes_it(native: ModuleType) -> None:
    nasty = '"\\/\b\f\n\r\t\x00\x1f ~\x7f\xe9\u2028\ud800x\udfff\U0001f600'  # lone surrogates
    cmd = RemotingCommand(1, 2, 0, nasty, {nasty: nasty, "k": "v"}, b"", 0, nasty)
    raw = native.encode(1, nasty, 0, 2, 0, nasty, cmd.ext_fields)
    assert raw == cmd.encode_header_py()
    assert native.decode(raw) == fields(RemotingCommand.decode_header_py(raw, b""))
    assert native.decode(raw)[3] == nasty
