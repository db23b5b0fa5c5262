"""Micropartitioning (the Canary paper's Figure 8): iteration time vs partitions per core.

Each iteration runs a compute stage over ``P = ppc x workers`` partitions, then reduces one
number per partition to one partition and broadcasts it back (a barrier, as in logistic
regression). The work per iteration per core is fixed (``--work-ms``); each task gets
``work / ppc`` of busy loop, times a variance factor:

* ``uniform``: none;
* ``random``: each (iteration, partition) task is ``--slow-factor`` times slower with
  probability ``--slow-prob`` (seeded hash: the same draws on every run);
* ``skewed``: static data skew, the first ``--slow-prob`` of the partitions (at least one)
  are ``--slow-factor`` times heavier in every iteration.

With random variance, more partitions per core average it out on each worker, so the barrier
waits less: iteration time falls toward the mean as ``ppc`` grows, until scheduling cost per
task (more, shorter tasks) takes over. With static skew, finer partitions shrink the hot region each
hot task covers, but contiguous placement keeps the hot partitions on one worker: the rest needs
migration (load balancing).

    python benchmarks/micropartition.py            # ppc 1,2,4,8,16 x 3 modes on 2 workers
    python benchmarks/micropartition.py --quick    # tiny (tests)

JSON lines; the last is the summary (iteration ms per mode and ppc).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numba
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
# first the repository root, and not this folder: benchmarks/apps.py would shadow the apps package
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "benchmarks")]

import canary  # noqa: E402
from canary.trace import Tracer, gather_and_write, trace_path  # noqa: E402

MODES = {"uniform": 0, "random": 1, "skewed": 2}
# Partition layout: [iters per task, mode, slow_prob, slow_factor, seed, iteration, acc, hot]
I_ITERS, I_MODE, I_PROB, I_FACTOR, I_SEED, I_IT, I_ACC, I_HOT = range(8)


@numba.njit(cache=True)
def _hash_u01(seed: int, part: int, it: int) -> float:
    x = (seed * 0x9E3779B97F4A7C15 + part * 0xBF58476D1CE4E5B9 + it * 0x94D049BB133111EB) & (
        (1 << 63) - 1)
    x ^= x >> 31
    x = (x * 0x7FB5D38D) & ((1 << 63) - 1)
    x ^= x >> 29
    return (x % 1000003) / 1000003.0


@numba.njit(cache=True)
def work_kernel(a: np.ndarray, part: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One task: a busy loop of a[I_ITERS] x the variance factor; returns (state, [sum])."""
    n = a[I_ITERS]
    mode = int(a[I_MODE])
    if mode == 1 and _hash_u01(int(a[I_SEED]), int(part[0]), int(a[I_IT])) < a[I_PROB]:
        n *= a[I_FACTOR]
    elif mode == 2 and a[I_HOT] > 0:
        n *= a[I_FACTOR]
    x = a[I_ACC]
    for _ in range(int(n)):
        x = x * 0.9999999 + 1e-7
    a[I_ACC] = x
    a[I_IT] += 1
    return a, np.array([x])


@numba.njit(cache=True)
def mix_kernel(total: np.ndarray) -> np.ndarray:
    return total


