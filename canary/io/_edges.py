"""Edge lists for graph apps: SNAP-style text and (m, 2) int64 .npy arrays."""

from __future__ import annotations

import os

import numpy as np

from canary.io import _kernels as K
from canary.io._common import (
    InputFormatError,
    PathLike,
    bom_note,
    check_exists,
    count_data_lines,
    line_of,
    map_npy,
    read_line_range,
    reject_binary,
    token,
)

_EXPECT = "expected 'SRC DST' with non-negative integer ids"
# What a binary file given as an edge list is not, and what it should be.
_TEXT = "an edge-list text file"
_TEXT_EXPECTED = "'SRC DST' lines of non-negative integer ids, or an (m, 2) integer .npy array"


def _is_npy(path: str) -> bool:
    return os.path.splitext(path)[1].lower() == ".npy"


def count_edges(path: PathLike, allow_empty: bool = False) -> int:
    """Number of edges in an edge file.

    ``.npy``: rows of the (m, 2) array, from the header only.  Text: lines that
    are neither blank nor '#' comments, in one fast pass (no parsing; malformed
    lines are reported by the readers).

    Raises FileNotFoundError if missing; InputFormatError if a .npy file is not an
    (m, 2) integer array, a text file is binary (holds a NUL byte), or there are no
    edges and ``allow_empty`` is False (a graph app cannot run on an empty graph).
    """
    p = check_exists(path)
    if _is_npy(p):
        m = int(_npy_edges(p).shape[0])
    else:
        m = count_data_lines(p, _TEXT, _TEXT_EXPECTED)
    if m == 0 and not allow_empty:
        expected = ("an (m, 2) integer array with m >= 1" if _is_npy(p)
                    else "at least one 'SRC DST' line")
        raise InputFormatError(f"{p}: no edges (expected {expected})")
    return m


def read_edges_range(
    path: PathLike, byte_start: int, byte_end: int, allow_extra_columns: bool = False
) -> np.ndarray:
    """Edges on the text lines that start in bytes [byte_start, byte_end).

    Returns a C-contiguous (m, 2) int64 array of (src, dst) in file order.
    Format: whitespace-separated ``SRC DST`` per line, ids non-negative int64
    (not necessarily contiguous); '#' starts a comment (whole line or the rest
    of a line); blank lines are skipped.  A third and further columns (weights,
    timestamps) are an error unless ``allow_extra_columns`` is True, in which
    case they are ignored unparsed.  Use with :func:`split_byte_ranges`: the
    ranges together give every edge exactly once.  An empty range gives (0, 2).

    Raises FileNotFoundError; ValueError for a range outside the file;
    InputFormatError naming file and true 1-based line for a line with one
    field, a non-integer, negative or out-of-int64 id, or extra columns (or
    saying that the file is binary, when the range holds a NUL byte).
    """
    p = check_exists(path)
    if _is_npy(p):
        raise InputFormatError(f"{p}: read_edges_range reads text; use read_edges_rows for .npy")
    buf, _, line = read_line_range(p, byte_start, byte_end)
    return _parse(p, buf, line, allow_extra_columns)


def read_edges_rows(path: PathLike, start: int, stop: int | None) -> np.ndarray:
    """Edges [start, stop) of an (m, 2) integer .npy array, via a memory map.

    Returns a C-contiguous (stop - start, 2) int64 copy (``stop=None``: to the
    end).  Raises FileNotFoundError; ValueError for a range outside the array;
    InputFormatError if the array is not (m, 2) integer or holds a negative id
    (the message names the 0-based row).
    """
    p = check_exists(path)
    if not _is_npy(p):
        raise InputFormatError(f"{p}: read_edges_rows reads .npy; use read_edges_range for text")
    a = _npy_edges(p)
    m = int(a.shape[0])
    stop = m if stop is None else stop
    if not (0 <= start <= stop <= m):
        raise ValueError(f"{p}: edge range [{start}, {stop}) is outside the file's {m} edges")
    if a.dtype.kind == "u" and a.dtype.itemsize == 8:
        part = np.array(a[start:stop], copy=True)
        big = part > np.iinfo(np.int64).max
        if big.any():
            i = int(np.argmax(big.any(axis=1)))
            raise InputFormatError(
                f"{p}: row {start + i} (0-based) has an id above int64's maximum"
            )
    out = np.array(a[start:stop], dtype=np.int64, order="C", copy=True)
    neg = out < 0
    if neg.any():
        i = int(np.argmax(neg.any(axis=1)))
        raise InputFormatError(
            f"{p}: row {start + i} (0-based) has a negative id {out[i].tolist()} ({_EXPECT})"
        )
    return out


def read_edges(path: PathLike, allow_extra_columns: bool = False) -> np.ndarray:
    """All edges of a text or .npy edge file as (m, 2) int64 (for tests and small graphs).

    Raises like :func:`read_edges_range` / :func:`read_edges_rows`, and
    InputFormatError if the file has no edges.
    """
    p = check_exists(path)
    if _is_npy(p):
        e = read_edges_rows(p, 0, None)
    else:
        e = read_edges_range(p, 0, os.path.getsize(p), allow_extra_columns)
    if e.shape[0] == 0:
        raise InputFormatError(f"{p}: no edges (expected at least one 'SRC DST' line)")
    return e


def _npy_edges(p: str) -> np.ndarray:
    a = map_npy(p)
    if a.ndim != 2 or a.shape[1] != 2 or a.dtype.kind not in "iu":
        raise InputFormatError(
            f"{p}: array has shape {a.shape} and dtype {a.dtype} (expected (m, 2) integer edges)"
        )
    return a


def _parse(p: str, buf: np.ndarray, line: int, allow_extra: bool) -> np.ndarray:
    cap = int(np.count_nonzero(buf == K.NL)) + 1
    out = np.empty((cap, 2), np.int64)
    m, err, s, e = K.edges_parse(buf, out, allow_extra)
    if err:
        reject_binary(p, buf, line, _TEXT, _TEXT_EXPECTED)
        ln = line_of(buf, line, int(s))
        tok = token(buf, int(s), int(e))
        comma = "; comma-separated (CSV) lines are not an edge list" if "," in tok else ""
        msg = {
            K.E_ONE_FIELD: f"line '{tok}' has one field ({_EXPECT}{comma})",
            K.E_NOT_INT: f"vertex id '{tok}' is not an integer ({_EXPECT}{comma})",
            K.E_NEGATIVE: f"vertex id '{tok}' is negative ({_EXPECT})",
            K.E_OVERFLOW: f"vertex id '{tok}' does not fit in int64 ({_EXPECT})",
            K.E_EXTRA: (
                f"line '{tok}' has more than two fields ({_EXPECT}; keep the first two columns, "
                "or read it with read_edges(..., allow_extra_columns=True))"
            ),
        }.get(int(err), f"malformed line '{tok}'")
        raise InputFormatError(f"{p}:{ln}: {msg}{bom_note(tok)}")
    return out[:m].copy() if m < cap // 2 else np.ascontiguousarray(out[:m])
