"""C prepare/encode kernels against their Python reference: same Prepared, bytes, errors."""

from __future__ import annotations

import gc
import zlib
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker_runtime.common.message import KEYS, TAGS, UNIQ_KEY, Message
from broker_runtime.store import record_codec as codec
from broker_runtime.store.record_codec import DispatchRequest, Prepared
from tests.unit.broker_runtime.accel_helpers import c_kernels, c_path_in_use, outcome

C = c_kernels()
I32 = (-(2**31), 2**31 - 1)
I64 = (-(2**63), 2**63 - 1)

any_text = st.text(st.characters(exclude_categories=()), max_size=12)  # lone surrogates too
prop_key = st.one_of(st.sampled_from([TAGS, KEYS, UNIQ_KEY, "a", "k2"]), any_text)
prop_value = st.one_of(
    st.text(max_size=20),
    st.text(alphabet=" ab\u00e9\u4e2d\U0001f600", max_size=12),  # spaces, BMP, astral
    any_text,
    st.integers(0, 99),  # not a str: the Python path formats it
)
topics = st.sampled_from(["T", "TopicA", "%RETRY%g", "a|b", "bad/topic", "", "x" * 128, "\u00e9"])
hosts = st.one_of(
    st.sampled_from([("127.0.0.1", 10911), ("10.1.2.3", 0), ("1.2.3.4", 2**31 - 1)]),
    st.sampled_from([("not an ip", 1), ("1.2.3.4", 2**32), ("1.2.3.4", -1)]),
    st.tuples(st.ip_addresses(v=4).map(str), st.integers(0, 65535)),
)


def ints(lo: int, hi: int) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.integers(0, 9), st.integers(lo, hi), st.integers(2 * lo, 2 * hi), st.booleans()
    )


# Valid messages of exact types: what the C kernel must take without the Python path.
clean_text = st.one_of(
    st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x01\x02"), max_size=10),
    st.text(alphabet=" ab\u00e9\u4e2d\U0001f600", max_size=12),  # spaces, BMP, astral
)
valid_messages = st.builds(
    Message,
    topic=st.sampled_from(["T", "TopicA", "%RETRY%g"]),
    body=st.binary(max_size=300),
    properties=st.dictionaries(st.sampled_from([TAGS, KEYS, UNIQ_KEY, "a"]), clean_text),
    queue_id=st.integers(0, 3),
    flag=st.integers(*I32),
    sys_flag=st.integers(*I32),
    born_timestamp=st.integers(*I64),
    reconsume_times=st.integers(*I32),
    prepared_transaction_offset=st.integers(*I64),
    born_host=st.sampled_from([("127.0.0.1", 10911), ("10.1.2.3", 2**31 - 1), ("1.2.3.4", -2)]),
)
limits = st.sampled_from([codec.DEFAULT_MAX_MESSAGE_SIZE, 400, 700])

# Mostly odd values, with every way `prepare` can refuse a message mixed in.
wild_messages = st.builds(
    Message,
    topic=topics,
    body=st.one_of(
        st.binary(max_size=600),
        st.binary(max_size=20).map(bytearray),
        st.text(max_size=5),  # refused: not bytes
    ),
    properties=st.dictionaries(prop_key, prop_value, max_size=5),
    queue_id=ints(-1, 2**31 - 1),
    flag=ints(*I32),
    sys_flag=ints(*I32),
    born_timestamp=ints(*I64),
    born_host=hosts,
    reconsume_times=ints(*I32),
    prepared_transaction_offset=ints(*I64),
)
messages = st.one_of(valid_messages, wild_messages)


def c_prepare(msgs: list[Message], limit: int, seen: list[Message]) -> list[Prepared]:
    def reference(m: Message, lim: int) -> Prepared:
        seen.append(m)  # the message went to the Python path
        return codec.prepare(m, lim)

    batch = C.prepare_batch(msgs, limit, codec._valid_topics, codec._hosts, reference, Prepared)
    assert len(batch) == len(msgs)
    assert batch.largest == max((p.size for p in batch), default=0)
    return list(batch)  # each item built as the Prepared tuple Python would have made


def plain(msg: Message) -> bool:
    """Exact types only: the kind of message the C kernel must handle without Python."""
    ints = (msg.queue_id, msg.flag, msg.sys_flag, msg.born_timestamp, msg.reconsume_times)
    return (
        type(msg.body) is bytes
        and all(type(i) is int for i in (*ints, msg.prepared_transaction_offset))
        and all(type(k) is str and type(v) is str for k, v in msg.properties.items())
    )


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(msg=messages, limit=limits)
def test_prepare_matches_python_and_takes_plain_messages_itself(msg: Message, limit: int) -> None:
    expected = outcome(lambda: [codec.prepare(msg, limit)])  # also fills the name/host caches
    seen: list[Message] = []
    got = outcome(lambda: c_prepare([msg], limit, seen))
    assert got == expected
    if expected[0] == "ok":
        assert all(type(p) is Prepared for p in got[1])
        if plain(msg):
            assert seen == []  # the fast path took it


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(msgs=st.lists(messages, max_size=8), limit=limits)
def test_prepare_batch_fails_at_the_same_message(msgs: list[Message], limit: int) -> None:
    expected = outcome(lambda: [codec.prepare(m, limit) for m in msgs])
    assert outcome(lambda: c_prepare(msgs, limit, [])) == expected


