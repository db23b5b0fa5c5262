"""Seeded synthetic inputs that each worker can generate for its own rows only.

Every generator is deterministic in its ``seed`` and *slice-invariant*: row
(or edge) ``i`` is the same whichever ``[start, stop)`` slice it is generated
in, so ``concatenate(slices) == whole``.  This holds because rows are made in
fixed-size blocks, block ``b`` drawing from its own stream
``np.random.default_rng([seed, tag, b])``; a slice generates only the blocks it
overlaps.  Global parameters (true weights, centres, the id injection) come
from a stream of their own, so they do not depend on the slice either.
"""

from __future__ import annotations

import math

import numpy as np

#: Rows per block.  Part of the output's definition: changing it changes the data.
BLOCK_ROWS = 4096
#: Edges per block for R-MAT.
BLOCK_EDGES = 1 << 16

# Stream tags keep the parameter streams and the block streams of different
# generators apart even for equal seeds.
_TAG_LOGISTIC_W = 1
_TAG_LOGISTIC_ROWS = 2
_TAG_BLOBS_C = 3
_TAG_BLOBS_ROWS = 4
_TAG_RMAT = 5
_TAG_RMAT_IDS = 6


def _slice(n: int, start: int, stop: int | None) -> tuple[int, int]:
    stop = n if stop is None else stop
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not (0 <= start <= stop <= n):
        raise ValueError(f"slice [{start}, {stop}) is outside [0, {n})")
    return start, stop


