"""Row-partitioned tabular data: .npy, .npz, HDF5 and svmlight/LIBSVM text."""

from __future__ import annotations

import math
import os
import zipfile
from typing import Any

import numpy as np

from canary.io import _kernels as K
from canary.io._common import (
    HDF5_FILE,
    ZIP_ARCHIVE,
    InputFormatError,
    PathLike,
    binary_kind,
    bom_note,
    check_exists,
    file_kind,
    iter_text_blocks,
    line_of,
    locate_data_lines,
    map_npy,
    read_line_range,
    reject_binary,
    token,
)

_EXPECT_FEATURE = "expected INDEX:VALUE with 1-based integer INDEX"


def _index_zero(tok: str) -> str:
    """What a feature index 0 in token ``tok`` is told: most such files are 0-based ones."""
    return (f"feature index 0 in '{tok}' is not 1-based ({_EXPECT_FEATURE} >= 1; scikit-learn's "
            "dump_svmlight_file writes 0-based indices unless given zero_based=False)")


# What a binary file given as svmlight is not, and what a tabular file should be.
_SVM_TEXT = "svmlight text"
_SVM_EXPECTED = ("'LABEL INDEX:VALUE ...' lines, or a .npy, .npz or .h5 file named so; "
                 "see docs/formats.md")


def _kind(path: str) -> str:
    ext = os.path.splitext(path)[1].lower()
    if ext == ".npy":
        return "npy"
    if ext == ".npz":
        return "npz"
    if ext in (".h5", ".hdf5"):
        return "h5"
    return "svmlight"


# ---------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------


def _first_index_zero(path: str, limit: int = 1 << 20) -> tuple[int, str] | None:
    """(line number, token) of the first ``0:VALUE`` feature in the first ``limit`` bytes of an
    svmlight file, or None."""
    with open(path, "rb") as f:
        head = f.read(limit).decode("utf-8", "replace")
    for k, line in enumerate(head.splitlines(), 1):
        for tok in line.split("#", 1)[0].split()[1:]:
            index, colon, _ = tok.partition(":")
            if colon and index.isdigit() and int(index) == 0:
                return k, tok
    return None


def count_rows(path: PathLike, n_features: int | None = None) -> tuple[int, int]:
    """(n_rows, n_features) of a tabular file, cheaply.

    Formats by extension: ``.npy`` (a 2-D array), ``.npz`` (array ``X``,
    optional ``y``), ``.h5``/``.hdf5`` (dataset ``X``, optional ``y``); any
    other extension is svmlight/LIBSVM text.  Binary formats read only the
    header/metadata.  Svmlight text takes one fast pass (no value parsing):
    n_rows counts lines that are neither blank nor comments, n_features is the
    largest 1-based feature index, or ``n_features`` if given.

    Raises FileNotFoundError if the file is missing; InputFormatError if it is
    not what its extension says (a binary file read as svmlight text, an empty
    or foreign file as ``.npy``/``.npz``/``.h5``; the message says what the file
    is not and what was expected), has no data rows, a binary array is not 2-D
    numeric, ``y`` does not match ``X``, an svmlight file has no feature on any
    line and ``n_features`` is not given, or a feature index exceeds the given
    ``n_features``.
    """
    p = check_exists(path)
    kind = _kind(p)
    if kind == "svmlight":
        n, d = _svm_count(p)
        if n > 0 and d == 0 and n_features is None:
            zero = _first_index_zero(p)
            if zero is not None:  # features there, all at index 0: a 0-based file
                line, tok = zero
                raise InputFormatError(f"{p}:{line}: {_index_zero(tok)}")
            raise InputFormatError(
                f"{p}: no line has an INDEX:VALUE feature (expected 'LABEL INDEX:VALUE ...' "
                "lines; a table of plain numbers is not svmlight: save it with numpy.save as "
                ".npy, or pass n_features to read label-only rows)"
            )
        if n_features is not None:
            if d > n_features:
                raise InputFormatError(
                    f"{p}: largest feature index is {d} but n_features={n_features} was given"
                )
            d = n_features
    else:
        n, d = _binary_shape(p)
        if n_features is not None and n_features != d:
            raise InputFormatError(f"{p}: X has {d} columns but n_features={n_features} was given")
    if n == 0:
        raise InputFormatError(f"{p}: no data rows (expected at least one row)")
    return n, d


