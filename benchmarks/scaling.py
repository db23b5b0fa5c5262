"""How canary scales: real runs up to the cores (or hosts) there are, and past them in virtual
time, beside a central scheduler's model.

Sections (every line printed is JSON; the last is the summary):

* ``network``: MPI latency and bandwidth between two ranks of this machine, timed by
  ``canary doctor``'s ranks (``canary/doctor.py``), and the published 10 GbE cloud figures
  (:data:`CLOUD_10GBE`; sources in docs/performance.md).
* ``real``: strong scaling (fixed data) and weak scaling (data per worker fixed) of logistic
  regression, k-means and PageRank on real ranks, ``--workers 1,2,...`` (``--hostfile``: on
  those hosts, through MPICH's ``HYDRA_HOST_FILE``); per-iteration time from the workers' loop
  tests (``benchmarks/apps.py``'s ``run_canary``), speed-up and efficiency against 1 worker.
* ``task_rate``: empty tasks per second against workers (``benchmarks/scheduler.py``'s MPI
  job: 10 partitions per worker, compute stages of an empty kernel): the shape of the Canary
  paper's Figure 5.
* ``agreement``: the strong-scaling runs again, in virtual time (``canary.virtual_runner``,
  measured task times, this machine's network), against the real ones: ``virtual_over_real``.
* ``virtual``: logistic regression and PageRank at ``--virtual-workers`` (8, 64, 256, 1024)
  over both networks: per-iteration time, the controller's messages and bytes per iteration,
  and per-worker scheduling work (the seconds a worker spent handling events, per iteration).
  Logistic regression is the reference's 4M x 20 job: each worker runs at most
  ``--rows-per-worker`` rows for real and its row tasks are charged as if they had their share
  of 4M (:class:`RowScaled`); PageRank runs its whole graph.
* ``central``: the same jobs under a central scheduler dispatching every task at the measured
  Spark task rate (``--central-rate``; :mod:`canary.sim.central`), and the crossover
  ``W* = sqrt(rate C / k)``.

    python benchmarks/scaling.py                     # this machine, ~3 min
    python benchmarks/scaling.py --quick             # tiny sizes (tests), seconds
    python benchmarks/scaling.py --plot DIR          # also draw scaling.png and virtual.png
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# first the repository root, and not this folder: benchmarks/apps.py would shadow the apps package
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "benchmarks")]

import numpy as np  # noqa: E402

import apps.kmeans as km_app  # noqa: E402
import apps.logistic_regression as lr_app  # noqa: E402
import apps.pagerank as pr_app  # noqa: E402
from benchmarks import apps as bench_apps  # noqa: E402
from benchmarks import scheduler as bench_sched  # noqa: E402
from benchmarks.spark_jvm import inner_mean  # noqa: E402
from canary.sim.central import central_iteration_seconds, crossover_workers  # noqa: E402
from canary.virtual_runner import Network, Runtime, TaskCost, VirtualResult, run_virtual  # noqa: E402
from canary.worker.tasks import Task  # noqa: E402

# A 10 GbE cloud network: 10 Gbit/s per instance, and about 100 µs round trip between
# instances of one zone (docs/performance.md#scaling names the published measurements).
CLOUD_10GBE = Network(50e-6, 1.25e9, "cloud_10gbe")
# Spark's JVM task rate measured on this machine (benchmarks/results/scheduler.jsonl).
SPARK_TASKS_PER_S = 611.2

APPS = ("logistic_regression", "kmeans", "pagerank")
# strong: the whole job; weak: per worker. (N, D) / (N, D, K) / (V, E)
STRONG = {"logistic_regression": (400_000, 20), "kmeans": (200_000, 20, 8),
          "pagerank": (131_072, 1_310_720)}
WEAK = {"logistic_regression": (200_000, 20), "kmeans": (100_000, 20, 8),
        "pagerank": (65_536, 655_360)}
QUICK_SIZE = {"logistic_regression": (4_000, 8), "kmeans": (4_000, 4, 3),
              "pagerank": (2_048, 16_000)}
ITERS = {"logistic_regression": 20, "kmeans": 10, "pagerank": 10}
LR_VIRTUAL_ROWS = 4_000_000
PR_VIRTUAL = (131_072, 1_310_720)
ROW_DATASETS = {"training_X"}  # logistic regression's rows: its tasks scale with them


@dataclass(frozen=True)
class RowScaled:
    """A task that reads a dataset of ``datasets`` takes ``scale`` times its measured time
    (its partition stands for ``scale`` times the rows run here); any other task its
    measured time."""

    datasets: frozenset[str]
    scale: float

    def __call__(self, task: Task, measured_s: float) -> float:
        if any(d.name in self.datasets for d in task.stage.reads):
            return measured_s * self.scale
        return measured_s


def app_module(app: str) -> Any:
    return {"logistic_regression": lr_app, "kmeans": km_app, "pagerank": pr_app}[app]


def app_argv(app: str, size: tuple[int, ...], iters: int, tmp: str) -> list[str]:
    """The app's flags for a timing run (data, iterations, no early stop)."""
    return [*bench_apps._data(app, size, tmp), "--max-iter", str(iters), "--print-every", "0",
            *bench_apps._extra(app)]


