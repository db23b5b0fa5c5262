"""L2-regularised logistic regression by accelerated gradient descent on canary.

Objective: mean log-loss + reg/2 * ||coef||^2 (intercept not penalised), the optimum of
scikit-learn's ``LogisticRegression(C=1/(n*reg))``.

Dataflow per iteration (the paper's Figure 2):

    weight (1) --broadcast--> local_weight (P)
    training data (P) + local_weight --gradient kernel--> local_gradient (P)
    local_gradient (P) --reduce sum--> gradient (1)
    gradient + weight + opt --update kernel--> weight, opt, stats
    while stats.gradient_norm >= tol (signal), at most --max-iter times

The update is Nesterov's accelerated gradient with gradient-based restart and step 1/L, where L
bounds the gradient's Lipschitz constant (0.25 * ||[X 1]||_F^2 / n + reg, computed in a first
pass). The returned coefficients are the point whose gradient norm met ``--tol``.

Run: ``canary run -n 2 apps/logistic_regression.py`` (default: generated 20,000 x 20 data).
"""

from __future__ import annotations

import argparse
import math
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
from canary.generate import logistic_data
from canary.io import count_rows, partition_rows, read_rows

# Layout of the one-partition "opt" dataset (optimizer state); D = n_features + 1.
I_ITER, I_T, I_STEP, I_REG, I_TOL, I_OBJ, I_GNORM, I_N, HEAD = 0, 1, 2, 3, 4, 5, 6, 7, 8


# Reassociation lets LLVM vectorise the row's dot product (the order of a row's sum no longer
# follows the column order; it is still the same for every row, partition and worker count),
# and contraction lets it use FMA. No-NaN/no-inf assumptions are NOT made: bad data still
# shows up as a NaN objective instead of being optimised away.
_ROW_MATH = {"reassoc", "nsz", "contract"}
_LOSS_BLOCK = 512  # rows whose (1 + e^-|z|) factors multiply without overflow: 2^512 < DBL_MAX


# One partition per worker by default. Every partition costs each iteration a broadcast gather,
# a gradient task and a reduce piece, each some Python on a cache the kernel has just flushed,
# and on workers of equal speed one per worker measured about 5% faster than four
# (docs/performance.md has the figures). More pay where tasks vary in cost, which dense rows do
# not, or where a worker is slower and balancing needs smaller pieces to move off it (21% faster
# at 8 per worker with one worker 2x slower); --partitions chooses more.
PARTITIONS_PER_WORKER = 1

PROG = "logistic_regression.py"  # how the app names itself in usage and error lines


@numba.njit(cache=True, fastmath=_ROW_MATH, inline="always")
def _row_terms(z: float, y: float) -> tuple[float, float, float]:
    """For one row with margin z: (sigmoid(z) - y, max(z, 0) - y z, 1 + e^-|z|). The sigmoid is
    computed without a branch on the sign of z (random signs made a branch mispredict on
    every other row), stably for either sign."""
    ez = math.exp(-abs(z))
    q = 1.0 + ez
    s = 1.0 / q
    p = s if z >= 0.0 else ez * s
    return p - y, max(z, 0.0) - y * z, q


