"""Shared pieces: the error type, row partitioning and line-aligned byte ranges."""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np

from canary.errors import CanaryError
from canary.io import _kernels as K

#: Size of the blocks text files are scanned in: large enough that Python's
#: per-block overhead vanishes, small enough to keep memory flat.
BLOCK = 16 * 1024 * 1024

PathLike = str | os.PathLike[str]


class InputFormatError(CanaryError, ValueError):
    """Malformed input data.

    The message always names the file and, for text formats, the 1-based line
    number (``data.svm:17: ...``) or, for binary formats, the 0-based row, and
    says what was expected instead.
    """


def check_exists(path: PathLike) -> str:
    """Return ``path`` as a str; raise FileNotFoundError naming it if it is missing."""
    p = os.fspath(path)
    if not os.path.exists(p):
        raise FileNotFoundError(f"{p}: no such file")
    if os.path.isdir(p):
        raise IsADirectoryError(f"{p}: is a directory, expected a data file")
    return p


#: How a binary file starts, for saying what a file given where text was expected is instead.
ZIP_ARCHIVE = "a zip archive (an .npz?)"
HDF5_FILE = "an HDF5 file"
_MAGIC = (
    (b"\x93NUMPY", "a NumPy .npy array"),
    (b"PK\x03\x04", ZIP_ARCHIVE),
    (b"\x89HDF\r\n\x1a\n", HDF5_FILE),
    (b"\x1f\x8b", "gzip-compressed: decompress it first"),
    (b"\xff\xfe", "UTF-16 text: save it as UTF-8 or ASCII"),
    (b"\xfe\xff", "UTF-16 text: save it as UTF-8 or ASCII"),
)


def file_kind(p: str) -> str | None:
    """What the start of file ``p`` says it is (``"a NumPy .npy array"``, :data:`ZIP_ARCHIVE`,
    :data:`HDF5_FILE`, ...), or None."""
    with open(p, "rb") as f:
        head = f.read(8)
    for magic, what in _MAGIC:
        if head.startswith(magic):
            return what
    return None


def binary_kind(p: str) -> str:
    """``"; it is WHAT"`` when the start of file ``p`` says what it is (``"; it is a NumPy .npy
    array"``), else ``""``: the tail of an error saying what a file is not."""
    what = file_kind(p)
    return f"; it is {what}" if what is not None else ""


def first_nul(data: bytes | np.ndarray) -> int:
    """Offset of the first NUL byte in ``data``, or -1. Text never holds one, so it tells a
    binary file given where text was expected (``bytes.find`` runs at memory speed)."""
    if isinstance(data, np.ndarray):
        hits = np.flatnonzero(data == 0)
        return int(hits[0]) if hits.size else -1
    return data.find(b"\0")


def not_text(p: str, where: str, what: str, expected: str) -> InputFormatError:
    """The error for file ``p``, read as text, that holds a NUL byte at ``where`` (``"byte
    17"``, ``"line 3"``): it is not ``what`` (``"svmlight text"``) but binary; ``expected``
    says what the file should hold."""
    return InputFormatError(
        f"{p}: not {what}: {where} holds a NUL byte, so the file is binary{binary_kind(p)} "
        f"(expected {expected})"
    )


def reject_binary(p: str, buf: np.ndarray, first_line: int, what: str, expected: str) -> None:
    """Raise :func:`not_text` if ``buf`` (complete lines of ``p`` from line ``first_line``) holds
    a NUL byte. Parsers call it before reporting a malformed token, so that a binary file is
    called binary instead of having its bytes quoted as a label or an id."""
    i = first_nul(buf)
    if i >= 0:
        raise not_text(p, f"line {line_of(buf, first_line, i)}", what, expected)


def map_npy(path: PathLike) -> np.ndarray:
    """Memory-map the ``.npy`` file at ``path`` read-only, having checked it is one.

    Never unpickles anything. Raises FileNotFoundError if missing; InputFormatError saying the
    file is not a numeric ``.npy`` array when it is empty, does not start with the ``.npy``
    magic string (another kind of file under a ``.npy`` name), has a damaged header, holds
    Python objects, or is shorter than its header says. Callers check shape and dtype.
    """
    p = check_exists(path)
    expected = "an array written by numpy.save"
    not_npy = f"{p}: not a numeric .npy array"
    with open(p, "rb") as f:
        head = f.read(6)
        if not head:
            raise InputFormatError(f"{not_npy}: the file is empty (expected {expected})")
        if head != b"\x93NUMPY":
            raise InputFormatError(
                f"{not_npy}: it does not start with the .npy magic string{binary_kind(p)} "
                f"(expected {expected})"
            )
        f.seek(0)
        try:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                dtype = np.lib.format.read_array_header_1_0(f)[2]
            elif version == (2, 0):
                dtype = np.lib.format.read_array_header_2_0(f)[2]
            else:  # newer layouts: np.load below reads them, and refuses to map objects
                dtype = np.dtype(np.float64)
        except (ValueError, EOFError) as exc:
            raise InputFormatError(
                f"{not_npy}: its header is damaged ({exc}; expected {expected})"
            ) from None
    if dtype.hasobject:
        raise InputFormatError(
            f"{not_npy}: it holds Python objects (dtype {dtype}), which canary never unpickles "
            f"(expected numbers, {expected})"
        )
    try:
        return np.load(p, mmap_mode="r", allow_pickle=False)
    except (ValueError, EOFError, OSError) as exc:
        raise InputFormatError(
            f"{not_npy}: it is damaged or shorter than its header says ({exc}; expected "
            f"{expected})"
        ) from None


