"""How much longer a worker's burst of work takes when a busy process shares its core.

A worker that shares its core with another job (``benchmarks/straggler.py``'s ``competing``
scenario) runs bursts of tasks between waits for messages. Whether the kernel lets a burst run
at full speed depends on the burst's length and on how much of the time the worker wants the
core (its duty), not only on the half of the core a fair share gives it. This measures that:
a process pinned to one core beside a busy loop pinned there too runs ``--bursts`` bursts of
CPU work of each length, sleeping between them so that it is busy ``duty`` of the time, and
reports each burst's wall time over its CPU time (the **stretch**: 1 at full speed, about 2 at
half a core), and how late it sees the end of each wait (the **lateness**): it waits as an idle
worker does (``WorkerConfig.idle_backoff`` without a core of its own, and its timer slack) for
a deadline that stands for the message it waits for, and the lateness is the time from the
deadline to the first look at the clock after it, what a message's arrival would wait for.
``--slices`` also runs each case after asking the kernel for longer time slices
(``sched_attr.sched_runtime``, honoured by Linux 6.12 and later).

One JSON line per case (``burst_ms``, ``duty``, ``slice_ms``: 0 for the kernel's own; the
median, 90th and 99th percentile and mean stretch; the median, 90th percentile and mean
lateness in ms), then a summary with the kernel's release. ``--alone`` runs the cases without
the busy loop too (``"alone": true``): the lateness a worker's sleeps have on a core of its own.

    python benchmarks/core_share.py                        # ~1 min
    python benchmarks/core_share.py --slices 5,20 --quick
    python benchmarks/core_share.py --alone --burst-ms 0.5,1,1.5,2 --duties 0.3
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# first the repository root, and not this folder: benchmarks/apps.py would shadow the apps package
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "benchmarks")]

from benchmarks.straggler import busy_loop  # noqa: E402

BURSTS_MS = (0.3, 1.0, 3.0)
DUTIES = (0.2, 0.3, 0.4, 0.5)
# sched_setattr's system call number on the machines it has one for
SCHED_SETATTR = {"x86_64": 314, "aarch64": 274}


class SchedAttr(ctypes.Structure):
    _fields_ = [("size", ctypes.c_uint32), ("sched_policy", ctypes.c_uint32),
                ("sched_flags", ctypes.c_uint64), ("sched_nice", ctypes.c_int32),
                ("sched_priority", ctypes.c_uint32), ("sched_runtime", ctypes.c_uint64),
                ("sched_deadline", ctypes.c_uint64), ("sched_period", ctypes.c_uint64)]


def ask_for_slice(seconds: float) -> bool:
    """Ask for time slices of ``seconds`` (normal policy, nice kept); whether it was taken."""
    number = SCHED_SETATTR.get(platform.machine())
    if number is None or not sys.platform.startswith("linux"):
        return False
    attr = SchedAttr(48, 0, 0, os.getpriority(os.PRIO_PROCESS, 0), 0, int(seconds * 1e9), 0, 0)
    return bool(ctypes.CDLL(None, use_errno=True).syscall(number, 0, ctypes.byref(attr), 0) == 0)


def bursts(burst_s: float, duty: float, count: int) -> tuple[list[float], list[float]]:
    """Run ``count`` bursts of ``burst_s`` CPU seconds, waiting between them as an idle worker
    does (:class:`canary.idle.Backoff`) for a deadline that keeps it busy ``duty`` of the time;
    each burst's wall time over its CPU time, and how late after each deadline it saw it."""
    from canary.idle import tight_timer_slack
    from canary.worker.config import WorkerConfig

    tight_timer_slack()
    backoff = WorkerConfig().idle_backoff(own_core=False)
    gap = burst_s * (1.0 / duty - 1.0)
    stretch, late = [], []
    for _ in range(count):
        t0, c0 = time.perf_counter(), time.thread_time()
        while time.thread_time() - c0 < burst_s:
            pass
        t1 = time.perf_counter()
        stretch.append((t1 - t0) / (time.thread_time() - c0))
        deadline = t1 + gap
        backoff.reset()
        while (now := time.perf_counter()) < deadline:
            backoff.sleep()
        late.append(now - deadline)
    return stretch, late


