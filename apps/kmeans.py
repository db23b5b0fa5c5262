"""k-means (Lloyd's algorithm) on canary, step for step the one scikit-learn runs.

Dataflow per iteration (docs/apps/kmeans.md draws it):

    centers (1) --broadcast--> local_centers (P)
    points (P) + labels (P) + local_centers --assign kernel--> labels, partial (P)
        partial = per-centre sums and counts, labels changed, inertia, farthest points
    partial (P) --reduce concat--> total (1)
    total + centers + state --update kernel--> centers, state
    while labels changed and centre shift > tol (signal), at most --max-iter times

then one more assignment against the final centres gives the returned labels and inertia.

Semantics follow ``sklearn.cluster.KMeans(algorithm="lloyd")``: ties go to the lowest centre
index; ``--tol`` is relative to the data (the loop stops once the sum of squared centre shifts is
<= tol * mean per-feature variance, as scikit-learn's ``tol``), and the loop also stops when no
label changed. **Empty clusters** use scikit-learn's rule: each empty cluster (in increasing
index) takes the point farthest from its assigned centre (farthest first, ties to the lower row
index), which is removed from its old cluster's sum; if every point sits on its centre, nothing
moves and an empty centre is placed on the centre of the largest cluster.

Initial centres: ``--init PATH.npy`` (k, d), or seeded k-means++ (D^2 sampling, one candidate
per step, run distributed over the partitions: k rounds of weight reduce, pick, broadcast).

Run: ``canary run -n 2 apps/kmeans.py`` (default: generated blobs 20000,10,8).
"""

from __future__ import annotations

import argparse
import math
import sys
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
from canary.generate import blobs
from canary.io import InputFormatError, count_rows, map_npy, partition_rows, read_rows

# Layout of the one-partition "state" dataset.
S_ITER, S_CHANGED, S_SHIFT, S_INERTIA, S_TOL, S_TOLREL, S_EMPTY, S_LEN = range(8)
# Layout of the k-means++ state: step, chosen partition, offset in it, mode, then k uniforms.
K_STEP, K_PART, K_OFF, K_MODE, K_HEAD = range(5)

PROG = "kmeans.py"  # how the app names itself in usage and error lines


# ----------------------------------------------------------------------- kernels
@numba.njit(cache=True)
def moments_kernel(X: np.ndarray) -> np.ndarray:
    """[rows, column means (d), column sums of squared deviations (d)] of one partition."""
    n, d = X.shape
    out = np.zeros(1 + 2 * d)
    out[0] = n
    if n == 0:
        return out
    for j in range(d):
        s = 0.0
        for i in range(n):
            s += X[i, j]
        m = s / n
        q = 0.0
        for i in range(n):
            q += (X[i, j] - m) ** 2
        out[1 + j] = m
        out[1 + d + j] = q
    return out


@numba.njit(cache=True)
def tolerance_kernel(mom: np.ndarray, centers: np.ndarray, state: np.ndarray) -> np.ndarray:
    """Combine partition moments (Chan et al., in partition order) into the absolute tolerance
    tol * mean per-feature variance, scikit-learn's ``_tolerance``."""
    d = centers.shape[1]
    L = 1 + 2 * d
    P = mom.shape[0] // L
    n = 0.0
    mean = np.zeros(d)
    m2 = np.zeros(d)
    for p in range(P):
        b = p * L
        nb = mom[b]
        if nb == 0:
            continue
        tot = n + nb
        for j in range(d):
            delta = mom[b + 1 + j] - mean[j]
            mean[j] += delta * nb / tot
            m2[j] += mom[b + 1 + d + j] + delta * delta * n * nb / tot
        n = tot
    var = 0.0
    for j in range(d):
        var += m2[j] / n
    if not math.isfinite(var):  # so do the squared distances: every point would be nearest 0
        raise ValueError("the features' squared deviations overflow float64 (values of 1e154 "
                         "or more): rescale the data, e.g. standardise each column")
    state[S_TOL] = var / d * state[S_TOLREL] if state[S_TOLREL] > 0 else 0.0
    return state


# Reassociation lets LLVM vectorise a distance's sum over features; the order is the same for
# every row, partition and worker count, so results stay identical across them. No-NaN/no-inf
# assumptions are not made: a NaN row still yields a NaN inertia.
_ROW_MATH = {"reassoc", "nsz", "contract"}


