"""C dispatch kernels against their Python reference: same rows, entry bytes, key hashes."""

from __future__ import annotations

from array import array
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker_runtime.store import consume_queue, dispatcher, index_file, index_service
from broker_runtime.store.record_codec import DispatchRequest
from tests.unit.broker_runtime.accel_helpers import c_kernels, outcome

C = c_kernels()
I32 = (-(2**31), 2**31 - 1)
I64 = (-(2**63), 2**63 - 1)
quick = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Keys as stored messages carry them: any text a property can hold (no lone surrogates).
key_text = st.one_of(
    st.text(st.characters(exclude_categories=["Cs"]), max_size=8),
    st.text(alphabet=" ab\u00e9\u4e2d\U0001f600", max_size=10),  # spaces, BMP, astral
)
requests = st.builds(
    DispatchRequest,
    topic=st.sampled_from(["T", "TopicA", "%RETRY%g", "\u00e9t\u00e9"]),
    queue_id=st.integers(0, 3),
    queue_offset=st.integers(0, 2**40),
    phys_offset=st.integers(0, 2**50),
    size=st.integers(1, 2**20),
    store_timestamp=st.integers(*I64),
    tags_code=st.integers(*I32),
    uniq_key=st.none() | key_text,
    keys=st.none() | key_text,
)


@quick
@given(reqs=st.lists(requests, max_size=30))
def test_split_requests_matches_python(reqs: list[DispatchRequest]) -> None:
    by_queue, index_rows = C.split_requests(reqs)
    ref_by_queue, ref_index_rows = dispatcher._split_requests(reqs)
    # Views over the requests (no list per queue): the same rows, queue order too.
    assert [(k, list(v)) for k, v in by_queue.items()] == list(ref_by_queue.items())
    assert list(index_rows) == ref_index_rows
    # The kernels that read the views see the same rows (offsets renumbered: small gaps).
    renumbered = [r._replace(queue_offset=i) for i, r in enumerate(reqs)]
    for rows in C.split_requests(renumbered)[0].values():
        first = rows[0].queue_offset
        assert C.pack_entries(rows, first, 0) == C.pack_entries(list(rows), first, 0)
    got = outcome(lambda: C.index_keys(index_rows, 2**40, lambda _at: 1))
    assert got == outcome(lambda: C.index_keys(list(index_rows), 2**40, lambda _at: 1))


# Queue offsets that mostly follow on, with repeats (re-dispatch) and jumps (gaps).
steps = st.lists(st.sampled_from([0, 1, 1, 1, 2, 5, -1]), max_size=40)


@quick
@given(
    steps=steps,
    first=st.integers(0, 100),
    expected=st.integers(-1, 120),
    max_phys_end=st.integers(0, 3000),
    sizes=st.lists(st.integers(1, 200), min_size=40, max_size=40),
    tags=st.integers(*I64),
)
def test_pack_entries_matches_python(
    steps: list[int], first: int, expected: int, max_phys_end: int, sizes: list[int], tags: int
) -> None:
    reqs, qo, phys = [], first, 0
    for step, size in zip(steps, sizes, strict=False):
        qo += step
        reqs.append(DispatchRequest("T", 0, qo, phys, size, 0, tags, None, None))
        phys += size
    got = C.pack_entries(reqs, expected, max_phys_end)
    assert got == consume_queue._pack_entries(reqs, expected, max_phys_end)
    assert type(got[0]) is bytearray


index_rows = st.tuples(
    st.sampled_from(["T", "TopicA", "\u00e9t\u00e9", "\U0001f600"]),
    st.integers(90, 110),  # around `end`
    st.integers(*I64),
    st.none() | key_text,
    st.none() | key_text,
)


@quick
@given(
    rows=st.lists(index_rows, max_size=25),
    end=st.integers(-1, 105),
    held=st.integers(0, 4),  # keys of the message at `end` the newest file holds
)
def test_index_keys_matches_python(
    rows: list[tuple[str, int, int, str | None, str | None]], end: int, held: int
) -> None:
    rows.sort(key=lambda r: r[1])  # the log's order
    calls: list[list[int]] = [[], []]

    def tail_counter(k: int) -> Any:
        def tail_count(at: int) -> int:
            calls[k].append(at)
            return held

        return tail_count

    got = outcome(lambda: [list(col) for col in C.index_keys(rows, end, tail_counter(0))])
    ref = outcome(
        lambda: [list(col) for col in index_service._index_keys(rows, end, tail_counter(1))]
    )
    assert got == ref
    assert calls[0] == calls[1]


@quick
@given(
    slots=st.integers(1, 16),
    count=st.integers(1, 30),
    n=st.integers(0, 12),
    start=st.integers(0, 3),
    data=st.data(),
)
def test_write_entries_matches_python(
    slots: int, count: int, n: int, start: int, data: st.DataObject
) -> None:
    index_num = count + n + 2
    at = index_file.HEADER_SIZE + slots * 4
    size = index_file.file_size(slots, index_num)
    # Slots already pointing at older, newer (a crash) or negative entries.
    filler = st.integers(-3, count + 5).map(lambda v: v.to_bytes(4, "big", signed=True))
    head = b"".join(data.draw(st.lists(filler, min_size=slots, max_size=slots)))
    image = bytearray(index_file.HEADER_SIZE) + head + bytes(size - at)
    hashes = data.draw(st.lists(st.integers(0, 2**31 - 1), min_size=start + n, max_size=start + n))
    phys = data.draw(st.lists(st.integers(*I64), min_size=start + n, max_size=start + n))
    times = data.draw(st.lists(st.integers(*I64), min_size=start + n, max_size=start + n))
    base = data.draw(st.sampled_from([1 << 62, 1_700_000_000_000]) | st.integers(*I64))
    args = (hashes, phys, times, start, start + n, count, slots, at, base)
    c_image, py_image, c_arrays = bytearray(image), bytearray(image), bytearray(image)
    C.write_entries(c_image, *args)
    index_file._write_entries(py_image, *args)
    assert c_image == py_image
    columns = [array("q", col) for col in (hashes, phys, times)]  # as index_keys returns them
    C.write_entries(c_arrays, *columns, *args[3:])
    assert c_arrays == py_image
