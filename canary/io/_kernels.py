"""Numba kernels that scan and parse the bytes of svmlight and edge-list text.

Every kernel works on a uint8 array holding *complete* lines (the caller cuts
blocks at newlines), so no state crosses a call.  Kernels never raise: a
malformed token is reported as ``(error code, token start, token end)`` and the
Python caller turns it into an :class:`~canary.io.InputFormatError` with the
file name and the true line number, which keeps the message logic in one place
and the hot loops free of string formatting.

Floats are parsed exactly: the kernel handles the common case with Clinger's
fast path (an integer mantissa below 2**53 times or divided by an exactly
representable power of ten is correctly rounded by one IEEE operation) and
flags every other token as "slow" so that Python's ``float`` (correctly
rounded, like C's ``strtod`` that scikit-learn uses) converts it.  The result is
bit-identical to ``sklearn.datasets.load_svmlight_file``.
"""

from __future__ import annotations

import numba as nb
import numpy as np

NL = 10
HASH = 35
COLON = 58
COMMA = 44

# Error codes returned by the kernels (0 = no error).
E_NO_COLON = 1
E_INDEX_NOT_INT = 2
E_INDEX_ZERO = 3
E_INDEX_ORDER = 4
E_INDEX_RANGE = 5
E_MULTILABEL = 6
E_QID = 7
E_INDEX_TOO_LARGE = 8
E_ONE_FIELD = 11
E_NOT_INT = 12
E_NEGATIVE = 13
E_OVERFLOW = 14
E_EXTRA = 15

_POW10 = np.array([10.0**k for k in range(23)], dtype=np.float64)
_TWO53 = 1 << 53
_INT64_MAX = (1 << 63) - 1


@nb.njit(cache=True, inline="always")
def _is_ws(c: int) -> bool:
    # Space, tab, CR (so CRLF files work), vertical tab, form feed.
    return c == 32 or c == 9 or c == 13 or c == 11 or c == 12


@nb.njit(cache=True, inline="always")
def _is_term(c: int) -> bool:
    # A token ends at whitespace, end of line or the start of a comment.
    return c == 32 or c == 9 or c == 13 or c == 11 or c == 12 or c == NL or c == HASH


@nb.njit(cache=True, inline="always")
def _next_data(buf: np.ndarray, i: int) -> int:  # pragma: no cover - compiled
    """Offset of the first non-blank byte of the next data line at or after ``i``, skipping
    blank lines and '#' comment lines; ``buf.size`` if there is none."""
    n = buf.size
    while i < n:
        while i < n and _is_ws(buf[i]):
            i += 1
        if i >= n:
            break
        c = buf[i]
        if c == NL:
            i += 1
        elif c == HASH:
            while i < n and buf[i] != NL:
                i += 1
            i += 1
        else:
            return i
    return n


@nb.njit(cache=True)
def count_data_lines(buf: np.ndarray) -> int:  # pragma: no cover - compiled
    """Number of lines that are neither blank nor comments ('#' first)."""
    n = buf.size
    i = 0
    rows = 0
    while i < n:
        while i < n and _is_ws(buf[i]):
            i += 1
        if i < n and buf[i] != NL and buf[i] != HASH:
            rows += 1
        while i < n and buf[i] != NL:
            i += 1
        i += 1
    return rows


@nb.njit(cache=True)
def nth_data_line_start(buf: np.ndarray, k: int) -> int:  # pragma: no cover - compiled
    """Byte offset of the start of the k-th (0-based) data line, or -1."""
    n = buf.size
    i = 0
    rows = 0
    while i < n:
        start = i
        while i < n and _is_ws(buf[i]):
            i += 1
        if i < n and buf[i] != NL and buf[i] != HASH:
            if rows == k:
                return start
            rows += 1
        while i < n and buf[i] != NL:
            i += 1
        i += 1
    return -1


