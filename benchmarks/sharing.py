"""Several jobs sharing a pool, on real ranks (issue 20's figures; docs/sharing.md).

Each experiment starts its own pool (``canary cluster start`` through the Python API, in a
temporary directory), submits jobs of ``benchmarks/sharing_job.py`` (a known CPU cost per
task) or the apps, and reads the jobs' status files (submitted, started, ended: wall clock):

* ``correctness``: logistic regression, k-means and PageRank submitted at the same moment to
  one pool, their outputs against their solo ``canary run`` (``--quick``: the synthetic job);
* ``priority``: short high-priority jobs arriving while long low-priority jobs keep the pool
  busy, ``--policy priority`` and ``fifo``: response time against the same job on an idle pool;
* ``fair``: users with weights 1 and 2 submitting back to back, a third user arriving and
  leaving: each user's share of the work done per time window (``fair_share.png``);
* ``hfsp``: a mixed workload (90% small jobs, 10% large, Poisson arrivals at load 0.7) under
  fifo, fair and hfsp: mean, 95th percentile and largest response time (``hfsp.png``);
* ``placement``: short single-worker jobs (about 20 ms) at load 0.8 under each placement
  policy: median and 99th percentile response, beside what the simulator
  (:func:`canary.sim.cluster.simulate_cluster`, the same policy objects) predicts, both for
  the jobs' work alone and with the pool's measured cost per job (the workers' CPU per job
  added to each job's work, the rest of an idle pool's tiny-job latency added to each
  response);
* ``overheads``: submit to first task (median, p99), submit to end of a one-task job, the rate
  of tiny jobs submitted back to back, rank 0's CPU per job, and each worker's memory after
  the first few jobs, then after 50, 100, 200 and 400 more submitted back to back (half of
  them failing).

Every line printed is JSON; the last is the summary. The machine's cores are shared, so these
are small runs: read the figures as shapes, not as the pool's best.

    python benchmarks/sharing.py --out benchmarks/results/sharing.jsonl --plot benchmarks/results
    python benchmarks/sharing.py --quick          # tiny sizes (tests)
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
# first the repository root, and not this folder: benchmarks/apps.py would shadow the apps package
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "benchmarks")]

from canary.cli import find_mpiexec, mpiexec_env  # noqa: E402
from canary.pool import client  # noqa: E402
from canary.pool.spool import read_json  # noqa: E402

JOB = str(ROOT / "benchmarks" / "sharing_job.py")
OUT: list[dict[str, Any]] = []


def emit(row: dict[str, Any]) -> None:
    OUT.append(row)
    print(json.dumps(row), flush=True)


@contextlib.contextmanager
def pool(workers: int, policy: str = "fair", placement: str = "batch-late") -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="canary-pool-") as tmp:
        root = Path(tmp)
        client.start(workers, find_mpiexec(), mpiexec_env(None, str(ROOT)), root, policy,
                     placement, timeout=120)
        try:
            yield root
        finally:
            with contextlib.suppress(client.PoolError):
                client.stop(root, now=True, timeout=60)


def scratch(prefix: str) -> Path:
    """A new temporary folder for an experiment's files, removed when this process exits."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, True)
    return Path(path)


def job_args(iters: int, task_ms: float, parts: int = 0, **extra: str) -> list[str]:
    args = ["--iters", str(iters), "--task-ms", str(task_ms)]
    if parts:
        args += ["--parts", str(parts)]
    for k, v in extra.items():
        args += [f"--{k.replace('_', '-')}", v]
    return args


def run_schedule(root: Path, schedule: list[tuple[float, list[str], dict[str, Any]]],
                 script: str = JOB, timeout: float = 600) -> list[dict[str, Any]]:
    """Submit each ``(offset s, args, submit options)`` at its offset; return every job's
    final status, in schedule order."""
    t0 = time.time()
    ids = []
    for offset, args, opts in sorted(schedule, key=lambda s: s[0]):
        delay = t0 + offset - time.time()
        if delay > 0:
            time.sleep(delay)
        ids.append(client.submit(script, args, root, **opts))
    return [client.wait(j, root, timeout=timeout) for j in ids]


def response(st: dict[str, Any]) -> float:
    return float(st["ended"] - st["submitted"])


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


