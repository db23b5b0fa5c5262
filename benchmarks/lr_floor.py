"""How much of logistic regression's time is canary's own: the app next to a hand-written MPI
program with the same processes, kernel and partitions, and next to the numba bound.

``benchmarks/apps.py`` compares canary (W worker processes) with one process on W numba
threads. The two differ in more than canary's scheduling: processes and threads share the
machine's memory bandwidth differently. This benchmark adds the floor that any engine of W
MPI processes could reach: ``mpiexec -n W`` ranks, each calling the app's own
``gradient_kernel`` on the same row partitions that a canary worker holds, then one
``Allreduce`` and the weight update, nothing else. Each round times, interleaved (the VM's load
comes in bursts): the numba bound (``apps.py``'s ``bound_lr``), the MPI floor and a canary run
(``apps.py``'s ``run_canary``, iteration times from the workers' traces). Each is the mean over
iterations, first and last excluded. The floor also reports its final weights, which a test
compares with numpy's.

Every line is JSON; the last is the summary: the median of each over the rounds, the ratios
of the fastest of each (as ``apps.py`` compares them) and the median of each round's own
ratio (``*_paired``, the three of a round measured back to back).

    python benchmarks/lr_floor.py                 # 400K x 20, 5 rounds of 20 iterations, ~1 min
    python benchmarks/lr_floor.py --rows 4000000  # 4M x 20, ~3 min
    python benchmarks/lr_floor.py --quick         # tiny (tests)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# first the repository root, and not this folder: benchmarks/apps.py would shadow the apps package
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "benchmarks")]

import numpy as np  # noqa: E402

import apps.logistic_regression as lr_app  # noqa: E402
from benchmarks.spark_jvm import inner_mean  # noqa: E402
from canary.generate import logistic_data  # noqa: E402
from canary.io import partition_rows  # noqa: E402

STEP = 0.1  # the floor's gradient step: any fixed step keeps every rank on the same weights


def floor_rank(n: int, d: int, iters: int) -> dict[str, Any] | None:
    """This MPI rank's part of the floor: as many partitions per rank as canary places on a
    worker by default (the app's ``PARTITIONS_PER_WORKER``); returns (on rank 0) the mean
    seconds per iteration, first and last excluded, and the final weights."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    k = lr_app.PARTITIONS_PER_WORKER
    ranges = partition_rows(n, k * size)
    parts = [logistic_data(n, d, 0, *ranges[i]) for i in range(k * rank, k * rank + k)]
    w = np.zeros(d + 1)
    for X, y in parts:  # load or compile the kernel outside the timed loop
        lr_app.gradient_kernel(X, y, w)
    total = np.zeros(d + 3)
    times = []
    comm.Barrier()
    for _ in range(iters):
        t0 = time.perf_counter()
        g = np.zeros(d + 3)
        for X, y in parts:
            g += lr_app.gradient_kernel(X, y, w)
        comm.Allreduce(g, total)
        w = w - STEP * total[:d + 1] / n
        times.append(time.perf_counter() - t0)
    if rank != 0:
        return None
    return {"seconds": inner_mean(times), "weights": w.tolist()}


def reference_weights(n: int, d: int, iters: int) -> np.ndarray:
    """The floor's final weights computed by numpy in one process (for the test)."""
    X, y = logistic_data(n, d, 0)
    Xb = np.hstack([X, np.ones((n, 1))])
    w = np.zeros(d + 1)
    for _ in range(iters):
        p = 1.0 / (1.0 + np.exp(-(Xb @ w)))
        w = w - STEP * (Xb.T @ (p - y)) / n
    return w


def run_floor(n: int, d: int, workers: int, iters: int, timeout: int) -> dict[str, Any]:
    from canary.cli import find_mpiexec, mpiexec_env

    cmd = [find_mpiexec(), "-n", str(workers), sys.executable, "-m", "mpi4py", __file__,
           "--rank-program", "--rows", str(n), "--features", str(d), "--iters", str(iters)]
    proc = subprocess.run(cmd, env=mpiexec_env(timeout, str(ROOT)), capture_output=True, text=True, timeout=timeout + 30)
    if proc.returncode != 0:
        raise RuntimeError(f"MPI floor failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=None, help="rows (default 400000)")
    ap.add_argument("--features", type=int, default=20)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--iters", type=int, default=None, help="iterations per run (default 20)")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 5)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (tests)")
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--trace", default=None, help="Chrome trace of the first canary run (JSON)")
    ap.add_argument("--rank-program", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    n = args.rows or (4000 if args.quick else 400_000)
    d = args.features
    iters = args.iters or (5 if args.quick else 20)
    if args.rank_program:
        got = floor_rank(n, d, iters)
        if got is not None:
            print(json.dumps(got), flush=True)
        return 0
    import benchmarks.apps as bench_apps

    rounds = args.rounds or (1 if args.quick else 5)
    W = args.workers
    print(json.dumps({"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                                  "workers": W, "date": time.strftime("%Y-%m-%d")}}), flush=True)
    runs: dict[str, list[float]] = {"numba": [], "mpi_floor": [], "canary": []}
    for r in range(rounds):
        bound = bench_apps.bound_lr(n, d, W, iters)["seconds"]
        floor = run_floor(n, d, W, iters, args.timeout)
        got = bench_apps.run_canary("logistic_regression", ["--generate", f"{n},{d}"], W, iters,
                                    bench_apps._extra("logistic_regression"), args.timeout,
                                    args.trace if r == 0 else None)
        row = {"round": r, "rows": n, "features": d, "workers": W, "numba_s": bound,
               "mpi_floor_s": floor["seconds"], "canary_s": got["seconds"],
               "floor_weights": floor["weights"]}
        for k, v in (("numba", bound), ("mpi_floor", floor["seconds"]), ("canary", got["seconds"])):
            runs[k].append(v)
        print(json.dumps(row), flush=True)
    best = {k: min(v) for k, v in runs.items()}
    print(json.dumps({
        "summary": "lr_floor", "rows": n, "features": d, "workers": W, "rounds": rounds,
        "median_ms": {k: round(statistics.median(v) * 1e3, 3) for k, v in runs.items()},
        "best_ms": {k: round(v * 1e3, 3) for k, v in best.items()},
        "canary_vs_numba": round(best["canary"] / best["numba"], 3),
        "canary_vs_numba_paired": bench_apps.paired_ratio(runs["canary"], runs["numba"]),
        "canary_vs_mpi_floor_paired": bench_apps.paired_ratio(runs["canary"], runs["mpi_floor"]),
        "canary_vs_mpi_floor": round(best["canary"] / best["mpi_floor"], 3),
        "mpi_floor_vs_numba": round(best["mpi_floor"] / best["numba"], 3)}), flush=True)
    return 0


if __name__ == "__main__":
    from canary.script import end_script

    end_script(main())