def partition_rows(n_rows: int, parts: int) -> list[tuple[int, int]]:
    """Split ``range(n_rows)`` into ``parts`` contiguous, balanced [start, stop) ranges.

    The first ``n_rows % parts`` ranges get one extra row; ranges may be empty
    when ``n_rows < parts``.  Every app uses this so that partition ``p`` of a
    dataset holds the same rows on every rank.

    Raises ValueError if ``parts < 1`` or ``n_rows < 0``.
    """
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    if n_rows < 0:
        raise ValueError(f"n_rows must be >= 0, got {n_rows}")
    base, extra = divmod(n_rows, parts)
    out = []
    start = 0
    for p in range(parts):
        stop = start + base + (1 if p < extra else 0)
        out.append((start, stop))
        start = stop
    return out


def count_newlines(f: object, start: int, stop: int) -> int:
    """Number of b'\\n' bytes in [start, stop) of the open binary file ``f``.

    Reads in BLOCK-sized pieces; bytes.count runs at memory speed, far cheaper
    than parsing, which is what lets a worker reading the middle of a file name
    true line numbers in its errors.
    """
    f.seek(start)  # type: ignore[attr-defined]
    total = 0
    pos = start
    while pos < stop:
        chunk = f.read(min(BLOCK, stop - pos))  # type: ignore[attr-defined]
        if not chunk:
            break
        total += chunk.count(b"\n")
        pos += len(chunk)
    return total