# ---------------------------------------------------------------- experiments
def correctness(quick: bool, workers: int) -> None:
    tmp = scratch("canary-sharing-")
    if quick:
        apps = {"sharing_job": (JOB, job_args(20, 0.1, 3) + ["--out"], ".npy")}
    else:
        apps = {
            "logistic_regression": (str(ROOT / "apps/logistic_regression.py"),
                                    ["--generate", "20000,10", "--partitions", "4",
                                     "--print-every", "0", "--output"], ".npz"),
            "kmeans": (str(ROOT / "apps/kmeans.py"),
                       ["--generate", "20000,8,4", "--partitions", "4", "--print-every", "0",
                        "--output"], ".npz"),
            "pagerank": (str(ROOT / "apps/pagerank.py"),
                         ["--generate", "5000,50000", "--partitions", "4", "--print-every",
                          "0", "--output"], ".txt"),
        }
    with pool(workers) as root:
        t0 = time.time()
        ids = {name: client.submit(script, [*args, str(tmp / f"{name}_pool{ext}")], root)
               for name, (script, args, ext) in apps.items()}
        pool_status = {name: client.wait(j, root, timeout=900) for name, j in ids.items()}
        pool_s = time.time() - t0
    for name, (script, args, ext) in apps.items():
        t = time.time()
        solo = subprocess.run([sys.executable, "-m", "canary.cli", "run", "-n", str(workers),
                               script, *args, str(tmp / f"{name}_solo{ext}")], cwd=ROOT,
                              capture_output=True, text=True, timeout=900)
        solo_s = time.time() - t
        a, b = tmp / f"{name}_pool{ext}", tmp / f"{name}_solo{ext}"
        if ext == ".npz":
            with np.load(a) as x, np.load(b) as y:
                same = sorted(x.files) == sorted(y.files) and all(
                    np.array_equal(x[k], y[k]) for k in x.files)
        elif ext == ".npy":
            same = bool(np.array_equal(np.load(a), np.load(b)))
        else:
            same = a.read_bytes() == b.read_bytes()
        emit({"experiment": "correctness", "app": name, "workers": workers,
              "pool_state": pool_status[name]["state"], "solo_exit": solo.returncode,
              "identical": bool(same and solo.returncode == 0),
              "pool_all_three_s": round(pool_s, 3), "solo_s": round(solo_s, 3)})


def priority(quick: bool, workers: int) -> None:
    short = job_args(5 if quick else 10, 2.0)
    long_ = job_args(60 if quick else 600, 2.0)
    arrivals = [0.3, 0.6] if quick else [0.4, 1.0, 1.6, 2.2, 2.8]
    with pool(workers, "priority") as root:
        idle = [response(st) for st in run_schedule(
            root, [(0.0, short, {"priority": 0}) for _ in range(3)])]
    idle_s = statistics.median(idle)
    for policy in ("priority", "fifo"):
        with pool(workers, policy) as root:
            sched = [(0.0, long_, {"priority": 1, "user": "batch"}) for _ in range(2)]
            sched += [(t, short, {"priority": 0, "user": "interactive"}) for t in arrivals]
            sts = run_schedule(root, sched)
        busy = [response(st) for st in sts[2:]]
        emit({"experiment": "priority", "policy": policy, "workers": workers,
              "idle_response_s": round(idle_s, 4),
              "busy_response_median_s": round(statistics.median(busy), 4),
              "busy_response_max_s": round(max(busy), 4),
              "median_over_idle": round(statistics.median(busy) / idle_s, 3),
              "long_jobs_response_s": [round(response(st), 3) for st in sts[:2]]})