def read_rows(
    path: PathLike,
    start: int,
    stop: int | None,
    n_features: int | None = None,
    need_labels: bool = True,
    binary_labels: bool = False,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Rows [start, stop) of a tabular file as (X, y).

    X is a C-contiguous float64 array of shape (stop - start, d) and y a float64
    array of shape (stop - start,), or None when ``need_labels`` is False.
    ``stop=None`` means the last row.  Binary formats read only that slice
    (memory map / HDF5 slicing).  Svmlight text is scanned quickly up to the
    stop row, and only rows [start, stop) are parsed; d is ``n_features`` or,
    if None, the largest feature index in the *whole* file (so every worker
    agrees; pass the value from :func:`count_rows` to skip that scan).  Rows are
    exactly those ``sklearn.datasets.load_svmlight_file(path,
    zero_based=False)`` returns, densified.

    With ``binary_labels`` labels must be in {-1, 0, 1} and -1 becomes 0.

    Raises FileNotFoundError if missing; ValueError for a row range outside
    the file; InputFormatError (naming file and line, or row for binary
    formats) for malformed data, NaN/inf, missing labels when ``need_labels``,
    or non-binary labels when ``binary_labels``.
    """
    p = check_exists(path)
    kind = _kind(p)
    if kind == "svmlight":
        return _svm_read_rows(p, start, stop, n_features, need_labels, binary_labels)
    X, y, start = _binary_read_rows(p, start, stop, n_features, need_labels)
    if y is not None and binary_labels:
        y = _binarise(p, y, start, None)
    return X, y


def read_svmlight_range(
    path: PathLike,
    byte_start: int,
    byte_end: int,
    n_features: int,
    need_labels: bool = True,
    binary_labels: bool = False,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Parse the svmlight lines that start in bytes [byte_start, byte_end).

    Use with :func:`split_byte_ranges`: each worker reads its own range and the
    ranges together yield every row exactly once, in file order.  ``n_features``
    is required so all workers produce the same width (get it from
    :func:`count_rows`).  Errors name the true line number in the file.

    Returns (X, y) like :func:`read_rows`.  Raises FileNotFoundError,
    ValueError for a range outside the file, InputFormatError for bad data.
    """
    p = check_exists(path)
    buf, _, line = read_line_range(p, byte_start, byte_end)
    X, y, rs = _svm_parse(p, buf, line, n_features)
    if binary_labels:
        y = _binarise(p, y, None, (buf, line, rs))
    return X, (y if need_labels else None)


# ---------------------------------------------------------------------------
# svmlight
# ---------------------------------------------------------------------------


def _svm_count(p: str) -> tuple[int, int]:
    """(data rows, largest feature index); raises InputFormatError if the file is binary."""
    rows = 0
    d = 0
    for _, block in iter_text_blocks(p, _SVM_TEXT, _SVM_EXPECTED):
        r, m = K.svm_scan(np.frombuffer(block, np.uint8))
        rows += int(r)
        d = max(d, int(m))
    return rows, d


def _svm_read_rows(
    p: str,
    start: int,
    stop: int | None,
    n_features: int | None,
    need_labels: bool,
    binary_labels: bool,
) -> tuple[np.ndarray, np.ndarray | None]:
    total: int | None = None
    if n_features is None or stop is None:
        total, d_seen = _svm_count(p)
        if n_features is None:
            n_features = d_seen
    if stop is None:
        assert total is not None
        stop = total
    if not (0 <= start <= stop):
        raise ValueError(f"{p}: invalid row range [{start}, {stop})")
    b0, b1, line, seen = locate_data_lines(p, start, stop)
    if seen >= 0 and stop > seen:
        raise ValueError(f"{p}: row range [{start}, {stop}) exceeds the file's {seen} rows")
    with open(p, "rb") as f:
        f.seek(b0)
        buf = np.frombuffer(f.read(b1 - b0), np.uint8)
    X, y, rs = _svm_parse(p, buf, line, n_features)
    assert X.shape[0] == stop - start
    if binary_labels:
        y = _binarise(p, y, None, (buf, line, rs))
    return X, (y if need_labels else None)


def _svm_parse(
    p: str, buf: np.ndarray, line: int, d: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Parse complete svmlight lines; returns (dense X, labels, row start offsets)."""
    max_rows = int(np.count_nonzero(buf == K.NL)) + 1
    max_nnz = int(np.count_nonzero(buf == K.COLON))
    labels = np.empty(max_rows, np.float64)
    row_start = np.empty(max_rows, np.int64)
    indptr = np.empty(max_rows + 1, np.int64)
    indices = np.empty(max_nnz, np.int64)
    values = np.empty(max_nnz, np.float64)
    # Tokens outside the float fast path are usually a few percent; size for
    # 1 in 8 so the kernel rarely has to run twice.
    cap = max(1024, (max_nnz + max_rows) // 8)
    while True:
        sp = np.empty(cap, np.int64)
        ss = np.empty(cap, np.int64)
        se = np.empty(cap, np.int64)
        rows, nnz, nslow, err, es, ee = K.svm_parse(
            buf, d, labels, row_start, indptr, indices, values, sp, ss, se
        )
        if err:
            _svm_error(p, buf, line, d, int(err), int(es), int(ee))
        if nslow <= cap:
            break
        cap = int(nslow)  # rare: many values outside the fast path; parse again
    if nslow:
        _svm_slow_all(p, buf, line, labels, values, indices, sp[:nslow], ss[:nslow], se[:nslow])
    X = np.zeros((rows, d), np.float64)
    counts = np.diff(indptr[: rows + 1])
    X[np.repeat(np.arange(rows), counts), indices[:nnz]] = values[:nnz]
    return X, labels[:rows].copy(), row_start[:rows].copy()


def _svm_slow_all(
    p: str,
    buf: np.ndarray,
    line: int,
    labels: np.ndarray,
    values: np.ndarray,
    indices: np.ndarray,
    sp: np.ndarray,
    ss: np.ndarray,
    se: np.ndarray,
) -> None:
    """Convert every token the kernel's fast path declined, with Python's exact float.

    One list comprehension of float() converts them all cheaply; only if it
    fails (or meets NaN/inf or an underscore, which Python accepts but strtod
    does not) do we go token by token to name the culprit.
    """
    raw = buf.tobytes()
    toks = [raw[s:e] for s, e in zip(ss.tolist(), se.tolist())]
    ok = True
    try:
        v = np.array([float(t) for t in toks], dtype=np.float64)
        ok = bool(np.isfinite(v).all()) and not (
            raw.find(b"_") >= 0 and any(b"_" in t for t in toks)
        )
    except ValueError:
        ok = False
    if not ok:
        reject_binary(p, buf, line, _SVM_TEXT, _SVM_EXPECTED)
        # Token by token, so the first bad one is named (and raises).
        for k in range(sp.size):
            _svm_slow(p, buf, line, labels, values, indices, int(sp[k]), int(ss[k]), int(se[k]))
        raise AssertionError("unreachable: a slow token failed in bulk but not alone")
    is_label = sp < 0
    labels[-sp[is_label] - 1] = v[is_label]
    values[sp[~is_label]] = v[~is_label]


def _svm_slow(
    p: str,
    buf: np.ndarray,
    line: int,
    labels: np.ndarray,
    values: np.ndarray,
    indices: np.ndarray,
    pos: int,
    s: int,
    e: int,
) -> None:
    """Convert a token the kernel's fast path declined, with Python's exact float."""
    raw = bytes(buf[s:e])
    tok = token(buf, s, e)
    what = f"label '{tok}'" if pos < 0 else f"value '{tok}' of feature {int(indices[pos]) + 1}"
    try:
        # Python's float accepts '1_0'; strtod (and scikit-learn) does not.
        if b"_" in raw:
            raise ValueError
        v = float(raw)
    except ValueError:
        expect = (
            "expected a numeric LABEL first on the line"
            if pos < 0
            else "expected INDEX:VALUE with numeric VALUE"
        )
        raise InputFormatError(
            f"{p}:{line_of(buf, line, s)}: {what} is not a number ({expect}){bom_note(tok)}"
        ) from None
    if not math.isfinite(v):
        raise InputFormatError(
            f"{p}:{line_of(buf, line, s)}: {what} is not finite "
            "(expected a finite number; NaN and inf are rejected)"
        )
    if pos < 0:
        labels[-pos - 1] = v
    else:
        values[pos] = v


def _svm_error(p: str, buf: np.ndarray, line: int, d: int, err: int, s: int, e: int) -> None:
    reject_binary(p, buf, line, _SVM_TEXT, _SVM_EXPECTED)
    ln = line_of(buf, line, s)
    tok = token(buf, s, e)
    idx = tok.split(":", 1)[0]
    msg = {
        K.E_NO_COLON: f"feature '{tok}' has no ':' ({_EXPECT_FEATURE})",
        K.E_INDEX_NOT_INT: f"feature index '{idx}' is not an integer ({_EXPECT_FEATURE})",
        K.E_INDEX_ZERO: _index_zero(tok),
        K.E_INDEX_ORDER: (
            f"feature index {idx} is not greater than the previous index on the line "
            "(expected strictly increasing feature indices)"
        ),
        K.E_INDEX_RANGE: f"feature index {idx} exceeds n_features={d} (expected INDEX <= {d})",
        K.E_INDEX_TOO_LARGE: f"feature index '{idx}' is too large (expected INDEX < 10**18)",
        K.E_MULTILABEL: (
            f"label '{tok}' contains ',' (expected one numeric LABEL; multi-label lines "
            "and comma-separated (CSV) files are not supported)"
        ),
        K.E_QID: f"'{tok}' is not a valid query id (expected qid:INTEGER after the label)",
    }.get(err, f"malformed token '{tok}'")
    raise InputFormatError(f"{p}:{ln}: {msg}{bom_note(tok)}")


def _binarise(
    p: str,
    y: np.ndarray,
    row0: int | None,
    text: tuple[np.ndarray, int, np.ndarray] | None,
) -> np.ndarray:
    """Map labels {-1, 0, 1} to {0, 0, 1}; raise naming the first other label."""
    ok = (y == 0) | (y == 1) | (y == -1)
    if not ok.all():
        i = int(np.argmin(ok))
        if text is not None:
            buf, line, rs = text
            where = f"{p}:{line_of(buf, line, int(rs[i]))}"
        elif row0 is not None:
            where = f"{p}: row {row0 + i} (0-based) of y"
        else:
            where = f"{p}: row {i} (0-based) of the rows read"
        raise InputFormatError(
            f"{where}: label {float(y[i])!r} is not a binary label (expected 0/1 or -1/+1)"
        )
    return np.where(y == -1, 0.0, y)


# ---------------------------------------------------------------------------
# Binary formats
# ---------------------------------------------------------------------------


def _check_numeric(p: str, name: str, dtype: np.dtype) -> None:
    # by kind: numpy's type tree makes timedelta64 a signed integer
    if dtype.kind not in "iufb":
        raise InputFormatError(
            f"{p}: array '{name}' has dtype {dtype} (expected a real numeric dtype)"
        )


def _npz_member(p: str, zf: zipfile.ZipFile, name: str) -> zipfile.ZipInfo | None:
    try:
        return zf.getinfo(name + ".npy")
    except KeyError:
        return None


def _h5_array(p: str, h: Any, name: str) -> Any:
    """HDF5 member ``name`` of open file ``h``, checked to be a dataset holding an array.

    Raises InputFormatError naming the file and the member for a group, a link to nothing or
    an empty (shapeless) dataset: h5py's own errors say none of that."""
    import h5py

    try:
        obj = h[name]
    except KeyError:
        raise InputFormatError(f"{p}: '{name}' is a link to nothing (expected datasets X and "
                               "optional y, as h5py writes them)") from None
    if not isinstance(obj, h5py.Dataset):
        raise InputFormatError(f"{p}: '{name}' is a {type(obj).__name__.lower()}, not a dataset "
                               "(expected datasets X and optional y, as h5py writes them)")
    if obj.shape is None:
        raise InputFormatError(f"{p}: dataset '{name}' is empty, with no shape (expected an "
                               "array)")
    return obj


def _npz_header(
    p: str, zf: zipfile.ZipFile, info: zipfile.ZipInfo
) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """(shape, fortran_order, dtype, header length) of an .npy member of the .npz ``p``.

    Raises InputFormatError naming the member if it is not an .npy array."""
    try:
        with zf.open(info) as m:
            version = np.lib.format.read_magic(m)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(m)
            else:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(m)
            return shape, fortran, dtype, m.tell()
    except (ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise InputFormatError(
            f"{p}: member '{info.filename}' is not a numeric .npy array ({exc}; expected "
            "np.savez(path, X=..., y=...))"
        ) from None


class _Arrays:
    """Lazily sliceable X (and y) of a binary file, reading only requested rows."""

    def __init__(self, p: str) -> None:
        self.p = p
        kind = _kind(p)
        self.kind = kind
        self.has_y = False
        self.y_shape: tuple[int, ...] = ()
        if kind == "npy":
            self._X = map_npy(p)
            self.x_shape = tuple(self._X.shape)
            self.x_dtype = self._X.dtype
        elif kind == "npz":
            try:
                zf = zipfile.ZipFile(p)
            except zipfile.BadZipFile:
                size = os.path.getsize(p)
                if file_kind(p) == ZIP_ARCHIVE:  # the start of one, the end missing
                    raise InputFormatError(
                        f"{p}: a damaged or truncated .npz file ({size} bytes: it starts as a "
                        "zip archive, but its end is not one): copy or save it again"
                    ) from None
                why = "the file is empty" if size == 0 else "not a zip archive"
                raise InputFormatError(
                    f"{p}: not an .npz file: {why}{binary_kind(p)} (expected "
                    "np.savez(path, X=..., y=...))"
                ) from None
            with zf:
                xi = _npz_member(p, zf, "X")
                if xi is None:
                    raise InputFormatError(
                        f"{p}: no array 'X' (expected np.savez(path, X=..., y=...))"
                    )
                self.x_shape, _, self.x_dtype, _ = _npz_header(p, zf, xi)
                yi = _npz_member(p, zf, "y")
                if yi is not None:
                    self.has_y = True
                    self.y_shape, _, self.y_dtype, _ = _npz_header(p, zf, yi)
        else:
            import h5py

            try:
                with h5py.File(p, "r") as h:
                    if "X" not in h:
                        raise InputFormatError(
                            f"{p}: no dataset 'X' (expected datasets X and optional y)"
                        )
                    x = _h5_array(p, h, "X")
                    self.x_shape, self.x_dtype = tuple(x.shape), x.dtype
                    if "y" in h.keys():  # a broken link is a key, not a member (`in h`)
                        self.has_y = True
                        y = _h5_array(p, h, "y")
                        self.y_shape, self.y_dtype = tuple(y.shape), y.dtype
            except OSError as exc:
                size = os.path.getsize(p)
                if file_kind(p) == HDF5_FILE:
                    raise InputFormatError(
                        f"{p}: a damaged or truncated HDF5 file ({size} bytes; h5py: {exc}): "
                        "copy or save it again"
                    ) from None
                why = "the file is empty" if size == 0 else f"h5py: {exc}"
                raise InputFormatError(
                    f"{p}: not an HDF5 file ({why}{binary_kind(p)}; expected datasets X and "
                    "optional y, as h5py writes them)"
                ) from None
        if len(self.x_shape) != 2:
            raise InputFormatError(
                f"{p}: X has shape {self.x_shape} (expected a 2-D array (n_rows, n_features))"
            )
        _check_numeric(p, "X", self.x_dtype)
        if self.has_y:
            if self.y_shape != (self.x_shape[0],):
                raise InputFormatError(
                    f"{p}: y has shape {self.y_shape} (expected ({self.x_shape[0]},) to match X)"
                )
            _check_numeric(p, "y", self.y_dtype)

    def read(self, name: str, start: int, stop: int) -> np.ndarray:
        p = self.p
        if self.kind == "npy":
            return np.asarray(self._X[start:stop])
        if self.kind == "h5":
            import h5py

            with h5py.File(p, "r") as h:
                return np.asarray(h[name][start:stop])
        with zipfile.ZipFile(p) as zf:
            info = zf.getinfo(name + ".npy")
            shape, fortran, dtype, hlen = _npz_header(p, zf, info)
            rowbytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
            if fortran and len(shape) == 2:
                # Rows are strided in column-major data: read the member whole.
                with zf.open(info) as m:
                    return np.asarray(np.lib.format.read_array(m))[start:stop]
            if info.compress_type == zipfile.ZIP_STORED:
                # np.savez stores members uncompressed: map the rows in place
                # (zipfile's own seek would read every byte before them).
                with open(p, "rb") as f:
                    f.seek(info.header_offset)
                    local = f.read(30)
                name_len = int.from_bytes(local[26:28], "little")
                extra_len = int.from_bytes(local[28:30], "little")
                data = info.header_offset + 30 + name_len + extra_len + hlen
                if stop == start:
                    return np.empty((0,) + tuple(shape[1:]), dtype)
                return np.memmap(
                    p,
                    dtype=dtype,
                    mode="r",
                    offset=data + start * rowbytes,
                    shape=(stop - start,) + tuple(shape[1:]),
                )
            with zf.open(info) as m:
                # Compressed members decompress up to `start`: deflate data
                # has no random access.
                m.seek(hlen + start * rowbytes)
                raw = m.read((stop - start) * rowbytes)
            return np.frombuffer(raw, dtype).reshape((stop - start,) + tuple(shape[1:]))


def _binary_shape(p: str) -> tuple[int, int]:
    a = _Arrays(p)
    return int(a.x_shape[0]), int(a.x_shape[1])


def _check_finite(p: str, name: str, a: np.ndarray, row0: int) -> None:
    if np.issubdtype(a.dtype, np.floating):
        bad = ~np.isfinite(a)
        if bad.any():
            rows = bad.reshape(bad.shape[0], -1).any(axis=1)
            i = int(np.argmax(rows))
            raise InputFormatError(
                f"{p}: row {row0 + i} (0-based) of '{name}' contains NaN or inf "
                "(expected finite numbers)"
            )


def _binary_read_rows(
    p: str, start: int, stop: int | None, n_features: int | None, need_labels: bool
) -> tuple[np.ndarray, np.ndarray | None, int]:
    a = _Arrays(p)
    n, d = int(a.x_shape[0]), int(a.x_shape[1])
    if n_features is not None and n_features != d:
        raise InputFormatError(f"{p}: X has {d} columns but n_features={n_features} was given")
    stop = n if stop is None else stop
    if not (0 <= start <= stop <= n):
        raise ValueError(f"{p}: row range [{start}, {stop}) is outside the file's {n} rows")
    # One copy: float64, C order, writable, and never a view of a memory map.
    X = np.array(a.read("X", start, stop), dtype=np.float64, order="C", copy=True)
    _check_finite(p, "X", X, start)
    y = None
    if need_labels:
        if not a.has_y:
            raise InputFormatError(
                f"{p}: no labels (expected array 'y' of shape ({n},); .npy files hold X only)"
            )
        y = np.array(a.read("y", start, stop), dtype=np.float64, copy=True)
        _check_finite(p, "y", y, start)
    return X, y, start
