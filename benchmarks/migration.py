"""How fast a partition moves: a ``--mb`` MB partition group moved between two workers, against
the MPI point-to-point bandwidth measured in the same run.

Under ``mpiexec -n 3`` (a controller and two workers) the child first times ``--reps`` plain
``Send``/``Recv`` of the same number of bytes from worker 1 to worker 0 (the MPI bandwidth),
then runs a job whose loop touches a few elements of each worker's big partition every
iteration, with ``--moves`` scripted moves (``controller.balance.ScriptedPolicy``) of worker 1's
partition to worker 0 and back, the first ``--at`` seconds in and then every ``--every``
seconds. A move's transfer time is from the source sending its values to the destination
installing them (the ends of the two ``migrate`` trace spans of that move). The MPI bandwidth
is taken twice: into one buffer reused (MPI's copy alone: ``mpi_gbps``) and into new memory each
time, sent and mapped as canary sends and maps an array (``mpi_new_memory_gbps``). Both it and
the moves are the best of their repetitions (the median is printed too). Iterations are timed
from the loop test's trace records: the ``slowest_ms`` iteration a move fell in is compared with
the median plus the transfer time it has to absorb.

A worker receives a partition into new pages the first time (moves 1 and 2), and from move 3
on into the pages it kept from the array it received before and has sent away since
(``canary.mpi_transport.Recycler``); each move line says how many bytes arrived in kept pages
(``recycled_bytes``), and the summary rates the two kinds of move apart.

Prints JSON lines: the bandwidth probes, one line per move, then the summary
(``move_over_mpi_bandwidth``: the best move's throughput over the MPI bandwidth;
``new_pages_move_over_mpi_bandwidth`` and ``kept_pages_move_over_mpi_bandwidth``: the same for
the best move of each kind; ``new_pages_move_over_mpi_new_memory``: the best move into new
pages over MPI's into new memory).

    python benchmarks/migration.py              # 100 MB, 5 moves, ~30 s
    python benchmarks/migration.py --quick      # 4 MB, 3 moves (tests)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
# first the repository root, and not this folder: benchmarks/apps.py would shadow the apps package
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "benchmarks")]

from canary.trace import Tracer, gather_and_write, load_events  # noqa: E402


def program(mb: float, iters: int) -> Any:
    import canary

    n = int(mb * 2**20 / 8)
    p = canary.Program("migration")
    big, head = p.dataset("big", 2), p.dataset("head", 2)
    s = p.dataset("s", 1)
    p.load([big], lambda i, parts: np.full(n, float(i + 1)))
    p.compute(lambda v: v[:1].copy(), [big], [head], name="touch")
    p.reduce(head, s)
    with p.while_(lambda v: True, on=s, max_iter=iters, name="while_loop"):
        p.compute(lambda v: v[:1] + v[-1:], [big], [head], name="touch")
        p.reduce(head, s)
    p.report(s)
    return p


def child(args: argparse.Namespace) -> int:
    from mpi4py import MPI

    from canary.controller.balance import ScriptedPolicy
    from canary.controller.runtime import run_controller
    from canary.worker.config import WorkerConfig
    from canary.worker.runtime import run_worker

    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    comm = world.Dup()
    nbytes = int(args.mb * 2**20)
    if rank in (1, 2):  # the MPI bandwidth between the two workers, same bytes
        from canary.mpi_transport import receive_raw, send_raw, wait_sent

        buf = np.ones(nbytes // 8)
        rates = {}
        # into the same buffer every time (its pages mapped already: MPI's copy alone), and
        # into new memory as a receiver of new data needs it (sent and mapped the way canary
        # sends and maps a received array: in chunks, each mapped just ahead of its copy)
        for probe in ("mpi_send", "mpi_send_new_memory"):
            times = []
            for _ in range(args.reps):
                t0 = time.perf_counter()
                if rank == 2:
                    if probe == "mpi_send":
                        comm.Send(buf, dest=1, tag=7)
                    else:
                        wait_sent(send_raw(comm, buf, 1))
                    comm.Recv(buf[:1], source=1, tag=8)  # the receiver's ack closes the timing
                else:
                    if probe == "mpi_send":
                        comm.Recv(buf, source=2, tag=7)
                    else:
                        receive_raw(comm, 2, buf.dtype, buf.shape)
                    comm.Send(buf[:1], dest=2, tag=8)
                times.append(time.perf_counter() - t0)
            rates[probe] = nbytes / min(times)
            if rank == 2:
                print(json.dumps({"probe": probe, "bytes": nbytes, "seconds": times,
                                  "gbps": round(rates[probe] / 1e9, 3)}), flush=True)
        if rank == 2:
            comm.send(rates, dest=0, tag=9)
        del buf
    if rank == 0:
        bandwidth = comm.recv(source=2, tag=9)
    job = comm.Dup()
    prog = program(args.mb, args.iters)
    group = prog.finalize().group_of(prog.datasets[0])
    tracer = Tracer(rank, "controller" if rank == 0 else f"worker {rank - 1}", loop_only=True)
    if rank == 0:
        script = [(args.at + k * args.every, group, 1, 0 if k % 2 == 0 else 1)
                  for k in range(args.moves)]
        res = run_controller(prog, job, tracer=tracer, policy=ScriptedPolicy(script))
    else:
        run_worker(prog, job, WorkerConfig.from_env(), tracer=tracer)
        res = None
    gather_and_write(job, tracer, args.trace)
    if rank == 0:
        assert res is not None
        print(json.dumps({"job": "done", "migrations": res.migrations,
                          "bytes_migrated": res.bytes_migrated,
                          "mpi_bytes_per_s": bandwidth}), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=100.0)
    ap.add_argument("--iters", type=int, default=150000)
    ap.add_argument("--at", type=float, default=0.5, help="seconds into the job to move")
    ap.add_argument("--moves", type=int, default=5, help="moves there and back")
    ap.add_argument("--every", type=float, default=0.5, help="seconds between moves")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--trace", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)
    if args.quick:
        # the moves 0.1 s apart from 0.1 s in, in a job of 2.4 s here (30,000 iterations of
        # 0.08 ms): a machine several times faster still runs all three before the job ends
        args.mb, args.iters, args.at, args.reps, args.moves, args.every = 4.0, 30000, 0.1, 2, 3, 0.1
    from canary.cli import find_mpiexec, mpiexec_env

    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "trace.json")
        cmd = [find_mpiexec(), "-n", "3", sys.executable, "-m", "mpi4py", __file__, "--child",
               "--mb", str(args.mb), "--iters", str(args.iters), "--at", str(args.at),
               "--reps", str(args.reps), "--moves", str(args.moves), "--every", str(args.every),
               "--trace", trace]
        env = mpiexec_env(600, str(ROOT))
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=660)
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            return 1
        events = load_events(trace)
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    probes = {x["probe"]: x for x in lines if x.get("probe")}
    job = next(x for x in lines if x.get("job"))
    for p in probes.values():
        print(json.dumps(p))
    ends: dict[tuple[int, str], float] = {}
    nbytes: dict[int, int] = {}
    recycled: dict[int, int] = {}
    for e in events:
        if e.get("cat") == "migration":
            ends[(e["args"]["move"], e["name"])] = e["ts"] + e["dur"]
            if e["name"] == "migrate in":
                nbytes[e["args"]["move"]] = e["args"]["bytes"]
                recycled[e["args"]["move"]] = e["args"]["recycled"]
    loop_ends = sorted(e["ts"] + e["dur"] for e in events
                       if e.get("cat") == "task" and e["name"] == "while_loop")
    gaps = [(b - a) / 1e3 for a, b in zip(loop_ends, loop_ends[1:])]
    median = statistics.median(gaps)
    moves = []
    for move in sorted({m for m, _ in ends}):
        if (move, "migrate out") not in ends or (move, "migrate in") not in ends:
            continue
        sent, installed = ends[(move, "migrate out")], ends[(move, "migrate in")]
        transfer = (installed - sent) / 1e6
        around = max((b - a) / 1e3 for a, b in zip(loop_ends, loop_ends[1:])
                     if a <= installed and b >= sent)
        row = {"move": move, "bytes": nbytes[move], "recycled_bytes": recycled[move],
               "transfer_s": round(transfer, 6),
               "gbps": round(nbytes[move] / transfer / 1e9, 3),
               "iteration_median_ms": round(median, 4), "slowest_ms": round(around, 3),
               "explained_ms": round(median + transfer * 1e3, 3)}
        print(json.dumps(row))
        moves.append(row)
    if len(moves) < args.moves:
        print(f"migration.py: {len(moves)} of {args.moves} moves were traced ({job})",
              file=sys.stderr)
        return 1
    best = max(m["gbps"] for m in moves)
    fresh = [m["gbps"] for m in moves if not m["recycled_bytes"]]
    kept = [m["gbps"] for m in moves if m["recycled_bytes"]]
    warm, new = probes["mpi_send"]["gbps"], probes["mpi_send_new_memory"]["gbps"]
    print(json.dumps({"summary": "migration", "mb": args.mb, "moves": len(moves),
                      "mpi_gbps": warm, "mpi_new_memory_gbps": new, "move_gbps": best,
                      "move_median_gbps": statistics.median(m["gbps"] for m in moves),
                      "mpi_median_gbps": round(args.mb * 2**20 / statistics.median(
                          probes["mpi_send"]["seconds"]) / 1e9, 3),
                      "move_over_mpi_bandwidth": round(best / warm, 3),
                      "new_pages_moves": len(fresh), "kept_pages_moves": len(kept),
                      "new_pages_move_over_mpi_bandwidth":
                          round(max(fresh) / warm, 3) if fresh else None,
                      "new_pages_move_over_mpi_new_memory":
                          round(max(fresh) / new, 3) if fresh else None,
                      "kept_pages_move_over_mpi_bandwidth":
                          round(max(kept) / warm, 3) if kept else None,
                      "slowest_over_explained": max(round(m["slowest_ms"] / m["explained_ms"], 3)
                                                    for m in moves),
                      "migrations": job["migrations"]}))
    return 0


if __name__ == "__main__":
    from canary.script import end_script

    end_script(main())
