"""How late an idle worker sees a message, and what its waiting costs in CPU.

A worker with nothing to run polls MPI between sleeps (``canary.idle.Backoff``): the sleeps
are what a worker-to-worker hop (a gather's piece, a signal) costs on top of MPI. Two ranks
under ``mpiexec``: rank 1 waits a random time (drawn from ``WAITS_MS``, seeded; it sleeps, so
it leaves the CPU to rank 0) and sends a timestamped message; rank 0 waits for it exactly as a
worker does (``MpiTransport.poll``, then ``Backoff.sleep``) and records how long after the send
it saw the message, and its own CPU time over the run. Variants:

* ``sleep_only``: the worker's sleeping back-off (200 quick polls, then sleeps of 20 µs
  doubling to 250 µs) with Linux's default 50 µs timer slack;
* ``tight_slack``: the same with 1 µs timer slack (``canary.idle.tight_timer_slack``);
* ``spin_1ms``: also polling hot for 1 ms after each message (``spin_s``; a worker polls hot
  for ``worker.runtime.SPIN_S``, 50 ms, where every worker has a core:
  ``canary.idle.has_own_core``);
* ``spin_always``: polling hot all the time, the floor (a core at 100%).

It also times what encoding costs at the two ends of a hop: pickling and unpickling a piece or
a signal as a dataclass against ``canary.wire``'s tuples (in this process).

With ``--apps``, it also times small app runs where hops dominate an iteration (logistic
regression 20K x 20, the README's example size; PageRank on 2^14 vertices), on 2 workers with
hot polling off (``CANARY_SPIN_US=0``), for 1 ms and for 50 ms (the default), interleaved,
``--reps`` times each (``--app-size`` runs an app at another size);
iteration times come from the workers' traces (``benchmarks/apps.py``'s ``run_canary``).

Every line is JSON; the last is the summary (median latency and CPU fraction per variant, and
with ``--apps`` the median iteration time per app and variant).

    python benchmarks/hop_latency.py            # 400 messages per variant, ~10 s
    python benchmarks/hop_latency.py --apps     # and the app runs, ~2 min
    python benchmarks/hop_latency.py --quick    # 20 messages (tests)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# first the repository root, and not this folder: benchmarks/apps.py would shadow the apps package
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "benchmarks")]

from canary.idle import Backoff, tight_timer_slack  # noqa: E402

WAITS_MS = (0.05, 0.2, 0.5, 1.0, 2.0, 5.0)
# name: (timer slack ns, spin_s); min_sleep, max_sleep and spins as in worker.runtime
VARIANTS: dict[str, tuple[int, float]] = {
    "sleep_only": (50_000, 0.0),
    "tight_slack": (1_000, 0.0),
    "spin_1ms": (1_000, 1e-3),
    "spin_always": (1_000, 1e9),
}


def child(messages: int, seed: int) -> int:
    from mpi4py import MPI

    from canary.mpi_transport import MpiTransport

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    for name, (slack, spin_s) in VARIANTS.items():
        tight_timer_slack(slack)
        tx = MpiTransport(comm)
        rnd = random.Random(seed)
        comm.Barrier()
        if rank == 1:
            for i in range(messages):
                time.sleep(rnd.choice(WAITS_MS) * 1e-3)
                tx.send(0, (i, time.perf_counter()))
                while tx.poll() is None:  # the ack: the next wait starts after rank 0 saw it
                    time.sleep(5e-5)
            tx.flush()
        else:
            backoff = Backoff(min_sleep=2e-5, max_sleep=2.5e-4, spins=200, spin_s=spin_s)
            lat: list[float] = []
            order_ok = True
            c0, w0 = time.process_time(), time.perf_counter()
            for i in range(messages):
                got = tx.poll()
                while got is None:
                    tx.progress()
                    backoff.sleep()
                    got = tx.poll()
                seen = time.perf_counter()
                k, sent = got[1]
                order_ok &= k == i
                lat.append(seen - sent)
                backoff.reset()
                tx.send(1, "ack")
            cpu = (time.process_time() - c0) / (time.perf_counter() - w0)
            tx.flush()
            lat.sort()
            print(json.dumps({
                "variant": name, "messages": messages, "received_in_order": order_ok,
                "latency_median_us": round(statistics.median(lat) * 1e6, 1),
                "latency_p90_us": round(lat[int(0.9 * (len(lat) - 1))] * 1e6, 1),
                "latency_mean_us": round(statistics.mean(lat) * 1e6, 1),
                "cpu_fraction": round(cpu, 3)}), flush=True)
        comm.Barrier()
    return 0


APP_RUNS = {  # app: (size, iterations); quick: tiny sizes
    "logistic_regression": (("20000,20", 100), ("2000,8", 8)),
    "pagerank": (("16384,160000", 60), ("1024,8000", 8)),
}
SPIN_VARIANTS = {"spin_off": "0", "spin_1ms": "1000", "spin_50ms": "50000"}


def app_runs(reps: int, quick: bool, timeout: int,
             sizes: dict[str, tuple[str, int]] | None = None) -> list[dict[str, Any]]:
    """Per-iteration time of app runs for each hot-polling variant, interleaved; ``sizes``
    (app: (size, iterations)) replaces the default sizes of the apps it names."""
    import benchmarks.apps as bench_apps

    rows = []
    for app, (full, small) in APP_RUNS.items():
        size, iters = small if quick else (sizes or {}).get(app, full)
        for rep in range(reps):
            for variant, spin_us in SPIN_VARIANTS.items():
                got = bench_apps.run_canary(app, ["--generate", size], 2, iters,
                                            bench_apps._extra(app), timeout, None,
                                            {"CANARY_SPIN_US": spin_us})
                row = {"app": app, "size": size, "variant": variant, "rep": rep,
                       "iterations": got["iterations"],
                       "iteration_ms": round(got["seconds"] * 1e3, 3) if got["seconds"] else None}
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


def codec_costs(reps: int) -> list[dict[str, Any]]:
    """µs to pickle and unpickle one message (what the two ends of a hop pay besides MPI): as
    the pickled dataclass and in ``canary.wire``'s tuple format, in this process."""
    import pickle

    import numpy as np

    from canary.messages import Piece, Signal
    from canary.wire import pack, unpack

    def per_call(fn: Any) -> float:
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            best = min(best, (time.perf_counter() - t0) / reps)
        return round(best * 1e6, 2)

    rows = []
    for name, msg in (("piece_23_float64", Piece(1, 5, 2, 3, (0,), (1,), np.random.rand(23))),
                      ("piece_1000_float64", Piece(1, 5, 2, 3, (0,), (1,), np.random.rand(1000))),
                      ("signal", Signal(1, 2, True))):
        rows.append({
            "codec": name,
            "pickled_dataclass_us": per_call(lambda m=msg: pickle.loads(pickle.dumps(m, 5))),
            "wire_tuple_us": per_call(
                lambda m=msg: unpack(pickle.loads(pickle.dumps(pack(m, 8192)[0], 5)))),
        })
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="20 messages per variant (tests)")
    ap.add_argument("--messages", type=int, default=400)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--apps", action="store_true",
                    help="also time small app runs with hot polling off and on")
    ap.add_argument("--reps", type=int, default=4, help="app runs per variant (--apps)")
    ap.add_argument("--app-size", action="append", default=[], metavar="APP=N,D:ITERS",
                    help="with --apps: run APP at this size, e.g. "
                         "logistic_regression=4000000,20:12 (repeatable)")
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    messages = 20 if args.quick else args.messages
    if args.child:
        return child(messages, args.seed)
    from canary.cli import find_mpiexec, mpiexec_env

    env = mpiexec_env(args.timeout)
    cmd = [find_mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py", __file__, "--child",
           "--messages", str(messages), "--seed", str(args.seed)]
    print(json.dumps({"machine": {"cpus": os.cpu_count(), "load_avg": os.getloadavg()[0],
                                  "date": time.strftime("%Y-%m-%d"),
                                  "waits_ms": list(WAITS_MS)}}), flush=True)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                          timeout=args.timeout + 30)
    if proc.returncode != 0:
        raise RuntimeError(f"mpiexec failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    rows: list[dict[str, Any]] = [json.loads(line) for line in proc.stdout.splitlines()
                                  if line.startswith("{")]
    for r in rows:
        print(json.dumps(r), flush=True)
    codecs = codec_costs(200 if args.quick else 5000)
    for r in codecs:
        print(json.dumps(r), flush=True)
    summary: dict[str, Any] = {
        "summary": "hop_latency",
        "latency_median_us": {r["variant"]: r["latency_median_us"] for r in rows},
        "cpu_fraction": {r["variant"]: r["cpu_fraction"] for r in rows},
        "all_in_order": all(r["received_in_order"] for r in rows),
        "codec_us": {r["codec"]: [r["pickled_dataclass_us"], r["wire_tuple_us"]] for r in codecs},
    }
    if args.apps:
        sizes = {}
        for spec in args.app_size:
            try:
                app, rest = spec.split("=", 1)
                size, iters = rest.rsplit(":", 1)
                sizes[app] = (size, int(iters))
            except ValueError:
                ap.error(f"--app-size {spec!r}: expected APP=N,D:ITERS")
            if app not in APP_RUNS:
                ap.error(f"--app-size {spec!r}: APP must be one of {sorted(APP_RUNS)}")
        runs = app_runs(1 if args.quick else args.reps, args.quick, args.timeout, sizes)
        summary["app_iteration_ms"] = {
            f"{r['app']}@{r['size']}": {
                v: round(statistics.median(x["iteration_ms"] for x in runs
                                           if x["app"] == r["app"] and x["variant"] == v), 3)
                for v in SPIN_VARIANTS}
            for r in runs}
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    from canary.script import end_script

    end_script(main())