@nb.njit(cache=True)
def svm_scan(buf: np.ndarray) -> tuple[int, int]:  # pragma: no cover - compiled
    """(data rows, largest feature index) without parsing values.

    Malformed tokens are skipped here; the parser reports them when the rows
    are read.  Indices of 19 or more digits are ignored (the parser rejects
    them) so the scan cannot overflow.
    """
    n = buf.size
    i = 0
    rows = 0
    maxidx = 0
    while i < n:
        while i < n and _is_ws(buf[i]):
            i += 1
        if i >= n:
            break
        c = buf[i]
        if c == NL:
            i += 1
            continue
        if c != HASH:
            rows += 1
            while i < n and not _is_term(buf[i]):  # the label
                i += 1
            while True:
                while i < n and _is_ws(buf[i]):
                    i += 1
                if i >= n or buf[i] == NL or buf[i] == HASH:
                    break
                v = 0
                nd = 0
                while i < n and buf[i] >= 48 and buf[i] <= 57:
                    if nd < 18:
                        v = v * 10 + (buf[i] - 48)
                    nd += 1
                    i += 1
                if i < n and buf[i] == COLON and 0 < nd <= 18 and v > maxidx:
                    maxidx = v
                while i < n and not _is_term(buf[i]):
                    i += 1
        while i < n and buf[i] != NL:
            i += 1
        i += 1
    return rows, maxidx


@nb.njit(cache=True)
def parse_float(buf: np.ndarray, s: int, e: int) -> tuple[float, bool]:  # pragma: no cover
    """Parse buf[s:e] as a decimal float; returns (value, needs_slow_path)."""
    i = s
    neg = False
    if i < e and (buf[i] == 43 or buf[i] == 45):
        neg = buf[i] == 45
        i += 1
    mant = 0
    sig = 0  # significant digits accumulated into mant
    exp10 = 0
    any_digit = False
    while i < e and buf[i] >= 48 and buf[i] <= 57:
        any_digit = True
        d = buf[i] - 48
        if mant == 0 and d == 0:
            pass  # leading zeros carry no information
        elif sig < 18:
            mant = mant * 10 + d
            sig += 1
        else:
            return 0.0, True
        i += 1
    if i < e and buf[i] == 46:  # '.'
        i += 1
        while i < e and buf[i] >= 48 and buf[i] <= 57:
            any_digit = True
            d = buf[i] - 48
            if mant == 0 and d == 0:
                exp10 -= 1
            elif sig < 18:
                mant = mant * 10 + d
                sig += 1
                exp10 -= 1
            else:
                return 0.0, True
            i += 1
    if not any_digit:
        return 0.0, True
    if i < e and (buf[i] == 101 or buf[i] == 69):  # 'e' / 'E'
        i += 1
        eneg = False
        if i < e and (buf[i] == 43 or buf[i] == 45):
            eneg = buf[i] == 45
            i += 1
        if i >= e:
            return 0.0, True
        ev = 0
        while i < e and buf[i] >= 48 and buf[i] <= 57:
            if ev < 100000:
                ev = ev * 10 + (buf[i] - 48)
            i += 1
        exp10 += -ev if eneg else ev
    if i != e:
        return 0.0, True
    if mant == 0:
        return (-0.0 if neg else 0.0), False
    if mant > _TWO53 or exp10 < -22 or exp10 > 22:
        return 0.0, True
    v = float(mant)
    if exp10 >= 0:
        v = v * _POW10[exp10]
    else:
        v = v / _POW10[-exp10]
    return (-v if neg else v), False