def test_prepare_batch_public_entry_uses_the_kernel_when_built() -> None:
    c_path_in_use()
    msgs = [Message("T", b"body", {TAGS: "t", UNIQ_KEY: "u"}, queue_id=q) for q in range(3)]
    batch = codec.prepare_batch(msgs)
    assert isinstance(batch, C.PreparedBatch)
    assert list(batch) == [codec.prepare(m) for m in msgs]
    assert batch[-1] == codec.prepare(msgs[2])
    assert codec.largest_unit(batch) == codec.largest_unit(list(batch)) == batch[0].size
    with pytest.raises(IndexError):
        batch[3]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    msgs=st.lists(valid_messages, min_size=1, max_size=12),
    start=st.integers(0, 3),
    room=st.integers(-8, 3000),
    prefix=st.binary(max_size=40),
    base=st.integers(0, 2**40),
    now=st.integers(*I64),
    port=st.integers(*I32),
    known=st.dictionaries(st.tuples(st.sampled_from(["T", "TopicA"]), st.integers(0, 3)),
                          st.integers(0, 2**62), max_size=4),
)  # fmt: skip
def test_encode_run_matches_python(
    msgs: list[Message], start: int, room: int, prefix: bytes, base: int, now: int, port: int,
    known: dict[tuple[str, int], int],
) -> None:  # fmt: skip
    batch = codec.prepare_batch(msgs)  # the C batch, and its items as Prepared tuples below
    runs: list[tuple[Any, ...]] = []
    for encode_run in (
        codec._encode_run,
        lambda b, *a: C.encode_run(DispatchRequest, b, *a),
        lambda b, *a: C.encode_run(DispatchRequest, list(b), *a),
    ):
        taken: dict[tuple[str, int], int] = {}
        results: list[DispatchRequest] = []
        buf = bytearray(prefix)  # a run may follow bytes already in the buffer
        qtable = dict(known)
        args = (batch, start, room, base, now, b"\x0a\x00\x00\x01", port, qtable, taken)
        stop = outcome(lambda: encode_run(*args, results, buf))  # noqa: B023
        runs.append((stop, bytes(buf), taken, qtable, results, [type(r) for r in results]))
    assert runs[0] == runs[1] == runs[2]
    assert runs[0][0][0] == "ok"


def test_encode_run_refuses_inconsistent_prepared() -> None:
    p = codec.prepare(Message("T", b"abc"))
    bad = p._replace(size=p.size + 1)  # the C kernel would write past what it sized
    with pytest.raises(ValueError, match="do not add up"):
        C.encode_run(DispatchRequest, [bad], 0, 10_000, 0, 0, b"\0" * 4, 0, {}, {}, [], bytearray())


def test_body_crc_at_every_length_around_the_block_sizes() -> None:
    data = bytes(range(256)) * 8 + b"tail"  # 16-, 64- and 256-byte folds, then zlib's tail
    for n in range(0, len(data)):
        assert C.body_crc(data[:n]) == zlib.crc32(data[:n]) & 0x7FFFFFFF, n
        assert C.body_crc(data[n:]) == zlib.crc32(data[n:]) & 0x7FFFFFFF, n


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=5000), offset=st.integers(0, 15), big=st.booleans())
def test_body_crc_is_zlib_crc32(data: bytes, offset: int, big: bool) -> None:
    if big:  # whole-log sizes, where the kernel lets go of the GIL
        data = data * (70_000 // (len(data) + 1) + 1)
    view = memoryview(data)[offset:]  # any alignment, any buffer
    assert C.body_crc(view) == zlib.crc32(view) & 0x7FFFFFFF == codec._body_crc(view)


def test_requests_of_plain_values_are_left_out_of_the_gc() -> None:
    msgs = [Message("T", b"x", {UNIQ_KEY: "u"}), Message("T", b"x", {UNIQ_KEY: ["u"]})]  # type: ignore[dict-item]
    results: list[DispatchRequest] = []
    args = (0, 10_000, 0, 0, b"\0" * 4, 0, {}, {}, results, bytearray())
    C.encode_run(DispatchRequest, codec.prepare_batch(msgs), *args)
    assert results[1].uniq_key == ["u"]  # a list value: the Python path took it as it is
    assert [gc.is_tracked(r) for r in results] == [False, True]


def test_prepare_reads_fields_as_attribute_access_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel reads Message's slots directly; a changed class or a subclass is honoured."""

    class Renamed(Message):
        __slots__ = ()
        topic = property(lambda self: "TopicA", lambda self, value: None)  # type: ignore[assignment]

    def both(msg: Message) -> tuple[Any, Any]:
        return outcome(lambda: c_prepare([msg], 1 << 20, [])), outcome(
            lambda: [codec.prepare(msg, 1 << 20)]
        )

    msg = Message("T", b"body", {UNIQ_KEY: "u"}, queue_id=1)
    c, py = both(msg)  # the kernel learns where Message keeps its fields
    assert c == py and c[1][0].queue_id == 1
    monkeypatch.setattr(Message, "queue_id", property(lambda self: 2))
    c, py = both(msg)
    assert c == py and c[1][0].queue_id == 2
    monkeypatch.undo()
    c, py = both(msg)
    assert c == py and c[1][0].queue_id == 1
    c, py = both(Renamed("T", b"body"))
    assert c == py and c[1][0].topic == "TopicA"
