"""The benchmarks' generated data, made once per process and shared read-only.

``benchmarks/apps.py`` times the numba bound and up to five peers on the same data; generating
the largest data sets takes seconds each, which every one of them would pay again. The arrays come back read-only, so
that one peer cannot change the data the next one times (numpy raises ``ValueError`` on a
write); a caller that needs to write copies. One entry of each is kept (4M x 20 is 640 MB): the
bounds go through the sizes in order, then the peers again, so a size is made at most twice.
"""

from __future__ import annotations

import functools

import numpy as np

from canary.generate import logistic_data, rmat_edges


def _frozen(*arrays: np.ndarray) -> None:
    for a in arrays:
        a.flags.writeable = False


@functools.lru_cache(maxsize=1)
def lr_data(n: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    """``canary.generate.logistic_data(n, d, 0)``, read-only: the rows the app generates."""
    X, y = logistic_data(n, d, 0)
    _frozen(X, y)
    return X, y


@functools.lru_cache(maxsize=1)
def rmat(v: int, e: int) -> np.ndarray:
    """``canary.generate.rmat_edges(v, e, 0)`` (``e`` x 2 source, destination), read-only."""
    edges = rmat_edges(v, e, 0)
    _frozen(edges)
    return edges


@functools.lru_cache(maxsize=1)
def pagerank_csr(v: int, e: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The graph of :func:`rmat` as in-edge CSR, read-only: ``indptr`` (by destination),
    ``src`` (source ids in destination order, stable) and the out-degrees (float64)."""
    edges = rmat(v, e)
    order = np.argsort(edges[:, 1], kind="stable")
    src = np.ascontiguousarray(edges[order, 0])
    indptr = np.zeros(v + 1, np.int64)
    np.cumsum(np.bincount(edges[:, 1], minlength=v), out=indptr[1:])
    outdeg = np.bincount(edges[:, 0], minlength=v).astype(np.float64)
    _frozen(indptr, src, outdeg)
    return indptr, src, outdeg
