"""canary.io against references nobody here wrote: scikit-learn's svmlight
reader/writer, numpy and h5py round-trips, networkx's edge-list reader."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import h5py
import networkx as nx
import numpy as np
import pytest
from sklearn.datasets import dump_svmlight_file, load_svmlight_file

from canary.io import (
    InputFormatError,
    count_edges,
    count_rows,
    map_npy,
    partition_rows,
    read_edges,
    read_edges_range,
    read_edges_rows,
    read_rows,
    read_svmlight_range,
    split_byte_ranges,
)

# A hand-written file exercising comments (whole-line and trailing), blank and
# whitespace-only lines, tabs, CRLF, -1/+1 labels, a qid, exponents and a last
# line without a newline.
MESSY = (
    "# header comment\n"
    "+1 1:0.5 3:-2.25e-3 7:1e5\n"
    "\n"
    "-1 qid:3 2:1.0\t5:3   # trailing comment\n"
    "   \t \n"
    "1 1:0.1 2:0.2 3:0.3 4:0.4 5:0.5 6:0.6 7:0.7\r\n"
    "  # indented comment\n"
    "-1\n"
    "1 4:123456789.123456789 6:.5 7:-0\n"
    "-1 2:1.7976931348623157e308 3:4.9e-324 5:0.30000000000000004"
)


@pytest.fixture
def messy(tmp_path: Path) -> Path:
    p = tmp_path / "messy.svm"
    p.write_bytes(MESSY.encode())
    return p


def sk(path: Path, d: int) -> tuple[np.ndarray, np.ndarray]:
    X, y = load_svmlight_file(str(path), n_features=d, zero_based=False)
    return X.toarray(), y


# ---------------------------------------------------------------------------
# partitioning helpers


def test_partition_rows_balanced_and_contiguous() -> None:
    for n in range(0, 40):
        for parts in range(1, 9):
            r = partition_rows(n, parts)
            assert len(r) == parts and r[0][0] == 0 and r[-1][1] == n
            assert all(r[i][1] == r[i + 1][0] for i in range(parts - 1))
            sizes = [b - a for a, b in r]
            assert sizes == sorted(sizes, reverse=True) and max(sizes) - min(sizes) <= 1
    assert partition_rows(10, 3) == [(0, 4), (4, 7), (7, 10)]
    with pytest.raises(ValueError):
        partition_rows(5, 0)


def test_split_byte_ranges_line_aligned_and_covering(messy: Path) -> None:
    data = messy.read_bytes()
    for parts in range(1, 12):
        r = split_byte_ranges(messy, parts)
        assert r[0][0] == 0 and r[-1][1] == len(data) and len(r) == parts
        for a, b in r:
            assert a <= b
            assert a in (0, len(data)) or data[a - 1 : a] == b"\n"
        assert all(r[i][1] == r[i + 1][0] for i in range(parts - 1))


# ---------------------------------------------------------------------------
# svmlight vs scikit-learn


def test_messy_file_matches_sklearn_whole_and_every_row_range(messy: Path) -> None:
    n, d = count_rows(messy)
    X_ref, y_ref = sk(messy, d)
    assert (n, d) == X_ref.shape == (6, 7)
    X, y = read_rows(messy, 0, None)
    assert X.dtype == np.float64 and X.flags.c_contiguous and y is not None
    np.testing.assert_array_equal(X, X_ref)
    np.testing.assert_array_equal(y, y_ref)
    for start in range(n + 1):
        for stop in range(start, n + 1):
            Xs, ys = read_rows(messy, start, stop, n_features=d)
            np.testing.assert_array_equal(Xs, X_ref[start:stop])
            np.testing.assert_array_equal(ys, y_ref[start:stop])


def test_byte_ranges_concatenate_to_sklearn(messy: Path) -> None:
    n, d = count_rows(messy)
    X_ref, y_ref = sk(messy, d)
    size = messy.stat().st_size
    for parts in range(1, 10):
        got = [read_svmlight_range(messy, a, b, d) for a, b in split_byte_ranges(messy, parts)]
        np.testing.assert_array_equal(np.concatenate([g[0] for g in got]), X_ref)
        np.testing.assert_array_equal(np.concatenate([g[1] for g in got]), y_ref)
    # Ranges need not be line-aligned: a line belongs to the range holding its first byte.
    cuts = [0, 3, 30, 31, 77, 150, size]
    got = [read_svmlight_range(messy, a, b, d) for a, b in zip(cuts, cuts[1:])]
    np.testing.assert_array_equal(np.concatenate([g[0] for g in got]), X_ref)


def test_random_dump_roundtrip_exact(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    n, d = 2000, 13
    X = rng.standard_normal((n, d)) * 10.0 ** rng.integers(-30, 30, size=(n, d))
    X[rng.random((n, d)) < 0.4] = 0.0
    X[:, -1] = 0.0  # trailing all-zero column: width must come from n_features
    X[5] = 0.0  # a row with no features at all
    y = rng.choice([-1.0, 1.0], size=n)
    p = tmp_path / "r.libsvm"
    dump_svmlight_file(X, y, str(p), zero_based=False, comment="made by sklearn")
    assert count_rows(p) == (n, d - 1)
    assert count_rows(p, n_features=d) == (n, d)
    X_ref, y_ref = sk(p, d)
    for a, b in partition_rows(n, 3):
        Xs, ys = read_rows(p, a, b, n_features=d)
        np.testing.assert_array_equal(Xs, X_ref[a:b])
        np.testing.assert_array_equal(ys, y_ref[a:b])
    # Whole file, width from n_features (the last column is all zero).
    np.testing.assert_array_equal(read_rows(p, 0, None, n_features=d)[0], X_ref)
    # %.16g in the writer rounds, so the file is close to, not equal to, X.
    np.testing.assert_allclose(read_rows(p, 0, None, n_features=d)[0], X, rtol=1e-15)


def test_binary_labels(tmp_path: Path, messy: Path) -> None:
    _, y = read_rows(messy, 0, None, binary_labels=True)
    _, y_ref = sk(messy, 7)
    np.testing.assert_array_equal(y, (y_ref > 0).astype(float))
    _, yraw = read_rows(messy, 0, None)
    assert set(np.unique(yraw)) == {-1.0, 1.0}
    bad = tmp_path / "bad.svm"
    bad.write_text("1 1:1\n0 1:2\n# c\n2 1:3\n")
    with pytest.raises(InputFormatError, match=r"bad\.svm:4: label 2\.0 is not a binary label"):
        read_rows(bad, 0, None, binary_labels=True)
    with pytest.raises(InputFormatError, match=r"bad\.svm:4: label"):
        read_svmlight_range(bad, 0, bad.stat().st_size, 1, binary_labels=True)
    assert read_rows(bad, 0, 2, binary_labels=True)[1].tolist() == [1.0, 0.0]


def test_need_labels_false(messy: Path) -> None:
    X, y = read_rows(messy, 1, 3, need_labels=False)
    assert y is None and X.shape == (2, 7)


def _lines(n: int) -> list[str]:
    return [f"{i % 2} 1:{i}.5 2:{-i}" for i in range(n)]


@pytest.mark.parametrize(
    ("bad_line", "pattern"),
    [
        (
            "1 1:2 x3:4",
            r"feature index 'x3' is not an integer \(expected INDEX:VALUE with 1-based integer INDEX\)",
        ),
        ("1 1:2 3", r"feature '3' has no ':'"),
        ("1 0:2", r"feature index 0 .* not 1-based .*dump_svmlight_file writes 0-based "
                  r"indices unless given zero_based=False"),
        ("1 3:2 2:1", r"feature index 2 is not greater than the previous"),
        ("1 3:2 3:1", r"feature index 3 is not greater than the previous"),
        (
            "1 1:abc",
            r"value 'abc' of feature 1 is not a number \(expected INDEX:VALUE with numeric VALUE\)",
        ),
        ("1 1:1_0", r"value '1_0' of feature 1 is not a number"),
        ("1 1:nan", r"value 'nan' of feature 1 is not finite"),
        ("1 1:2 2:-inf", r"value '-inf' of feature 2 is not finite"),
        ("1 1:1e999", r"value '1e999' of feature 1 is not finite"),
        ("yes 1:2", r"label 'yes' is not a number"),
        ("inf 1:2", r"label 'inf' is not finite"),
        ("1,2 1:2", r"label '1,2' contains ','"),
        ("1 qid:x 1:2", r"'qid:x' is not a valid query id"),
        ("1 1:2 qid:3", r"feature index 'qid' is not an integer"),
    ],
)
def test_svmlight_errors_name_true_line(tmp_path: Path, bad_line: str, pattern: str) -> None:
    lines = ["# comment", ""] + _lines(14) + [bad_line] + _lines(20)
    p = tmp_path / "data.svm"
    p.write_text("\n".join(lines) + "\n")
    bad_no = 17  # 1-based line of bad_line
    with pytest.raises(InputFormatError, match=rf"data\.svm:{bad_no}: {pattern}"):
        read_rows(p, 0, None, n_features=3)
    # A worker whose rows contain the bad line (in the middle of the file) names it too ...
    with pytest.raises(InputFormatError, match=rf"data\.svm:{bad_no}: "):
        read_rows(p, 10, 20, n_features=3)
    # ... and so does one reading a byte range, while others are unaffected.
    data = p.read_bytes()
    off = data.index((bad_line + "\n").encode())
    with pytest.raises(InputFormatError, match=rf"data\.svm:{bad_no}: "):
        read_svmlight_range(p, off - 5, off + 3, 3)
    assert read_rows(p, 0, 14, n_features=3)[0].shape == (14, 3)
    assert read_svmlight_range(p, 0, off - 5, 3)[0].shape[0] < 15


def test_svmlight_index_above_n_features(tmp_path: Path) -> None:
    p = tmp_path / "w.svm"
    p.write_text("1 1:1\n1 5:1\n")
    with pytest.raises(InputFormatError, match=r"w\.svm:2: feature index 5 exceeds n_features=3"):
        read_rows(p, 0, 2, n_features=3)
    with pytest.raises(InputFormatError, match=r"w\.svm: largest feature index is 5"):
        count_rows(p, n_features=3)


def test_row_range_validation(messy: Path) -> None:
    with pytest.raises(ValueError, match="exceeds"):
        read_rows(messy, 0, 7, n_features=7)
    with pytest.raises(ValueError):
        read_rows(messy, 3, 2, n_features=7)
    assert read_rows(messy, 6, 6, n_features=7)[0].shape == (0, 7)
    with pytest.raises(ValueError, match="exceeds"):
        read_rows(messy, 7, 7, n_features=7)


def test_missing_and_empty_files(tmp_path: Path) -> None:
    missing = tmp_path / "nope.svm"
    with pytest.raises(FileNotFoundError, match="nope.svm"):
        count_rows(missing)
    with pytest.raises(FileNotFoundError, match="nope.svm"):
        read_rows(missing, 0, 1)
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        count_edges(tmp_path / "nope.txt")
    empty = tmp_path / "e.svm"
    empty.write_text("# only a comment\n\n")
    with pytest.raises(InputFormatError, match=r"e\.svm: no data rows"):
        count_rows(empty)


def test_long_lines_across_blocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Shrink the scan block so lines straddle block boundaries and some lines
    # are longer than a block.
    import canary.io._common as common

    monkeypatch.setattr(common, "BLOCK", 64)
    rng = np.random.default_rng(3)
    X = rng.random((60, 40))
    X[X < 0.5] = 0
    y = rng.choice([0.0, 1.0], 60)
    p = tmp_path / "long.svm"
    dump_svmlight_file(X, y, str(p), zero_based=False)
    assert count_rows(p) == (60, 40)
    for a, b in partition_rows(60, 7):
        Xs, ys = read_rows(p, a, b, n_features=40)
        np.testing.assert_array_equal(Xs, X[a:b])
        np.testing.assert_array_equal(ys, y[a:b])


# ---------------------------------------------------------------------------
# binary tabular formats


def _data(n: int = 50, d: int = 4) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    return rng.standard_normal((n, d)), rng.choice([-1.0, 1.0], n)


def test_npy_rows_and_no_labels(tmp_path: Path) -> None:
    X, _ = _data()
    p = tmp_path / "x.npy"
    np.save(p, X.astype(np.float32))
    assert count_rows(p) == (50, 4)
    Xs, ys = read_rows(p, 10, 20, need_labels=False)
    assert ys is None and Xs.dtype == np.float64 and Xs.flags.c_contiguous and Xs.flags.writeable
    np.testing.assert_array_equal(Xs, X.astype(np.float32)[10:20].astype(np.float64))
    with pytest.raises(InputFormatError, match=r"x\.npy: no labels"):
        read_rows(p, 0, 5)
    f = tmp_path / "f.npy"
    np.save(f, np.asfortranarray(X))
    np.testing.assert_array_equal(read_rows(f, 3, 9, need_labels=False)[0], X[3:9])


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed])
def test_npz_rows(tmp_path: Path, save: object) -> None:
    X, y = _data()
    p = tmp_path / "d.npz"
    save(p, X=X, y=y)  # type: ignore[operator]
    assert count_rows(p) == (50, 4)
    parts = [read_rows(p, a, b, binary_labels=True) for a, b in partition_rows(50, 4)]
    np.testing.assert_array_equal(np.concatenate([q[0] for q in parts]), X)
    np.testing.assert_array_equal(np.concatenate([q[1] for q in parts]), (y > 0).astype(float))
    q = tmp_path / "noX.npz"
    np.savez(q, Z=X)
    with pytest.raises(InputFormatError, match="no array 'X'"):
        count_rows(q)


def test_hdf5_rows_and_nonfinite(tmp_path: Path) -> None:
    X, y = _data()
    p = tmp_path / "d.h5"
    with h5py.File(p, "w") as h:
        h["X"] = X
        h["y"] = y
    assert count_rows(p) == (50, 4)
    Xs, ys = read_rows(p, 5, 45)
    np.testing.assert_array_equal(Xs, X[5:45])
    np.testing.assert_array_equal(ys, y[5:45])
    X[30, 2] = np.nan
    with h5py.File(p, "w") as h:
        h["X"] = X
        h["y"] = y[:-1]
    with pytest.raises(InputFormatError, match=r"y has shape \(49,\)"):
        count_rows(p)
    with h5py.File(p, "w") as h:
        h["X"] = X
    with pytest.raises(InputFormatError, match=r"d\.h5: row 30 \(0-based\) of 'X' contains NaN"):
        read_rows(p, 20, 40, need_labels=False)
    assert read_rows(p, 0, 30, need_labels=False)[0].shape == (30, 4)


@pytest.mark.parametrize(("make", "says"), [
    (lambda h: h.create_group("X"), r"'X' is a group, not a dataset"),
    (lambda h: (h.__setitem__("X", np.ones((3, 2))), h.create_group("y")),
     r"'y' is a group, not a dataset"),
    (lambda h: (h.__setitem__("X", np.ones((3, 2))), h.__setitem__("y", h5py.SoftLink("/no"))),
     r"'y' is a link to nothing"),
    (lambda h: h.create_dataset("X", data=h5py.Empty("f8")),
     r"dataset 'X' is empty, with no shape"),
])
def test_an_hdf5_layout_that_holds_no_arrays_is_named(tmp_path: Path, make: Any,
                                                      says: str) -> None:
    # h5py's own errors (AttributeError, TypeError, KeyError) reached the user as tracebacks
    p = tmp_path / "odd.h5"
    with h5py.File(p, "w") as h:
        make(h)
    with pytest.raises(InputFormatError, match=r"odd\.h5: " + says):
        count_rows(p)


def test_binary_shape_errors(tmp_path: Path) -> None:
    p = tmp_path / "x3.npy"
    np.save(p, np.zeros((2, 3, 4)))
    with pytest.raises(InputFormatError, match=r"x3\.npy: X has shape \(2, 3, 4\)"):
        count_rows(p)
    s = tmp_path / "s.npy"
    np.save(s, np.array([["a", "b"]]))
    with pytest.raises(InputFormatError, match="expected a real numeric dtype"):
        count_rows(s)
    t = tmp_path / "t.npy"  # numpy's type tree calls timedelta64 an integer
    np.save(t, np.zeros((2, 3), "m8[s]"))
    with pytest.raises(InputFormatError, match=r"dtype timedelta64\[s\] \(expected a real "):
        count_rows(t)


# ---------------------------------------------------------------------------
# edge lists


EDGES = (
    "# Directed graph (each unordered pair of nodes is saved once)\n"
    "# FromNodeId\tToNodeId\n"
    "0\t1\n"
    "0 7\n"
    "\n"
    "   7    3  \n"
    "9223372036854775807 0\n"
    "3 3\n"
    "100 200 # trailing comment\n"
    "3\t1\r\n"
    "0 1\n"
)


def test_edges_match_networkx_and_ranges(tmp_path: Path) -> None:
    p = tmp_path / "g.txt"
    p.write_text(EDGES)
    ref = nx.read_edgelist(p, nodetype=int, create_using=nx.MultiDiGraph, comments="#")
    ref_edges = sorted((u, v) for u, v, _ in ref.edges(keys=True))
    e = read_edges(p)
    assert e.dtype == np.int64 and e.shape == (8, 2) and e.flags.c_contiguous
    assert sorted(map(tuple, e.tolist())) == ref_edges
    assert e[3].tolist() == [9223372036854775807, 0]  # file order kept
    assert count_edges(p) == 8
    for parts in range(1, 12):
        got = np.concatenate([read_edges_range(p, a, b) for a, b in split_byte_ranges(p, parts)])
        np.testing.assert_array_equal(got, e)


@pytest.mark.parametrize(
    ("bad", "pattern"),
    [
        ("5", r"line '5' has one field"),
        ("5 x", r"vertex id 'x' is not an integer"),
        ("5 1.0", r"vertex id '1.0' is not an integer"),
        ("-2 5", r"vertex id '-2' is negative"),
        ("5 9223372036854775808", r"vertex id .* does not fit in int64"),
        ("5 6 0.5", r"line '5 6 0.5' has more than two fields"),
    ],
)
def test_edge_errors_name_true_line(tmp_path: Path, bad: str, pattern: str) -> None:
    lines = ["# c"] + [f"{i} {i + 1}" for i in range(30)] + [bad] + ["1 2"] * 10
    p = tmp_path / "g.txt"
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputFormatError, match=rf"g\.txt:32: {pattern}"):
        read_edges(p)
    data = p.read_bytes()
    off = data.index(("\n" + bad + "\n").encode()) + 1
    with pytest.raises(InputFormatError, match=r"g\.txt:32: "):
        read_edges_range(p, off - 2, len(data))
    assert read_edges_range(p, 0, off).shape == (30, 2)


def test_extra_columns_allowed_when_asked(tmp_path: Path) -> None:
    p = tmp_path / "w.txt"
    p.write_text("1 2 0.5\n3 4 17 x\n")
    np.testing.assert_array_equal(read_edges(p, allow_extra_columns=True), [[1, 2], [3, 4]])
    # refused otherwise, with what to do from the command line too (the app has no such flag)
    with pytest.raises(InputFormatError, match=r"w\.txt:1: line '1 2 0\.5' has more than two "
                                               r"fields .*keep the first two columns, or read it "
                                               r"with read_edges\(\.\.\., allow_extra_columns"):
        read_edges(p)


def test_a_byte_order_mark_is_named_where_it_hides_in_a_token(tmp_path: Path) -> None:
    # 'label '1' is not a number' with an invisible mark before the 1
    for name, text, read in (("e.txt", "1 2\n2 3\n", read_edges),
                             ("d.svm", "1 1:2\n0 1:3\n", lambda f: read_rows(f, 0, 2))):
        f = tmp_path / name
        f.write_text(text, encoding="utf-8-sig")
        with pytest.raises(InputFormatError, match=r":1: .*; the file starts with a UTF-8 "
                                                   r"byte-order mark, invisible before it"):
            read(f)


def test_empty_graph(tmp_path: Path) -> None:
    p = tmp_path / "g.txt"
    p.write_text("# nothing\n\n")
    with pytest.raises(InputFormatError, match=r"g\.txt: no edges"):
        count_edges(p)
    with pytest.raises(InputFormatError, match=r"g\.txt: no edges"):
        read_edges(p)
    assert count_edges(p, allow_empty=True) == 0
    assert read_edges_range(p, 0, os.path.getsize(p)).shape == (0, 2)


def test_npy_edges(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    e = rng.integers(0, 10**12, size=(1000, 2))
    p = tmp_path / "e.npy"
    np.save(p, e.astype(np.uint64))
    assert count_edges(p) == 1000
    got = np.concatenate([read_edges_rows(p, a, b) for a, b in partition_rows(1000, 3)])
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, e)
    e[700, 1] = -4
    np.save(p, e)
    with pytest.raises(InputFormatError, match=r"e\.npy: row 700 \(0-based\) has a negative id"):
        read_edges_rows(p, 600, 800)
    np.testing.assert_array_equal(read_edges_rows(p, 0, 700), e[:700])
    bad = tmp_path / "b.npy"
    np.save(bad, np.zeros((4, 3), np.int64))
    with pytest.raises(InputFormatError, match=r"expected \(m, 2\) integer edges"):
        count_edges(bad)


# ---------------------------------------------------------------------------
# files that are not what their name says: each error says what the file is
# not and what was expected, and never quotes binary bytes as a label or an id


GARBAGE = np.random.default_rng(5).integers(0, 256, 5000, dtype=np.uint8).tobytes()


def _readers(kind: str) -> list:
    """Every public reader of a file named as ``kind``, as one-argument calls."""
    if kind == "svm":
        return [count_rows, lambda p: read_rows(p, 0, None, n_features=3),
                lambda p: read_svmlight_range(p, 0, os.path.getsize(p), 3)]
    if kind == "txt":
        return [count_edges, read_edges, lambda p: read_edges_range(p, 0, os.path.getsize(p))]
    if kind == "npy":
        return [count_rows, lambda p: read_rows(p, 0, 1, need_labels=False), count_edges,
                lambda p: read_edges_rows(p, 0, 1), map_npy]
    return [count_rows, lambda p: read_rows(p, 0, 1)]


@pytest.mark.parametrize(("name", "data", "pattern"), [
    ("d.svm", GARBAGE, r"not svmlight text: (byte|line) \d+ holds a NUL byte, so the file is "
                       r"binary \(expected 'LABEL INDEX:VALUE \.\.\.' lines"),
    ("d.txt", GARBAGE, r"not an edge-list text file: (byte|line) \d+ holds a NUL byte, so the "
                       r"file is binary \(expected 'SRC DST' lines"),
    ("d.npy", GARBAGE, r"not a numeric \.npy array: it does not start with the \.npy magic "
                       r"string \(expected an array written by numpy\.save\)"),
    ("d.npy", b"", r"not a numeric \.npy array: the file is empty"),
    ("d.npy", b"0 1\n2 3\n", r"not a numeric \.npy array: it does not start with the \.npy magic"),
    ("d.npz", GARBAGE, r"not an \.npz file: not a zip archive \(expected np\.savez\(path, X="),
    ("d.npz", b"", r"not an \.npz file: the file is empty"),
    ("d.h5", GARBAGE, r"not an HDF5 file \(h5py: .*; expected datasets X and optional y"),
    ("d.h5", b"", r"not an HDF5 file \(the file is empty; expected datasets X"),
])
def test_garbage_and_empty_files_say_what_they_are_not(tmp_path: Path, name: str, data: bytes,
                                                       pattern: str) -> None:
    p = tmp_path / name
    p.write_bytes(data)
    for read in _readers(name.rsplit(".", 1)[1]):
        with pytest.raises(InputFormatError, match=rf"^{p}: {pattern}") as err:
            read(p)
        assert "allow_pickle" not in str(err.value) and "\\x" not in str(err.value)


@pytest.mark.parametrize("name", ["d.npz", "d.h5"])
def test_a_truncated_file_is_called_damaged_not_something_else(tmp_path: Path,
                                                               name: str) -> None:
    # it said "not an .npz file: not a zip archive; it is a zip archive"
    whole = tmp_path / f"whole.{name.rsplit('.', 1)[1]}"
    X = np.arange(600.0).reshape(200, 3)
    if name.endswith(".npz"):
        np.savez(whole, X=X, y=np.ones(200))
    else:
        with h5py.File(whole, "w") as f:
            f["X"], f["y"] = X, np.ones(200)
    p = tmp_path / name
    data = whole.read_bytes()
    p.write_bytes(data[:len(data) // 2])
    kind = ".npz" if name.endswith(".npz") else "HDF5"
    for read in _readers(name.rsplit(".", 1)[1]):
        with pytest.raises(InputFormatError, match=rf"^{p}: a damaged or truncated {kind} file "
                                                   rf"\({len(data) // 2} bytes.*: copy or save it "
                                                   r"again$"):
            read(p)


@pytest.mark.parametrize(("name", "text"), [("d.svm", b"1 1:0.5 2:1\r0 1:2 2:3\r"),
                                           ("d.txt", b"0 1\r1 2\r2 0\r")])
def test_carriage_return_line_endings_are_named(tmp_path: Path, name: str, text: bytes) -> None:
    # counted as one row, then the load failed on "feature '0' has no ':'"
    p = tmp_path / name
    p.write_bytes(text)
    count = count_edges if name.endswith(".txt") else count_rows
    with pytest.raises(InputFormatError, match=rf"^{p}: not .*: its lines end in a carriage "
                                               r"return alone \(old Mac line endings\)"):
        count(p)
    p.write_bytes(text.replace(b"\r", b"\r\n"))  # Windows line endings read as before
    rows = count(p)
    assert (rows[0] if isinstance(rows, tuple) else rows) == text.count(b"\r")


def test_empty_text_files(tmp_path: Path) -> None:
    (tmp_path / "e.svm").write_bytes(b"")
    with pytest.raises(InputFormatError, match=r"e\.svm: no data rows"):
        count_rows(tmp_path / "e.svm")
    (tmp_path / "e.txt").write_bytes(b"")
    with pytest.raises(InputFormatError, match=r"e\.txt: no edges \(expected at least one "
                                               r"'SRC DST' line\)$"):
        count_edges(tmp_path / "e.txt")
    np.save(tmp_path / "e.npy", np.empty((0, 2), np.int64))  # it was told of lines too
    with pytest.raises(InputFormatError, match=r"e\.npy: no edges \(expected an \(m, 2\) "
                                               r"integer array with m >= 1\)$"):
        count_edges(tmp_path / "e.npy")


def test_binary_file_under_a_text_name_is_named_by_its_magic(tmp_path: Path) -> None:
    p = tmp_path / "x.svm"
    np.save(tmp_path / "x.npy", np.zeros((4, 3)))
    p.write_bytes((tmp_path / "x.npy").read_bytes())
    with pytest.raises(InputFormatError, match=r"binary; it is a NumPy \.npy array \(expected"):
        count_rows(p)
    np.savez(tmp_path / "z.npz", X=np.zeros((4, 3)))
    e = tmp_path / "z.txt"
    e.write_bytes((tmp_path / "z.npz").read_bytes())
    with pytest.raises(InputFormatError, match=r"binary; it is a zip archive \(an \.npz\?\)"):
        count_edges(e)


def test_npy_of_python_objects_is_never_unpickled(tmp_path: Path) -> None:
    p = tmp_path / "o.npy"
    np.save(p, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    for read in _readers("npy"):
        with pytest.raises(InputFormatError, match=r"o\.npy: not a numeric \.npy array: it "
                                                   r"holds Python objects \(dtype object\)"):
            read(p)


def test_truncated_npy_and_npz_member(tmp_path: Path) -> None:
    p = tmp_path / "t.npy"
    np.save(p, np.zeros((100, 3)))
    p.write_bytes(p.read_bytes()[:300])
    with pytest.raises(InputFormatError, match=r"t\.npy: not a numeric \.npy array: it is "
                                               r"damaged or shorter than its header says"):
        count_rows(p)
    import zipfile

    z = tmp_path / "m.npz"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("X.npy", GARBAGE)
    with pytest.raises(InputFormatError, match=r"m\.npz: member 'X\.npy' is not a numeric "
                                               r"\.npy array"):
        count_rows(z)


def test_text_that_is_not_svmlight_or_an_edge_list(tmp_path: Path) -> None:
    dense = tmp_path / "dense.svm"
    dense.write_text("0.5 1.5 2.5\n1 2 3\n")
    with pytest.raises(InputFormatError, match=r"dense\.svm: no line has an INDEX:VALUE feature "
                                               r"\(expected 'LABEL INDEX:VALUE \.\.\.' lines; a "
                                               r"table of plain numbers is not svmlight"):
        count_rows(dense)
    assert count_rows(dense, n_features=2) == (2, 2)  # label-only rows, when asked for
    # features all at index 0 are a 0-based file, not a table of plain numbers
    zero = tmp_path / "zero.svm"
    zero.write_text("# a comment 0:9\n1 0:1\n0 0:2\n")
    with pytest.raises(InputFormatError, match=r"zero\.svm:2: feature index 0 in '0:1' is not "
                                               r"1-based"):
        count_rows(zero)
    csv = tmp_path / "t.csv"
    csv.write_text("1.0,0.5,2\n0.0,1.5,3\n")
    with pytest.raises(InputFormatError, match=r"t\.csv:1: label '1\.0,0\.5,2' contains ','.*"
                                               r"comma-separated \(CSV\) files are not supported"):
        read_rows(csv, 0, None, n_features=3)
    edges = tmp_path / "e.csv"
    edges.write_text("# src,dst\n1,2\n2,3\n")
    with pytest.raises(InputFormatError, match=r"e\.csv:2: .*comma-separated \(CSV\) lines are "
                                               r"not an edge list"):
        read_edges(edges)
