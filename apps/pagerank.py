"""PageRank on canary with the 2-D vertex-cut of the edge matrix (as PowerGraph/GraphX do).

Semantics are those of ``networkx.pagerank(G, alpha=damping, weight=None)`` on
``nx.DiGraph(edge list)``: duplicate edges count once, self-loops count, a vertex is every id
that appears in the edge list, and dangling vertices (no out-edge) spread their rank uniformly
over all vertices. The loop stops when the L1 change of the rank vector drops below ``--tol``
(absolute; networkx stops at ``N * tol``) or after ``--max-iter`` iterations.

Partitioning. ``--partitions P`` (a perfect square, P = g*g) edge partitions form a g x g grid;
vertex id v is owned by vertex partition b(v) = hash(v) mod g, and edge (s, d) lives in edge
partition (b(s), b(d)). So a vertex has at most g mirrors as a source (row b(v)) and g as a
destination (column b(v)): at most 2*sqrt(P). Nobody holds the whole edge list, nor even its
share of it: each read partition is one byte range of the text file (or one row range of the
.npy array, or one slice of the generated graph), streamed in K chunks, twice.

Set-up (once):

    pass 1, K times: read a chunk (P) --scatter by grid cell, gather ids + counts--> merge
        into each cell's distinct sources (with edge counts) and destinations
    allocate each cell's CSR: csr_indptr, csr_indices (int32), src_ids, dst_ids (P)
    pass 2, K times: read the chunk again --scatter by grid cell, concat--> fill the rows
    sort each row, drop duplicate edges, compact
    src_ids + out-degrees (P) --to row owner--> routing (g);  dst_ids (P) --to column owner-->
    vertex set-up kernel: vertex ids, routing tables (local indices), 1/out-degree (g)
    vertex counts --reduce--> stats (1) --broadcast--> ranks = 1/N

Per iteration (docs/apps/pagerank.md draws it):

    incoming + routing + ranks + sums --vertex kernel--> ranks, contribution, vertex_stats
    vertex_stats (g) --reduce sum--> (1) --step kernel--> stats  (L1 change, dangling mass)
    vertex_stats (g) --all-reduce sum--> global sums (g)          (dangling mass)
    edge pass for the next iteration (pipelined across the loop test):
      contribution (g) --scatter through the source routing table--> mirrors (P) [replace]
      CSR + mirrors --edge kernel--> partial sums over the cell's destinations (P)
      partial (P) --to the column owner, concat--> incoming (g)
    while stats.l1 >= tol (signal), at most --max-iter times

Run: ``canary run -n 2 apps/pagerank.py`` (default: generated R-MAT graph 100000,1000000).
"""

from __future__ import annotations

import argparse
import math
import os
import time
from typing import Any

import numba
import numpy as np

import canary
from canary.driver import (
    Progress,
    add_output_args,
    check_outputs,
    declare,
    json_line,
    out_of_range,
    planned_workers,
    reports_each_iteration,
    save_npz,
    write_outputs,
)
from canary.generate import BLOCK_EDGES, rmat_edges
from canary.io import (
    count_edges,
    partition_rows,
    read_edges_range,
    read_edges_rows,
    split_byte_ranges,
)

# Layout of the one-partition "stats" dataset.
T_ITER, T_L1, T_DANGLING, T_SUM, T_N, T_ALPHA, T_TOL, T_LEN = range(8)

PROG = "pagerank.py"  # how the app names itself in usage and error lines

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def vertex_owner(ids: np.ndarray, g: int) -> np.ndarray:
    """Vertex partition of each id: splitmix64(id) mod g (the same on every rank)."""
    with np.errstate(over="ignore"):
        x = ids.astype(np.uint64)
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
        x = x ^ (x >> np.uint64(31))
    return (x % np.uint64(g)).astype(np.int64)


def pack(pieces: list[np.ndarray]) -> np.ndarray:
    """Gather keeping piece boundaries: [count, len_0 .. len_{count-1}, piece_0, piece_1, ...]."""
    head = np.array([len(pieces)] + [len(p) for p in pieces], np.int64)
    return np.concatenate([head] + [np.asarray(p, np.int64) for p in pieces])


