"""What snapshots cost: write throughput, iteration-time overhead, and recovery time.

1. **Throughput** (``kind: write``): a worker's part of a snapshot (``--mb`` MB in 8 arrays,
   written as :func:`canary.snapshot.save_part` does: HDF5, a checksum per array, fsync,
   rename)
   against a plain sequential write of the same bytes to the same folder with the same fsync
   and rename, alternating, ``--reps`` times each; the ratio of the medians.
2. **Overhead** (``kind: overhead``): logistic regression on ``--lr`` rows under
   ``canary run -n 2`` with a snapshot every ``--every`` seconds: the time each snapshot cost
   the job (the iterations around its barrier beyond the median iteration, timed by the workers'
   loop tests in a ``loop``-level trace), and what the median cost is at the default interval
   of 60 s.
3. **Recovery** (``kind: recovery``): the same job with ``--restarts 1``; worker rank 2 is
   killed with SIGKILL once the first snapshot is committed. From the kill to the launcher
   saying it restarts (the death noticed and the job torn down), and from then to the first
   iteration of the resumed job (relaunch, start-up, reading the snapshot), of which reading
   the snapshot's files (measured apart, in this process) is shown on its own.
4. **Lateness** (``kind: lateness``): ``benchmarks/slow_steps.py`` (``--steps`` steps of
   ``--step-ms`` on the worker holding the model, the other worker's tasks waiting for it)
   with a snapshot due every ``--late-every`` seconds, run with the workers' run-ahead window
   fixed at 64 stage instances (``CANARY_WINDOW_MS=0``) and following the pace (the default):
   when the first snapshot was committed, and the median time between two commits. A snapshot
   waits for everything emitted before its barrier, the furthest position any worker emitted.

Prints JSON lines, the last a summary; writes them to ``--out`` as well.

    python benchmarks/snapshot.py                 # about 2.5 minutes
    python benchmarks/snapshot.py --quick         # seconds (tests)
    python benchmarks/snapshot.py --kinds lateness  # the lateness runs only, ~30 s
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
# first the repository root, and not this folder: benchmarks/apps.py would shadow the apps package
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "benchmarks")]

from benchmarks.straggler import loop_ends  # noqa: E402
from canary.snapshot import choose, committed, load_part, save_part  # noqa: E402
from canary.trace import load_events  # noqa: E402

KINDS = ("write", "overhead", "recovery", "lateness")


def emit(row: dict[str, Any], sink: list[dict[str, Any]]) -> None:
    sink.append(row)
    print(json.dumps(row), flush=True)


def plain_write(path: str, arrays: list[np.ndarray]) -> None:
    """The same bytes, written as plainly as durability allows: one file, fsync, rename."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        for a in arrays:
            f.write(memoryview(a).cast("B"))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(os.path.dirname(path), os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)


def write_throughput(folder: str, mb: float, reps: int, sink: list[dict[str, Any]]) -> float:
    rng = np.random.default_rng(0)
    n = int(mb * 2**20 / 8 / 8)
    arrays = [rng.random(n) for _ in range(8)]
    rows = [("x", i, a, 0) for i, a in enumerate(arrays)]
    nbytes = sum(a.nbytes for a in arrays)
    times: dict[str, list[float]] = {"snapshot": [], "plain": []}
    for rep in range(reps):
        order = ["snapshot", "plain"] if rep % 2 == 0 else ["plain", "snapshot"]
        for kind in order:
            t = time.perf_counter()
            if kind == "snapshot":
                _, error = save_part(folder, 1000 + rep, 0, rows)
                assert error is None, error
            else:
                plain_write(os.path.join(folder, f"plain-{rep}.bin"), arrays)
            times[kind].append(time.perf_counter() - t)
        shutil.rmtree(os.path.join(folder, f"snapshot-{1000 + rep:06d}"), ignore_errors=True)
        os.remove(os.path.join(folder, f"plain-{rep}.bin"))
    snap, plain = statistics.median(times["snapshot"]), statistics.median(times["plain"])
    ratio = plain / snap
    emit({"kind": "write", "mb": round(nbytes / 2**20, 1), "reps": reps,
          "snapshot_gbps": round(nbytes / snap / 1e9, 3),
          "plain_gbps": round(nbytes / plain / 1e9, 3),
          "snapshot_over_plain_throughput": round(ratio, 3),
          "snapshot_s": [round(t, 4) for t in times["snapshot"]],
          "plain_s": [round(t, 4) for t in times["plain"]]}, sink)
    return ratio


def lr_args(rows: int, iters: int) -> list[str]:
    return ["apps/logistic_regression.py", "--generate", f"{rows},20", "--max-iter", str(iters),
            "--tol", "1e-300", "--partitions", "2", "--print-every", "1"]