def fair(quick: bool, workers: int, plot_dir: Path | None) -> None:
    tmp = scratch("canary-fair-")
    task_ms = 2.0
    n_long = 150 if quick else 1500
    n_third = 40 if quick else 300
    third_at = 0.6 if quick else 2.0
    users = {"w1": (1.0, n_long, 0.0), "w2": (2.0, n_long, 0.0), "w1b": (1.0, n_third, third_at)}
    with pool(workers, "fair") as root:
        sched = [(at, job_args(iters, task_ms, metrics=str(tmp / f"{u}.jsonl")),
                  {"user": u, "weight": w}) for u, (w, iters, at) in users.items()]
        sts = run_schedule(root, sched)
    t0 = min(st["submitted"] for st in sts)
    times = {u: np.array([json.loads(line)["time"] - t0 for line in
                          (tmp / f"{u}.jsonl").read_text().splitlines()]) for u in users}
    window = 0.25
    end = max(t.max() for t in times.values())
    edges = np.arange(0.0, end + window, window)
    counts = {u: np.histogram(t, edges)[0].astype(float) for u, t in times.items()}
    total = sum(counts.values())
    mids = (edges[:-1] + edges[1:]) / 2
    shares = {u: np.where(total > 0, c / np.maximum(total, 1), np.nan) for u, c in counts.items()}
    # the windows where exactly the two long users were both backlogged
    third_start, third_end = times["w1b"].min(), times["w1b"].max()
    both_end = min(times["w1"].max(), times["w2"].max())
    two = (mids > 0.5) & (mids < both_end - window) & ((mids < third_start - window)
                                                       | (mids > third_end + window))
    three = (mids > third_start + window) & (mids < third_end - window)
    row: dict[str, Any] = {"experiment": "fair", "workers": workers, "weights": {
        u: w for u, (w, _, _) in users.items()}, "window_s": window}
    for label, mask in (("two_users", two), ("three_users", three)):
        if mask.any():
            row[f"{label}_share"] = {u: round(float(np.nansum(counts[u][mask]) /
                                                    np.nansum(total[mask])), 4) for u in users}
    row["third_user_active_s"] = [round(float(third_start), 3), round(float(third_end), 3)]
    row["timeline"] = {"t": [round(float(m), 3) for m in mids],
                       **{u: [None if np.isnan(v) else round(float(v), 4) for v in s]
                          for u, s in shares.items()}}
    emit(row)
    if plot_dir is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 3.5))
        for u, s in shares.items():
            ax.plot(mids, s, label=f"user {u} (weight {users[u][0]:g})")
        ax.axhline(1 / 3, color="grey", lw=0.5, ls=":")
        ax.axhline(2 / 3, color="grey", lw=0.5, ls=":")
        ax.set_xlabel("seconds since the first submission")
        ax.set_ylabel(f"share of iterations per {window} s")
        ax.set_ylim(0, 1)
        ax.legend(fontsize=8)
        ax.set_title(f"weighted fair share on {workers} workers (canary pool)")
        fig.tight_layout()
        fig.savefig(plot_dir / "fair_share.png", dpi=110)
        plt.close(fig)


def hfsp(quick: bool, workers: int, plot_dir: Path | None) -> None:
    rng = np.random.default_rng(1)
    n = 12 if quick else 40
    small, large = job_args(4, 2.0), job_args(60 if quick else 100, 2.0)
    small_s, large_s = 4 * 2e-3, (60 if quick else 100) * 2e-3  # per worker, every worker
    sizes = rng.random(n) < 0.1
    sizes[n // 3] = True  # at least one large job
    mean_work = float(np.where(sizes, large_s, small_s).mean())
    rate = 0.7 / mean_work
    arrivals = np.cumsum(rng.exponential(1.0 / rate, n))
    results = {}
    for policy in ("fifo", "fair", "hfsp"):
        with pool(workers, policy) as root:
            sts = run_schedule(root, [(float(a), large if big else small, {})
                                      for a, big in zip(arrivals, sizes)])
        r = [response(st) for st in sts]
        small_r = [x for x, big in zip(r, sizes) if not big]
        results[policy] = r
        emit({"experiment": "hfsp", "policy": policy, "workers": workers, "jobs": n,
              "large_jobs": int(sizes.sum()), "load": 0.7,
              "mean_response_s": round(statistics.mean(r), 4),
              "p95_response_s": round(pct(r, 95), 4), "max_response_s": round(max(r), 4),
              "small_mean_response_s": round(statistics.mean(small_r), 4),
              "all_done": all(st["state"] == "done" for st in sts)})
    if plot_dir is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.5))
        names = list(results)
        x = np.arange(len(names))
        ax.bar(x - 0.2, [statistics.mean(results[k]) for k in names], 0.4, label="mean")
        ax.bar(x + 0.2, [pct(results[k], 95) for k in names], 0.4, label="95th percentile")
        ax.set_xticks(x, names)
        ax.set_ylabel("response time (s)")
        ax.set_title(f"mixed workload at load 0.7, {workers} workers")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(plot_dir / "hfsp.png", dpi=110)
        plt.close(fig)


def job_cost(root: Path, workers: int, quick: bool) -> tuple[float, float, float]:
    """The pool's own cost per job, from tiny one-worker jobs on the idle pool at ``root``:
    ``(latency s, worker CPU s, rank 0 CPU s)``. Latency: the median submit-to-end time of a
    job that does almost nothing, submitted when the last one ended. CPU: what the workers
    (together) and rank 0 spend per job over a back-to-back burst of such jobs."""
    tiny = job_args(1, 0.0, 1)
    ends = [response(run_schedule(root, [(0.0, tiny, {"workers": 1})])[0])
            for _ in range(5 if quick else 15)]
    pids = _pool_pids(root, workers)
    before = [_cpu_seconds(p) for p in pids]
    many = 10 if quick else 60
    ids = [client.submit(JOB, tiny, root, workers=1) for _ in range(many)]
    for j in ids:
        client.wait(j, root, timeout=600)
    spent = [_cpu_seconds(p) - c for p, c in zip(pids, before)]
    return statistics.median(ends), sum(spent[1:]) / many, spent[0] / many