# ----------------------------------------------------------------------- kernels
@numba.njit(cache=True)
def _unique_sorted(a: np.ndarray) -> np.ndarray:
    """Distinct values of a sorted array."""
    if a.shape[0] == 0:
        return a.copy()
    keep = np.ones(a.shape[0], np.bool_)
    for i in range(1, a.shape[0]):
        if a[i] == a[i - 1]:
            keep[i] = False
    return a[keep]


@numba.njit(cache=True)
def _unique_counts(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct values of a sorted array and how many times each occurs."""
    n = a.shape[0]
    k = 0
    for i in range(n):
        if i == 0 or a[i] != a[i - 1]:
            k += 1
    vals = np.empty(k, np.int64)
    cnt = np.zeros(k, np.int64)
    j = -1
    for i in range(n):
        if i == 0 or a[i] != a[i - 1]:
            j += 1
            vals[j] = a[i]
        cnt[j] += 1
    return vals, cnt


@numba.njit(cache=True)
def chunk_summary_kernel(e: np.ndarray) -> np.ndarray:
    """What a cell learns from one chunk of its edges: [ns, nd, sources (sorted, distinct),
    their edge counts (duplicates included), destinations (sorted, distinct)]."""
    src, cnt = _unique_counts(np.sort(e[:, 0]))
    dst = _unique_sorted(np.sort(e[:, 1]))
    ns, nd = src.shape[0], dst.shape[0]
    out = np.empty(2 + 2 * ns + nd, np.int64)
    out[0] = ns
    out[1] = nd
    out[2: 2 + ns] = src
    out[2 + ns: 2 + 2 * ns] = cnt
    out[2 + 2 * ns:] = dst
    return out


def chunk_summary(pieces: list[np.ndarray]) -> np.ndarray:
    """Gather of a chunk's edges for one cell (pass 1): only the cell's ids and counts."""
    e = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
    return chunk_summary_kernel(e)


@numba.njit(cache=True)
def merge_summary_kernel(acc: np.ndarray, add: np.ndarray) -> np.ndarray:
    """Union of two packed summaries (see chunk_summary_kernel), counts added."""
    na, ma = acc[0], acc[1]
    nb, mb = add[0], add[1]
    sa, ca, da = acc[2: 2 + na], acc[2 + na: 2 + 2 * na], acc[2 + 2 * na: 2 + 2 * na + ma]
    sb, cb, db = add[2: 2 + nb], add[2 + nb: 2 + 2 * nb], add[2 + 2 * nb: 2 + 2 * nb + mb]
    src = np.empty(na + nb, np.int64)
    cnt = np.empty(na + nb, np.int64)
    i = j = k = 0
    while i < na or j < nb:
        if j >= nb or (i < na and sa[i] < sb[j]):
            src[k], cnt[k] = sa[i], ca[i]
            i += 1
        elif i >= na or sb[j] < sa[i]:
            src[k], cnt[k] = sb[j], cb[j]
            j += 1
        else:
            src[k], cnt[k] = sa[i], ca[i] + cb[j]
            i += 1
            j += 1
        k += 1
    dst = np.empty(ma + mb, np.int64)
    i = j = m = 0
    while i < ma or j < mb:
        if j >= mb or (i < ma and da[i] < db[j]):
            dst[m] = da[i]
            i += 1
        elif i >= ma or db[j] < da[i]:
            dst[m] = db[j]
            j += 1
        else:
            dst[m] = da[i]
            i += 1
            j += 1
        m += 1
    out = np.empty(2 + 2 * k + m, np.int64)
    out[0] = k
    out[1] = m
    out[2: 2 + k] = src[:k]
    out[2 + k: 2 + 2 * k] = cnt[:k]
    out[2 + 2 * k:] = dst[:m]
    return out


@numba.njit(cache=True)
def csr_alloc_kernel(
    acc: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """From a cell's summary: (indptr with room for every edge, duplicates included; indices
    (int32, to fill); src_ids; dst_ids; fill cursors = indptr[:-1]; an empty summary)."""
    ns, nd = acc[0], acc[1]
    indptr = np.zeros(ns + 1, np.int64)
    for s in range(ns):
        indptr[s + 1] = indptr[s] + acc[2 + ns + s]
    src_ids = acc[2: 2 + ns].copy()
    dst_ids = acc[2 + 2 * ns: 2 + 2 * ns + nd].copy()
    indices = np.empty(indptr[ns], np.int32)
    return indptr, indices, src_ids, dst_ids, indptr[:ns].copy(), np.zeros(2, np.int64)


def csr_fill(e: np.ndarray, src_ids: np.ndarray, dst_ids: np.ndarray, indices: np.ndarray,
             fill: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pass 2: put one chunk of a cell's edges into their rows (in place)."""
    _csr_fill(e, src_ids, dst_ids, indices, fill)
    return indices, fill


