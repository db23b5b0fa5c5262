"""The wire format: every message comes back equal, arrays with their dtype, shape and values."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from canary.messages import Done, Hello, Piece, PieceBatch, ReportPart, Shutdown, Signal
from canary.wire import pack, unpack

LIMIT = 8192


class Tagged(np.ndarray):
    """An ndarray subclass (module level, so that pickle finds it)."""


def roundtrip(msg: object) -> object:
    """What the receiving rank gets: the header through pickle, the raw buffer copied."""
    payload, buf = pack(msg, LIMIT)
    got, raw = unpack(pickle.loads(pickle.dumps(payload, protocol=5)))
    if raw is None:
        assert buf is None
    else:
        assert buf is not None and buf.flags.c_contiguous
        assert (buf.dtype, buf.shape) == raw
        got.array = np.array(buf, copy=True)  # what Recv into a fresh buffer gives
    return got


ARRAYS = [
    np.arange(23, dtype=np.float64),
    np.arange(12, dtype=">i4").reshape(3, 4),  # byte order kept
    np.asfortranarray(np.arange(12.0).reshape(3, 4)),  # values kept (arrives C-ordered)
    np.arange(20.0).reshape(4, 5)[:, 1::2],  # a non-contiguous view
    np.array(3.5),  # 0-d
    np.zeros((0, 3)),
    np.arange(4000, dtype=np.float64),  # 32 KB: a raw buffer behind the header
    np.array([True, False]),
]


@pytest.mark.parametrize("arr", ARRAYS, ids=lambda a: f"{a.dtype}{a.shape}")
def test_pieces_and_report_parts_come_back_equal(arr: np.ndarray) -> None:
    piece = Piece(7, 3, 2, 1, (0, 4), (1, 2), arr)
    got = roundtrip(piece)
    assert isinstance(got, Piece)
    assert (got.eid, got.seq, got.dataset, got.src, got.dsts, got.versions) == (7, 3, 2, 1, (0, 4), (1, 2))
    assert got.array.dtype == arr.dtype and got.array.shape == arr.shape
    assert np.array_equal(got.array, arr)
    assert got.array.flags.writeable  # kernels may update a gathered piece in place
    part = ReportPart(9, 4, 5, (2, 1), 3, arr, 17, 0.25)
    back = roundtrip(part)
    assert isinstance(back, ReportPart) and np.array_equal(back.array, arr)
    assert (back.eid, back.seq, back.stage, back.iteration, back.index, back.tasks,
            back.seconds) == (9, 4, 5, (2, 1), 3, 17, 0.25)


def check_batch(sent: PieceBatch) -> None:
    got = roundtrip(sent)
    assert isinstance(got, PieceBatch) and got.eid == sent.eid
    assert len(got.pieces) == len(sent.pieces)
    for back, piece in zip(got.pieces, sent.pieces):
        assert (back.eid, back.seq, back.dataset, back.src, back.dsts, back.versions) == (
            piece.eid, piece.seq, piece.dataset, piece.src, piece.dsts, piece.versions)
        assert back.array.dtype == piece.array.dtype and back.array.shape == piece.array.shape
        assert np.array_equal(back.array, piece.array) and back.array.flags.writeable


@pytest.mark.parametrize("arr", ARRAYS, ids=lambda a: f"{a.dtype}{a.shape}")
def test_a_batch_of_like_pieces_travels_as_one_header_and_one_byte_string(arr: np.ndarray) -> None:
    pieces = tuple(Piece(10 + k, 3, 2, k, (0, k), (1, k + 1), np.asarray(arr + k) if arr.dtype != bool else arr)
                   for k in range(3))
    payload, buf = pack(PieceBatch(5, pieces), LIMIT)
    assert payload[0] != 0 and buf is None  # compact, not pickled; even 32 KB arrays inline
    check_batch(PieceBatch(5, pieces))
    got = roundtrip(PieceBatch(5, pieces))
    got.pieces[0].array[...] = 0  # a gather may update its piece in place: the others keep theirs
    assert np.array_equal(got.pieces[1].array, pieces[1].array)


def test_a_batch_of_unlike_pieces_is_pickled_whole_and_comes_back_equal() -> None:
    mixed = PieceBatch(6, tuple(Piece(10 + k, 3, 2, k, (0,), (k + 1,), a)
                                for k, a in enumerate(ARRAYS)))
    objects = PieceBatch(7, (mixed.pieces[0], Piece(1, 1, 1, 0, (0,), (1,), np.array([None]))))
    for batch in (mixed, objects):
        payload, buf = pack(batch, LIMIT)
        assert payload[0] == 0 and payload[1] is batch and buf is None
    check_batch(mixed)


def test_a_later_change_to_the_sent_array_does_not_reach_the_receiver() -> None:
    for n in (10, 4000):  # inline and raw buffer
        arr = np.ones(n)
        payload, buf = pack(Piece(1, 1, 1, 0, (0,), (1,), arr), LIMIT)
        arr[:] = 5.0  # an in-place kernel runs while the send is in flight
        got, raw = unpack(pickle.loads(pickle.dumps(payload)))
        values = buf if raw is not None else got.array
        assert values is not None and float(values.max()) == 1.0


def test_signals_travel_as_tuples_and_other_objects_pickled_as_they_are() -> None:
    payload, buf = pack(Signal(4, 11, False), LIMIT)
    assert type(payload) is tuple and buf is None
    assert roundtrip(Signal(4, 11, True)) == Signal(4, 11, True)
    for msg in (Hello(1, 0, "d", ["s"]), Done(2, 1, 30, {"Piece": 3}), Shutdown(3),
                (1, 2.5), ("a tuple", (3,))):  # tuples too: the transport carries any object
        payload, buf = pack(msg, LIMIT)
        assert payload == (0, msg) and payload[1] is msg and buf is None
        assert roundtrip(msg) == msg


def test_arrays_raw_bytes_cannot_carry_are_pickled_whole() -> None:
    objects = np.array([{"a": 1}, None], dtype=object)
    records = np.zeros(2, dtype=[("x", "f8"), ("n", "i4")])
    subclass = np.eye(2).view(Tagged)
    for arr in (objects, records, subclass):
        piece = Piece(1, 1, 1, 0, (0,), (1,), arr)
        payload, buf = pack(piece, LIMIT)
        assert payload[1] is piece and buf is None
        got = roundtrip(piece)
        assert type(got.array) is type(arr) and got.array.dtype == arr.dtype


def test_unknown_tags_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown message tag 99"):
        unpack((99, 1, ("<f8", (1,), bytearray(8))))