class Run:
    """``canary run`` in the background, its lines stamped with when they arrived."""

    def __init__(self, args: list[str], tmp: str, env_extra: dict[str, str] | None = None) -> None:
        env = dict(os.environ, TMPDIR=tmp, PYTHONUNBUFFERED="1",
                   PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
                   **(env_extra or {}))
        self.proc = subprocess.Popen([sys.executable, "-m", "canary.cli", "run", "--timeout",
                                      "900", *args], cwd=ROOT, env=env, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.out: list[tuple[float, str]] = []
        self.err: list[tuple[float, str]] = []
        self._threads = [threading.Thread(target=self._read, args=(s, sink), daemon=True)
                         for s, sink in ((self.proc.stdout, self.out),
                                         (self.proc.stderr, self.err))]
        for t in self._threads:
            t.start()

    @staticmethod
    def _read(stream: Any, sink: list[tuple[float, str]]) -> None:
        for line in stream:
            sink.append((time.monotonic(), line))

    def wait(self) -> int:
        code = self.proc.wait(timeout=1200)
        for t in self._threads:
            t.join(timeout=10)
        if code != 0:
            sys.stderr.write("".join(line for _, line in self.err[-20:]))
        return code

    def summary(self) -> dict[str, Any]:
        return dict(json.loads(self.out[-1][1]))


def overhead(rows: int, iters: int, every: float, tmp: str,
             sink: list[dict[str, Any]]) -> dict[str, Any]:
    """What one snapshot costs the job, measured inside one run (runs side by side differ by
    more than a snapshot costs on a shared machine): each snapshot's barrier names the loop
    iteration it fell in, and the time the iterations around it took beyond the run's median
    iteration is its cost."""
    ck = os.path.join(tmp, "ck-overhead")
    trace = os.path.join(tmp, "trace.json")
    # iterations timed where they run, by the workers' loop tests: the reports' arrival times
    # at rank 0 come in bursts (a median iteration of 0.19 ms in a run of 8 ms iterations)
    run = Run(["-n", "2", "--balance", "off", "--checkpoint", ck, "--checkpoint-every",
               str(every), "--keep", "100000", *lr_args(rows, iters), "--print-every", "0"], tmp,
              {"CANARY_TRACE": trace, "CANARY_TRACE_LEVEL": "loop"})
    assert run.wait() == 0, "the job failed"
    seconds = np.array(loop_ends(load_events(trace))) / 1e6
    took = np.diff(seconds)  # took[k]: iteration k + 1
    median = float(np.median(took))
    snaps = committed(ck)
    costs = []
    for snap in snaps:
        c = int(snap.position["counters"][0])  # the loop iteration the barrier fell in
        around = took[max(c - 2, 0):c + 2]
        costs.append(float(np.sum(np.maximum(around - median, 0.0))))
    per_snapshot = statistics.median(costs) if costs else 0.0
    mb = statistics.median(s.data["bytes"] for s in snaps) / 2**20 if snaps else 0.0
    total = seconds[-1] - seconds[0]
    row = {"kind": "overhead", "rows": rows, "iterations": len(took), "every_s": every,
           "snapshots": len(snaps), "snapshot_mb": round(mb, 1),
           "median_iteration_ms": round(median * 1e3, 3),
           "seconds_per_snapshot": round(per_snapshot, 4),
           "seconds_per_snapshot_each": [round(c, 4) for c in costs],
           "overhead_at_every": round(sum(costs) / max(total - sum(costs), 1e-9), 4),
           "overhead_at_60s": round(per_snapshot / 60.0, 5)}
    emit(row, sink)
    return row


def recovery(rows: int, iters: int, every: float, tmp: str,
             sink: list[dict[str, Any]]) -> dict[str, Any]:
    ck = os.path.join(tmp, "ck-recovery")
    run = Run(["-n", "2", "--checkpoint", ck, "--checkpoint-every", str(every), "--restarts", "1",
               *lr_args(rows, iters)], tmp)
    while not list(Path(ck).glob("snapshot-*/manifest.json")):
        assert run.proc.poll() is None, "the job ended before its first snapshot"
        time.sleep(0.005)
    starts = list(Path(tmp).glob("canary-run-*/start-2.json"))
    pid = int(json.loads(starts[0].read_text())["pid"])
    t_kill = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    assert run.wait() == 0, "the job did not recover"
    t_restart = next(t for t, line in run.err if "restarting the job" in line)
    t_running = next(t for t, line in run.out if t > t_restart and line.startswith("iter "))
    snap = choose(ck)[0]
    t = time.perf_counter()
    load_part(snap, list(snap.arrays()))
    load = time.perf_counter() - t
    row = {"kind": "recovery", "rows": rows, "snapshot_mb": round(snap.data["bytes"] / 2**20, 1),
           "kill_to_restart_s": round(t_restart - t_kill, 3),
           "restart_to_running_s": round(t_running - t_restart, 3),
           "of_which_reading_snapshot_s": round(load, 3),
           "kill_to_running_s": round(t_running - t_kill, 3)}
    emit(row, sink)
    return row


def lateness(steps: int, step_ms: float, every: float, tmp: str,
             sink: list[dict[str, Any]]) -> dict[str, float | None]:
    """First commit and median gap between commits (None with fewer than two), window fixed
    against following the pace (the run-ahead window: ``docs/architecture.md``); one row each,
    in that order."""
    gaps: dict[str, float | None] = {}
    for window, env in (("fixed", {"CANARY_WINDOW_MS": "0"}), ("pace", {})):
        ck = os.path.join(tmp, f"ck-late-{window}")
        run = Run(["-n", "2", "--balance", "off", "--checkpoint", ck, "--checkpoint-every",
                   str(every), "--keep", "100000", "benchmarks/slow_steps.py", str(steps),
                   str(step_ms)], tmp, env)
        assert run.wait() == 0, "the job failed"
        commits = sorted(float(s.data["run_seconds"]) for s in committed(ck))
        gap = round(float(statistics.median(np.diff(commits))), 3) if len(commits) > 1 else None
        gaps[window] = gap
        emit({"kind": "lateness", "window": window, "steps": steps, "step_ms": step_ms,
              "every_s": every, "run_s": round(run.summary()["seconds"], 3),
              "snapshots": len(commits),
              "first_commit_s": round(commits[0], 3) if commits else None,
              "median_gap_s": gap}, sink)
    return gaps


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=256.0, help="bytes per written part, in MB")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--lr", type=int, default=400_000, help="logistic regression rows")
    ap.add_argument("--iters", type=int, default=3000)
    ap.add_argument("--every", type=float, default=2.0, help="snapshot interval of the runs")
    ap.add_argument("--steps", type=int, default=48, help="steps of the lateness runs")
    ap.add_argument("--step-ms", type=float, default=250.0, help="ms a step takes")
    ap.add_argument("--late-every", type=float, default=1.0,
                    help="snapshot interval of the lateness runs")
    ap.add_argument("--kinds", default=",".join(KINDS), help="which measurements, comma-separated")
    ap.add_argument("--dir", default=None, help="folder to write in (default: a temporary one)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (tests)")
    ap.add_argument("--out", default=None, help="also write the JSON lines here")
    args = ap.parse_args(argv)
    if args.quick:
        # 2,000 iterations and a snapshot every 0.1 s: 400 iterations (0.15 ms each on a quiet
        # VM) could end before the first snapshot, then 0.2 s in, and leave the overhead run
        # none to measure; the run's start-up (0.17 s) now outlasts the interval on its own
        args.mb, args.reps, args.lr, args.iters, args.every = 4.0, 2, 4000, 2000, 0.1
        args.steps, args.step_ms, args.late_every = 30, 40.0, 0.2
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = set(kinds) - set(KINDS)
    if unknown:
        ap.error(f"--kinds: unknown {sorted(unknown)}; choose from {','.join(KINDS)}")
    sink: list[dict[str, Any]] = []
    summary: dict[str, Any] = {"summary": "snapshot"}
    tmp = tempfile.mkdtemp(prefix="canary-snapshot-bench-", dir=args.dir)
    try:
        if "write" in kinds:
            ratio = write_throughput(tmp, args.mb, args.reps, sink)
            summary.update(write_over_plain=round(ratio, 3), write_target_met=ratio >= 0.7)
        if "overhead" in kinds:
            over = overhead(args.lr, args.iters, args.every, tmp, sink)
            summary.update(overhead_at_60s=over["overhead_at_60s"],
                           overhead_target_met=over["overhead_at_60s"] <= 0.02)
        if "recovery" in kinds:
            rec = recovery(args.lr, args.iters * 3, args.every, tmp, sink)
            summary.update(kill_to_running_s=rec["kill_to_running_s"])
        if "lateness" in kinds:
            late = lateness(args.steps, args.step_ms, args.late_every, tmp, sink)
            summary.update(median_gap_fixed_window_s=late["fixed"],
                           median_gap_paced_window_s=late["pace"])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    emit(summary, sink)
    if args.out:
        Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in sink))
    return 0


if __name__ == "__main__":
    from canary.script import end_script

    end_script(main())