def child(core: int, slice_s: float, burst_s: float, duty: float, count: int) -> int:
    os.sched_setaffinity(0, {core})
    taken = ask_for_slice(slice_s) if slice_s else True
    stretch, late = bursts(burst_s, duty, count)
    got, late_ms = sorted(stretch), sorted(x * 1e3 for x in late)
    print(json.dumps({"burst_ms": round(burst_s * 1e3, 3), "duty": duty,
                      "slice_ms": round(slice_s * 1e3, 3), "slice_taken": taken,
                      "bursts": count, "median": round(statistics.median(got), 3),
                      "p90": round(got[int(0.9 * len(got))], 3),
                      "p99": round(got[int(0.99 * len(got))], 3),
                      "mean": round(statistics.fmean(got), 3),
                      "late_ms_median": round(statistics.median(late_ms), 4),
                      "late_ms_p90": round(late_ms[int(0.9 * len(late_ms))], 4),
                      "late_ms_mean": round(statistics.fmean(late_ms), 4)}), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    if argv is None and sys.argv[1:2] == ["--child"]:
        core, slice_s, burst_s, duty, count = sys.argv[2:7]
        return child(int(core), float(slice_s), float(burst_s), float(duty), int(count))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bursts", type=int, default=600, help="bursts per case")
    ap.add_argument("--slices", default="", help="longer slices to try too, in ms: 5,20")
    ap.add_argument("--burst-ms", default=",".join(map(str, BURSTS_MS)), metavar="B,B,...",
                    help="burst lengths in ms (default %(default)s)")
    ap.add_argument("--duties", default=",".join(map(str, DUTIES)), metavar="D,D,...",
                    help="fractions of the time busy (default %(default)s)")
    ap.add_argument("--alone", action="store_true",
                    help="run the cases without the busy loop too, first")
    ap.add_argument("--quick", action="store_true", help="1 ms bursts at 30%% duty, 40 of them")
    args = ap.parse_args(argv)
    try:
        slices = [0.0] + [float(s) * 1e-3 for s in args.slices.split(",") if s]
        lengths = [float(b) * 1e-3 for b in args.burst_ms.split(",") if b]
        duties = [float(d) for d in args.duties.split(",") if d]
    except ValueError:
        ap.error("--slices and --burst-ms take milliseconds, --duties fractions, each separated "
                 "by commas")
    if args.bursts < 10 or any(not 0.1e-3 <= s <= 0.1 for s in slices[1:]):
        ap.error("--bursts must be >= 10 and every --slices value within 0.1 to 100 ms")
    if not lengths or not duties or any(not 0.01e-3 <= b <= 0.1 for b in lengths) \
            or any(not 0 < d < 1 for d in duties):
        ap.error("--burst-ms values must be within 0.01 to 100 ms, --duties within (0, 1)")
    cases = [(1e-3, 0.3)] if args.quick else [(b, d) for b in lengths for d in duties]
    count = 40 if args.quick else args.bursts
    core = sorted(os.sched_getaffinity(0))[-1]
    rows: list[dict[str, Any]] = []

    def run_cases(slice_s: float, alone: bool) -> None:
        for burst_s, duty in cases:
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child",
                                   str(core), str(slice_s), str(burst_s), str(duty),
                                   str(count)], capture_output=True, text=True, timeout=600)
            if proc.returncode != 0:
                raise SystemExit(f"core_share.py: a case failed:\n{proc.stderr[-2000:]}")
            row = json.loads(proc.stdout)
            if alone:
                row["alone"] = True
            rows.append(row)
            print(json.dumps(row), flush=True)

    if args.alone:
        run_cases(0.0, True)
    hog = busy_loop(core)
    try:
        time.sleep(0.3)
        for slice_s in slices:
            run_cases(slice_s, False)
    finally:
        hog.kill()
        hog.wait()
    print(json.dumps({"summary": "core_share", "kernel": platform.release(), "core": core,
                      "cases": len(rows)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