def build(workers: int, ppc: int, mode: str, iters_per_task: int, iterations: int,
          prob: float, factor: float, seed: int) -> canary.Program:
    P = ppc * workers
    n_hot = max(1, int(round(prob * P)))  # at least one hot partition

    def load(i: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        a = np.array([iters_per_task, MODES[mode], prob, factor, seed, 0, 0.5,
                      1.0 if i < n_hot else 0.0])
        return a, np.array([float(i)])

    p = canary.Program(f"micropartition_{mode}_{ppc}")
    state = p.dataset("state", P)
    part = p.dataset("part", P)
    local = p.dataset("local_sum", P)
    total = p.dataset("total", 1)
    back = p.dataset("total_back", P)
    p.load([state, part], load, name="init")
    with p.loop(iterations):
        p.compute(work_kernel, [state, part], [state, local], name="work")
        p.reduce(local, total, name="reduce")
        p.compute(mix_kernel, [total], [total], name="mix")
        p.broadcast(total, back, name="broadcast")
    p.report(total, name="final")
    return p


def expected_total(workers: int, ppc: int, mode: str, iters_per_task: int, iterations: int,
                   prob: float, factor: float, seed: int) -> float:
    """The job's answer computed here, partition by partition, with the same kernel."""
    P = ppc * workers
    n_hot = max(1, int(round(prob * P)))  # at least one hot partition
    total = 0.0
    for i in range(P):
        a = np.array([iters_per_task, MODES[mode], prob, factor, seed, 0, 0.5,
                      1.0 if i < n_hot else 0.0])
        out = np.zeros(1)
        for _ in range(iterations):
            a, out = work_kernel(a, np.array([float(i)]))
        total += float(out[0])
    return total


def child(args: argparse.Namespace) -> int:
    from mpi4py import MPI

    from canary.controller.runtime import run_controller
    from canary.worker.runtime import run_worker

    comm = MPI.COMM_WORLD
    rank, workers = comm.Get_rank(), comm.Get_size() - 1
    work_kernel(np.zeros(8), np.zeros(1))
    for mode, ppc, iters_per_task in json.loads(args.points):
        prog = build(workers, ppc, mode, iters_per_task, args.iterations, args.slow_prob,
                     args.slow_factor, args.seed)
        jc = comm.Dup()
        stats: dict[str, float] = {}
        path = trace_path()
        tracer = Tracer(rank, "controller" if rank == 0 else f"worker {rank - 1}") if path else None
        if rank == 0:
            res = run_controller(prog, jc, tracer=tracer)
        else:
            st = run_worker(prog, jc, stats=stats, tracer=tracer)
            stats["tasks"] = st.tasks_run
            res = None
        if tracer is not None and path:  # one file per point: PATH.<mode>.ppc<C>.json
            root, ext = os.path.splitext(path)
            gather_and_write(jc, tracer, f"{root}.{mode}.ppc{ppc}{ext or '.json'}")
        rows = jc.gather(stats, root=0)
        jc.Free()
        if rank == 0:
            assert res is not None and rows is not None
            wall = max(r["t_done"] for r in rows[1:]) - min(r["t_first"] for r in rows[1:])
            tasks = sum(int(r["tasks"]) for r in rows[1:])
            print(json.dumps({"mode": mode, "ppc": ppc, "workers": workers,
                              "partitions": ppc * workers, "iterations": args.iterations,
                              "iteration_ms": round(wall / args.iterations * 1e3, 3),
                              "tasks": tasks, "tasks_per_s": round(tasks / wall, 1),
                              "total": float(res.results["total"][0][0]),
                              "correct": bool(np.isclose(
                                  float(res.results["total"][0][0]),
                                  expected_total(workers, ppc, mode, iters_per_task,
                                                 args.iterations, args.slow_prob,
                                                 args.slow_factor, args.seed),
                                  rtol=1e-12))}), flush=True)
    return 0


def ns_per_iter() -> float:
    a = np.array([1e6, 0, 0, 1, 0, 0, 1.0, 0])
    part = np.zeros(1)
    work_kernel(a, part)
    best = np.inf
    for _ in range(3):
        t0 = time.process_time()
        work_kernel(a, part)
        best = min(best, time.process_time() - t0)
    return best * 1e9 / 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny sizes (for tests)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--ppc", default="1,2,4,8,16", help="partitions per core to try")
    ap.add_argument("--modes", default="uniform,random,skewed")
    ap.add_argument("--work-ms", type=float, default=20.0, help="work per iteration per core")
    ap.add_argument("--iterations", type=int, default=None, help="default 30 (quick: 3)")
    ap.add_argument("--slow-prob", type=float, default=0.1)
    ap.add_argument("--slow-factor", type=float, default=8.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--trace", default=None, help="Chrome trace of the runs (sets CANARY_TRACE)")
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--points", default="[]", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.iterations is None:
        args.iterations = 3 if args.quick else 30
    if args.child:
        return child(args)
    work_ms = 0.5 if args.quick else args.work_ms
    ppcs = [int(v) for v in args.ppc.split(",")]
    if args.quick:
        ppcs = ppcs[:2]
    modes = args.modes.split(",")
    nspi = ns_per_iter()
    print(json.dumps({"machine": {"cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d"),
                                  "ns_per_iter": round(nspi, 4)},
                      "config": {"workers": args.workers, "work_ms": work_ms,
                                 "iterations": args.iterations, "slow_prob": args.slow_prob,
                                 "slow_factor": args.slow_factor}}), flush=True)
    points = [(m, c, int(work_ms * 1e6 / nspi / c)) for m in modes for c in ppcs]
    from canary.cli import find_mpiexec, mpiexec_env

    env = mpiexec_env(args.timeout, str(ROOT))
    if args.trace:  # one file per point: PATH.<mode>.ppc<C>.json
        env["CANARY_TRACE"] = args.trace
    cmd = [find_mpiexec(), "-n", str(args.workers + 1), sys.executable, "-m", "mpi4py",
           __file__, "--child", "--points", json.dumps(points[:1] + points),  # 1st: warm-up
           "--iterations", str(args.iterations), "--slow-prob", str(args.slow_prob),
           "--slow-factor", str(args.slow_factor), "--seed", str(args.seed)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout + 30)
    if proc.returncode != 0:
        print(proc.stderr[-3000:], file=sys.stderr)
        return 1
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")][1:]
    for r in rows:
        print(json.dumps(r), flush=True)
    summary: dict[str, Any] = {"summary": "micropartition", "workers": args.workers,
                               "iteration_ms": {}, "tasks_per_s": {}}
    for r in rows:
        summary["iteration_ms"].setdefault(r["mode"], {})[str(r["ppc"])] = r["iteration_ms"]
        summary["tasks_per_s"].setdefault(r["mode"], {})[str(r["ppc"])] = r["tasks_per_s"]
    summary["all_correct"] = all(r["correct"] for r in rows)
    ideal = work_ms * (1 + args.slow_prob * (args.slow_factor - 1))
    summary["random_mean_work_ms"] = round(ideal, 3)
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    from canary.script import end_script

    end_script(main())