@numba.njit(cache=True, fastmath=_ROW_MATH)
def gradient_kernel(X: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Sums over the partition's rows: [gradient of log-loss (D), log-loss, row count].

    The log-loss of a row is max(z, 0) - y z + log(1 + e^-|z|). Its log term is summed as the
    log of the product of each block of ``_LOSS_BLOCK`` factors (each in (1, 2], so no overflow
    or underflow): one ``log`` per block instead of a ``log1p`` per row, which dominated the
    kernel's time, at a relative error near 1e-14. Rows go four at a time: four independent
    dot products and one read-modify-write of the gradient per four rows (a row at a time,
    the latency of the short length-d loops, not memory bandwidth, bounded the kernel).
    """
    n, d = X.shape
    out = np.zeros(d + 3)
    linear = 0.0
    logs = 0.0
    block = 1.0
    n4 = n - n % 4
    for i in range(0, n4, 4):
        z0 = z1 = z2 = z3 = float(w[d])
        for j in range(d):
            wj = w[j]
            z0 += X[i, j] * wj
            z1 += X[i + 1, j] * wj
            z2 += X[i + 2, j] * wj
            z3 += X[i + 3, j] * wj
        r0, l0, q0 = _row_terms(z0, y[i])
        r1, l1, q1 = _row_terms(z1, y[i + 1])
        r2, l2, q2 = _row_terms(z2, y[i + 2])
        r3, l3, q3 = _row_terms(z3, y[i + 3])
        linear += (l0 + l1) + (l2 + l3)
        block *= (q0 * q1) * (q2 * q3)
        if i % _LOSS_BLOCK == _LOSS_BLOCK - 4:
            logs += math.log(block)
            block = 1.0
        for j in range(d):
            out[j] += (r0 * X[i, j] + r1 * X[i + 1, j]) + (r2 * X[i + 2, j] + r3 * X[i + 3, j])
        out[d] += (r0 + r1) + (r2 + r3)
    for i in range(n4, n):  # at most 3 rows: the block product stays below 2^515
        z = float(w[d])
        for j in range(d):
            z += X[i, j] * w[j]
        r, lin, q = _row_terms(z, y[i])
        linear += lin
        block *= q
        for j in range(d):
            out[j] += r * X[i, j]
        out[d] += r
    out[d + 1] = linear + logs + math.log(block)
    out[d + 2] = n
    return out


@numba.njit(cache=True)
def sumsq_kernel(X: np.ndarray) -> np.ndarray:
    """[sum of squares of the partition's entries, row count]."""
    s = 0.0
    for v in X.ravel():
        s += v * v
    return np.array([s, X.shape[0]])


@numba.njit(cache=True)
def init_kernel(sq: np.ndarray, opt: np.ndarray) -> np.ndarray:
    """Set the step 1/L from the global sum of squares (Frobenius bound on the Hessian)."""
    n = sq[1]
    lip = 0.25 * (sq[0] + n) / n + opt[I_REG]
    if not math.isfinite(lip):  # a step of 0: every iteration would leave w at 0
        raise ValueError("the features' sum of squares overflows float64 (values of 1e154 or "
                         "more): rescale the data, e.g. standardise each column")
    opt[I_STEP] = 1.0 / lip
    opt[I_N] = n
    return opt


@numba.njit(cache=True)
def _evaluate(g: np.ndarray, w: np.ndarray, opt: np.ndarray) -> np.ndarray:
    """Record in ``opt`` the objective and gradient norm at ``w`` from ``g``, the summed
    gradient kernel at ``w``; returns the gradient (D)."""
    D = w.shape[0]
    d = D - 1
    n = g[D + 1]
    reg = opt[I_REG]
    grad = g[:D] / n
    pen = 0.0
    for j in range(d):
        grad[j] += reg * w[j]
        pen += w[j] * w[j]
    opt[I_OBJ] = g[D] / n + 0.5 * reg * pen
    opt[I_GNORM] = math.sqrt(np.sum(grad * grad))
    return grad


@numba.njit(cache=True)
def evaluate_kernel(g: np.ndarray, w: np.ndarray, opt: np.ndarray) -> np.ndarray:
    """Make ``w`` the returned point without a step: its objective and gradient norm."""
    D = w.shape[0]
    _evaluate(g, w, opt)
    opt[HEAD + D:HEAD + 2 * D] = w
    return opt


@numba.njit(cache=True)
def update_kernel(g: np.ndarray, w: np.ndarray, opt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One accelerated step from the gradient at ``w``; records objective and gradient norm."""
    D = w.shape[0]
    grad = _evaluate(g, w, opt)
    opt[I_ITER] += 1
    x_prev = opt[HEAD:HEAD + D]
    y_eval = opt[HEAD + D:HEAD + 2 * D]
    y_eval[:] = w
    x_new = w - opt[I_STEP] * grad
    t = opt[I_T]
    if np.sum(grad * (x_new - x_prev)) > 0.0:  # momentum points uphill: restart
        t = 1.0
    t_new = 0.5 * (1.0 + math.sqrt(1.0 + 4.0 * t * t))
    w_new = x_new + ((t - 1.0) / t_new) * (x_new - x_prev)
    x_prev[:] = x_new
    opt[I_T] = t_new
    return w_new, opt


@numba.njit(cache=True)
def not_converged(opt: np.ndarray) -> bool:
    return opt[I_GNORM] >= opt[I_TOL]


@numba.njit(cache=True)
def result_kernel(opt: np.ndarray) -> np.ndarray:
    """[iterations, objective, gradient norm, coef..., intercept] of the last evaluated point."""
    D = (opt.shape[0] - HEAD) // 2
    out = np.empty(3 + D)
    out[0] = opt[I_ITER]
    out[1] = opt[I_OBJ]
    out[2] = opt[I_GNORM]
    out[3:] = opt[HEAD + D:HEAD + 2 * D]
    return out


@numba.njit(cache=True)
def accuracy_kernel(X: np.ndarray, y: np.ndarray, r: np.ndarray) -> np.ndarray:
    """[correct predictions, rows] at the final coefficients."""
    n, d = X.shape
    correct = 0.0
    for i in range(n):
        z = r[3 + d]
        for j in range(d):
            z += X[i, j] * r[3 + j]
        if (z >= 0) == (y[i] > 0.5):
            correct += 1.0
    return np.array([correct, float(n)])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog=PROG,
        description="L2-regularised logistic regression (accelerated gradient descent) on canary.",
    )
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--input", help="svmlight/LIBSVM text, .npz (X, y) or .h5 (datasets X, y)")
    src.add_argument("--generate", default=None, metavar="N,D",
                     help="seeded synthetic data (default 20000,20 when no --input)")
    ap.add_argument("--features", type=int, default=None,
                    help="number of features of svmlight input (default: largest index seen)")
    ap.add_argument("--reg", type=float, default=1e-3, help="L2 strength (sklearn C = 1/(n*reg))")
    ap.add_argument("--tol", type=float, default=1e-6,
                    help="stop when ||gradient|| < tol (0: run --max-iter iterations)")
    ap.add_argument("--max-iter", type=int, default=1000)
    ap.add_argument("--partitions", type=int, default=None,
                    help=f"data partitions (default: {PARTITIONS_PER_WORKER} per worker)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output", help="write coef (d,) and intercept to this .npz")
    add_output_args(ap)
    args = ap.parse_args(argv)
    args.on_progress = None  # set by main() on rank 0; tests may set their own
    if args.input is None and args.generate is None:
        args.generate = "20000,20"
    if args.generate is not None:
        try:
            n, d = (int(v) for v in args.generate.split(","))
        except ValueError:
            ap.error(f"--generate expects N,D (two integers), got {args.generate!r}")
        if n < 1 or d < 1:
            ap.error(f"--generate N,D must be positive, got {args.generate!r}")
        args.n, args.d = n, d
    bad = out_of_range(("--reg", args.reg, args.reg >= 0, ">= 0"),
                       ("--tol", args.tol, args.tol >= 0, ">= 0"),
                       ("--max-iter", args.max_iter, args.max_iter >= 0, ">= 0"))
    if bad:
        ap.error(bad)
    if args.partitions is not None and args.partitions < 1:
        ap.error(f"--partitions must be positive, got {args.partitions}")
    return args


def build(args: argparse.Namespace, n_workers: int) -> tuple[canary.Program, dict[str, Any]]:
    """Declare the program (on every rank, identically). Returns it and the data shape."""
    if args.input is not None:
        n, d = count_rows(args.input, args.features)
    else:
        n, d = args.n, args.d
    # the default never asks for more partitions than there are rows; a given count may not
    P = args.partitions or min(PARTITIONS_PER_WORKER * max(n_workers, 1), n)
    if P > n:
        where = args.input or f"--generate {args.generate}"
        raise canary.DeclarationError(f"--partitions {P} exceeds the {n} data rows of {where}")
    ranges = partition_rows(n, P)

    def load(i: int, parts: int) -> tuple[np.ndarray, np.ndarray]:
        start, stop = ranges[i]
        if args.input is not None:
            X, y = read_rows(args.input, start, stop, n_features=d, binary_labels=True)
            assert y is not None
            return X, y
        return logistic_data(n, d, args.seed, start, stop)

    D = d + 1
    p = canary.Program("logistic_regression")
    X = p.dataset("training_X", P)
    y = p.dataset("training_y", P)
    local_w = p.dataset("local_weight", P)
    local_g = p.dataset("local_gradient", P)
    w = p.dataset("weight", 1)
    g = p.dataset("gradient", 1)
    opt = p.dataset("opt", 1)
    sq_local = p.dataset("local_sumsq", P)
    sq = p.dataset("sumsq", 1)
    res = p.dataset("result", 1)
    acc_local = p.dataset("local_accuracy", P)
    acc = p.dataset("accuracy", 1)

    p.load([X, y], load, name="load_rows")
    opt0 = np.zeros(HEAD + 2 * D)
    opt0[[I_T, I_REG, I_TOL, I_GNORM]] = [1.0, args.reg, args.tol, np.inf]
    p.load([w, opt], lambda i, n_: (np.zeros(D), opt0.copy()), name="init_weight")
    p.compute(sumsq_kernel, [X], [sq_local])
    p.reduce(sq_local, sq)
    p.compute(init_kernel, [sq, opt], [opt])
    with p.while_(not_converged, on=opt, max_iter=args.max_iter):
        p.broadcast(w, local_w)
        p.compute(gradient_kernel, [X, y, local_w], [local_g])
        p.reduce(local_g, g)
        p.compute(update_kernel, [g, w, opt], [w, opt])
        p.compute(result_kernel, [opt], [res])
        if reports_each_iteration(args):
            p.report(res, callback=args.on_progress)
    if args.max_iter == 0:
        # No step is taken, so no gradient was evaluated: evaluate the starting point, which
        # is the one returned, so the result reports its true objective and gradient norm.
        p.broadcast(w, local_w, name="broadcast_start")
        p.compute(gradient_kernel, [X, y, local_w], [local_g], name="gradient_at_start")
        p.reduce(local_g, g, name="reduce_gradient_at_start")
        p.compute(evaluate_kernel, [g, w, opt], [opt])
    p.compute(result_kernel, [opt], [res])
    p.broadcast(res, local_w, name="broadcast_result")
    p.compute(accuracy_kernel, [X, y, local_w], [acc_local])
    p.reduce(acc_local, acc)
    p.report(res, name="final_result")
    p.report(acc, name="final_accuracy")
    return p, {"n": n, "d": d, "partitions": P}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    is_root = comm.Get_rank() == 0
    output = args.output
    if not check_outputs(PROG, {"--output": output, "--metrics": args.metrics,
                                "--trace": args.trace}, comm,
                         {"--input": args.input}):
        return 2
    t0 = time.perf_counter()

    def on_progress(ev: canary.ReportEvent) -> None:
        it, obj, gnorm = int(ev.value[0]), float(ev.value[1]), float(ev.value[2])
        row = {"iteration": it, "objective": obj, "gradient_norm": gnorm,
               "seconds": round(ev.seconds, 6), "tasks": ev.tasks}
        progress.record(row, f"iter {it:5d}  objective {obj:.12g}  |grad| {gnorm:.3e}  "
                             f"tasks {ev.tasks}  {ev.seconds:.3f}s")

    args.on_progress = on_progress
    declared = declare(PROG, build, args, planned_workers(comm), is_root=is_root)
    if declared is None:  # every rank fails alike; rank 0 said why
        return 2
    prog, shape = declared
    progress = Progress(args.metrics, args.print_every, is_root)
    result = canary.run(prog, comm, trace=args.trace)
    progress.close()
    if result is None:
        return 0
    r = result.value("result")
    correct, rows = result.value("accuracy")
    d = shape["d"]
    coef, intercept = r[3:3 + d], float(r[3 + d])
    status = 0
    if output:
        status = write_outputs(PROG, {"--output": (output, lambda path: save_npz(
            path, coef=coef, intercept=np.float64(intercept)))})
    summary = {
        "app": "logistic_regression", "rows": shape["n"], "features": d,
        "partitions": shape["partitions"], "workers": result.workers,
        "iterations": int(r[0]), "objective": float(r[1]), "gradient_norm": float(r[2]),
        "converged": bool(r[2] < args.tol), "accuracy": correct / rows,
        "seconds": round(time.perf_counter() - t0, 4), "tasks": result.tasks_run,
        "controller_cpu_percent": result.controller_cpu_percent,
        "controller_messages": result.scheduling_messages,
        "migrations": result.migrations, "bytes_migrated": result.bytes_migrated,
        "snapshots": result.snapshots, "resumed_from": result.resumed_from,
    }
    print(f"final objective {summary['objective']:.12g}  training accuracy "
          f"{summary['accuracy']:.4f}  after {summary['iterations']} iterations", flush=True)
    print(json_line(summary), flush=True)
    return status


if __name__ == "__main__":
    from canary.script import end_script, run_main

    end_script(run_main(__file__))  # under the name apps.<module>: one numba cache