def _blocks(n: int, start: int, stop: int, block: int) -> range:
    if start == stop:
        return range(0)
    return range(start // block, (stop - 1) // block + 1)


def logistic_weights(d: int, seed: int) -> tuple[np.ndarray, float]:
    """The true (weights (d,), intercept) of :func:`logistic_data`'s model.

    Weights are N(0, 4/d), so the logit X @ w has standard deviation about 2:
    classes overlap (the problem is not separable) yet the model is learnable.
    """
    if d < 1:
        raise ValueError(f"d must be >= 1, got {d}")
    rng = np.random.default_rng([seed, _TAG_LOGISTIC_W, d])
    w = rng.standard_normal(d) * (2.0 / math.sqrt(d))
    b = float(rng.uniform(-0.5, 0.5))
    return w, b


def logistic_data(
    n: int, d: int, seed: int, start: int = 0, stop: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Rows [start, stop) of an n-row binary classification problem.

    Returns (X, y): X float64 (stop - start, d), C-contiguous, features i.i.d.
    N(0, 1); y float64 in {0, 1}, drawn as Bernoulli(sigmoid(X @ w + b)) with
    (w, b) = :func:`logistic_weights` (d, seed), so labels are noisy.  Row i
    does not depend on the slice (nor on n).  Raises ValueError for a slice
    outside [0, n) or d < 1.
    """
    start, stop = _slice(n, start, stop)
    w, b = logistic_weights(d, seed)
    X = np.empty((stop - start, d), np.float64)
    y = np.empty(stop - start, np.float64)
    for blk in _blocks(n, start, stop, BLOCK_ROWS):
        lo = blk * BLOCK_ROWS
        rows = min(BLOCK_ROWS, n - lo)
        rng = np.random.default_rng([seed, _TAG_LOGISTIC_ROWS, d, blk])
        Xb = rng.standard_normal((rows, d))
        u = rng.random(rows)
        yb = (u < 1.0 / (1.0 + np.exp(-(Xb @ w + b)))).astype(np.float64)
        a, z = max(lo, start), min(lo + rows, stop)
        X[a - start : z - start] = Xb[a - lo : z - lo]
        y[a - start : z - start] = yb[a - lo : z - lo]
    return X, y


def blob_centers(d: int, k: int, seed: int, spread: float = 10.0) -> np.ndarray:
    """The (k, d) true centres of :func:`blobs`: uniform in [-spread, spread]^d."""
    if d < 1 or k < 1:
        raise ValueError(f"d and k must be >= 1, got d={d}, k={k}")
    rng = np.random.default_rng([seed, _TAG_BLOBS_C, d, k])
    return rng.uniform(-spread, spread, size=(k, d))


def blobs(
    n: int,
    d: int,
    k: int,
    seed: int,
    start: int = 0,
    stop: int | None = None,
    std: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Rows [start, stop) of n points around k Gaussian centres (k-means input).

    Returns (X, centers): X float64 (stop - start, d), C-contiguous, each row
    ``centers[c] + std * N(0, I)`` with c uniform in [0, k); centers =
    :func:`blob_centers` (d, k, seed), (k, d).  Slice-invariant.  Raises
    ValueError for a slice outside [0, n), d < 1 or k < 1.
    """
    start, stop = _slice(n, start, stop)
    centers = blob_centers(d, k, seed)
    X = np.empty((stop - start, d), np.float64)
    for blk in _blocks(n, start, stop, BLOCK_ROWS):
        lo = blk * BLOCK_ROWS
        rows = min(BLOCK_ROWS, n - lo)
        rng = np.random.default_rng([seed, _TAG_BLOBS_ROWS, d, k, blk])
        lab = rng.integers(0, k, size=rows)
        Xb = centers[lab] + std * rng.standard_normal((rows, d))
        a, z = max(lo, start), min(lo + rows, stop)
        X[a - start : z - start] = Xb[a - lo : z - lo]
    return X, centers


def _mix_ids(v: np.ndarray, key: np.ndarray, bits: int) -> np.ndarray:
    """A bijection of [0, 2**bits) (xor-shift / odd-multiply rounds), applied to v.

    Each step is invertible modulo 2**bits, so distinct vertices keep distinct
    ids; every worker computes it alone, with no table to share.
    """
    mask = np.uint64((1 << bits) - 1)
    x = v.astype(np.uint64)
    half = np.uint64(max(1, bits // 2))
    for mult, add in key.reshape(-1, 2):
        x = (x ^ (x >> half)) & mask
        x = (x * (mult | np.uint64(1))) & mask  # odd multiplier: invertible
        x = (x + add) & mask
    x = (x ^ (x >> half)) & mask
    return x.astype(np.int64)


def rmat_edges(
    n_vertices: int,
    n_edges: int,
    seed: int,
    a: float = 0.57,
    b: float = 0.19,
    c: float = 0.19,
    start: int = 0,
    stop: int | None = None,
    sparse_ids: bool = False,
    id_bits: int = 40,
) -> np.ndarray:
    """Edges [start, stop) of an R-MAT graph (Chakrabarti et al.), as (m, 2) int64.

    Each edge picks one quadrant of the adjacency matrix per level with
    probabilities a, b, c, d = 1 - a - b - c over ceil(log2(n_vertices))
    levels; an edge with an endpoint >= n_vertices is redrawn (within its block,
    so slice invariance holds), so ids lie in [0, n_vertices) with R-MAT's
    skew, not folded by a modulo.  The graph has self-loops, duplicate edges
    and vertices without out-edges (dangling) or without any edge, as real
    graphs do.  With ``sparse_ids`` every vertex id v is replaced by a fixed
    seeded bijection of [0, 2**id_bits) applied to v, giving non-contiguous
    ids (an injection of [0, n_vertices)).

    Raises ValueError for bad probabilities, n_vertices < 1, a slice outside
    [0, n_edges), or n_vertices > 2**id_bits.
    """
    if n_vertices < 1:
        raise ValueError(f"n_vertices must be >= 1, got {n_vertices}")
    d = 1.0 - a - b - c
    if min(a, b, c, d) < 0:
        raise ValueError(f"R-MAT probabilities must be >= 0 and sum to 1: a={a}, b={b}, c={c}")
    if sparse_ids and (not (1 <= id_bits <= 62) or n_vertices > (1 << id_bits)):
        raise ValueError(f"need 1 <= id_bits <= 62 and n_vertices <= 2**id_bits, got {id_bits}")
    start, stop = _slice(n_edges, start, stop)
    levels = max(1, math.ceil(math.log2(n_vertices)))
    t_a, t_ab, t_abc = a, a + b, a + b + c
    out = np.empty((stop - start, 2), np.int64)
    for blk in _blocks(n_edges, start, stop, BLOCK_EDGES):
        lo = blk * BLOCK_EDGES
        want = min(BLOCK_EDGES, n_edges - lo)
        rng = np.random.default_rng([seed, _TAG_RMAT, n_vertices, blk])
        got: list[np.ndarray] = []
        have = 0
        while have < want:
            # Oversample a little so one round usually suffices.
            m = int((want - have) * 1.1) + 16
            src = np.zeros(m, np.int64)
            dst = np.zeros(m, np.int64)
            for _ in range(levels):
                r = rng.random(m)
                src = (src << 1) | (r >= t_ab)
                dst = (dst << 1) | (((r >= t_a) & (r < t_ab)) | (r >= t_abc))
            keep = (src < n_vertices) & (dst < n_vertices)
            e = np.stack([src[keep], dst[keep]], axis=1)[: want - have]
            got.append(e)
            have += e.shape[0]
        eb = np.concatenate(got)
        s0, s1 = max(lo, start), min(lo + want, stop)
        out[s0 - start : s1 - start] = eb[s0 - lo : s1 - lo]
    if sparse_ids:
        key = np.random.default_rng([seed, _TAG_RMAT_IDS]).integers(
            0, 1 << 62, size=6, dtype=np.uint64
        )
        out = _mix_ids(out.ravel(), key, id_bits).reshape(-1, 2)
    return out