@numba.njit(cache=True)
def _csr_fill(e: np.ndarray, src_ids: np.ndarray, dst_ids: np.ndarray, indices: np.ndarray,
              fill: np.ndarray) -> None:
    si = np.searchsorted(src_ids, e[:, 0])
    di = np.searchsorted(dst_ids, e[:, 1])
    for t in range(e.shape[0]):
        s = si[t]
        indices[fill[s]] = di[t]
        fill[s] += 1


@numba.njit(cache=True)
def csr_finish_kernel(
    indptr: np.ndarray, indices: np.ndarray, fill: np.ndarray, raw: np.ndarray, chunk: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Sort each row, drop duplicate edges, compact. Returns (indptr, indices) and empty
    arrays for the set-up's temporaries (fill cursors, the last chunk read and gathered)."""
    ns = indptr.shape[0] - 1
    w = 0
    lo = indptr[0]
    for s in range(ns):
        hi = indptr[s + 1]
        row = indices[lo:hi]
        row.sort()
        start = w
        for t in range(row.shape[0]):
            if t == 0 or row[t] != row[t - 1]:
                indices[w] = row[t]
                w += 1
        indptr[s] = start
        lo = hi
    indptr[ns] = w
    return (indptr, indices[:w].copy(), np.empty(0, np.int64), np.empty((0, 2), np.int64),
            np.empty((0, 2), np.int64))


def source_piece(indptr: np.ndarray, src_ids: np.ndarray) -> np.ndarray:
    """What a cell tells its row owner: its distinct sources and their out-degree in the cell."""
    return np.concatenate((src_ids, np.diff(indptr)))


@numba.njit(cache=True)
def vertex_setup_kernel(
    src_in: np.ndarray, dst_in: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Vertex ids, routing tables and 1/out-degree of a vertex partition.

    ``src_in``/``dst_in`` are packed pieces from the cells of this partition's row/column. The
    partition's vertices are every id they name (a vertex is a source in its row or a
    destination in its column). The routing tables are [g, offsets (g+1), local vertex
    indices...]: piece c of the table lists, in the cell's order, the local index of each of
    the cell's sources (destinations).
    Returns (ids, route_src, route_dst, inv_out_degree, [vertices, dangling vertices]).
    """
    ids = _unique_sorted(np.sort(np.concatenate((_packed_ids(src_in, True),
                                                 _packed_ids(dst_in, False)))))
    n = ids.shape[0]
    outdeg = np.zeros(n, np.int64)
    route_src = _route(ids, src_in, outdeg, True)
    route_dst = _route(ids, dst_in, outdeg, False)
    inv = np.zeros(n)
    dangling = 0
    for i in range(n):
        if outdeg[i] > 0:
            inv[i] = 1.0 / outdeg[i]
        else:
            dangling += 1
    return ids, route_src, route_dst, inv, np.array([float(n), float(dangling)])


@numba.njit(cache=True)
def _packed_ids(packed: np.ndarray, with_deg: bool) -> np.ndarray:
    """The ids in packed routing pieces (each piece: ids, then their degrees if with_deg)."""
    g = packed[0]
    total = 0
    for c in range(g):
        ln = packed[1 + c]
        total += ln // 2 if with_deg else ln
    out = np.empty(total, np.int64)
    pos = 1 + g
    w = 0
    for c in range(g):
        ln = packed[1 + c]
        k = ln // 2 if with_deg else ln
        out[w: w + k] = packed[pos: pos + k]
        w += k
        pos += ln
    return out


@numba.njit(cache=True)
def _route(ids: np.ndarray, packed: np.ndarray, outdeg: np.ndarray, with_deg: bool) -> np.ndarray:
    g = packed[0]
    total = 0
    for c in range(g):
        ln = packed[1 + c]
        total += ln // 2 if with_deg else ln
    out = np.empty(1 + (g + 1) + total, np.int64)
    out[0] = g
    out[1] = 0
    pos = 1 + g
    w = 2 + g
    for c in range(g):
        ln = packed[1 + c]
        k = ln // 2 if with_deg else ln
        vals = packed[pos: pos + k]
        loc = np.searchsorted(ids, vals)
        for t in range(k):
            if loc[t] >= ids.shape[0] or ids[loc[t]] != vals[t]:
                raise ValueError("pagerank: a cell names a vertex its owner does not hold")
            out[w + t] = loc[t]
            if with_deg:
                outdeg[loc[t]] += packed[pos + k + t]
        w += k
        out[2 + c] = out[1 + c] + k
        pos += ln
    return out


@numba.njit(cache=True)
def stats_init_kernel(counts: np.ndarray, stats: np.ndarray) -> np.ndarray:
    n = counts[0]
    stats[T_N] = n
    stats[T_DANGLING] = counts[1] / n
    stats[T_SUM] = 1.0
    return stats


@numba.njit(cache=True)
def rank_init_kernel(inv: np.ndarray, stats: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x = 1/N, its contribution x/out-degree, and the sums the first vertex kernel reads
    ([L1 change, dangling mass, rank sum] of x, as the all-reduce of vertex_stats gives them)."""
    x = np.full(inv.shape[0], 1.0 / stats[T_N])
    return x, x * inv, np.array([stats[T_L1], stats[T_DANGLING], stats[T_SUM]])


def mirror_scatter(contrib: np.ndarray, route: np.ndarray) -> list[np.ndarray]:
    """Each cell of the row gets the contributions of its sources, in its own order."""
    g = int(route[0])
    off = route[1: g + 2]
    idx = route[g + 2:]
    return [contrib[idx[off[c]: off[c + 1]]] for c in range(g)]


@numba.njit(cache=True)
def edge_kernel(
    indptr: np.ndarray, indices: np.ndarray, dst_ids: np.ndarray, mirror: np.ndarray
) -> np.ndarray:
    """Sum of rank/out-degree over in-edges, for each destination of the cell."""
    out = np.zeros(dst_ids.shape[0])
    for s in range(indptr.shape[0] - 1):
        v = mirror[s]
        for e in range(indptr[s], indptr[s + 1]):
            out[indices[e]] += v
    return out


@numba.njit(cache=True)
def vertex_kernel(
    incoming: np.ndarray, route: np.ndarray, x: np.ndarray, contrib: np.ndarray,
    inv: np.ndarray, stats: np.ndarray, sums: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x' = alpha * (in-sum + dangling mass / N) + (1 - alpha) / N, as networkx.

    ``stats`` holds the constants (N, alpha), ``sums`` the previous iteration's [L1 change,
    dangling mass, rank sum] summed over all vertex partitions. Updates x and the contribution
    x' / out-degree in place; returns them and [L1 change, dangling mass of x', sum of x'].
    """
    n = x.shape[0]
    g = route[0]
    idx = route[g + 2:]
    acc = np.zeros(n)
    for t in range(idx.shape[0]):
        acc[idx[t]] += incoming[t]
    alpha = stats[T_ALPHA]
    nv = stats[T_N]
    base = alpha * sums[1] / nv + (1.0 - alpha) / nv
    l1 = 0.0
    dang = 0.0
    tot = 0.0
    for i in range(n):
        v = alpha * acc[i] + base
        l1 += abs(v - x[i])
        x[i] = v
        contrib[i] = v * inv[i]
        tot += v
        if inv[i] == 0.0:
            dang += v
    return x, contrib, np.array([l1, dang, tot])


@numba.njit(cache=True)
def step_kernel(vsum: np.ndarray, stats: np.ndarray) -> np.ndarray:
    stats[T_ITER] += 1
    stats[T_L1] = vsum[0]
    stats[T_DANGLING] = vsum[1]
    stats[T_SUM] = vsum[2]
    return stats


@numba.njit(cache=True)
def not_converged(stats: np.ndarray) -> bool:
    return stats[T_L1] >= stats[T_TOL]


@numba.njit(cache=True)
def edge_count_kernel(indices: np.ndarray) -> np.ndarray:
    return np.array([float(indices.shape[0])])


# ------------------------------------------------------------------- driver
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog=PROG,
        description="PageRank (networkx semantics) with a 2-D vertex-cut on canary.",
    )
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--input", help="edge list: SNAP-style text ('#' comments, 'SRC DST' "
                                     "lines) or .npy (m, 2) integer array")
    src.add_argument("--generate", default=None, metavar="V,E",
                     help="seeded R-MAT graph (default 100000,1000000 when no --input)")
    ap.add_argument("--sparse-ids", action="store_true",
                    help="with --generate: scatter vertex ids over [0, 2**40)")
    ap.add_argument("--damping", type=float, default=0.85)
    ap.add_argument("--tol", type=float, default=1e-10,
                    help="stop when the L1 change of the ranks is below this (0: run --max-iter "
                         "iterations)")
    ap.add_argument("--max-iter", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=None,
                    help="edge partitions, a perfect square g*g (default: the smallest square "
                         ">= 2 per worker that splits evenly over the workers: 4, 4, 9, 16 for "
                         "1-4 workers); vertices get g partitions")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--chunk-edges", type=int, default=None,
                    help="set-up reads each partition's edges in chunks of about this many "
                         "(smaller: less memory while loading, more tasks; default: 1/16 of "
                         "a partition, a power of two in [4096, 65536])")
    ap.add_argument("--output", help="write 'vertex rank' lines, sorted by vertex id (a name "
                                     "ending in .npz: the arrays vertex and rank)")
    ap.add_argument("--top", type=int, default=0, help="print the K highest-ranked vertices")
    add_output_args(ap)
    args = ap.parse_args(argv)
    args.on_progress = None  # set by main() on rank 0; tests may set their own
    args.want_ranks = bool(args.output or args.top)
    if args.input is None and args.generate is None:
        args.generate = "100000,1000000"
    if args.generate is not None:
        try:
            v, e = (int(t) for t in args.generate.split(","))
        except ValueError:
            ap.error(f"--generate expects V,E (two integers), got {args.generate!r}")
        if v < 1 or e < 1:
            ap.error(f"--generate V,E must be positive (an empty graph has no PageRank), "
                     f"got {args.generate!r}")
        args.n_vertices, args.n_edges = v, e
    if not (0.0 < args.damping < 1.0):
        ap.error(f"--damping must be in (0, 1), got {args.damping}")
    bad = out_of_range(("--tol", args.tol, args.tol >= 0, ">= 0"),
                       ("--max-iter", args.max_iter, args.max_iter >= 0, ">= 0"),
                       ("--top", args.top, args.top >= 0, ">= 0"))
    if bad:
        ap.error(bad)
    if args.chunk_edges is not None and args.chunk_edges < 1:
        ap.error(f"--chunk-edges must be >= 1, got {args.chunk_edges}")
    if args.partitions is not None:
        g = math.isqrt(max(args.partitions, 0))
        if args.partitions < 1 or g * g != args.partitions:
            lo, hi = max(1, g) ** 2, (g + 1) ** 2
            ap.error(f"--partitions must be a perfect square (a g x g grid of edge blocks), "
                     f"got {args.partitions}; try {lo} or {hi}")
    return args


def default_grid(workers: int) -> int:
    """Grid side g (P = g*g edge partitions, g vertex partitions) for ``workers`` workers.

    The smallest g with at least 2 cells per worker whose g*g cells split evenly over the
    workers (2 workers: 2 x 2; 3: 3 x 3; 4: 4 x 4); if none does below the old rule's side
    (at least 4 cells per worker), that. Fewer, evenly spread partitions mean fewer tasks
    and exchanges per iteration and no worker with a cell more than another (the 3 x 3 grid
    on 2 workers gave one 5 cells and 2 vertex partitions, the other 4 and 1).
    """
    w = max(workers, 1)
    most = math.ceil(math.sqrt(4 * w))
    for g in range(max(2, math.ceil(math.sqrt(2 * w))), most):
        if g * g % w == 0:
            return g
    return most


def auto_chunk_edges(m: int, partitions: int) -> int:
    """About 1/16 of a read partition, a power of two in [4096, 65536] (65536 = R-MAT's block):
    the chunks in flight on a worker stay a small fraction of its CSR."""
    want = max(1, math.ceil(m / partitions / 16))
    return min(1 << 16, max(1 << 12, 1 << (want - 1).bit_length()))


def build(args: argparse.Namespace, n_workers: int) -> tuple[canary.Program, dict[str, Any]]:
    """Declare the program (on every rank, identically). Returns it and the graph's shape."""
    if args.input is not None:
        m = count_edges(args.input)  # raises for an empty graph, naming the file
        is_npy = os.path.splitext(args.input)[1].lower() == ".npy"
    else:
        m = args.n_edges
        is_npy = False
    g = math.isqrt(args.partitions) if args.partitions else default_grid(n_workers)
    P = g * g
    # Set-up streams the edges in chunks of about --chunk-edges per read partition, twice
    # (pass 1: each cell's ids and row lengths; pass 2: fill the CSR), so no worker ever holds
    # its raw edge list: memory stays near the CSR's own size.
    chunk = args.chunk_edges or auto_chunk_edges(m, P)
    if args.input is not None and not is_npy:
        K = max(1, math.ceil(m / P / chunk))
        byte_ranges = split_byte_ranges(args.input, P * K)
        chunks = [byte_ranges[i * K:(i + 1) * K] for i in range(P)]
    else:
        # Row chunks; with --generate, aligned to R-MAT's blocks (a block is generated whole).
        align = BLOCK_EDGES if args.input is None and chunk >= BLOCK_EDGES else 1
        step = max(align, chunk // align * align)
        rows = []
        for a, b in partition_rows(m, P):
            cuts = [a] + list(range((a // step + 1) * step, b, step)) + [b]
            rows.append(list(zip(cuts[:-1], cuts[1:])))
        K = max(len(r) for r in rows)
        chunks = [r + [(r[-1][1], r[-1][1])] * (K - len(r)) for r in rows]

    def start_reading(i: int, parts: int) -> tuple[np.ndarray, np.ndarray]:
        return np.array([i, 0], np.int64), np.zeros(2, np.int64)

    def read_chunk(cursor: np.ndarray, after: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The next chunk of read partition cursor[0] (chunk cursor[1] mod K); advances.

        ``after`` is only a dependency: the cell that the previous chunk's pieces were merged
        into, so reading waits for that merge, which waited for every piece of the previous
        chunk. Without it, reads and scatters run ahead of the gathers (up to the run-ahead
        window) and the pieces of many chunks pile up, which is what chunking avoids."""
        i, k = int(cursor[0]), int(cursor[1]) % K
        a, b = chunks[i][k]
        cursor[1] += 1
        if args.input is None:
            e = rmat_edges(args.n_vertices, args.n_edges, args.seed, start=a, stop=b,
                           sparse_ids=args.sparse_ids)
        elif is_npy:
            e = read_edges_rows(args.input, a, b)
        else:
            e = read_edges_range(args.input, a, b)
        return e, cursor

    def cell_scatter(e: np.ndarray) -> list[np.ndarray]:
        cell = vertex_owner(e[:, 0], g) * g + vertex_owner(e[:, 1], g)
        order = np.argsort(cell, kind="stable")
        bounds = np.searchsorted(cell[order], np.arange(P + 1))
        es = e[order]
        return [es[bounds[q]: bounds[q + 1]] for q in range(P)]

    p = canary.Program("pagerank")
    cursor = p.dataset("read_cursor", P)
    raw = p.dataset("raw_edges", P)
    summary = p.dataset("chunk_summary", P)
    cell_ids = p.dataset("cell_summary", P)
    cells = p.dataset("cell_edges", P)
    fill = p.dataset("csr_fill", P)
    indptr = p.dataset("csr_indptr", P)
    indices = p.dataset("csr_indices", P)
    src_ids = p.dataset("src_ids", P)
    dst_ids = p.dataset("dst_ids", P)
    mirror = p.dataset("mirrors", P)
    partial = p.dataset("partial", P)
    ecount_local = p.dataset("local_edge_count", P)
    vids = p.dataset("vertex_ids", g)
    src_in = p.dataset("source_routing_in", g)
    dst_in = p.dataset("dest_routing_in", g)
    route_src = p.dataset("source_routing", g)
    route_dst = p.dataset("dest_routing", g)
    inv = p.dataset("inv_out_degree", g)
    vinfo = p.dataset("vertex_info", g)
    x = p.dataset("ranks", g)
    contrib = p.dataset("contribution", g)
    incoming = p.dataset("incoming", g)
    vstat = p.dataset("vertex_stats", g)
    local_stats = p.dataset("local_stats", g)
    gsums = p.dataset("global_sums", g)
    counts = p.dataset("vertex_counts", 1)
    stats = p.dataset("stats", 1)
    vsum = p.dataset("stats_sum", 1)
    ecount = p.dataset("edge_count", 1)

    # --- set-up, pass 1: each cell's distinct sources (with edge counts) and destinations
    p.load([cursor, cell_ids], start_reading, name="start_reading")
    with p.loop(K):
        p.compute(read_chunk, [cursor, cell_ids], [raw, cursor], name="read_chunk")
        p.scatter_gather(raw, summary, cell_scatter, chunk_summary, name="summarize_cells")
        p.compute(merge_summary_kernel, [cell_ids, summary], [cell_ids])
    p.compute(csr_alloc_kernel, [cell_ids], [indptr, indices, src_ids, dst_ids, fill, cell_ids])
    # --- pass 2: the same chunks again, each edge into its row of the cell's CSR
    with p.loop(K):
        p.compute(read_chunk, [cursor, fill], [raw, cursor], name="reread_chunk")
        p.scatter_gather(raw, cells, cell_scatter, "concat", name="shuffle_edges_to_cells")
        p.compute(csr_fill, [cells, src_ids, dst_ids, indices, fill], [indices, fill])
    p.compute(csr_finish_kernel, [indptr, indices, fill, raw, cells],
              [indptr, indices, fill, raw, cells])
    # --- routing tables: each cell's sources to its row owner, destinations to its column's
    p.scatter_gather([indptr, src_ids], src_in, source_piece, pack,
                     targets=lambda q: [q // g], one_piece=True, name="route_sources")
    p.scatter_gather(dst_ids, dst_in, None, pack, targets=lambda q: [q % g], one_piece=True,
                     name="route_destinations")
    p.compute(vertex_setup_kernel, [src_in, dst_in], [vids, route_src, route_dst, inv, vinfo])
    p.reduce(vinfo, counts, name="count_vertices")
    stats0 = np.zeros(T_LEN)
    stats0[[T_L1, T_ALPHA, T_TOL]] = [np.inf, args.damping, args.tol]
    p.load([stats], lambda i, n_: stats0.copy(), name="init_stats")
    p.compute(stats_init_kernel, [counts, stats], [stats])
    p.compute(edge_count_kernel, [indices], [ecount_local])
    p.reduce(ecount_local, ecount, name="count_edges")
    p.broadcast(stats, local_stats, name="broadcast_n")
    p.compute(rank_init_kernel, [inv, local_stats], [x, contrib, gsums])

    # --- power iteration, software-pipelined across the loop test: an iteration's edge pass
    # (mirrors, edge kernels, partial sums to the owners) is issued right after its vertex
    # kernel, for the next iteration, so it overlaps the reduce and the signal that decide
    # whether there is a next iteration (if not, one edge pass is computed for nothing). The
    # vertex partitions get the global sums (dangling mass) by an all-reduce.
    def edge_pass() -> None:
        p.scatter_gather([contrib, route_src], mirror, mirror_scatter, "replace",
                         targets=lambda b: [b * g + c for c in range(g)], name="send_to_mirrors")
        p.compute(edge_kernel, [indptr, indices, dst_ids, mirror], [partial])
        p.scatter_gather(partial, incoming, None, "concat", targets=lambda q: [q % g],
                         one_piece=True, name="send_to_owners")

    edge_pass()
    with p.while_(not_converged, on=stats, max_iter=args.max_iter):
        p.compute(vertex_kernel, [incoming, route_dst, x, contrib, inv, local_stats, gsums],
                  [x, contrib, vstat])
        p.reduce(vstat, vsum)
        p.scatter_gather(vstat, gsums, None, "sum", one_piece=True, name="allreduce_sums")
        edge_pass()
        p.compute(step_kernel, [vsum, stats], [stats])
        if reports_each_iteration(args):
            p.report(stats, callback=args.on_progress)
    p.report(stats, name="final_stats")
    p.report(ecount, name="final_edge_count")
    if args.want_ranks:
        p.report(vids, name="final_vertex_ids")
        p.report(x, name="final_ranks")
    return p, {"edges": m, "partitions": P, "grid": g}


def ranks_by_id(result: canary.JobResult) -> tuple[np.ndarray, np.ndarray]:
    """(vertex ids sorted, their ranks) from a job that reported them."""
    ids = result.concat("vertex_ids")
    r = result.concat("ranks")
    order = np.argsort(ids, kind="stable")
    return ids[order], r[order]


def write_ranks(path: str, ids: np.ndarray, ranks: np.ndarray) -> None:
    """'vertex rank' text lines sorted by vertex id, or, for a name ending in .npz, the arrays
    ``vertex`` and ``rank`` (what the other apps write: a .npz name got text)."""
    if path.endswith(".npz"):
        save_npz(path, vertex=ids, rank=ranks)
        return
    with open(path, "w") as f:
        for a in range(0, len(ids), 65536):
            f.write("".join(f"{int(i)} {float(r):.17g}\n"
                            for i, r in zip(ids[a:a + 65536], ranks[a:a + 65536])))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    is_root = comm.Get_rank() == 0
    if not check_outputs(PROG, {"--output": args.output, "--metrics": args.metrics,
                                "--trace": args.trace}, comm,
                         {"--input": args.input}):
        return 2
    t0 = time.perf_counter()

    def on_progress(ev: canary.ReportEvent) -> None:
        s = ev.value
        it = int(s[T_ITER])
        row = {"iteration": it, "l1_change": float(s[T_L1]), "dangling_mass": float(s[T_DANGLING]),
               "rank_sum": float(s[T_SUM]), "seconds": round(ev.seconds, 6), "tasks": ev.tasks}
        progress.record(row, f"iter {it:4d}  L1 change {row['l1_change']:.3e}  tasks {ev.tasks}  "
                             f"{ev.seconds:.3f}s")

    args.on_progress = on_progress
    declared = declare(PROG, build, args, planned_workers(comm), is_root=is_root)
    if declared is None:
        return 2
    prog, shape = declared
    progress = Progress(args.metrics, args.print_every, is_root)
    result = canary.run(prog, comm, trace=args.trace)
    progress.close()
    if result is None:
        return 0
    s = result.value("stats")
    top: list[list[float]] = []
    status = 0
    if args.want_ranks:
        ids, ranks = ranks_by_id(result)
        if args.output:
            status = write_outputs(PROG, {"--output": (args.output,
                                                       lambda path: write_ranks(path, ids, ranks))})
        if args.top:
            order = np.lexsort((ids, -ranks))[: args.top]
            print(f"top {len(order)} vertices by rank:")
            for j in order:
                print(f"  {int(ids[j])} {float(ranks[j]):.17g}")
                top.append([int(ids[j]), float(ranks[j])])
    summary = {
        "app": "pagerank", "vertices": int(s[T_N]), "edges": shape["edges"],
        "distinct_edges": int(result.value("edge_count")[0]),
        "partitions": shape["partitions"], "grid": shape["grid"], "workers": result.workers,
        "iterations": int(s[T_ITER]),
        # before any iteration (--max-iter 0) the change is unknown: null in the JSON
        "l1_change": float(s[T_L1]), "rank_sum": float(s[T_SUM]),
        "converged": bool(s[T_L1] < args.tol),
        "seconds": round(time.perf_counter() - t0, 4), "tasks": result.tasks_run,
        "controller_cpu_percent": result.controller_cpu_percent,
        "controller_messages": result.scheduling_messages,
        "migrations": result.migrations, "bytes_migrated": result.bytes_migrated,
        "snapshots": result.snapshots, "resumed_from": result.resumed_from,
    }
    if top:
        summary["top"] = top
    change = f"{s[T_L1]:.3e}" if np.isfinite(s[T_L1]) else "unknown (no iteration)"
    print(f"L1 change {change} after {summary['iterations']} iterations "
          f"({summary['vertices']} vertices, {summary['distinct_edges']} distinct edges)",
          flush=True)
    print(json_line(summary), flush=True)
    return status


if __name__ == "__main__":
    from canary.script import end_script, run_main

    end_script(run_main(__file__))  # under the name apps.<module>: one numba cache