@numba.njit(cache=True, fastmath=_ROW_MATH)
def sqdist(a: np.ndarray, i: int, b: np.ndarray, j: int) -> float:
    """Squared Euclidean distance between row ``i`` of ``a`` and row ``j`` of ``b``."""
    s = 0.0
    for f in range(a.shape[1]):
        t = a[i, f] - b[j, f]
        s += t * t
    return s


@numba.njit(cache=True, fastmath=_ROW_MATH)
def nearest_center(X: np.ndarray, i: int, centers: np.ndarray) -> tuple[int, float]:
    """(index, squared distance) of the centre nearest to row ``i``; ties go to the lower index.

    Written as a plain running minimum from centre 0 so that LLVM turns it into selects: the
    branchy form (``best < 0 or s < bd``) mispredicted on random data and ran several times
    slower.
    """
    best = 0
    bd = sqdist(X, i, centers, 0)
    for j in range(1, centers.shape[0]):
        s = sqdist(X, i, centers, j)
        if s < bd:
            best = j
            bd = s
    return best, bd


@numba.njit(cache=True)
def assign_kernel(
    X: np.ndarray, meta: np.ndarray, labels: np.ndarray, centers: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Label each point with its nearest centre (ties: lowest index) and summarise the partition.

    Returns the new labels and ``partial``: per-centre sums (k*d), counts (k), number of labels
    that changed, inertia, then the partition's k points farthest from their centre, each as
    (squared distance, global row, label, x (d)) with distance -1 for unused slots.
    """
    n, d = X.shape
    k = centers.shape[0]
    row0 = meta[1]
    out = np.zeros(k * d + k + 2 + k * (3 + d))
    sums = out[: k * d].reshape((k, d))
    counts = out[k * d: k * d + k]
    cand = out[k * d + k + 2:].reshape((k, 3 + d))
    for t in range(k):
        cand[t, 0] = -1.0
    new = np.empty(n, np.int64)
    changed = 0
    inertia = 0.0
    for i in range(n):
        best, bd = nearest_center(X, i, centers)
        new[i] = best
        if labels[i] != best:
            changed += 1
        inertia += bd
        counts[best] += 1.0
        for f in range(d):
            sums[best, f] += X[i, f]
        # keep the k farthest points (distance descending, ties: earlier row first)
        if bd > cand[k - 1, 0]:
            pos = k - 1
            while pos > 0 and bd > cand[pos - 1, 0]:
                pos -= 1
            for t in range(k - 1, pos, -1):
                cand[t, :] = cand[t - 1, :]
            cand[pos, 0] = bd
            cand[pos, 1] = row0 + i
            cand[pos, 2] = best
            for f in range(d):
                cand[pos, 3 + f] = X[i, f]
    out[k * d + k] = changed
    out[k * d + k + 1] = inertia
    return new, out


@numba.njit(cache=True)
def update_kernel(
    total: np.ndarray, centers: np.ndarray, state: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """New centres from the partitions' sums (in partition order), as scikit-learn's Lloyd step."""
    k, d = centers.shape
    L = k * d + k + 2 + k * (3 + d)
    P = total.shape[0] // L
    sums = np.zeros((k, d))
    counts = np.zeros(k)
    changed = 0.0
    inertia = 0.0
    for p in range(P):
        b = p * L
        sums += total[b: b + k * d].reshape((k, d))
        counts += total[b + k * d: b + k * d + k]
        changed += total[b + k * d + k]
        inertia += total[b + k * d + k + 1]
    n_empty = 0
    for j in range(k):
        if counts[j] == 0:
            n_empty += 1
    if n_empty > 0:
        # candidates from every partition: (distance desc, global row asc)
        cand = np.empty((P * k, 3 + d))
        m = 0
        for p in range(P):
            b = p * L + k * d + k + 2
            for t in range(k):
                if total[b + t * (3 + d)] >= 0:
                    cand[m, :] = total[b + t * (3 + d): b + (t + 1) * (3 + d)]
                    m += 1
        cand = cand[:m]
        key = np.empty(m)
        order = np.argsort(cand[:, 1], kind="mergesort")
        cand = cand[order]
        for t in range(m):
            key[t] = -cand[t, 0]
        order = np.argsort(key, kind="mergesort")
        cand = cand[order]
        if m > 0 and cand[0, 0] > 0:
            idx = 0
            for new in range(k):
                if counts[new] != 0 or idx >= m:
                    continue
                old = int(cand[idx, 2])
                for f in range(d):
                    sums[old, f] -= cand[idx, 3 + f]
                    sums[new, f] = cand[idx, 3 + f]
                counts[new] = 1.0
                counts[old] -= 1.0
                idx += 1
    big = 0
    for j in range(1, k):
        if counts[j] > counts[big]:
            big = j
    for j in range(k):
        if counts[j] > 0:
            alpha = 1.0 / counts[j]
            for f in range(d):
                sums[j, f] *= alpha
        else:
            for f in range(d):
                sums[j, f] = sums[big, f]
    shift = 0.0
    for j in range(k):
        shift += sqdist(sums, j, centers, j)
    state[S_ITER] += 1
    state[S_CHANGED] = changed
    state[S_SHIFT] = shift
    state[S_INERTIA] = inertia
    state[S_EMPTY] = n_empty
    return sums, state


@numba.njit(cache=True)
def not_converged(state: np.ndarray) -> bool:
    return state[S_CHANGED] > 0 and state[S_SHIFT] > state[S_TOL]


@numba.njit(cache=True)
def final_assign_kernel(
    X: np.ndarray, centers: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Labels against the final centres and the partition's inertia."""
    n, d = X.shape
    labels = np.empty(n, np.int64)
    inertia = 0.0
    for i in range(n):
        best, bd = nearest_center(X, i, centers)
        labels[i] = best
        inertia += bd
    return labels, np.array([inertia])


@numba.njit(cache=True)
def result_kernel(state: np.ndarray, fin: np.ndarray) -> np.ndarray:
    """[iterations, inertia, labels changed in the last iteration, centre shift, empty clusters,
    absolute tolerance]."""
    return np.array([state[S_ITER], fin[0], state[S_CHANGED], state[S_SHIFT], state[S_EMPTY],
                     state[S_TOL]])


# ------------------------------------------------------------------ k-means++
@numba.njit(cache=True)
def kpp_init_kernel(X: np.ndarray) -> np.ndarray:
    return np.full(X.shape[0], np.inf)


@numba.njit(cache=True)
def kpp_weight_kernel(mind: np.ndarray) -> np.ndarray:
    """[sum of squared distances to the nearest chosen centre, rows] of a partition."""
    s = 0.0
    for v in mind:
        s += v
    return np.array([s, float(mind.shape[0])])


@numba.njit(cache=True)
def kpp_pick_kernel(w: np.ndarray, ks: np.ndarray) -> np.ndarray:
    """Choose the partition (and the offset within it) of the next centre from uniform u[step].

    Weighted by D^2 (k-means++); the first centre, or a total weight that is 0 or not finite
    (every point already a centre), falls back to a uniform pick over the rows.
    """
    P = w.shape[0] // 2
    step = int(ks[K_STEP])
    u = ks[K_HEAD + step]
    tot = 0.0
    rows = 0.0
    for p in range(P):
        tot += w[2 * p]
        rows += w[2 * p + 1]
    uniform = step == 0 or not (tot > 0.0 and np.isfinite(tot))
    col = 1 if uniform else 0
    r = u * (rows if uniform else tot)
    part = -1
    before = 0.0
    for p in range(P):
        wp = w[2 * p + col]
        if wp > 0 and before + wp > r:
            part = p
            break
        before += wp
    if part < 0:  # rounding: the last partition with weight
        before = 0.0
        for p in range(P):
            if w[2 * p + col] > 0:
                part = p
        for p in range(part):
            before += w[2 * p + col]
    ks[K_PART] = part
    ks[K_OFF] = max(r - before, 0.0)
    ks[K_MODE] = 1.0 if uniform else 0.0
    return ks


@numba.njit(cache=True)
def kpp_candidate_kernel(
    X: np.ndarray, mind: np.ndarray, meta: np.ndarray, ks: np.ndarray
) -> np.ndarray:
    """The chosen point if this partition holds it, else zeros (a sum then yields the point)."""
    n, d = X.shape
    out = np.zeros(d)
    if int(meta[0]) != int(ks[K_PART]) or n == 0:
        return out
    r = ks[K_OFF]
    idx = n - 1
    if ks[K_MODE] == 1.0:
        idx = min(int(r), n - 1)
    else:
        acc = 0.0
        last = -1
        for i in range(n):
            if mind[i] > 0:
                last = i
            acc += mind[i]
            if acc > r and mind[i] > 0:
                last = i
                break
        idx = last if last >= 0 else n - 1
    out[:] = X[idx]
    return out


@numba.njit(cache=True)
def kpp_append_kernel(
    newc: np.ndarray, centers: np.ndarray, ks: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    centers[int(ks[K_STEP])] = newc
    ks[K_STEP] += 1
    return centers, ks


@numba.njit(cache=True)
def kpp_mind_kernel(X: np.ndarray, mind: np.ndarray, c: np.ndarray) -> np.ndarray:
    n, d = X.shape
    c2 = c.reshape((1, d))
    for i in range(n):
        s = sqdist(X, i, c2, 0)
        if s < mind[i]:
            mind[i] = s
    return mind


# ------------------------------------------------------------------- driver
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog=PROG, description="k-means (Lloyd's algorithm, as scikit-learn) on canary."
    )
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--input", help=".npy (n, d), .npz with X, .h5 with dataset X, or svmlight")
    src.add_argument("--generate", default=None, metavar="N,D,K",
                     help="seeded Gaussian blobs (default 20000,10,8 when no --input)")
    ap.add_argument("--features", type=int, default=None,
                    help="number of features of svmlight input (default: largest index seen)")
    ap.add_argument("--k", type=int, default=None,
                    help="clusters (default: rows of --init, else K of --generate, else 8)")
    ap.add_argument("--init", default=None, help="initial centres, .npy (k, d); default k-means++")
    ap.add_argument("--tol", type=float, default=1e-4,
                    help="stop when the sum of squared centre shifts <= tol * mean feature "
                         "variance (scikit-learn's tol); 0: only when no label changes")
    ap.add_argument("--max-iter", type=int, default=300)
    ap.add_argument("--partitions", type=int, default=None,
                    help="data partitions (default: 4 per worker, at most one per point)")
    ap.add_argument("--seed", type=int, default=0, help="data generation and k-means++ seed")
    ap.add_argument("--output", help="write centers (k, d), labels (n,), inertia to this .npz")
    add_output_args(ap)
    args = ap.parse_args(argv)
    args.on_progress = None  # set by main() on rank 0; tests may set their own
    args.want_labels = bool(args.output)
    if args.input is None and args.generate is None:
        args.generate = "20000,10,8"
    if args.generate is not None:
        try:
            n, d, kg = (int(v) for v in args.generate.split(","))
        except ValueError:
            ap.error(f"--generate expects N,D,K (three integers), got {args.generate!r}")
        if n < 1 or d < 1 or kg < 1:
            ap.error(f"--generate N,D,K must be positive, got {args.generate!r}")
        args.n, args.d, args.blob_k = n, d, kg
    bad = out_of_range(("--tol", args.tol, args.tol >= 0, ">= 0"),
                       ("--max-iter", args.max_iter, args.max_iter >= 0, ">= 0"))
    if bad:
        ap.error(bad)
    if args.k is not None and args.k < 1:
        ap.error(f"--k must be positive, got {args.k}")
    if args.partitions is not None and args.partitions < 1:
        ap.error(f"--partitions must be positive, got {args.partitions}")
    return args


def _load_init(path: str, k: int | None, d: int) -> np.ndarray:
    """The initial centres in ``path``, a (k, d) numeric .npy array, as float64.

    Raises FileNotFoundError, or InputFormatError naming the file when it is not a numeric
    .npy array or the centres have the wrong shape, dtype, or a NaN or inf."""
    c = map_npy(path)
    if c.ndim != 2 or c.shape[1] != d or (k is not None and c.shape[0] != k) or c.shape[0] < 1:
        want = f"({k if k is not None else 'k'}, {d})"
        raise InputFormatError(f"{path}: initial centres have shape {c.shape}, expected {want}")
    if c.dtype.kind not in "biuf":  # as the data may be
        raise InputFormatError(f"{path}: initial centres have dtype {c.dtype}, expected numbers")
    c = np.array(c, dtype=np.float64, order="C", copy=True)  # owned, not a view of the map
    bad = ~np.isfinite(c)
    if bad.any():
        raise InputFormatError(f"{path}: row {int(np.argmax(bad.any(axis=1)))} (0-based) of the "
                               "initial centres contains NaN or inf")
    return c


def build(args: argparse.Namespace, n_workers: int) -> tuple[canary.Program, dict[str, Any]]:
    """Declare the program (on every rank, identically). Returns it and the data shape."""
    if args.input is not None:
        n, d = count_rows(args.input, args.features)
        where = args.input
    else:
        n, d = args.n, args.d
        where = f"--generate {args.generate}"
    if d == 0:  # every point is the same empty vector: no distance to cluster on
        raise InputFormatError(f"{where}: the points have no features (0 columns); k-means "
                               "needs at least one")
    init = _load_init(args.init, args.k, d) if args.init else None
    k = args.k or (init.shape[0] if init is not None else None)
    if k is None:
        k = args.blob_k if args.input is None else 8
    if k > n:
        raise InputFormatError(f"{where}: k={k} is larger than the number of points ({n})")
    # the default never asks for more partitions than there are points; a given count may not
    P = args.partitions or min(4 * max(n_workers, 1), n)
    if P > n:
        raise canary.DeclarationError(f"--partitions {P} exceeds the {n} data points of {where}")
    ranges = partition_rows(n, P)

    def load(i: int, parts: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        start, stop = ranges[i]
        if args.input is not None:
            X, _ = read_rows(args.input, start, stop, n_features=d, need_labels=False)
        else:
            X, _ = blobs(n, d, args.blob_k, args.seed, start, stop)
        return X, np.array([float(i), float(start)]), np.full(stop - start, -1, np.int64)

    p = canary.Program("kmeans")
    X = p.dataset("points", P)
    meta = p.dataset("partition_info", P)
    labels = p.dataset("labels", P)
    local_c = p.dataset("local_centers", P)
    partial = p.dataset("partial", P)
    mom_local = p.dataset("local_moments", P)
    fin_local = p.dataset("local_inertia", P)
    centers = p.dataset("centers", 1)
    total = p.dataset("total", 1)
    state = p.dataset("state", 1)
    mom = p.dataset("moments", 1)
    fin = p.dataset("inertia", 1)
    res = p.dataset("result", 1)

    p.load([X, meta, labels], load, name="load_points")
    state0 = np.zeros(S_LEN)
    state0[[S_CHANGED, S_SHIFT, S_TOLREL]] = [np.inf, np.inf, args.tol]
    c0 = init if init is not None else np.zeros((k, d))
    p.load([centers, state], lambda i, n_: (c0.copy(), state0.copy()), name="init_state")
    p.compute(moments_kernel, [X], [mom_local])
    p.reduce(mom_local, mom, op="concat", name="reduce_moments")
    p.compute(tolerance_kernel, [mom, centers, state], [state])

    if init is None:  # distributed k-means++ (one D^2-sampled candidate per step)
        mind = p.dataset("min_sq_distance", P)
        wloc = p.dataset("local_weight", P)
        kloc = p.dataset("local_pick", P)
        cand = p.dataset("local_candidate", P)
        newc_loc = p.dataset("local_new_center", P)
        wall = p.dataset("weights", 1)
        ks = p.dataset("kpp_state", 1)
        newc = p.dataset("new_center", 1)
        ks0 = np.zeros(K_HEAD + k)
        ks0[K_HEAD:] = np.random.default_rng([args.seed, 0x6B6D]).random(k)
        p.load([ks], lambda i, n_: ks0.copy(), name="init_kpp")
        p.compute(kpp_init_kernel, [X], [mind])
        with p.loop(k):
            p.compute(kpp_weight_kernel, [mind], [wloc])
            p.reduce(wloc, wall, op="concat", name="reduce_kpp_weights")
            p.compute(kpp_pick_kernel, [wall, ks], [ks])
            p.broadcast(ks, kloc)
            p.compute(kpp_candidate_kernel, [X, mind, meta, kloc], [cand])
            p.reduce(cand, newc, name="reduce_kpp_candidate")
            p.compute(kpp_append_kernel, [newc, centers, ks], [centers, ks])
            p.broadcast(newc, newc_loc)
            p.compute(kpp_mind_kernel, [X, mind, newc_loc], [mind])

    with p.while_(not_converged, on=state, max_iter=args.max_iter):
        p.broadcast(centers, local_c)
        p.compute(assign_kernel, [X, meta, labels, local_c], [labels, partial])
        p.reduce(partial, total, op="concat", name="reduce_partial")
        p.compute(update_kernel, [total, centers, state], [centers, state])
        if reports_each_iteration(args):
            p.report(state, callback=args.on_progress)
    p.broadcast(centers, local_c, name="broadcast_final_centers")
    p.compute(final_assign_kernel, [X, local_c], [labels, fin_local])
    p.reduce(fin_local, fin)
    p.compute(result_kernel, [state, fin], [res])
    p.report(res, name="final_result")
    p.report(centers, name="final_centers")
    if args.want_labels:
        p.report(labels, name="final_labels")
    return p, {"n": n, "d": d, "k": k, "partitions": P}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    is_root = comm.Get_rank() == 0
    output = args.output
    if not check_outputs(PROG, {"--output": output, "--metrics": args.metrics,
                                "--trace": args.trace}, comm,
                         {"--input": args.input, "--init": args.init}):
        return 2
    t0 = time.perf_counter()

    def on_progress(ev: canary.ReportEvent) -> None:
        s = ev.value
        it = int(s[S_ITER])
        row = {"iteration": it, "inertia": float(s[S_INERTIA]),
               "labels_changed": int(s[S_CHANGED]), "center_shift": float(s[S_SHIFT]),
               "empty_clusters": int(s[S_EMPTY]), "seconds": round(ev.seconds, 6),
               "tasks": ev.tasks}
        progress.record(row, f"iter {it:4d}  inertia {row['inertia']:.12g}  changed "
                        f"{row['labels_changed']}  shift {row['center_shift']:.3e}  "
                        f"tasks {ev.tasks}  {ev.seconds:.3f}s")

    args.on_progress = on_progress
    prog_shape = declare(PROG, build, args, planned_workers(comm), is_root=is_root)
    if prog_shape is None:
        return 2
    prog, shape = prog_shape
    progress = Progress(args.metrics, args.print_every, is_root)
    result = canary.run(prog, comm, trace=args.trace)
    progress.close()
    if result is None:
        return 0
    r = result.value("result")
    c = result.value("centers")
    status = 0
    if output:
        status = write_outputs(PROG, {"--output": (output, lambda path: save_npz(
            path, centers=c, labels=result.concat("labels"), inertia=np.float64(r[1])))})
    summary = {
        "app": "kmeans", "points": shape["n"], "features": shape["d"], "k": shape["k"],
        "partitions": shape["partitions"], "workers": result.workers,
        "iterations": int(r[0]), "inertia": float(r[1]),
        "converged": bool(r[2] == 0 or r[3] <= r[5]),
        # before any iteration (--max-iter 0) both are unknown: null in the JSON
        "labels_changed": int(r[2]) if np.isfinite(r[2]) else None,
        "center_shift": float(r[3]),
        "seconds": round(time.perf_counter() - t0, 4), "tasks": result.tasks_run,
        "controller_cpu_percent": result.controller_cpu_percent,
        "controller_messages": result.scheduling_messages,
        "migrations": result.migrations, "bytes_migrated": result.bytes_migrated,
        "snapshots": result.snapshots, "resumed_from": result.resumed_from,
    }
    print(f"final inertia {summary['inertia']:.12g} after {summary['iterations']} iterations",
          flush=True)
    print(json_line(summary), flush=True)
    if not np.isfinite(r[1]):  # the data holds no nan or inf: the reader refuses them
        print(f"{PROG}: error: the inertia overflowed float64 (squared distances past 1.8e308), "
              "so the labels may be wrong: rescale the data, e.g. standardise each column",
              file=sys.stderr, flush=True)
        status = 1
    return status


if __name__ == "__main__":
    from canary.script import end_script, run_main

    end_script(run_main(__file__))  # under the name apps.<module>: one numba cache
