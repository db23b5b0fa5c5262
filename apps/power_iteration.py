"""Largest eigenvalue of A^T A for a row-partitioned matrix A, by power iteration.

The small complete example of docs/programming.md: load, compute, broadcast, reduce, a
``while`` loop driven by a signal, an ``if`` branch, and a report. Run it with
``canary run -n 2 apps/power_iteration.py``.
"""

from __future__ import annotations

import argparse

import numba
import numpy as np

import canary

BLOCK = 50  # rows drawn from one seed: the matrix is the same whatever the partition count


def rows(i: int, parts: int, n: int = 4000, d: int = 30, seed: int = 0) -> np.ndarray:
    """Partition i of ``parts`` of a fixed random matrix (the same matrix for every partition
    count): each worker makes only its own rows."""
    lo, hi = i * n // parts, (i + 1) * n // parts
    first, last = lo // BLOCK, -(-hi // BLOCK)
    drawn = np.vstack([np.random.default_rng([seed, b]).standard_normal((BLOCK, d))
                       for b in range(first, last)] or [np.empty((0, d))])
    scale = np.append(np.linspace(1.0, 2.0, d - 1), 4.0)  # a clear dominant direction
    return drawn[lo - first * BLOCK:hi - first * BLOCK] * scale


@numba.njit(cache=True)
def local_product(a: np.ndarray, v: np.ndarray) -> np.ndarray:
    """This partition's share of (A^T A) v: the sum over its rows r of (r . v) r.

    Explicit loops, not ``a.T @ (a @ v)``: numba compiles ``@`` and ``np.dot`` to BLAS calls
    that need scipy, which a plain ``pip install`` of canary does not bring.
    """
    n, d = a.shape
    out = np.zeros(d)
    for i in range(n):
        z = 0.0
        for j in range(d):
            z += a[i, j] * v[j]
        for j in range(d):
            out[j] += z * a[i, j]
    return out


@numba.njit(cache=True)
def normalise(s: np.ndarray, state: np.ndarray) -> np.ndarray:
    """state = [eigenvalue estimate, change, iterations, v...]."""
    lam = np.sqrt(np.sum(s * s))
    state[1] = abs(lam - state[0])
    state[0] = lam
    state[2] += 1
    state[3:] = s / lam
    return state


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="power_iteration.py", description=__doc__)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--tol", type=float, default=1e-10)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    # a nan or inf tolerance would end the loop before its first iteration: a wrong answer
    if args.partitions < 1 or not 0 <= args.tol < np.inf:
        ap.error(f"--partitions must be >= 1 and --tol a finite number >= 0, got "
                 f"{args.partitions} and {args.tol}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    d = 30

    p = canary.Program("power_iteration")
    A = p.dataset("A", args.partitions)  # the data: P row blocks
    v_local = p.dataset("v_local", args.partitions)  # v, broadcast next to each block
    s_local = p.dataset("s_local", args.partitions)  # each block's A_i^T A_i v
    s = p.dataset("s", 1)  # the sum: (A^T A) v
    state = p.dataset("state", 1)  # [lambda, change, iterations, v]
    v = p.dataset("v", 1)

    p.load([A], lambda i, n: rows(i, n, seed=args.seed))
    p.load([state], lambda i, n: np.concatenate([[0.0, np.inf, 0.0], np.ones(d) / np.sqrt(d)]))
    with p.while_(lambda st: st[1] > args.tol * st[0], on=state, max_iter=1000):
        p.compute(lambda st: st[3:].copy(), [state], [v], name="current_vector")
        p.broadcast(v, v_local)
        p.compute(local_product, [A, v_local], [s_local])
        p.reduce(s_local, s)  # sums blocks in partition order: same answer on any worker count
        p.compute(normalise, [s, state], [state])
    with p.if_(lambda st: st[2] >= 1000, on=state):  # say so if it did not converge
        p.compute(lambda st: np.concatenate([[np.nan], st[1:]]), [state], [state], name="flag")
    p.report(state)

    result = canary.run(p)
    if result is not None:  # rank 0 (the controller) gets the reported datasets
        lam, change, its = result.value("state")[:3]
        if np.isnan(lam):  # the flag set above
            print(f"no convergence within {int(its)} iterations (last change {change:.3g}; "
                  "try a larger --tol)")
        else:
            print(f"largest eigenvalue of A^T A: {lam:.12g} after {int(its)} iterations")
    return 0


if __name__ == "__main__":
    from canary.script import end_script, run_main

    end_script(run_main(__file__))  # under the name apps.<module>: one numba cache
