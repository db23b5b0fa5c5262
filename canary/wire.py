"""How messages travel between ranks: compact tuples for the per-iteration ones.

A :class:`Piece`, :class:`PieceBatch`, :class:`Signal` or :class:`ReportPart` crosses the wire
every iteration, often on the critical path between two workers. Pickled as a slots dataclass
holding a small numpy array, a piece costs several times more to pickle and unpickle than a tuple
of ints and the array's raw bytes (numpy's ``__reduce__`` is most of it). So those travel as
tuples tagged with a small int; every other message (they are
rare: hello, placement, done, shutdown, abort) travels pickled as it is, inside a tuple tagged 0,
so that any object, a tuple included, comes back as it was sent.

An array whose bytes exceed ``inline_limit`` does not ride in the tuple: :func:`pack` returns
it as a separate C-contiguous buffer for the transport to send raw (``Isend``) right behind the
header, and :func:`unpack` says which dtype and shape to receive it into. Arrays that raw bytes
cannot carry faithfully (object or structured dtypes, ndarray subclasses) are pickled with their
message, as before. A :class:`PieceBatch` carries only small pieces (the worker batches
those alone), so its arrays ride inline, as one byte string when they share dtype and shape (a
reduce's pieces do); otherwise the batch is pickled as it is. No MPI here:
``canary.mpi_transport`` does the sending.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from canary.messages import MigrateArray, Piece, PieceBatch, ReportPart, Signal

_OTHER, _PIECE, _SIGNAL, _REPORT, _BATCH, _MIGRATE = 0, 1, 2, 3, 4, 5


def _raw_ok(arr: Any) -> bool:
    return type(arr) is np.ndarray and not arr.dtype.hasobject and arr.dtype.fields is None


def pack(msg: Any, inline_limit: int) -> tuple[Any, np.ndarray | None]:
    """``(payload, buffer)``: what to pickle as the header, and the array to send raw behind it
    (None if nothing follows). ``msg`` is not modified; the buffer is a private copy, so a later
    in-place kernel cannot change data in flight, except a :class:`MigrateArray`'s, which its
    sender no longer holds."""
    t = type(msg)
    if t is Signal:
        return (_SIGNAL, msg.eid, msg.seq, msg.value), None
    if t is PieceBatch:
        pieces = msg.pieces
        arr0 = pieces[0].array
        if not (_raw_ok(arr0) and all(type(p.array) is np.ndarray and p.array.dtype == arr0.dtype
                                      and p.array.shape == arr0.shape for p in pieces)):
            return (_OTHER, msg), None
        # One header and one byte string for all: with a byte string per piece, a batch cost
        # about as much to pack and unpack as its pieces sent alone.
        return (_BATCH, msg.eid, tuple((p.eid, p.seq, p.dataset, p.src, p.dsts, p.versions)
                                       for p in pieces),
                arr0.dtype.str, arr0.shape,
                bytearray().join([p.array.tobytes() for p in pieces])), None
    if t is Piece or t is ReportPart or t is MigrateArray:
        arr = msg.array
        if not _raw_ok(arr):
            return (_OTHER, msg), None
        buf: np.ndarray | None = None
        if arr.nbytes > inline_limit:
            # a migrating partition is given up by its sender: no private copy (a moved
            # partition can be most of a worker's memory)
            buf = (np.ascontiguousarray(arr) if t is MigrateArray
                   else np.array(arr, copy=True, order="C"))
            data: bytearray | None = None
        else:
            data = bytearray(arr.tobytes())  # C order; a bytearray unpickles writable
        head = (arr.dtype.str, arr.shape, data)
        if t is Piece:
            return (_PIECE, msg.eid, msg.seq, msg.dataset, msg.src, msg.dsts, msg.versions,
                    head), buf
        if t is MigrateArray:
            return (_MIGRATE, msg.eid, msg.move, msg.dataset, head), buf
        return (_REPORT, msg.eid, msg.seq, msg.stage, msg.iteration, msg.index, msg.tasks,
                msg.seconds, head), buf
    return (_OTHER, msg), None


def unpack(payload: Any) -> tuple[Any, tuple[np.dtype, tuple[int, ...]] | None]:
    """The message a :func:`pack` payload stands for, and ``(dtype, shape)`` of the raw buffer
    that follows it (None if none does; the message's ``array`` is then set by the caller)."""
    tag = payload[0]
    if tag == _OTHER:
        return payload[1], None
    if tag == _SIGNAL:
        return Signal(payload[1], payload[2], payload[3]), None
    if tag == _BATCH:
        _, eid, heads, dtype_str, shape, data = payload
        rows = np.frombuffer(data, np.dtype(dtype_str)).reshape((len(heads), *shape))
        # rows[k, ...], not rows[k]: a 0-d piece must stay an array, not become a numpy scalar
        return PieceBatch(eid, tuple(Piece(pe, seq, dataset, src, dsts, versions, rows[k, ...])
                                     for k, (pe, seq, dataset, src, dsts, versions)
                                     in enumerate(heads))), None
    dtype_str, shape, data = payload[-1]
    dtype = np.dtype(dtype_str)
    arr: Any = None if data is None else np.frombuffer(data, dtype).reshape(shape)
    if tag == _PIECE:
        _, eid, seq, dataset, src, dsts, versions, _h = payload
        msg: Any = Piece(eid, seq, dataset, src, dsts, versions, arr)
    elif tag == _REPORT:
        _, eid, seq, stage, iteration, index, tasks, seconds, _h = payload
        msg = ReportPart(eid, seq, stage, iteration, index, arr, tasks, seconds)
    elif tag == _MIGRATE:
        _, eid, move, dataset, _h = payload
        msg = MigrateArray(eid, move, dataset, arr)
    else:
        raise ValueError(f"unknown message tag {tag!r} in {payload!r:.200}")
    return msg, (None if data is not None else (dtype, tuple(shape)))