def _pool_pids(root: Path, workers: int) -> list[int]:
    """Rank 0's process id, then each worker's."""
    return [int(read_json(root / f"rank-{r}.json")["pid"]) for r in range(workers + 1)]


def placement(quick: bool, workers: int, plot_dir: Path | None) -> None:
    from canary.sched.placement import make_placement
    from canary.sim.cluster import JobSet, simulate_cluster

    n = 10 if quick else 40
    task_ms, iters = 5.0, 4  # about 20 ms of work on one worker
    work = task_ms * iters * 1e-3
    rate = 0.8 * workers / work
    rng = np.random.default_rng(2)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, n))
    with pool(workers, "fifo", "random") as root:
        latency, cpu_w, cpu_0 = job_cost(root, workers, quick)
    # The simulator with the pool's cost per job: each job occupies its worker for its work
    # plus the workers' CPU per job (driver thread, the job's state, its messages) and, where
    # the pool's ranks outnumber the cores, rank 0's CPU per job too (taken from the workers'
    # cores); its response also carries the rest of an idle pool's tiny-job latency (the
    # directory, placement and start-up messages: waits that occupy no core).
    shared = (os.cpu_count() or 1) < workers + 1
    occupied = work + cpu_w + (cpu_0 if shared else 0.0)
    delay = max(latency - cpu_w, 0.0)
    rows = {}
    for name in ("random", "per-task", "batch", "batch-late"):
        with pool(workers, "fifo", name) as root:
            sts = run_schedule(root, [(float(a), job_args(iters, task_ms, 1),
                                       {"workers": 1}) for a in arrivals])
        r = [response(st) for st in sts]
        zeros = np.zeros(n, dtype=np.int64)
        rel = arrivals - arrivals[0]
        sim = simulate_cluster(JobSet(rel, [np.array([work]) for _ in range(n)], zeros, zeros),
                               make_placement(name), workers, rtt=1e-3,
                               rng=np.random.default_rng(0)).response
        costed = simulate_cluster(JobSet(rel, [np.array([occupied]) for _ in range(n)], zeros,
                                         zeros), make_placement(name), workers, rtt=1e-3,
                                  rng=np.random.default_rng(0)).response + delay
        rows[name] = (r, sim.tolist(), costed.tolist())
        emit({"experiment": "placement", "placement": name, "workers": workers, "jobs": n,
              "load": 0.8, "job_work_s": work,
              "median_response_s": round(statistics.median(r), 4),
              "p99_response_s": round(pct(r, 99), 4),
              "simulated_median_s": round(float(np.median(sim)), 4),
              "simulated_p99_s": round(pct(sim.tolist(), 99), 4),
              "pool_job_latency_ms": round(1e3 * latency, 2),
              "pool_job_worker_cpu_ms": round(1e3 * cpu_w, 2),
              "pool_job_rank0_cpu_ms": round(1e3 * cpu_0, 2),
              "rank0_shares_the_workers_cores": shared,
              "simulated_with_pool_cost_median_s": round(float(np.median(costed)), 4),
              "simulated_with_pool_cost_p99_s": round(pct(costed.tolist(), 99), 4)})
    if plot_dir is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6.5, 3.5))
        names = list(rows)
        x = np.arange(len(names))
        ax.bar(x - 0.27, [statistics.median(rows[k][0]) for k in names], 0.27,
               label="pool median")
        ax.bar(x, [float(np.median(rows[k][2])) for k in names], 0.27,
               label="simulator + the pool's cost per job")
        ax.bar(x + 0.27, [float(np.median(rows[k][1])) for k in names], 0.27,
               label="simulator median")
        ax.set_xticks(x, names)
        ax.set_ylabel("response time (s)")
        ax.set_title(f"~20 ms jobs at load 0.8, {workers} workers")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(plot_dir / "placement.png", dpi=110)
        plt.close(fig)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def overheads(quick: bool, workers: int) -> None:
    tmp = scratch("canary-over-")
    n = 8 if quick else 30
    marks = (10, 20) if quick else (50, 100, 200, 400)
    with pool(workers, "fair") as root:
        first, ends = [], []
        for k in range(n):
            stamp = tmp / f"stamp{k}"
            st = run_schedule(root, [(0.0, job_args(1, 0.0, 1, stamp=str(stamp)),
                                      {"workers": 1})])[0]
            first.append(float(stamp.read_text().split()[0]) - st["submitted"])
            ends.append(response(st))
        rank0, *worker_pids = _pool_pids(root, workers)
        rss_first = [_rss_mb(p) for p in worker_pids]
        cpu0 = _cpu_seconds(rank0)
        t0 = time.time()
        # back to back, half failing; each worker's memory read after each batch
        rss_at: dict[int, list[float]] = {}
        failed = done = 0
        for upto in marks:
            ids = [client.submit(JOB, job_args(1, 0.0, 1) + (["--fail"] if k % 2 else []),
                                 root, workers=1) for k in range(done, upto)]
            failed += sum(client.wait(j, root, timeout=600)["state"] == "failed" for j in ids)
            done = upto
            rss_at[upto] = [round(_rss_mb(p), 1) for p in worker_pids]
        many = done
        wall = time.time() - t0
        cpu = _cpu_seconds(rank0) - cpu0
        rss_after = [_rss_mb(p) for p in worker_pids]
    emit({"experiment": "overheads", "workers": workers, "jobs": n,
          "submit_to_first_task_median_ms": round(1e3 * statistics.median(first), 2),
          "submit_to_first_task_p99_ms": round(1e3 * pct(first, 99), 2),
          "tiny_job_response_median_ms": round(1e3 * statistics.median(ends), 2),
          "tiny_job_response_p99_ms": round(1e3 * pct(ends, 99), 2),
          "back_to_back_jobs": many, "jobs_per_s": round(many / wall, 2),
          "rank0_cpu_ms_per_job": round(1e3 * cpu / many, 3),
          "half_failed": failed == many // 2,
          "worker_rss_mb_after_first": [round(x, 1) for x in rss_first],
          "worker_rss_mb_after_jobs": {str(k): v for k, v in rss_at.items()},
          "worker_rss_mb_after_all": [round(x, 1) for x in rss_after]})