# -- network -------------------------------------------------------------------------------


def measure_network(timeout: int) -> Network:
    """This machine's MPI latency and bandwidth between two ranks (canary doctor's ranks)."""
    from canary.cli import find_mpiexec, mpiexec_env

    cmd = [find_mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py",
           str(ROOT / "canary" / "doctor.py"), "--ranks"]
    r = subprocess.run(cmd, env=mpiexec_env(timeout, str(ROOT)), capture_output=True, text=True,
                       timeout=timeout + 30)
    if r.returncode != 0:
        raise RuntimeError(f"doctor's ranks failed ({r.returncode}):\n{r.stderr[-2000:]}")
    link = next(json.loads(x) for x in r.stdout.splitlines() if '"link"' in x)
    return Network(link["latency_us"] * 1e-6, link["bandwidth_gb_s"] * 1e9, "this_machine")


RUNTIME_REPS = 2000
SLEEPS_S = (2e-5, 4e-5, 8e-5, 1.6e-4, 2.5e-4)  # canary.idle.Backoff's sleeps up to a worker's cap


def runtime_ranks(reps: int) -> None:
    """The rank side of :func:`measure_runtime` (two ranks under mpiexec): ping-pong a signal
    and a small piece (alternately) through :class:`canary.mpi_transport.MpiTransport`, both
    ranks polling hot, timing each send, each poll that takes a message in and each that finds
    nothing; rank 0 also times the round trips and the idle back-off's sleeps, and prints one
    JSON line."""
    import numpy as np
    from mpi4py import MPI

    from canary.idle import tight_timer_slack
    from canary.messages import Piece, Signal
    from canary.mpi_transport import MpiTransport

    comm = MPI.COMM_WORLD
    rank, other = comm.Get_rank(), 1 - comm.Get_rank()
    tx = MpiTransport(comm)
    tight_timer_slack()
    clock = time.perf_counter
    sends: list[float] = []
    recvs: list[float] = []
    rtts: list[float] = []
    empty_s, empty_n = 0.0, 0
    arr = np.arange(128, dtype=np.float64)

    def message(i: int) -> Any:
        return Signal(i, i, True) if i % 2 else Piece(i, i, 1, 0, (0,), (1,), arr)

    def take() -> None:
        nonlocal empty_s, empty_n
        while True:
            a = clock()
            got = tx.poll()
            b = clock()
            if got is not None:
                recvs.append(b - a)
                return
            empty_s += b - a
            empty_n += 1

    comm.Barrier()
    for i in range(reps):
        if rank == 0:
            a = clock()
            tx.send(other, message(i))
            sends.append(clock() - a)
            take()
            rtts.append(clock() - a)
        else:
            take()
            a = clock()
            tx.send(other, message(i))
            sends.append(clock() - a)
    tx.flush()
    both = comm.gather((sends, recvs, empty_s, empty_n), root=0)
    if rank != 0:
        return
    over = []
    for s in SLEEPS_S:
        for _ in range(40):
            a = clock()
            time.sleep(s)
            over.append(clock() - a - s)
    med = statistics.median
    all_sends = [x for b in both for x in b[0]][reps // 10:]  # the first tenth warms up
    all_recvs = [x for b in both for x in b[1]][reps // 10:]
    hop = med(rtts[reps // 10:]) / 2
    print(json.dumps({"runtime": {
        "send_us": round(med(all_sends) * 1e6, 2), "recv_us": round(med(all_recvs) * 1e6, 2),
        "poll_us": round(sum(b[2] for b in both) / max(1, sum(b[3] for b in both)) * 1e6, 3),
        "oversleep_us": round(med(over) * 1e6, 1), "hop_us": round(hop * 1e6, 2)}}),
        flush=True)


def measure_runtime(timeout: int, quick: bool) -> tuple[Runtime, dict[str, Any]]:
    """This machine's :class:`Runtime` costs (:func:`runtime_ranks` on two ranks) and the row
    that reports them (with the one-way hop they add up to, polling hot)."""
    from canary.cli import find_mpiexec, mpiexec_env

    cmd = [find_mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py", str(Path(__file__)),
           "--runtime-ranks", str(200 if quick else RUNTIME_REPS)]
    r = subprocess.run(cmd, env=mpiexec_env(timeout, str(ROOT)), capture_output=True, text=True,
                       timeout=timeout + 30)
    if r.returncode != 0:
        raise RuntimeError(f"the runtime's ranks failed ({r.returncode}):\n{r.stderr[-2000:]}")
    got = next(json.loads(x)["runtime"] for x in r.stdout.splitlines() if '"runtime"' in x)
    rt = Runtime(send_s=got["send_us"] * 1e-6, recv_s=got["recv_us"] * 1e-6,
                 poll_s=got["poll_us"] * 1e-6, oversleep_s=max(0.0, got["oversleep_us"] * 1e-6),
                 name="this_machine")
    return rt, {"section": "runtime", **got}


# -- real runs -----------------------------------------------------------------------------


def real_runs(workers: list[int], quick: bool, timeout: int, hostfile: str | None,
              tmp: str) -> list[dict[str, Any]]:
    """Strong and weak scaling of every app on real ranks; one row per run."""
    rows = []
    env = {"HYDRA_HOST_FILE": os.path.abspath(hostfile)} if hostfile else None
    # a weak run whose size is a strong run's (one worker, where the two modes meet) is that run
    runs: dict[tuple[str, tuple[int, ...], int], dict[str, Any]] = {}
    for mode in ("strong", "weak"):
        for app in APPS:
            base = None
            for w in workers:
                size = (STRONG[app] if mode == "strong" else _weak(app, w)) if not quick else (
                    QUICK_SIZE[app] if mode == "strong" else _weak(app, w, QUICK_SIZE[app]))
                iters = 4 if quick else ITERS[app]
                if (app, size, w) not in runs:
                    runs[app, size, w] = bench_apps.run_canary(
                        app, bench_apps._data(app, size, tmp), w, iters, bench_apps._extra(app),
                        timeout, None, env)
                got = runs[app, size, w]
                t = got["seconds"]
                base = base if base is not None else t
                row = {"section": "real", "mode": mode, "app": app, "workers": w,
                       "size": list(size), "iterations": got["iterations"],
                       "iteration_ms": round(t * 1e3, 3) if t else None}
                if t and base:
                    if mode == "strong":  # against the first (fewest) workers
                        row["speedup"] = round(base / t, 3)
                        row["efficiency"] = round(base / t * workers[0] / w, 3)
                    else:
                        row["efficiency"] = round(base / t, 3)
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


def _weak(app: str, workers: int, per: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """The weak-scaling size on ``workers``: the per-worker size (``per``, default
    :data:`WEAK`'s) times the workers (PageRank: vertices and edges both)."""
    per = per or WEAK[app]
    if app == "pagerank":
        return (per[0] * workers, per[1] * workers)
    return (per[0] * workers, *per[1:])


def task_rates(workers: list[int], quick: bool, timeout: int) -> list[dict[str, Any]]:
    """Empty tasks per second on real ranks, per worker count (the scheduler benchmark's job)."""
    ppc, target = 10, (0.02 if quick else 0.3)
    min_tasks, max_tasks = (200, 2000) if quick else (20_000, 200_000)
    ns = bench_sched.kernel_ns(bench_sched.iters_for(0.0, 1.0), 0.01)
    rows = []
    for w in workers:
        stages = bench_sched.stages_for(0.0, w, ppc, target, min_tasks, max_tasks)
        raw = bench_sched.run_mpi(w, [(0.0, 0, stages)], ppc, timeout, None)
        point = bench_sched.summarise_point(raw[0], ppc)
        row = {"section": "task_rate", "workers": w, "tasks": point["tasks"],
               "tasks_per_s": point["tasks_per_s"], "correct": point["correct"],
               "tasks_per_s_per_worker": point["tasks_per_s_per_core"],
               "kernel_ns": round(ns, 1)}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


# -- virtual runs --------------------------------------------------------------------------


def virtual_run(app: str, argv: list[str], workers: int, net: Network, cost: Any = None,
                extra_args: dict[str, Any] | None = None,
                tasks: list[tuple[float, float]] | None = None,
                runtime: Runtime | None = None) -> VirtualResult:
    """One virtual run of ``app``; ``tasks``, if given, receives every task's (start, end)."""
    mod = app_module(app)
    args = mod.parse_args(argv)
    for k, v in (extra_args or {}).items():
        setattr(args, k, v)
    prog = mod.build(args, workers)[0]
    record = None if tasks is None else (lambda w, task, a, b: tasks.append((a, b)))
    return run_virtual(prog, workers, net, cost=cost or TaskCost(), on_task=record,
                       runtime=runtime)


def per_iteration(res: VirtualResult, iterations: int) -> dict[str, Any]:
    """The figures of a virtual run per loop iteration."""
    iters = res.iteration_seconds()
    ctrl = res.controller
    n = max(iterations, 1)
    handle = [w.handle_s for w in res.workers]
    return {"iteration_ms": round(inner_mean(iters) * 1e3, 4) if iters else None,
            "controller_messages_per_iter": round((ctrl.received + ctrl.sent) / n, 3),
            "controller_bytes_per_iter": round((ctrl.received_bytes + ctrl.sent_bytes) / n, 1),
            "controller_messages": ctrl.received + ctrl.sent,
            "worker_handle_ms_per_iter_median": round(statistics.median(handle) / n * 1e3, 4),
            "worker_handle_ms_per_iter_max": round(max(handle) / n * 1e3, 4),
            "worker_events_per_iter_max": round(max(w.events for w in res.workers) / n, 1),
            "virtual_s": round(res.seconds, 6), "wall_s": round(res.job.seconds, 3)}


def agreement(real: list[dict[str, Any]], quick: bool, timeout: int, net: Network,
              runtime: Runtime, reps: int, tmp: str) -> list[dict[str, Any]]:
    """The strong-scaling real runs (``real``), each followed by a virtual run (measured task
    times, this machine's network and runtime), and ``reps - 1`` more pairs run back to back:
    the median of each, and virtual over real. A worker spins when idle where the workers fit
    the cores, as over MPI. The machine's other load slows real and measured tasks alike, so
    the pairs are run close together."""
    from canary.idle import core_placement, has_own_core

    rows = []
    for r0 in real:
        if r0["mode"] != "strong" or not r0["iteration_ms"]:
            continue
        app, size, w, iters = r0["app"], tuple(r0["size"]), r0["workers"], r0["iterations"]
        argv = app_argv(app, size, iters, tmp)
        rt = replace(runtime, workers_spin=has_own_core(0, [core_placement()] * w))
        virtual_run(app, argv, w, net, runtime=rt)  # warm-up: kernels compiled, data cached
        real_ms, virt_ms = [r0["iteration_ms"]], []
        for rep in range(max(1, reps)):
            if rep:
                got = bench_apps.run_canary(app, bench_apps._data(app, size, tmp), w, iters,
                                            bench_apps._extra(app), timeout, None, None)
                real_ms.append(got["seconds"] * 1e3)
            res = virtual_run(app, argv, w, net, runtime=rt)
            virt_ms.append(inner_mean(res.iteration_seconds()) * 1e3)
        r, v = statistics.median(real_ms), statistics.median(virt_ms)
        row = {"section": "agreement", "app": app, "workers": w, "size": list(size),
               "reps": len(real_ms), "real_ms": round(r, 3), "virtual_ms": round(v, 3),
               "virtual_over_real": round(v / r, 3),
               "real_ms_all": [round(x, 3) for x in real_ms],
               "virtual_ms_all": [round(x, 3) for x in virt_ms],
               "load_avg": round(os.getloadavg()[0], 2)}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def pagerank_graph(size: tuple[int, ...], tmp: str) -> str:
    """The R-MAT graph of ``size`` (vertices, edges) as an .npy edge file, generated once.

    A virtual run reads its pieces from it: with ``--generate`` every read chunk regenerates
    the R-MAT block it lies in (a block is generated whole), and at 1,024 cells that was most
    of a run's wall time. The graph is the same one."""
    from canary.generate import rmat_edges

    path = os.path.join(tmp, f"pagerank_{size[0]}_{size[1]}.npy")
    if not os.path.exists(path):
        np.save(path, rmat_edges(size[0], size[1], 0))
    return path


def virtual_scaling(workers: list[int], nets: list[Network], runtime: Runtime, quick: bool,
                    rows_per_worker: int, central_rate: float, tmp: str,
                    pagerank_max: int, pagerank_local_max: int) -> list[dict[str, Any]]:
    """Logistic regression (the 4M x 20 job, rows scaled) and PageRank at each worker count over
    each network (PageRank past ``pagerank_local_max`` workers over the last one only), each
    beside the central scheduler's model of the same tasks. Every worker is a machine of its
    own: it polls hot when idle (``runtime.workers_spin``)."""
    out = []
    lr_rows = 20_000 if quick else LR_VIRTUAL_ROWS
    pr_size = QUICK_SIZE["pagerank"] if quick else PR_VIRTUAL
    iters = 4 if quick else 8
    rt = replace(runtime, workers_spin=True)
    for w in workers:
        for app in ("logistic_regression", "pagerank"):
            if app == "pagerank" and w > pagerank_max:
                continue
            if app == "logistic_regression":
                run_rows = min(lr_rows, rows_per_worker * w)
                argv = app_argv(app, (run_rows, 20), iters, tmp)
                cost: Any = RowScaled(frozenset(ROW_DATASETS), lr_rows / run_rows)
                extra = None
                size: list[int] = [lr_rows, 20]
            else:
                argv = ["--input", pagerank_graph(pr_size, tmp), "--max-iter", str(iters),
                        "--print-every", "0", *bench_apps._extra(app)]
                # one edge cell per worker at least: the smallest square grid with >= w cells
                g = 1
                while g * g < w:
                    g += 1
                extra = {"partitions": g * g}
                cost, size = None, list(pr_size)
            for net in nets:
                if app == "pagerank" and w > pagerank_local_max and net is not nets[-1]:
                    continue  # about two minutes a run: the cluster's network only
                if w == workers[0] and net is nets[0]:
                    virtual_run(app, argv, w, net, cost, extra, runtime=rt)  # warm-up
                spans: list[tuple[float, float]] = []
                res = virtual_run(app, argv, w, net, cost, extra, spans, runtime=rt)
                row = {"section": "virtual", "app": app, "workers": w, "network": net.name,
                       "size": size, "iterations": iters, **per_iteration(res, iters)}
                print(json.dumps(row), flush=True)
                out.append(row)
            out.append(central_row(app, w, res, spans, central_rate, size))
            print(json.dumps(out[-1]), flush=True)
    return out


def central_row(app: str, workers: int, res: VirtualResult, spans: list[tuple[float, float]],
                rate: float, size: list[int]) -> dict[str, Any]:
    """A central scheduler dispatching the tasks of one steady iteration of ``res``: the tasks
    that started between the loop test's second and last ends (``spans``: every task's
    virtual start and end), per iteration, as two stages (a loop of these apps has two
    barriers: the model's broadcast and the reduce)."""
    loop = max((v for k, v in res.signal_ends.items() if k.startswith("while_")), key=len)
    lo, hi = loop[1], loop[-1]
    n = max(len(loop) - 2, 1)
    inside = [b - a for a, b in spans if lo <= a < hi]
    tasks = len(inside) / n
    work = sum(inside) / n
    per_task = work / max(tasks, 1)
    half = max(1, round(tasks / 2))
    t = central_iteration_seconds([[per_task] * half] * 2, workers, rate, CLOUD_10GBE.latency_s)
    return {"section": "central", "app": app, "workers": workers, "size": size,
            "tasks_per_iter": round(tasks, 1), "work_ms_per_iter": round(work * 1e3, 4),
            "central_rate": rate, "central_iteration_ms": round(t * 1e3, 4),
            "crossover_workers": round(crossover_workers(rate, work, tasks / workers), 1)}


# -- plots ---------------------------------------------------------------------------------


def plot(rows: list[dict[str, Any]], folder: str) -> list[str]:
    """Draw ``scaling.png`` (real runs and task rate) and, if there are virtual runs,
    ``virtual.png`` (virtual runs and the central model) into ``folder``; returns the paths.
    Needs matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(folder, exist_ok=True)
    paths = []
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, mode in zip(axes[:2], ("strong", "weak")):
        for app in APPS:
            rs = [r for r in rows if r.get("section") == "real" and r["mode"] == mode
                  and r["app"] == app and r["iteration_ms"]]
            if rs:
                ax.plot([r["workers"] for r in rs], [r["iteration_ms"] for r in rs], "o-",
                        label=app)
        ax.set(xlabel="workers", ylabel="iteration (ms)", title=f"{mode} scaling, real ranks")
        ax.legend(fontsize=8)
    rs = [r for r in rows if r.get("section") == "task_rate"]
    axes[2].plot([r["workers"] for r in rs], [r["tasks_per_s"] / 1e6 for r in rs], "o-")
    axes[2].set(xlabel="workers", ylabel="M tasks/s", title="empty tasks per second")
    fig.tight_layout()
    paths.append(os.path.join(folder, "scaling.png"))
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    if not any(r.get("section") == "virtual" for r in rows):  # --skip-virtual: nothing to draw
        return paths

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for app, ax in zip(("logistic_regression", "pagerank"), axes[:2]):
        for net in sorted({r["network"] for r in rows if r.get("section") == "virtual"}):
            rs = [r for r in rows if r.get("section") == "virtual" and r["app"] == app
                  and r["network"] == net]
            ax.plot([r["workers"] for r in rs], [r["iteration_ms"] for r in rs], "o-",
                    label=f"canary, {net}")
        cs = [r for r in rows if r.get("section") == "central" and r["app"] == app]
        ax.plot([r["workers"] for r in cs], [r["central_iteration_ms"] for r in cs], "s--",
                label="central scheduler model")
        ax.set(xscale="log", yscale="log", xlabel="workers", ylabel="iteration (ms)",
               title=f"{app}, virtual time")
        ax.legend(fontsize=8)
    for app in ("logistic_regression", "pagerank"):
        rs = [r for r in rows if r.get("section") == "virtual" and r["app"] == app
              and r["network"] == CLOUD_10GBE.name]
        axes[2].plot([r["workers"] for r in rs],
                     [r["controller_messages_per_iter"] for r in rs], "o-", label=app)
    axes[2].set(xscale="log", yscale="log", xlabel="workers",
                ylabel="controller messages / iteration", title="controller traffic")
    axes[2].legend(fontsize=8)
    fig.tight_layout()
    paths.append(os.path.join(folder, "virtual.png"))
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def main(argv: list[str] | None = None) -> int:
    import tempfile

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", default=None,
                    help="real worker counts (default: 1 up to the cores less the controller)")
    ap.add_argument("--hostfile", default=None, help="run the real ranks on these hosts")
    ap.add_argument("--virtual-workers", default="8,64,256,1024")
    ap.add_argument("--pagerank-max-workers", type=int, default=1 << 20,
                    help="virtual PageRank runs up to this many workers (its set-up grows with "
                         "the square of the cells: minutes at 1,024)")
    ap.add_argument("--pagerank-local-max-workers", type=int, default=256,
                    help="past this many workers, virtual PageRank runs over the cloud network "
                         "only")
    ap.add_argument("--agreement-reps", type=int, default=3,
                    help="real and virtual runs of each app and worker count, back to back")
    ap.add_argument("--rows-per-worker", type=int, default=2_000,
                    help="logistic regression rows each virtual worker runs for real")
    ap.add_argument("--central-rate", type=float, default=SPARK_TASKS_PER_S,
                    help="the central scheduler's tasks per second (default: Spark's, measured)")
    ap.add_argument("--skip-real", action="store_true")
    ap.add_argument("--skip-virtual", action="store_true")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (tests)")
    ap.add_argument("--plot", metavar="DIR", default=None)
    ap.add_argument("--timeout", type=int, default=300)
    args = ap.parse_args(argv)
    cores = os.cpu_count() or 1
    workers = ([int(w) for w in args.workers.split(",")] if args.workers
               else list(range(1, max(2, cores) + 1)))
    vworkers = [int(w) for w in args.virtual_workers.split(",")]
    print(json.dumps({"machine": {"cpus": cores, "load_avg": os.getloadavg()[0],
                                  "date": time.strftime("%Y-%m-%d"), "workers": workers,
                                  "virtual_workers": vworkers}}), flush=True)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        doctor = measure_network(args.timeout)
        runtime, runtime_row = measure_runtime(args.timeout, args.quick)
        rows.append(runtime_row)
        print(json.dumps(runtime_row), flush=True)
        # A hop polled hot costs its sender's send, the link and its receiver's receive; the
        # doctor's ping-pong latency holds both ends' MPI calls, which the runtime charges
        # already, so the link is what the hop leaves over.
        link = max(0.0, runtime_row["hop_us"] * 1e-6 - runtime.send_s - runtime.recv_s)
        here = Network(link, doctor.bandwidth_bytes_s, "this_machine")
        for net, lat in ((here, doctor.latency_s), (CLOUD_10GBE, CLOUD_10GBE.latency_s)):
            rows.append({"section": "network", "network": net.name,
                         "latency_us": round(net.latency_s * 1e6, 2),
                         "ping_pong_latency_us": round(lat * 1e6, 2),
                         "bandwidth_gb_s": round(net.bandwidth_bytes_s / 1e9, 3)})
            print(json.dumps(rows[-1]), flush=True)
        real: list[dict[str, Any]] = []
        if not args.skip_real:
            real = real_runs(workers, args.quick, args.timeout, args.hostfile, tmp)
            rows += real
            rows += task_rates(workers, args.quick, args.timeout)
            if not args.hostfile:  # virtual time models this machine's links only
                rows += agreement(real, args.quick, args.timeout, here, runtime,
                                  args.agreement_reps, tmp)
        if not args.skip_virtual:
            rows += virtual_scaling(vworkers, [here, CLOUD_10GBE], runtime, args.quick,
                                    args.rows_per_worker, args.central_rate, tmp,
                                    args.pagerank_max_workers, args.pagerank_local_max_workers)
    agree = [r["virtual_over_real"] for r in rows if r["section"] == "agreement"]
    summary: dict[str, Any] = {
        "summary": "scaling",
        "strong_speedup": {f"{r['app']}@{r['workers']}": r.get("speedup") for r in real
                           if r["mode"] == "strong"},
        "weak_efficiency": {f"{r['app']}@{r['workers']}": r.get("efficiency") for r in real
                            if r["mode"] == "weak"},
        "tasks_per_s_by_workers": {str(r["workers"]): r["tasks_per_s"] for r in rows
                                   if r["section"] == "task_rate"},
        "virtual_over_real": {f"{r['app']}@{r['workers']}": r["virtual_over_real"]
                              for r in rows if r["section"] == "agreement"},
        "virtual_over_real_range": [min(agree), max(agree)] if agree else None,
        "virtual_iteration_ms": {f"{r['app']}@{r['workers']}/{r['network']}": r["iteration_ms"]
                                 for r in rows if r["section"] == "virtual"},
        "central_iteration_ms": {f"{r['app']}@{r['workers']}": r["central_iteration_ms"]
                                 for r in rows if r["section"] == "central"},
        "crossover_workers": {f"{r['app']}@{r['workers']}": r["crossover_workers"]
                              for r in rows if r["section"] == "central"},
    }
    print(json.dumps(summary), flush=True)
    if args.plot:
        plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    from canary.script import end_script

    if "--runtime-ranks" in sys.argv:
        runtime_ranks(int(sys.argv[sys.argv.index("--runtime-ranks") + 1]))
        end_script(0)
    end_script(main())
