"""The wire codec without I/O: round trips, partial feeds, and every malformed shape."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker_runtime.remoting.bodies import BodyError, decode_json
from broker_runtime.remoting.command import (
    FLAG_RESPONSE,
    HeaderError,
    RemotingCommand,
    request,
    response_to,
)
from broker_runtime.remoting.framing import FrameDecoder, FrameError, encode
from broker_runtime.remoting.protocol import RequestCode, ResponseCode, code_name
from tests.fuzz import targets

field_text = st.text(min_size=0, max_size=20)


@given(
    code=st.integers(-(2**31), 2**31 - 1),
    fields=st.dictionaries(st.text(min_size=1, max_size=10), field_text, max_size=5),
    body=st.binary(max_size=300),
    remark=st.none() | field_text,
)
def test_round_trip_any_command(
    code: int, fields: dict[str, str], body: bytes, remark: str | None
) -> None:
    cmd = RemotingCommand(code=code, opaque=7, remark=remark, ext_fields=fields, body=body)
    (back,) = FrameDecoder().feed(encode(cmd))
    assert back == RemotingCommand(
        code=code, opaque=7, remark=remark, ext_fields=fields, body=body, language="PYTHON"
    )


@given(
    code=st.integers(-(2**31), 2**31 - 1),
    fields=st.dictionaries(st.text(min_size=1, max_size=10), field_text, max_size=5),
    remark=st.none() | field_text,
    language=st.sampled_from(["JAVA", "PYTHON", "GO"]),
)
def test_header_is_what_json_dumps_writes(
    code: int, fields: dict[str, str], remark: str | None, language: str
) -> None:
    """The hand-written header encoder: byte for byte json.dumps of RocketMQ's header."""
    cmd = RemotingCommand(code=code, opaque=9, remark=remark, ext_fields=fields, language=language)
    header: dict[str, object] = {
        "code": code, "language": language, "version": 0, "opaque": 9, "flag": 0,
        "serializeTypeCurrentRPC": "JSON",
    }  # fmt: skip
    if remark is not None:
        header["remark"] = remark
    if fields:
        header["extFields"] = fields
    assert cmd.encode_header() == json.dumps(header, separators=(",", ":")).encode()


def test_header_json_with_blanks_or_numbers_still_decodes() -> None:
    """Another client's header: spaces around it, numbers as extFields values."""
    header = b' { "code" : 10 , "opaque" : 3, "extFields" : {"queueId": 2, "b": true} } '
    (cmd,) = FrameDecoder().feed(_frame(header))
    assert (cmd.code, cmd.opaque, cmd.ext_fields) == (10, 3, {"queueId": "2", "b": "true"})


def test_rocketmq_frame_layout() -> None:
    cmd = request(RequestCode.SEND_MESSAGE, {"topic": "T", "queueId": 3}, b"hello")
    frame = encode(cmd)
    length, type_and_len = struct.unpack_from(">ii", frame)
    assert length == len(frame) - 4
    assert type_and_len >> 24 == 0  # JSON
    header = json.loads(frame[8 : 8 + (type_and_len & 0xFFFFFF)])
    assert header["code"] == 10
    assert header["extFields"] == {"topic": "T", "queueId": "3"}  # strings, as Java sends
    assert frame.endswith(b"hello")


def test_byte_by_byte_feed_and_pipelined_frames() -> None:
    cmds = [request(RequestCode.PULL_MESSAGE, {"i": i}, bytes([i]) * i) for i in range(5)]
    stream = b"".join(encode(c) for c in cmds)
    decoder = FrameDecoder()
    got: list[RemotingCommand] = []
    for b in stream:
        got += decoder.feed(bytes([b]))
    assert [c.ext_fields["i"] for c in got] == [str(i) for i in range(5)]
    assert [c.body for c in got] == [c.body for c in cmds]
    assert decoder.buffered == 0


def test_response_keeps_opaque_and_sets_flag() -> None:
    req = request(RequestCode.HEART_BEAT)
    resp = response_to(req, ResponseCode.SYSTEM_BUSY, "busy", {"x": 1})
    assert resp.opaque == req.opaque and resp.flag & FLAG_RESPONSE and resp.is_response
    assert not req.is_response
    assert code_name(2, response=True) == "SYSTEM_BUSY" and code_name(99999, False) == "99999"


