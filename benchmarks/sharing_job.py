"""A synthetic job for ``benchmarks/sharing.py``: a known amount of CPU work, in iterations.

``--parts P`` partitions (default: one per worker), ``--iters N`` iterations of a busy loop of
``--task-ms T`` milliseconds per partition (CPU, not sleep), a reduce per iteration. Options:
``--metrics PATH`` (rank 0: one JSON line per iteration with the wall time it was reported),
``--stamp PATH`` (each load task appends the wall time it ran: the first is when the job's
first task ran), ``--fail`` (the first task raises), ``--out PATH`` (the final sum, ``.npy``).

    canary run -n 2 benchmarks/sharing_job.py --iters 20 --task-ms 2
    canary submit benchmarks/sharing_job.py --iters 20 --task-ms 2
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import canary


def spin(ms: float) -> None:
    end = time.perf_counter() + ms * 1e-3
    while time.perf_counter() < end:
        pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="sharing_job.py")
    ap.add_argument("--parts", type=int, default=0)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--task-ms", type=float, default=1.0)
    ap.add_argument("--metrics", default=None)
    ap.add_argument("--stamp", default=None)
    ap.add_argument("--fail", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    parts = args.parts or max(comm.Get_size() - 1, 1)
    task_ms, stamp, fail = args.task_ms, args.stamp, args.fail

    def load(i: int, n: int) -> np.ndarray:
        if stamp:
            with open(stamp, "a") as f:
                f.write(f"{time.time()!r}\n")
        if fail:
            raise ValueError("this job fails on purpose")
        return np.full(4, float(i))

    def work(x: np.ndarray) -> np.ndarray:
        spin(task_ms)
        return x + 1.0

    rows: list[str] = []

    def record(ev: canary.ReportEvent) -> None:
        rows.append(json.dumps({"iteration": ev.iteration[0] if ev.iteration else -1,
                                "time": time.time()}))

    p = canary.Program("sharing_job")
    x = p.dataset("x", parts)
    s = p.dataset("s", 1)
    p.load([x], load, name="load")
    with p.loop(args.iters):
        p.compute(work, [x], [x])
        p.reduce(x, s)
        if args.metrics:
            p.report(s, callback=record, name="progress")
    p.reduce(x, s, name="final_sum")
    p.report(s, name="final")
    result = canary.run(p, comm)
    if result is None:
        return 0
    if args.metrics:
        with open(args.metrics, "w") as f:
            f.write("".join(r + "\n" for r in rows))
    if args.out:
        np.save(args.out, result.value("s"))
    print(json.dumps({"tasks": result.tasks_run, "sum": float(result.value("s").sum())}))
    return 0


if __name__ == "__main__":
    from canary.script import end_script

    end_script(main())