def split_byte_ranges(path: PathLike, parts: int) -> list[tuple[int, int]]:
    """Split a text file into ``parts`` contiguous byte ranges aligned to line starts.

    Range ``k`` is ``(byte_start, byte_end)``; the ranges cover the file exactly
    ([0, size)), each boundary is 0, the file size, or the byte just after a
    b'\\n'.  Boundaries start at ``k * size // parts`` and move forward to the
    next line start, so a range may be empty (when one line spans several
    targets) and data rows per range are only roughly balanced.  Reading each
    range with :func:`read_svmlight_range` / :func:`read_edges_range` yields
    every line exactly once.

    Raises FileNotFoundError for a missing file, ValueError if ``parts < 1``.
    """
    p = check_exists(path)
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    size = os.path.getsize(p)
    bounds = [0]
    with open(p, "rb") as f:
        for k in range(1, parts):
            target = max(k * size // parts, bounds[-1])
            bounds.append(_next_line_start(f, target, size))
    bounds.append(size)
    return [(bounds[k], bounds[k + 1]) for k in range(parts)]


def _next_line_start(f: object, pos: int, size: int) -> int:
    """Smallest line start >= pos (or ``size``)."""
    if pos <= 0:
        return 0
    if pos >= size:
        return size
    f.seek(pos - 1)  # type: ignore[attr-defined]
    while True:
        chunk = f.read(1 << 16)  # type: ignore[attr-defined]
        if not chunk:
            return size
        j = chunk.find(b"\n")
        if j >= 0:
            return pos + j
        pos += len(chunk)


def read_line_range(path: str, byte_start: int, byte_end: int) -> tuple[np.ndarray, int, int]:
    """Bytes of the lines that *start* in [byte_start, byte_end).

    Returns (uint8 array, absolute offset of its first byte, 1-based line number
    of its first line).  A line beginning before ``byte_start`` belongs to the
    previous range and is skipped; the last line is read to its end even past
    ``byte_end``.  Hence any split of [0, size) into contiguous ranges reads
    every line exactly once, whether or not the ranges are line-aligned.

    Raises ValueError for a range outside the file.
    """
    size = os.path.getsize(path)
    if not (0 <= byte_start <= byte_end):
        raise ValueError(f"{path}: invalid byte range [{byte_start}, {byte_end})")
    if byte_end > size:
        raise ValueError(f"{path}: byte range [{byte_start}, {byte_end}) exceeds file size {size}")
    with open(path, "rb") as f:
        start = _next_line_start(f, byte_start, size)
        if start >= byte_end:
            # Read-only like every other buffer, so numba compiles one signature.
            return np.frombuffer(b"", np.uint8), start, 0
        f.seek(start)
        data = f.read(byte_end - start)
        if byte_end < size and not data.endswith(b"\n"):
            # Finish the last line, which started inside the range.
            tail = []
            while True:
                chunk = f.read(1 << 16)
                if not chunk:
                    break
                j = chunk.find(b"\n")
                if j >= 0:
                    tail.append(chunk[: j + 1])
                    break
                tail.append(chunk)
            data += b"".join(tail)
        line = 1 + count_newlines(f, 0, start)
    return np.frombuffer(data, np.uint8), start, line


def iter_line_blocks(
    path: str, start: int = 0, stop: int | None = None
) -> Iterator[tuple[int, bytes]]:
    """Yield (absolute offset, bytes) blocks of about BLOCK bytes cut after a newline.

    Blocks cover [start, stop) exactly; only the last may end without b'\\n'.
    A line longer than BLOCK is carried whole into the next block.
    """
    size = os.path.getsize(path)
    stop = size if stop is None else stop
    with open(path, "rb") as f:
        f.seek(start)
        pos = start
        carry = b""
        while pos < stop:
            chunk = f.read(min(BLOCK, stop - pos))
            if not chunk:
                break
            pos += len(chunk)
            data = carry + chunk if carry else chunk
            if pos >= stop:
                carry = b""
                yield pos - len(data), data
                break
            cut = data.rfind(b"\n")
            if cut < 0:
                carry = data
                continue
            carry = data[cut + 1 :]
            yield pos - len(data), data[: cut + 1]
        if carry:
            yield pos - len(carry), carry


def iter_text_blocks(path: str, what: str, expected: str) -> Iterator[tuple[int, bytes]]:
    """:func:`iter_line_blocks` over a whole file that must be text: raises :func:`not_text`
    (InputFormatError) at the first NUL byte, before any caller counts garbage as rows; and
    InputFormatError for lines that end in a carriage return alone (old Mac files), which
    would be counted as one row and fail its parse far from the cause."""
    for off, block in iter_line_blocks(path):
        i = first_nul(block)
        if i >= 0:
            raise not_text(path, f"byte {off + i}", what, expected)
        if off == 0 and b"\n" not in block and b"\r" in block:
            raise InputFormatError(
                f"{path}: not {what}: its lines end in a carriage return alone (old Mac line "
                f"endings), so it reads as one line (expected {expected}); convert them to "
                "newlines, e.g. tr '\\r' '\\n' < IN > OUT")
        yield off, block


def count_data_lines(path: str, what: str, expected: str) -> int:
    """Number of non-blank, non-comment lines of a text file (one fast pass).

    Raises InputFormatError (``not what ... (expected ...)``) if the file is binary."""
    total = 0
    for _, block in iter_text_blocks(path, what, expected):
        total += int(K.count_data_lines(np.frombuffer(block, np.uint8)))
    return total


def locate_data_lines(path: str, start: int, stop: int) -> tuple[int, int, int, int]:
    """Byte range holding data lines [start, stop) (0-based, blank/comment lines skipped).

    Returns (byte_start, byte_end, line number of byte_start, data lines in the
    whole file if the scan reached the end, else -1).  One fast pass over the
    file up to the stop row; nothing is parsed.
    """
    seen = 0
    lines = 1
    byte_start = -1
    line_start = -1
    size = os.path.getsize(path)
    for off, block in iter_line_blocks(path):
        buf = np.frombuffer(block, np.uint8)
        n = int(K.count_data_lines(buf))
        if byte_start < 0 and start < seen + n:
            rel = int(K.nth_data_line_start(buf, start - seen))
            byte_start = off + rel
            line_start = lines + block.count(b"\n", 0, rel)
        if byte_start >= 0 and stop < seen + n:
            rel = int(K.nth_data_line_start(buf, stop - seen))
            return byte_start, off + rel, line_start, -1
        seen += n
        lines += block.count(b"\n")
    if byte_start < 0:
        # start == seen (empty selection at the end) or beyond the data.
        byte_start, line_start = size, lines
    return byte_start, size, line_start, seen


def line_of(buf: np.ndarray, first_line: int, offset: int) -> int:
    """1-based line number of byte ``offset`` of ``buf`` whose first line is ``first_line``."""
    return first_line + int(np.count_nonzero(buf[:offset] == K.NL))


def token(buf: np.ndarray, s: int, e: int) -> str:
    """buf[s:e] decoded for an error message (undecodable bytes escaped)."""
    return bytes(buf[s:e]).decode("utf-8", errors="backslashreplace")


BOM = "\ufeff"


def bom_note(tok: str) -> str:
    """What to add to a message about ``tok`` when it starts with a UTF-8 byte-order mark,
    which no one sees: the token then looks fine ('label '1' is not a number')."""
    if not tok.startswith(BOM):
        return ""
    return ("; the file starts with a UTF-8 byte-order mark, invisible before it: save the file "
            "without one (in Python, encoding='utf-8', not 'utf-8-sig')")