EXPERIMENTS = ("correctness", "priority", "fair", "hfsp", "placement", "overheads")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes (tests)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--only", default=",".join(EXPERIMENTS),
                    help=f"comma-separated experiments (default all: {','.join(EXPERIMENTS)})")
    ap.add_argument("--out", default=None, help="also write the JSON lines to this file")
    ap.add_argument("--plot", default=None, metavar="DIR", help="draw the PNGs into DIR")
    args = ap.parse_args(argv)
    plot_dir = Path(args.plot) if args.plot else None
    if plot_dir is not None:
        plot_dir.mkdir(parents=True, exist_ok=True)
    chosen = [e for e in args.only.split(",") if e]
    unknown = set(chosen) - set(EXPERIMENTS)
    if unknown:
        ap.error(f"unknown experiment(s) {sorted(unknown)}; choose from {EXPERIMENTS}")
    t0 = time.time()
    for name in chosen:
        if name == "correctness":
            correctness(args.quick, args.workers)
        elif name == "priority":
            priority(args.quick, args.workers)
        elif name == "fair":
            fair(args.quick, args.workers, plot_dir)
        elif name == "hfsp":
            hfsp(args.quick, args.workers, plot_dir)
        elif name == "placement":
            placement(args.quick, args.workers, plot_dir)
        else:
            overheads(args.quick, args.workers)
    summary: dict[str, Any] = {"summary": "sharing", "workers": args.workers,
                               "seconds": round(time.time() - t0, 1)}
    for row in OUT:
        kind = row["experiment"]
        if kind == "correctness":
            summary.setdefault("identical", {})[row["app"]] = row["identical"]
        elif kind == "priority":
            summary.setdefault("priority_median_over_idle", {})[row["policy"]] = \
                row["median_over_idle"]
        elif kind == "fair":
            summary["fair_two_users_share"] = row.get("two_users_share")
        elif kind == "hfsp":
            summary.setdefault("hfsp_mean_response_s", {})[row["policy"]] = \
                row["mean_response_s"]
        elif kind == "placement":
            summary.setdefault("placement_median_s", {})[row["placement"]] = \
                row["median_response_s"]
        else:
            summary["jobs_per_s"] = row["jobs_per_s"]
            summary["submit_to_first_task_median_ms"] = row["submit_to_first_task_median_ms"]
    emit(summary)
    if args.out:
        Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in OUT))
    return 0


if __name__ == "__main__":
    from canary.script import end_script

    end_script(main())