def _frame(
    header: bytes, body: bytes = b"", serialize: int = 0, length: int | None = None
) -> bytes:
    n = 4 + len(header) + len(body) if length is None else length
    return struct.pack(">iI", n, (serialize << 24) | len(header)) + header + body


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        (struct.pack(">i", -1) + b"xxxx", "frame length -1"),
        (struct.pack(">i", 2) + b"xx", "frame length 2"),
        (struct.pack(">i", 1 << 30), "frame length"),
        (_frame(b'{"code":1}', serialize=1), "serialize type 1"),
        (struct.pack(">iI", 8, 100) + b"abcd", "header length 100"),
        (_frame(b"not json"), "not JSON"),
        (_frame(b"[1,2]"), "not a JSON object"),
        (_frame(b'{"code":"10"}'), "must be integers"),
        (_frame(b'{"code":10,"extFields":[1]}'), "extFields"),
        (_frame(b"\xff\xfe"), "not JSON"),
    ],
)
def test_malformed_frames_are_refused_with_a_reason(frame: bytes, reason: str) -> None:
    with pytest.raises(FrameError, match=reason):
        FrameDecoder().feed(frame)


def test_incomplete_frame_waits_for_more() -> None:
    frame = encode(request(RequestCode.SEND_MESSAGE, body=b"x" * 100))
    decoder = FrameDecoder()
    assert decoder.feed(frame[:-1]) == []
    assert len(decoder.feed(frame[-1:])) == 1


def test_missing_and_bad_fields_are_named() -> None:
    cmd = request(RequestCode.SEND_MESSAGE, {"queueId": "x"})
    with pytest.raises(HeaderError, match="'topic'"):
        cmd.field("topic")
    with pytest.raises(HeaderError, match="'queueId' is not an integer"):
        cmd.int_field("queueId")


@given(st.binary(max_size=200))
def test_random_bytes_are_a_clean_error_or_frames_that_re_encode(data: bytes) -> None:
    targets.frame(data)  # the outcome it asserts: see tests/fuzz/targets.py


@given(
    code=st.integers(-(2**31), 2**31 - 1),
    fields=st.dictionaries(st.text(min_size=1, max_size=10), field_text, max_size=5),
    body=st.binary(max_size=100),
    cut=st.integers(0, 400),
    flip=st.integers(0, 400),
)
def test_frames_cut_or_flipped_are_a_clean_error_or_frames_that_re_encode(
    code: int, fields: dict[str, str], body: bytes, cut: int, flip: int
) -> None:
    raw = bytearray(encode(RemotingCommand(code=code, opaque=3, ext_fields=fields, body=body)) * 2)
    targets.frame(bytes(raw))
    if flip < len(raw):
        raw[flip] ^= 0x41
    targets.frame(bytes(raw[: len(raw) - cut]))


@pytest.mark.parametrize("opener", ["[", '{"a":'])
def test_deeply_nested_header_is_a_clean_frame_error(opener: str) -> None:
    """50,000 nested `[` once raised RecursionError out of the decoder (a transport crash)."""
    header = (opener * 50_000).encode()
    frame = struct.pack(">ii", 4 + len(header), len(header)) + header
    with pytest.raises(FrameError, match="nest"):
        FrameDecoder().feed(frame)
    with pytest.raises(HeaderError, match="nest"):
        RemotingCommand.decode_header_py(
            b'{"code":1,"extFields":' + b"[" * 100 + b"]" * 100 + b"}", b""
        )


def test_deeply_nested_body_is_a_body_error() -> None:
    with pytest.raises(BodyError, match="nest"):
        decode_json(b"[" * 50_000 + b"]" * 50_000, "heartbeat")
    brackets_in_a_string = b'{"a":[[{"b":"' + b"[" * 100 + b'"}]]}'
    assert decode_json(brackets_in_a_string, "x") == {"a": [[{"b": "[" * 100}]]}