@nb.njit(cache=True)
def svm_parse(
    buf: np.ndarray,
    n_features: int,
    labels: np.ndarray,
    row_start: np.ndarray,
    indptr: np.ndarray,
    indices: np.ndarray,
    values: np.ndarray,
    slow_pos: np.ndarray,
    slow_s: np.ndarray,
    slow_e: np.ndarray,
) -> tuple[int, int, int, int, int, int]:  # pragma: no cover - compiled
    """Parse svmlight lines into CSR arrays.

    Returns (rows, nnz, n_slow, error code, error token start, error token end).
    ``slow_pos`` holds the nnz position of a value needing Python's float, or
    ``-(row + 1)`` for a label.  n_slow may exceed the slow arrays' size, in
    which case the caller re-runs with bigger ones.
    """
    n = buf.size
    i = 0
    rows = 0
    nnz = 0
    nslow = 0
    cap = slow_pos.size
    indptr[0] = 0
    while True:
        i = _next_data(buf, i)
        if i >= n:
            break
        row_start[rows] = i
        s = i
        while i < n and not _is_term(buf[i]):
            i += 1
        for j in range(s, i):
            if buf[j] == COMMA:
                return rows, nnz, nslow, E_MULTILABEL, s, i
        v, slow = parse_float(buf, s, i)
        labels[rows] = v
        if slow:
            if nslow < cap:
                slow_pos[nslow] = -(rows + 1)
                slow_s[nslow] = s
                slow_e[nslow] = i
            nslow += 1
        prev = 0
        first = True
        while True:
            while i < n and _is_ws(buf[i]):
                i += 1
            if i >= n or buf[i] == NL or buf[i] == HASH:
                break
            s = i
            while i < n and not _is_term(buf[i]):
                i += 1
            e = i
            k = s
            while k < e and buf[k] != COLON:
                k += 1
            if k == e:
                return rows, nnz, nslow, E_NO_COLON, s, e
            if first and k - s == 3 and buf[s] == 113 and buf[s + 1] == 105 and buf[s + 2] == 100:
                # "qid:N" directly after the label: validated, then ignored.
                first = False
                if k + 1 == e:
                    return rows, nnz, nslow, E_QID, s, e
                for j in range(k + 1, e):
                    if buf[j] < 48 or buf[j] > 57:
                        return rows, nnz, nslow, E_QID, s, e
                continue
            first = False
            if k == s:
                return rows, nnz, nslow, E_INDEX_NOT_INT, s, e
            idx = 0
            for j in range(s, k):
                if buf[j] < 48 or buf[j] > 57:
                    return rows, nnz, nslow, E_INDEX_NOT_INT, s, e
                if idx >= 100_000_000_000_000_000:
                    return rows, nnz, nslow, E_INDEX_TOO_LARGE, s, e
                idx = idx * 10 + (buf[j] - 48)
            if idx == 0:
                return rows, nnz, nslow, E_INDEX_ZERO, s, e
            if idx <= prev:
                return rows, nnz, nslow, E_INDEX_ORDER, s, e
            if n_features >= 0 and idx > n_features:
                return rows, nnz, nslow, E_INDEX_RANGE, s, e
            prev = idx
            v, slow = parse_float(buf, k + 1, e)
            indices[nnz] = idx - 1
            values[nnz] = v
            if slow:
                if nslow < cap:
                    slow_pos[nslow] = nnz
                    slow_s[nslow] = k + 1
                    slow_e[nslow] = e
                nslow += 1
            nnz += 1
        while i < n and buf[i] != NL:
            i += 1
        i += 1
        rows += 1
        indptr[rows] = nnz
    return rows, nnz, nslow, 0, 0, 0


@nb.njit(cache=True)
def edges_parse(
    buf: np.ndarray, out: np.ndarray, allow_extra: bool
) -> tuple[int, int, int, int]:  # pragma: no cover - compiled
    """Parse 'SRC DST' lines into out[:m]; returns (m, error code, start, end).

    For E_ONE_FIELD and E_EXTRA the span is the whole line (without newline).
    """
    n = buf.size
    i = 0
    m = 0
    while True:
        i = _next_data(buf, i)
        if i >= n:
            break
        line_start = i
        for f in range(2):
            while i < n and _is_ws(buf[i]):
                i += 1
            if i >= n or buf[i] == NL or buf[i] == HASH:
                le = i
                while le < n and buf[le] != NL:
                    le += 1
                return m, E_ONE_FIELD, line_start, le
            s = i
            while i < n and not _is_term(buf[i]):
                i += 1
            j = s
            neg = False
            if buf[j] == 43 or buf[j] == 45:
                neg = buf[j] == 45
                j += 1
            if j == i:
                return m, E_NOT_INT, s, i
            v = 0
            while j < i:
                d = buf[j] - 48
                if d < 0 or d > 9:
                    return m, E_NOT_INT, s, i
                if v > (_INT64_MAX - d) // 10:
                    # Keep scanning so that "1x" reads as "not an integer".
                    for jj in range(j, i):
                        if buf[jj] < 48 or buf[jj] > 57:
                            return m, E_NOT_INT, s, i
                    return m, E_NEGATIVE if neg else E_OVERFLOW, s, i
                v = v * 10 + d
                j += 1
            if neg and v != 0:
                return m, E_NEGATIVE, s, i
            out[m, f] = v
        while i < n and _is_ws(buf[i]):
            i += 1
        if i < n and buf[i] != NL and buf[i] != HASH and not allow_extra:
            le = i
            while le < n and buf[le] != NL:
                le += 1
            return m, E_EXTRA, line_start, le
        while i < n and buf[i] != NL:
            i += 1
        i += 1
        m += 1
    return m, 0, 0, 0
