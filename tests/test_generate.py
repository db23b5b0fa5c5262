"""canary.generate: slice invariance, determinism, shapes and statistical sanity."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

from canary.generate import (
    BLOCK_EDGES,
    BLOCK_ROWS,
    blob_centers,
    blobs,
    logistic_data,
    logistic_weights,
    rmat_edges,
)
from canary.io import partition_rows

# Cuts that straddle block boundaries, including one-row and empty slices.
ROW_CUTS = [0, 1, 1, BLOCK_ROWS - 1, BLOCK_ROWS + 1, 2 * BLOCK_ROWS, 2 * BLOCK_ROWS + 7, 10_000]


def test_logistic_slice_invariant_and_deterministic() -> None:
    n, d = 10_000, 6
    X, y = logistic_data(n, d, seed=5)
    assert X.shape == (n, d) and y.shape == (n,)
    assert X.dtype == y.dtype == np.float64 and X.flags.c_contiguous
    assert set(np.unique(y)) == {0.0, 1.0}
    for cuts in (ROW_CUTS, [a for a, _ in partition_rows(n, 7)] + [n]):
        parts = [logistic_data(n, d, 5, a, b) for a, b in zip(cuts, cuts[1:])]
        np.testing.assert_array_equal(np.concatenate([p[0] for p in parts]), X)
        np.testing.assert_array_equal(np.concatenate([p[1] for p in parts]), y)
    X2, y2 = logistic_data(n, d, seed=5)
    np.testing.assert_array_equal(X2, X)
    np.testing.assert_array_equal(y2, y)
    X3, _ = logistic_data(n, d, seed=6)
    assert not np.array_equal(X3, X)
    # Row i does not depend on n either.
    np.testing.assert_array_equal(logistic_data(5000, d, 5)[0], X[:5000])


def test_logistic_model_is_recoverable_and_noisy() -> None:
    n, d = 40_000, 5
    X, y = logistic_data(n, d, seed=11)
    w, b = logistic_weights(d, 11)
    np.testing.assert_allclose(X.mean(axis=0), 0, atol=0.03)
    np.testing.assert_allclose(X.std(axis=0), 1, atol=0.03)
    clf = LogisticRegression(C=1e6, max_iter=1000).fit(X, y)
    np.testing.assert_allclose(clf.coef_[0], w, atol=0.1)
    assert abs(clf.intercept_[0] - b) < 0.1
    acc = clf.score(X, y)
    assert 0.6 < acc < 0.95  # learnable, but labels are noisy: not separable
    assert 0.2 < y.mean() < 0.8


def test_blobs_slice_invariant_and_centred() -> None:
    n, d, k = 9000, 3, 4
    X, C = blobs(n, d, k, seed=2)
    assert X.shape == (n, d) and C.shape == (k, d) and X.dtype == np.float64
    np.testing.assert_array_equal(C, blob_centers(d, k, 2))
    cuts = [0, 1, BLOCK_ROWS, BLOCK_ROWS + 3, n]
    got = np.concatenate([blobs(n, d, k, 2, a, b)[0] for a, b in zip(cuts, cuts[1:])])
    np.testing.assert_array_equal(got, X)
    np.testing.assert_array_equal(blobs(n, d, k, seed=2)[0], X)
    assert not np.array_equal(blobs(n, d, k, seed=3)[0], X)
    # Points scatter N(0, I) around their nearest centre; clusters are about equal.
    dist2 = ((X[:, None, :] - C[None, :, :]) ** 2).sum(axis=2)
    lab = dist2.argmin(axis=1)
    assert abs(dist2.min(axis=1).mean() - d) < 0.3
    counts = np.bincount(lab, minlength=k)
    assert counts.min() > 0.8 * n / k
    for j in range(k):
        np.testing.assert_allclose(X[lab == j].mean(axis=0), C[j], atol=0.15)


def test_rmat_slice_invariant_deterministic_in_range() -> None:
    nv, m = 3000, 3 * BLOCK_EDGES + 11  # nv not a power of two: redraws happen
    E = rmat_edges(nv, m, seed=9)
    assert E.shape == (m, 2) and E.dtype == np.int64 and E.flags.c_contiguous
    assert E.min() >= 0 and E.max() < nv
    cuts = [0, 5, BLOCK_EDGES - 1, BLOCK_EDGES + 1, 2 * BLOCK_EDGES, m - 1, m]
    got = np.concatenate([rmat_edges(nv, m, 9, start=a, stop=b) for a, b in zip(cuts, cuts[1:])])
    np.testing.assert_array_equal(got, E)
    np.testing.assert_array_equal(rmat_edges(nv, m, seed=9), E)
    assert not np.array_equal(rmat_edges(nv, m, seed=10), E)


def test_rmat_statistics() -> None:
    nv, m = 1 << 12, 200_000
    a, b, c = 0.57, 0.19, 0.19
    E = rmat_edges(nv, m, seed=1, a=a, b=b, c=c)
    top_src, top_dst = E[:, 0] >> 11, E[:, 1] >> 11
    freq = [
        np.mean((top_src == 0) & (top_dst == 0)),
        np.mean((top_src == 0) & (top_dst == 1)),
        np.mean((top_src == 1) & (top_dst == 0)),
        np.mean((top_src == 1) & (top_dst == 1)),
    ]
    np.testing.assert_allclose(freq, [a, b, c, 1 - a - b - c], atol=0.01)
    out_deg = np.bincount(E[:, 0], minlength=nv)
    assert (out_deg == 0).sum() > 0  # dangling vertices occur
    assert out_deg.max() > 20 * out_deg.mean()  # skewed degrees


def test_rmat_sparse_ids_is_an_injection() -> None:
    nv, m = 5000, 50_000
    dense = rmat_edges(nv, m, seed=4)
    sparse = rmat_edges(nv, m, seed=4, sparse_ids=True, id_bits=40)
    assert sparse.dtype == np.int64 and sparse.min() >= 0 and sparse.max() < 2**40
    # The same graph up to relabelling: dense id -> sparse id is a function and one-to-one.
    mapping: dict[int, int] = {}
    for u, v in zip(dense.ravel().tolist(), sparse.ravel().tolist()):
        assert mapping.setdefault(u, v) == v
    assert len(set(mapping.values())) == len(mapping)
    assert max(mapping.values()) > 1000 * nv  # spread over the big id space
    got = np.concatenate(
        [rmat_edges(nv, m, 4, start=a, stop=b, sparse_ids=True) for a, b in partition_rows(m, 3)]
    )
    np.testing.assert_array_equal(got, sparse)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        logistic_data(10, 2, 0, start=5, stop=11)
    with pytest.raises(ValueError):
        blobs(10, 2, 0, 0)
    with pytest.raises(ValueError):
        rmat_edges(10, 10, 0, a=0.9, b=0.1, c=0.1)
    with pytest.raises(ValueError):
        rmat_edges(2**20, 10, 0, sparse_ids=True, id_bits=10)
    assert logistic_data(10, 2, 0, start=4, stop=4)[0].shape == (0, 2)
    assert rmat_edges(10, 0, 0).shape == (0, 2)
