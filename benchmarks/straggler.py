"""A straggler the engine recovers from: one slow worker, balancing off against on, in one run.

For logistic regression and k-means on ``--workers`` workers (default 2) with ``--ppw``
partitions per worker (default 8), each scenario runs the app under ``canary run``'s balancing
(on) and without it (off), interleaved. The inputs grow with the workers (the rows given below
are for 2 workers; ``W`` workers get ``W / 2`` times as many), so each worker's share, and so
the time of its tasks, stays the same at any count:

* ``equal``: no worker slowed (balancing on): the reference, and the check that a balanced run
  moves nothing;
* ``slowdown``: the last worker's tasks take ``--factor`` (3) times as long
  (``CANARY_SLOWDOWN``, the engine spins for the difference);
* ``competing``: a busy loop pinned to the last worker's core, every worker pinned to a core of
  its own (``os.sched_setaffinity``; a physical core each where there are enough, hardware
  threads of one core last: :func:`core_order`) and the controller to one more core where
  there is one,
  else to the first worker's, so the last worker gets about half of its core (``--hog-duty
  D``: the loop spins ``D`` of every 10 ms and sleeps the rest, a process that takes less of
  the core; 1 by default). Its reference
  is ``equal_pinned``, a run pinned the same way without the busy loop (balancing on), so
  that the ideal comes from the same placement: on a 16-core virtual machine the pinned runs
  of 8 workers ran slower all through than the unpinned equal run, beyond what the one
  competed worker explains (once it held nothing, 4.6 ms an iteration at the 10th percentile
  against 2.4 ms), at a time when a pinned worker never polled hot when idle
  (``canary.idle.has_own_core`` now lets it) and ranks were pinned in CPU order, which on a
  machine that numbers a core's hardware threads together puts two workers on one core.

Each run's iterations are timed from the workers' own records of the loop test
(``CANARY_TRACE_LEVEL=loop``) and each move from its trace span. The **ideal** iteration time
is the work divided over the workers in proportion to their speed: with the equal (or
equal_pinned) run's time ``t`` and the off run's ``t_off`` (the slow worker's ``ppw``
partitions bound it, so it is ``f = t_off / t`` times slower), ``ideal = W t / (W - 1 + 1 /
f)`` for ``W`` workers. Balancing
has **settled** at the first iteration after which the median of every window of 25 iterations
stays within 1.15x of the ideal (``settled_mean_s``: the mean of every window within 1.15x of
the ideal from the means); ``steady_ms`` is the median of the run's last 40%, and
``mean_ms`` its mean, with ``over_ideal_mean`` the same ratio from the means (a busy process on
a worker's core slows one iteration in a few by a whole turn of the busy process, which the
median leaves out as it leaves out noise).

``--micro`` adds the micropartitioning sweep (the Canary paper's Fig 8a shape): logistic
regression on a larger input (per-partition costs matter less) with the last worker
``--micro-factor`` (2) times slower, at 1, 2, 4, 8, 16 partitions per worker (``--micro-ppws``
picks some: a short lease on a bigger machine), balancing on, each beside a run with no worker
slowed; ``--micro-rounds R`` runs the sweep R times, every other round in reverse order, and
the summary gives each count's median over the rounds (a shared machine's load drifts by more
than the sweep measures within a few minutes). Whole partitions can split the work only so
finely: the **best split** at each granularity (``best_split_ms``) is the equal run's time
scaled by the best whole-partition split (e.g. with two workers and one 2x slower, 1 partition
per worker can do no better than leaving the slow worker its whole share; 8 come within 3% of
the 2:1 split). The slowdown stretches tasks only, not the messages between them, and the
scaling stretches the iteration's fixed cost too, so a run can beat it.

``--virtual 3,8,16`` adds runs on more workers than this machine has cores, in virtual time
(``canary.virtual_runner.run_virtual``: the real policy and migration protocol, every task run
for real): logistic regression with ``--ppw`` partitions per worker, the last worker
``--factor`` times slower, each task priced by a fixed model (:func:`gradient_cost`: 1 ms per
partition's gradient, 10 us for any other task), so the figures are the policy's arithmetic,
the same on every machine, and neither a real machine's noise nor its waits for a CPU. Each
row gives the balanced iteration against the best split and the ideal (``W ppw ms / (W - 1 +
1 / factor)``), and the unbalanced one.

``--virtual-competing 2,4,8`` adds logistic regression in virtual time with a busy process on
the last worker's core (:class:`canary.virtual_runner.SharedCore`, a model of the kernel's
sharing whose defaults give ``benchmarks/core_share.py``'s medians), each partition's gradient
``--partition-ms`` (0.4, the real runs' size): the balanced workers alone, and with the busy
process balancing off and on, about 20 virtual seconds each. Its figures come from the mean
iterations, and each row gives the partitions the competed worker kept.

``--spells 4,8,16`` adds balanced runs in virtual time (no worker slowed for good) where every
worker has seeded spells of 1.2-1.6x slower tasks lasting 1.5-5 s (3 to 10 load reports),
``--spell-rate`` a second each (:func:`spell_noise`), the noise balanced runs showed on a shared
machine: each row gives the moves of ``--spell-seeds`` runs, where none is the target, and each
run's time balancing on over balancing off, the same spells in both. ``--spell-s`` and
``--spell-factors`` set the spells' lengths and how much slower, ``--spell-virtual-s`` each
run's length (20 virtual seconds; spells of 6-20 s, as one 16-core host showed, want 60 or
more).

Each run's row also gives each worker's load over the run's last 40% (``worker_load``: busy,
waiting for a CPU, and how often it polled hot when idle), from its load reports.

Prints JSON lines (one per run, then a summary) and, with ``--plot DIR``, draws
``straggler.png`` (iteration time against time, moves marked) and ``micropartition_balance.png``.
``--keep-traces DIR`` keeps each run's trace (``APP_SCENARIO[_on|_off]_wW.json``): its load
reports can be replayed through a changed policy offline (``benchmarks/replay_balance.py``).

    python benchmarks/straggler.py --plot docs/img/performance          # ~7 min
    python benchmarks/straggler.py --micro --plot docs/img/performance  # + ~5 min
    python benchmarks/straggler.py --apps "" --micro --micro-rounds 3   # ~15 min
    python benchmarks/straggler.py --apps "" --virtual 3,8,16            # ~15 s
    python benchmarks/straggler.py --apps "" --spells 2,4,8,16           # ~8 min
    python benchmarks/straggler.py --apps "" --virtual-competing 2,4,8   # ~2 min
    python benchmarks/straggler.py --quick                               # tiny (tests)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# first the repository root, and not this folder: benchmarks/apps.py would shadow the apps package
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "benchmarks")]

from canary.trace import load_events, load_reports  # noqa: E402

# app -> (generated data, iterations) at full size and with --quick. The runs last 10 s or
# more, so that the steady state (the last 40%) comes well after balancing settled (it acts
# after about 2 s of load reports); logistic regression's about 25 s, since beside a busy loop
# the policy's trials end 12-16 s in (moves by speed, the halving, then partitions back or off
# one at a time, each judged on its own pace); k-means's points are drawn around 2 centres, so
# that its 32 take 1,295 iterations to converge (around 8, as many points converged after 536,
# and the window began inside those trials), at the same cost an iteration.
APPS = {
    "logistic_regression": (["--generate", "200000,20", "--tol", "1e-30"], 8000,
                            ["--generate", "4000,4", "--tol", "1e-30"], 60),
    "kmeans": (["--generate", "300000,20,2", "--k", "32", "--tol", "0"], 1300,
               ["--generate", "4000,4,4", "--tol", "0"], 40),
}
MICRO_DATA, MICRO_ITERS = ["--generate", "1000000,20", "--tol", "1e-30"], 1500
PPWS = (1, 2, 4, 8, 16)
SETTLE_WINDOW = 25
TARGET = 1.15
# a pinned child's scripted moves, JSON [[at, group, index, dest], ...]: the controller then
# runs canary.controller.balance.ScriptedPolicy instead of its own (benchmarks/competed_share.py)
SCRIPT_ENV = "STRAGGLER_SCRIPTED_MOVES"


def physical_core(cpu: int) -> tuple[str, str] | int:
    """The physical core ``cpu`` (a logical CPU) belongs to, as Linux's sysfs names it (its
    package and core ids); the CPU itself where the topology is not there to read."""
    topology = f"/sys/devices/system/cpu/cpu{cpu}/topology/"
    try:
        with open(topology + "physical_package_id") as f, open(topology + "core_id") as g:
            return f.read().strip(), g.read().strip()
    except OSError:
        return cpu


def core_order(cpus: list[int], core_of: Callable[[int], object] = physical_core) -> list[int]:
    """``cpus`` (logical CPUs) in the order pinned ranks take them: the first CPU of each
    physical core (``core_of``), in CPU order, then the cores' other hardware threads. So ranks
    get a physical core each where there are enough: two hardware threads of one core (SMT,
    hyper-threading) share its units, and ranks pinned to siblings run each other's work
    slower, a pinned reference run slower than an unpinned one and its ideal too high. Where
    siblings are numbered apart (0 and 8 on 8 cores) that is the CPU order; where they are
    numbered together (0 and 1), it is every other CPU first."""
    first: list[int] = []
    siblings: list[int] = []
    seen: set[object] = set()
    for cpu in sorted(cpus):
        core = core_of(cpu)
        (siblings if core in seen else first).append(cpu)
        seen.add(core)
    return first + siblings


def worker_core(worker: int) -> int:
    """The core a pinned run puts ``worker`` on (:func:`pinned_child`), and so the core a busy
    loop competing with it must take: the worker's place in :func:`core_order` of the CPUs this
    process may use, round and round."""
    cores = core_order(sorted(os.sched_getaffinity(0)))
    return cores[worker % len(cores)]


def controller_core(workers: int) -> int:
    """The core a pinned run of ``workers`` workers puts the controller on: the next core after
    the workers' where this process may use more cores than there are workers, else the first
    worker's (never the last, slowed one's)."""
    cores = sorted(os.sched_getaffinity(0))
    return worker_core(workers if len(cores) > workers else 0)


def pinned_child() -> int:
    """Run under mpiexec: pin this rank (a worker to a core of its own, the controller to
    :func:`controller_core`'s), then run the app."""
    import runpy

    # this folder holds benchmarks/apps.py, which would shadow the ``apps`` package
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    rank = int(os.environ.get("PMI_RANK", "0"))
    workers = int(os.environ.get("PMI_SIZE", "2")) - 1
    # the controller is pinned too, never to the slowed worker's core: left free, it landed on
    # the busy loop's core in some runs and not others, and the slowed worker lost its core to
    # two processes instead of one (logistic regression's iteration: 2.8 against 3.2-3.4 ms,
    # balancing off or on)
    os.sched_setaffinity(0, {worker_core(rank - 1) if rank else controller_core(workers)})
    scripted = os.environ.get(SCRIPT_ENV)
    if scripted:
        import canary.mpi_runner
        from canary.controller.balance import ScriptedPolicy

        moves = [(float(at), int(g), int(i), int(d)) for at, g, i, d in json.loads(scripted)]
        canary.mpi_runner.move_policy = lambda *_: ScriptedPolicy(moves)  # type: ignore
    app = sys.argv[2]
    sys.argv = [app, *sys.argv[3:]]
    runpy.run_path(app, run_name="__main__")
    return 0


def busy_loop(core: int, duty: float = 1.0) -> subprocess.Popen[bytes]:
    """A process on ``core`` until killed, spinning ``duty`` of every 10 ms and sleeping the
    rest (all the time at 1): a competing job on that machine."""
    code = f"import os, time; os.sched_setaffinity(0, {{{core}}})\n"
    if duty >= 1:
        code += "while True:\n    pass\n"
    else:
        code += ("while True:\n"
                 f"    end = time.perf_counter() + {duty * 0.01!r}\n"
                 "    while time.perf_counter() < end:\n        pass\n"
                 f"    time.sleep({(1 - duty) * 0.01!r})\n")
    return subprocess.Popen([sys.executable, "-c", code])


def per_worker(data: list[str], workers: int) -> list[str]:
    """``data``'s ``--generate ROWS,...`` with ROWS (given for 2 workers) scaled to ``workers``."""
    out = list(data)
    k = out.index("--generate") + 1
    rows, rest = out[k].split(",", 1)
    out[k] = f"{int(rows) * workers // 2},{rest}"
    return out


def run(app: str, argv: list[str], iters: int, workers: int, balance: bool,
        env_extra: dict[str, str], pinned: bool, timeout: int,
        keep: str | None = None) -> dict[str, Any]:
    """One run of ``app`` under ``canary run``: its iteration end times and moves. With
    ``keep`` (a file path), its trace (the loop tests and every load report) is kept there."""
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "trace.json")
        script = [str(ROOT / "apps" / f"{app}.py")]
        if pinned:
            script = [str(Path(__file__).resolve()), "--pinned-child", *script]
        cmd = [sys.executable, "-m", "canary.cli", "run", "-n", str(workers), "--timeout",
               str(timeout), "--balance", "on" if balance else "off", *script, *argv,
               "--max-iter", str(iters), "--print-every", "0"]
        env = dict(os.environ, CANARY_TRACE=trace, CANARY_TRACE_LEVEL="loop",
                   PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
                   **env_extra)
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout + 60)
        if proc.returncode != 0:
            raise RuntimeError(f"{app} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        events = load_events(trace)
        if keep:
            shutil.copyfile(trace, keep)
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    ends = loop_ends(events)
    t0 = ends[0] if ends else 0.0
    moves = sorted((e["ts"] + e["dur"] - t0) / 1e6 for e in events
                   if e.get("cat") == "migration" and e["name"] == "migrate in")
    times = [(b - a) / 1e3 for a, b in zip(ends, ends[1:])]  # ms
    return {"iteration_ms": times, "at_s": [(e - t0) / 1e6 for e in ends[1:]], "moves_s": moves,
            "worker_load": worker_load(events),
            "partition_ms": partition_ms(events, times),
            "migrations": summary["migrations"], "bytes_migrated": summary["bytes_migrated"],
            "controller_cpu_percent": summary.get("controller_cpu_percent"),
            "moves_said": [line for line in proc.stderr.splitlines()
                           if line.startswith("canary: moved partition")]}


def worker_load(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per worker, over its load reports in the last 40% of the run (as ``steady_ms``): the
    median fraction of the time it was busy and waited for a CPU, and the fraction of its
    reports in which it polled hot when idle (``canary.idle.Backoff.note_cpu_wait``)."""
    reports: dict[int, list[Any]] = {}
    for _, rep in load_reports(events):
        reports.setdefault(rep.worker, []).append(rep)
    out = []
    for w in sorted(reports):
        tail = reports[w][int(len(reports[w]) * 0.6):] or reports[w]
        out.append({"worker": w,
                    "busy": round(statistics.median(
                        max(1.0 - r.idle / max(r.interval, 1e-9), 0.0) for r in tail), 3),
                    "cpu_wait": round(statistics.median(r.cpu_wait / max(r.interval, 1e-9)
                                                        for r in tail), 3),
                    "polls_hot": round(sum(r.polls_hot for r in tail) / len(tail), 3)})
    return out


def partition_ms(events: list[dict[str, Any]], times: list[float]) -> float | None:
    """The median time the tasks of one partition of the first co-location group (the
    training data: logistic regression's gradients) take an iteration, over the load reports
    of the run's last 40%: a report's seconds for the partition over the iterations it spans
    (its interval over the mean iteration, ``times`` in ms, of the same part). None without
    reports."""
    reports = [rep for _, rep in load_reports(events)]
    tail = reports[int(len(reports) * 0.6):]
    shares = [seconds / rep.interval
              for rep in tail for g, _, seconds, _ in rep.busy if g == 0 and rep.interval > 0]
    return statistics.median(shares) * steady_mean(times) if shares else None


def loop_ends(events: list[dict[str, Any]]) -> list[float]:
    """End times (µs) of the main loop's test, one per iteration, in order."""
    ends: dict[str, dict[int, float]] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "task" and str(e["name"]).startswith("while_"):
            seqs = ends.setdefault(e["name"], {})
            seqs[e["args"]["seq"]] = max(seqs.get(e["args"]["seq"], 0.0), e["ts"] + e["dur"])
    if not ends:
        return []
    main = max(ends.values(), key=len)
    return [main[s] for s in sorted(main)]


def steady(times: list[float]) -> float:
    """The median iteration time over the run's last 40%."""
    return statistics.median(times[int(len(times) * 0.6):] or times)


def steady_mean(times: list[float]) -> float:
    """The mean iteration time over the run's last 40%: the pace of the job, including the
    iterations a periodic wait (a busy process's turn on a shared core) slows, which
    :func:`steady` leaves out as it would leave out noise."""
    return statistics.fmean(times[int(len(times) * 0.6):] or times)


def settled_at(times: list[float], at: list[float], ideal: float,
               stat: Callable[[list[float]], float] = statistics.median) -> float | None:
    """Seconds into the run after which every window's ``stat`` (median, or mean beside a busy
    process: see :func:`steady_mean`) is within TARGET of ideal."""
    w = SETTLE_WINDOW
    ok_from = None
    for k in range(0, max(len(times) - w, 0) + 1):
        good = stat(times[k:k + w]) <= TARGET * ideal
        if good and ok_from is None:
            ok_from = k
        elif not good:
            ok_from = None
    return None if ok_from is None else at[ok_from]


def main(argv: list[str] | None = None) -> int:
    if argv is None and sys.argv[1:2] == ["--pinned-child"]:  # a rank this script started
        return pinned_child()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--apps", default="logistic_regression,kmeans",
                    help="comma-separated; empty: the sweep alone (with --micro)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--ppw", type=int, default=8, help="partitions per worker")
    ap.add_argument("--factor", type=float, default=3.0)
    ap.add_argument("--scenarios", default="slowdown,competing")
    ap.add_argument("--hog-duty", type=float, default=1.0,
                    help="the competing process spins this fraction of every 10 ms and sleeps "
                         "the rest (default %(default)s: a busy loop)")
    ap.add_argument("--micro", action="store_true", help="add the micropartitioning sweep")
    ap.add_argument("--micro-factor", type=float, default=2.0,
                    help="how much slower the last worker is in the sweep")
    ap.add_argument("--micro-ppws", default=",".join(map(str, PPWS)), metavar="P,P,...",
                    help="the partitions per worker the sweep runs (default: %(default)s)")
    ap.add_argument("--micro-rounds", type=int, default=1,
                    help="run the sweep this many times, every other round in reverse order; "
                         "the summary gives each count's median over the rounds")
    ap.add_argument("--virtual", default="", metavar="W,W,...",
                    help="also balance on these numbers of virtual workers (virtual time)")
    ap.add_argument("--virtual-competing", default="", metavar="W,W,...",
                    help="also run on these numbers of virtual workers with a busy process on "
                         "the last one's core (virtual time, a model of the kernel's sharing)")
    ap.add_argument("--partition-ms", type=float, default=0.4,
                    help="a partition's gradient in --virtual-competing runs (default "
                         "%(default)s ms)")
    ap.add_argument("--spells", default="", metavar="W,W,...",
                    help="also run balanced jobs on these numbers of virtual workers, every "
                         "worker with seeded spells of slower tasks, and count the moves")
    ap.add_argument("--spell-rate", type=float, default=0.1,
                    help="spells a second of each worker (--spells; default %(default)s)")
    ap.add_argument("--spell-seeds", type=int, default=5,
                    help="seeded runs per worker count (--spells; default %(default)s)")
    ap.add_argument("--spell-s", default="1.5,5", metavar="LO,HI",
                    help="how long each spell lasts, seconds (--spells; default %(default)s)")
    ap.add_argument("--spell-factors", default="1.2,1.6", metavar="LO,HI",
                    help="how much slower a worker's tasks run in a spell (--spells; default "
                         "%(default)s)")
    ap.add_argument("--spell-virtual-s", type=float, default=20.0,
                    help="each --spells run's length in virtual seconds (default %(default)s)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (tests)")
    ap.add_argument("--plot", default=None, metavar="DIR", help="write the charts here")
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--keep-traces", default=None, metavar="DIR",
                    help="keep each run's trace here (its load reports can be replayed through "
                         "the policy: benchmarks/replay_balance.py)")
    args = ap.parse_args(argv)
    try:
        virtual = [int(w) for w in args.virtual.split(",") if w]
        spelled = [int(w) for w in args.spells.split(",") if w]
        competed = [int(w) for w in args.virtual_competing.split(",") if w]
    except ValueError:
        virtual = spelled = competed = [0]
    try:
        ppws = [int(p) for p in args.micro_ppws.split(",") if p]
    except ValueError:
        ppws = [0]
    spell_s, spell_factors = span(args.spell_s), span(args.spell_factors)
    if (args.micro_factor < 1 or args.factor < 1 or args.workers < 2 or args.ppw < 1
            or any(w < 2 for w in virtual + spelled + competed) or not ppws
            or any(p < 1 for p in ppws) or not args.spell_rate > 0 or args.spell_seeds < 1
            or not 0 < args.partition_ms < math.inf or args.micro_rounds < 1
            or spell_s is None or not spell_s[0] > 0 or spell_factors is None
            or not spell_factors[0] >= 1 or not 0 < args.spell_virtual_s < math.inf
            or not 0 < args.hog_duty <= 1):
        ap.error("--factor and --micro-factor must be >= 1 (how much slower), --workers >= 2, "
                 "--ppw, --micro-rounds and every --micro-ppws count >= 1, --virtual, "
                 "--virtual-competing and "
                 "--spells worker counts of 2 or more, --spell-rate > 0, --spell-seeds >= 1, "
                 "--spell-s LO,HI with 0 < LO <= HI, --spell-factors LO,HI with 1 <= LO <= HI, "
                 "--spell-virtual-s > 0, --hog-duty in (0, 1] and --partition-ms > 0")
    W = args.workers
    slow = W - 1
    if args.keep_traces:
        os.makedirs(args.keep_traces, exist_ok=True)

    def keep(name: str) -> str | None:
        return os.path.join(args.keep_traces, f"{name}_w{W}.json") if args.keep_traces else None

    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {"summary": "straggler", "workers": W, "ppw": args.ppw,
                               "factor": args.factor, "target": TARGET,
                               "cpus": len(os.sched_getaffinity(0))}
    for app in [a for a in args.apps.split(",") if a]:
        data, iters, qdata, qiters = APPS[app]
        if args.quick:
            data, iters = qdata, qiters
        argv_app = [*per_worker(data, W), "--partitions", str(W * args.ppw)]
        ref = run(app, argv_app, iters, W, True, {}, False, args.timeout,
                  keep(f"{app}_equal"))
        t_eq = steady(ref["iteration_ms"])
        rows.append(emit({"app": app, "scenario": "equal", "balance": True, "steady_ms": t_eq,
                          "migrations": ref["migrations"]}, ref))
        summary.setdefault("balanced_run_moves", {})[app] = ref["migrations"]
        scenarios = [x for x in args.scenarios.split(",") if x]
        t_pinned = t_eq
        if "competing" in scenarios:
            # where the pinned runs ran: with hardware threads, whether two ranks shared a core
            cpus = sorted(os.sched_getaffinity(0))
            summary["physical_cores"] = len({physical_core(c) for c in cpus})
            summary["pinned_cpus"] = {"workers": [worker_core(w) for w in range(W)],
                                      "controller": controller_core(W)}
            summary["hog_duty"] = args.hog_duty
            pinned = run(app, argv_app, iters, W, True, {}, True, args.timeout,
                         keep(f"{app}_equal_pinned"))
            t_pinned = steady(pinned["iteration_ms"])
            rows.append(emit({"app": app, "scenario": "equal_pinned", "balance": True,
                              "steady_ms": t_pinned, "migrations": pinned["migrations"]},
                             pinned))
            summary["balanced_run_moves"][f"{app}/pinned"] = pinned["migrations"]
        for scenario in scenarios:
            env = {"CANARY_SLOWDOWN": f"{slow}:{args.factor:g}"} if scenario == "slowdown" else {}
            got: dict[bool, dict[str, Any]] = {}
            for balance in (False, True):
                hog = (busy_loop(worker_core(slow), args.hog_duty) if scenario == "competing"
                       else None)
                try:
                    got[balance] = run(app, argv_app, iters, W, balance, env,
                                       scenario == "competing", args.timeout,
                                       keep(f"{app}_{scenario}_{'on' if balance else 'off'}"))
                finally:
                    if hog is not None:
                        hog.kill()
                        hog.wait()
            t_off = steady(got[False]["iteration_ms"])
            ref_run = pinned if scenario == "competing" else ref
            t_ref = steady(ref_run["iteration_ms"])
            f = max(t_off / t_ref, 1.0)
            ideal = ideal_ms(W, t_ref, f)
            # the same from the means: a busy process's turns slow some iterations only
            m_ref = steady_mean(ref_run["iteration_ms"])
            ideal_mean = ideal_ms(W, m_ref, max(steady_mean(got[False]["iteration_ms"]) / m_ref,
                                                1.0))
            for balance, r in got.items():
                settle = settled_at(r["iteration_ms"], r["at_s"], ideal) if balance else None
                settle_mean = (settled_at(r["iteration_ms"], r["at_s"], ideal_mean,
                                          statistics.fmean) if balance else None)
                row = {"app": app, "scenario": scenario, "balance": balance,
                       "steady_ms": steady(r["iteration_ms"]), "ideal_ms": round(ideal, 4),
                       "slow_worker_factor": round(f, 3),
                       "over_ideal": round(steady(r["iteration_ms"]) / ideal, 3),
                       "mean_ms": round(steady_mean(r["iteration_ms"]), 4),
                       "over_ideal_mean": round(steady_mean(r["iteration_ms"]) / ideal_mean, 3),
                       "settled_s": None if settle is None else round(settle, 3),
                       "settled_mean_s": None if settle_mean is None else round(settle_mean, 3),
                       "migrations": r["migrations"], "bytes_migrated": r["bytes_migrated"]}
                rows.append(emit(row, r))
                if balance:
                    summary.setdefault("over_ideal", {})[f"{app}/{scenario}"] = row["over_ideal"]
                    summary.setdefault("over_ideal_mean", {})[f"{app}/{scenario}"] = \
                        row["over_ideal_mean"]
                    summary.setdefault("settled_s", {})[f"{app}/{scenario}"] = row["settled_s"]
                    summary.setdefault("settled_mean_s", {})[f"{app}/{scenario}"] = \
                        row["settled_mean_s"]
                    summary.setdefault("bytes_migrated", {})[f"{app}/{scenario}"] = \
                        row["bytes_migrated"]
            summary.setdefault("off_over_on", {})[f"{app}/{scenario}"] = round(
                t_off / steady(got[True]["iteration_ms"]), 3)
    if args.micro:
        app = "logistic_regression"
        data, iters = (APPS[app][2], APPS[app][3]) if args.quick else (MICRO_DATA, MICRO_ITERS)
        env = {"CANARY_SLOWDOWN": f"{slow}:{args.micro_factor:g}"}
        for rnd, ppw in sweep_order(ppws, args.micro_rounds):
            tag = f"{app}_micro_{ppw}" + (f"_round{rnd}" if args.micro_rounds > 1 else "")
            argv_app = [*per_worker(data, W), "--partitions", str(W * ppw)]
            eq = run(app, argv_app, iters, W, True, {}, False, args.timeout,
                     keep(f"{tag}_equal"))
            r = run(app, argv_app, iters, W, True, env, False, args.timeout,
                    keep(f"{tag}_slowed"))
            t_eq, t_on = steady(eq["iteration_ms"]), steady(r["iteration_ms"])
            best = t_eq * W * best_split(W, ppw, args.micro_factor)
            rows.append(emit({"app": app, "scenario": "micropartition", "balance": True,
                              "ppw": ppw, "round": rnd, "factor": args.micro_factor,
                              "steady_ms": t_on, "equal_ms": round(t_eq, 4),
                              "best_split_ms": round(best, 4),
                              "over_best_split": round(t_on / best, 3),
                              "migrations": r["migrations"],
                              "bytes_migrated": r["bytes_migrated"]}, r))
        summary.update(micro_summary([r for r in rows if r["scenario"] == "micropartition"]))
    for w in virtual:
        row = virtual_run(w, args.ppw, args.factor, 60 if args.quick else 400)
        print(json.dumps(row), flush=True)
        summary.setdefault("virtual_over_best_split", {})[str(w)] = row["over_best_split"]
        summary.setdefault("virtual_over_ideal", {})[str(w)] = row["over_ideal"]
    for w in competed:
        row = virtual_competing_run(w, args.ppw, args.partition_ms * 1e-3,
                                    0.3 if args.quick else 20.0)
        print(json.dumps(row), flush=True)
        summary.setdefault("virtual_competing_over_ideal", {})[str(w)] = row["over_ideal"]
    for w in spelled:
        iters = 60 if args.quick else max(int(args.spell_virtual_s / (args.ppw * 1e-3)), 10)
        row = spells_run(w, args.ppw, args.spell_rate, args.spell_seeds, iters,
                         spell_s, spell_factors)
        print(json.dumps(row), flush=True)
        summary.setdefault("spells_runs_with_moves", {})[str(w)] = row["runs_with_moves"]
    print(json.dumps(summary), flush=True)
    if args.plot:
        plot(rows, args.plot)
    return 0


def gradients(task: Any) -> int:
    """How many partitions' gradients ``task`` computes (a fused stretch may hold several)."""
    if task.stretch is not None:
        grads = sum(st.name == "gradient_kernel" for st, _, _ in task.stretch.instances)
        return grads * len(task.stretch.idxs)
    return 1 if task.stage.name == "gradient_kernel" else 0


def gradient_cost(task: Any, measured_s: float, partition_s: float = 1e-3) -> float:
    """A fixed cost model for virtual runs of logistic regression: ``partition_s`` (1 ms) per
    partition's gradient (fused or not), 10 us for any other task; the time measured here is
    ignored."""
    grads = gradients(task)
    return grads * partition_s + (1e-5 if task.stretch is not None or not grads else 0.0)


def virtual_lr(workers: int, ppw: int, iters: int, balance: bool, partition_s: float = 1e-3,
               **kwargs: Any) -> Any:
    """Logistic regression (2000 x 6, ``iters`` iterations, ``ppw`` partitions per worker) on
    ``workers`` virtual workers priced by :func:`gradient_cost` (``partition_s`` a partition's
    gradient), with the balancing policy if ``balance`` (or ``policy``, if given); ``kwargs`` go
    to :func:`canary.virtual_runner.run_virtual` (``slowdown``, ``noise``, ``shared_cores``,
    ``on_task``; ``runtime`` and ``handle_s``, by default a runtime that costs nothing and
    2 µs an event). Its :class:`~canary.virtual_runner.VirtualResult`."""
    import apps.logistic_regression as lr
    from canary.controller.balance import BalancePolicy
    from canary.virtual_runner import IDEAL, Network, run_virtual

    def cost(task: Any, measured_s: float) -> float:
        return gradient_cost(task, measured_s, partition_s)

    policy = kwargs.pop("policy", BalancePolicy(workers) if balance else None)

    args = lr.parse_args(["--generate", "2000,6", "--max-iter", str(iters), "--tol", "1e-300",
                          "--print-every", "0", "--partitions", str(workers * ppw)])
    kwargs.setdefault("runtime", IDEAL)
    kwargs.setdefault("handle_s", 2e-6)
    return run_virtual(lr.build(args, workers)[0], workers, Network(5e-6, 1e9, "virtual"),
                       cost=cost, policy=policy, **kwargs)


def virtual_run(workers: int, ppw: int, factor: float, iters: int) -> dict[str, Any]:
    """Logistic regression on ``workers`` virtual workers, the last ``factor`` times slower,
    balancing off and on (see the module doc); one row."""
    got = {balance: virtual_lr(workers, ppw, iters, balance, slowdown={workers - 1: factor})
           for balance in (False, True)}
    on = got[True]
    times = [t * 1e3 for t in on.iteration_seconds()]
    t_on = steady(times)
    ideal = ideal_ms(workers, ppw * 1.0, factor)  # a fast worker: ppw gradients of 1 ms
    best = best_split(workers, ppw, factor) * workers * ppw
    settle = settled_at(times, on.iteration_ends()[1:], ideal)
    return {"app": "logistic_regression", "scenario": "virtual", "workers": workers, "ppw": ppw,
            "factor": factor, "iterations": iters,
            "off_ms": round(steady([t * 1e3 for t in got[False].iteration_seconds()]), 4),
            "steady_ms": round(t_on, 4), "best_split_ms": round(best, 4),
            "ideal_ms": round(ideal, 4), "over_best_split": round(t_on / best, 3),
            "over_ideal": round(t_on / ideal, 3),
            "settled_s": None if settle is None else round(settle, 3),
            "migrations": on.job.migrations, "bytes_migrated": on.job.bytes_migrated}


def virtual_competing_run(workers: int, ppw: int, partition_s: float,
                          virtual_s: float) -> dict[str, Any]:
    """Logistic regression on ``workers`` virtual workers, a busy process on the last one's core
    (:class:`canary.virtual_runner.SharedCore`), each partition's gradient ``partition_s``:
    with no busy process, and with it balancing off and on, about ``virtual_s`` seconds of the
    equal run each (see the module doc); one row. The ideal and the factor come from the runs'
    mean iteration times (:func:`steady_mean`): a shared core slows some iterations by a whole
    turn of the busy process and leaves the others as they were, which a median hides."""
    from canary.virtual_runner import SharedCore

    iters = max(int(virtual_s / (ppw * partition_s)), 10)
    slow = workers - 1
    held: list[tuple[float, int]] = []  # (start, gradients) of the slow worker's tasks

    def on_task(w: int, task: Any, start: float, end: float) -> None:
        if w == slow:
            held.append((start, gradients(task)))

    eq = virtual_lr(workers, ppw, iters, True, partition_s)
    got = {balance: virtual_lr(workers, ppw, iters, balance, partition_s,
                               shared_cores={slow: SharedCore()},
                               on_task=on_task if balance else None)
           for balance in (False, True)}
    ms = {k: [t * 1e3 for t in r.iteration_seconds()] for k, r in
          (("equal", eq), ("off", got[False]), ("on", got[True]))}
    mean = {k: steady_mean(v) for k, v in ms.items()}
    f = max(mean["off"] / mean["equal"], 1.0)
    ideal = ideal_ms(workers, mean["equal"], f)
    ends = got[True].iteration_ends()
    # the gradients the slow worker ran in the last whole iteration: the partitions it kept
    kept = sum(g for t, g in held if ends[-3] <= t < ends[-2]) if len(ends) >= 3 else None
    settle = settled_at(ms["on"], ends[1:], ideal)
    return {"app": "logistic_regression", "scenario": "virtual_competing", "workers": workers,
            "ppw": ppw, "partition_ms": round(partition_s * 1e3, 4), "iterations": iters,
            "equal_ms": round(mean["equal"], 4), "off_ms": round(mean["off"], 4),
            "steady_ms": round(mean["on"], 4), "slow_worker_factor": round(f, 3),
            "ideal_ms": round(ideal, 4), "over_ideal": round(mean["on"] / ideal, 3),
            "median_ms": {k: round(steady(v), 4) for k, v in ms.items()},
            "kept_partitions": kept, "settled_s": None if settle is None else round(settle, 3),
            "migrations": got[True].job.migrations,
            "bytes_migrated": got[True].job.bytes_migrated}


def spell_noise(workers: int, rate: float, seed: int, horizon_s: float = 3600.0,
                factors: tuple[float, float] = (1.2, 1.6),
                lasting_s: tuple[float, float] = (1.5, 5.0)) -> Any:
    """``noise(worker, t)`` for :func:`canary.virtual_runner.run_virtual`: each worker has
    spells of tasks ``factors`` times slower (uniform), lasting ``lasting_s`` seconds (3 to 10
    load-report rounds), starting ``rate`` times a second on average (exponential gaps after
    the last one ended), seeded. What balanced runs' load reports showed on a shared machine:
    a worker's tasks 1.2-1.6x slower for 3 to 10 rounds."""
    import numpy as np

    rng = np.random.default_rng(seed)
    table: list[list[tuple[float, float, float]]] = []
    for _ in range(workers):
        t, spells = 0.0, []
        while t < horizon_s:
            t += rng.exponential(1 / rate)
            d = rng.uniform(*lasting_s)
            spells.append((t, t + d, float(rng.uniform(*factors))))
            t += d
        table.append(spells)

    def noise(w: int, t: float) -> float:
        for start, end, f in table[w]:
            if start > t:
                break
            if t < end:
                return f
        return 1.0
    return noise


def spells_run(workers: int, ppw: int, rate: float, seeds: int, iters: int,
               lasting_s: tuple[float, float], factors: tuple[float, float]) -> dict[str, Any]:
    """Balanced logistic regression on ``workers`` virtual workers (as :func:`virtual_run`, no
    worker slowed for good), every worker with spells of slower tasks
    (:func:`spell_noise`: ``lasting_s`` long, ``factors`` times slower), ``seeds`` seeded
    runs, balancing on and off: the moves each made (target: none) and its time on over off
    (``on_over_off``: what the moves cost or saved). One row."""
    moves, ratio = [], []
    for seed in range(seeds):
        took = {}
        for balance in (True, False):
            run = virtual_lr(workers, ppw, iters, balance,
                             noise=spell_noise(workers, rate, seed, factors=factors,
                                               lasting_s=lasting_s))
            took[balance] = run.iteration_ends()[-1]
            if balance:
                moves.append(run.job.migrations)
        ratio.append(round(took[True] / took[False], 4))
    return {"app": "logistic_regression", "scenario": "spells", "workers": workers, "ppw": ppw,
            "spell_rate_per_s": rate, "spell_s": list(lasting_s), "spell_factors": list(factors),
            "iterations": iters, "virtual_s": round(iters * ppw * 1e-3, 2), "moves": moves,
            "runs_with_moves": sum(m > 0 for m in moves), "on_over_off": ratio}


def span(text: str) -> tuple[float, float] | None:
    """``"LO,HI"`` as two numbers with LO <= HI, or None."""
    try:
        lo, hi = (float(x) for x in text.split(","))
    except ValueError:
        return None
    return (lo, hi) if lo <= hi < math.inf else None


def ideal_ms(workers: int, equal_ms: float, factor: float) -> float:
    """The ideal iteration (see the module doc): the work of ``workers`` equal workers that take
    ``equal_ms`` an iteration, divided in proportion to their speeds, one ``factor`` times
    slower."""
    return workers * equal_ms / (workers - 1 + 1 / factor)


def best_split(workers: int, ppw: int, factor: float) -> float:
    """The least time, as a fraction of the whole work done at full speed, that ``workers`` x
    ``ppw`` equal partitions can take when the last worker is ``factor`` times slower: the best
    number of partitions to leave on it, the rest spread evenly over the others."""
    total = workers * ppw
    best = math.inf
    for on_slow in range(total + 1):
        rest = total - on_slow
        fast = math.ceil(rest / (workers - 1)) if workers > 1 else (math.inf if rest else 0)
        best = min(best, max(fast, on_slow * factor) / total)
    return best


def sweep_order(ppws: list[int], rounds: int) -> list[tuple[int, int]]:
    """The (round, partitions per worker) pairs of the sweep in the order it runs them: every
    other round reversed, since the machine's load drifts over a sweep of several minutes and
    a fixed order would hand the drift to the finest (or the coarsest) partitions."""
    return [(rnd, p) for rnd in range(rounds) for p in (ppws if rnd % 2 == 0 else ppws[::-1])]


def micro_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The sweep's summary fields from its rows (one per partitions-per-worker count and round):
    each count's median over the rounds of the balanced iteration, the equal run's and the best
    split's (``micro_*_ms``), the median of each round's own ratio of the two
    (``micro_over_best_split``), and the rounds."""
    by_ppw: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        by_ppw.setdefault(r["ppw"], []).append(r)

    def median_of(key: str) -> dict[str, float]:
        return {str(p): round(statistics.median(r[key] for r in rs), 4)
                for p, rs in sorted(by_ppw.items())}

    return {"micro_steady_ms": median_of("steady_ms"),
            "micro_best_split_ms": median_of("best_split_ms"),
            "micro_equal_ms": median_of("equal_ms"),
            "micro_over_best_split": {p: round(v, 3) for p, v in
                                      median_of("over_best_split").items()},
            "micro_rounds": max((len(rs) for rs in by_ppw.values()), default=0)}


def emit(row: dict[str, Any], run_: dict[str, Any]) -> dict[str, Any]:
    """Print ``row`` (with the run's iteration series, for the charts) and return it."""
    row = {**row, "steady_ms": round(row["steady_ms"], 4), "iterations": len(run_["iteration_ms"]),
           "series_ms": [round(t, 4) for t in run_["iteration_ms"]],
           "series_at_s": [round(t, 4) for t in run_["at_s"]], "moves_s": run_["moves_s"],
           "controller_cpu_percent": run_["controller_cpu_percent"],
           "moves_said": run_["moves_said"], "worker_load": run_["worker_load"]}
    print(json.dumps(row), flush=True)
    return row


def plot(rows: list[dict[str, Any]], out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out, exist_ok=True)
    panels = [(r["app"], r["scenario"]) for r in rows
              if r["scenario"] not in ("equal", "micropartition") and not r["balance"]]
    if panels:
        fig, axes = plt.subplots(len(panels), 1, figsize=(8, 2.6 * len(panels)), squeeze=False)
        for ax, (app, scenario) in zip(axes[:, 0], panels):
            for r in rows:
                if r["app"] == app and r["scenario"] == scenario:
                    label = "balancing on" if r["balance"] else "balancing off"
                    ax.plot(r["series_at_s"], r["series_ms"], lw=0.6, label=label)
                    for k, t in enumerate(r["moves_s"]):
                        ax.axvline(t, color="red", lw=0.5, alpha=0.6,
                                   label="a partition moved" if k == 0 else None)
                    if r["balance"]:
                        ax.axhline(r["ideal_ms"], color="k", ls="--", lw=0.8, label="ideal")
                        ax.axhline(TARGET * r["ideal_ms"], color="k", ls=":", lw=0.8,
                                   label=f"{TARGET}x ideal")
            ax.set_title(f"{app}, {scenario}")
            ax.set_ylabel("iteration (ms)")
            ax.set_yscale("log")
            ax.legend(fontsize=7, loc="upper right")
        axes[-1, 0].set_xlabel("seconds into the run")
        fig.tight_layout()
        fig.savefig(os.path.join(out, "straggler.png"), dpi=110)
        plt.close(fig)
    micro = [r for r in rows if r["scenario"] == "micropartition"]
    if micro:
        fig, ax = plt.subplots(figsize=(5.5, 3.4))
        med = micro_summary(micro)
        ppw = [int(p) for p in med["micro_steady_ms"]]
        rounds = med["micro_rounds"]
        each = f" (median of {rounds} rounds)" if rounds > 1 else ""
        ax.plot(ppw, list(med["micro_steady_ms"].values()), marker="o",
                label="one worker slowed, balancing on" + each)
        if rounds > 1:
            ax.scatter([r["ppw"] for r in micro], [r["steady_ms"] for r in micro], s=8,
                       color="C0", alpha=0.5, label="each round")
        ax.plot(ppw, list(med["micro_best_split_ms"].values()), marker=".", ls="--", color="k",
                lw=0.8, label="best split of whole partitions")
        ax.plot(ppw, list(med["micro_equal_ms"].values()), marker=".", ls=":", color="gray",
                label="no worker slowed")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("partitions per worker")
        ax.set_ylabel("iteration after balancing (ms)")
        ax.set_title(f"logistic regression, one worker {micro[0]['factor']:g}x slower")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "micropartition_balance.png"), dpi=110)
        plt.close(fig)


if __name__ == "__main__":
    from canary.script import end_script

    end_script(main())
