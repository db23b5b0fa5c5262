"""The papers' experiments, each a function returning one dict per data point.

Every function returns its rows and, if ``on_row`` is given, also passes
each row to it as soon as it is measured.  Every function is deterministic for its ``seed``: the workload of a data point
depends only on ``(seed, point index)`` and the placement randomness comes from
a separate stream, so policies compared at one load see the same jobs (common
random numbers make the comparison less noisy).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from canary.sched.placement import PLACEMENT_POLICIES, BatchLateBinding, make_placement
from canary.sched.queues import PriorityQueue, WeightedFairQueue, WorkerQueue
from canary.sim.cluster import ClusterResult, JobSet, poisson_jobs, simulate_cluster
from canary.sim.sizebased import simulate_size_based, weibull_workload

__all__ = [
    "fairshare_experiment",
    "hfsp_experiment",
    "max_min_shares",
    "placement_experiment",
    "priority_experiment",
    "zero_wait_experiment",
    "zero_wait_probability",
]

Row = dict[str, Any]


def _check_open_load(load: float) -> None:
    if not 0 < load < 1:
        raise ValueError(
            f"load must be in (0, 1): an open system at load >= 1 is unstable, got {load}"
        )


def _check_policies(policies: Sequence[str], allowed: Sequence[str]) -> None:
    for p in policies:
        if p not in allowed:
            raise ValueError(f"unknown policy {p!r}; choose from {', '.join(allowed)}")


def _emit(rows: list[Row], on_row: Callable[[Row], None] | None, row: Row) -> None:
    # Long sweeps report each point as soon as it is measured.
    rows.append(row)
    if on_row is not None:
        on_row(row)


def _ms(x: float) -> float:
    return round(1000.0 * float(x), 3)


def _window(n: int, warmup: float) -> slice:
    """Measured jobs: drop the first and last ``warmup`` fraction (fill and drain)."""
    k = int(n * warmup)
    return slice(k, max(n - k, k + 1))


def placement_experiment(
    policies: Sequence[str] = PLACEMENT_POLICIES,
    loads: Sequence[float] = (0.1, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95),
    workers: int = 10_000,
    slots: int = 1,
    tasks_per_job: int = 500,
    jobs: int = 600,
    seed: int = 1,
    d: float = 2,
    rtt: float = 0.001,
    mean_task: float = 0.1,
    warmup: float = 0.1,
    on_row: Callable[[Row], None] | None = None,
) -> list[Row]:
    """Sparrow Figure 3: job response time per placement policy and load.

    Each row holds mean, median and p95 response time of the measured jobs
    and ``optimal_ms``: their mean longest task, i.e. the response time with
    zero queueing and no network (~680 ms for 500 exponential 100 ms tasks).
    Raises ValueError for an unknown policy, load outside (0, 1) or d < 1.
    """
    _check_policies(policies, PLACEMENT_POLICIES)
    for load in loads:
        _check_open_load(load)
    rows: list[Row] = []
    for li, load in enumerate(loads):
        rate = load * workers * slots / (tasks_per_job * mean_task)
        for policy in policies:
            job_set = poisson_jobs(
                np.random.default_rng([seed, li]), rate, tasks_per_job, mean_task, num_jobs=jobs
            )
            res = simulate_cluster(
                job_set,
                make_placement(policy, d),
                workers,
                slots,
                rtt,
                np.random.default_rng([seed, li, 1]),
            )
            win = _window(jobs, warmup)
            resp = res.response[win]
            opt = float(res.optimal[win].mean())
            _emit(
                rows,
                on_row,
                {
                    "experiment": "placement",
                    "policy": policy,
                    "load": load,
                    "workers": workers,
                    "slots": slots,
                    "tasks_per_job": tasks_per_job,
                    "jobs": jobs,
                    "measured_jobs": int(resp.size),
                    "d": d,
                    "mean_ms": _ms(resp.mean()),
                    "median_ms": _ms(np.median(resp)),
                    "p95_ms": _ms(np.percentile(resp, 95)),
                    "optimal_ms": _ms(opt),
                    "mean_over_optimal": round(float(resp.mean()) / opt, 4),
                    "seed": seed,
                },
            )
    return rows


def zero_wait_probability(policy: str, load: float, m: int, d: int = 2) -> float:
    """Sparrow Table 2: P(no task of an m-task job waits) if each worker is busy w.p. load.

    random ``(1-p)^m``; per-task ``(1-p^d)^m``; batch: at least m of the d*m
    probed workers idle, ``sum_{i=m}^{dm} C(dm, i) (1-p)^i p^(dm-i)``.
    Raises ValueError for an unknown policy, m < 1, d < 1 or load outside [0, 1].
    """
    if m < 1 or d < 1:
        raise ValueError(f"need m >= 1 and d >= 1, got m={m}, d={d}")
    if not 0 <= load <= 1:
        raise ValueError(f"load must be in [0, 1], got {load}")
    if policy == "random":
        return (1 - load) ** m
    if policy == "per-task":
        return (1 - load**d) ** m
    if policy == "batch":
        n = d * m
        return float(
            sum(math.comb(n, i) * (1 - load) ** i * load ** (n - i) for i in range(m, n + 1))
        )
    raise ValueError(f"no zero-wait formula for policy {policy!r}; use random, per-task or batch")


def zero_wait_experiment(
    tasks: Sequence[int] = (10, 100),
    loads: Sequence[float] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9),
    policies: Sequence[str] = ("random", "per-task", "batch"),
    workers: int = 1000,
    horizon: float = 5.0,
    min_jobs: int = 500,
    seed: int = 1,
    d: int = 2,
    rtt: float = 0.001,
    mean_task: float = 0.1,
    on_row: Callable[[Row], None] | None = None,
) -> list[Row]:
    """Sparrow Table 2 / Figure 4: analytic vs simulated fraction of zero-wait jobs.

    Single-slot workers; jobs arrive for ``end = max(horizon, min_jobs /
    rate)`` seconds and those that arrive in ``[end/5, end - 5*mean_task)``
    are measured, so the cluster has reached its steady load (a warm-up
    counted in jobs would be far too short at high job rates).  A job counts as zero-wait if none of
    its tasks queued at its worker.  Raises ValueError for unknown policies,
    loads outside (0, 1) or jobs with more tasks than workers.
    """
    _check_policies(policies, ("random", "per-task", "batch"))
    for load in loads:
        _check_open_load(load)
    if horizon <= 10 * mean_task:
        raise ValueError(f"horizon must exceed 10 task durations, got {horizon}")
    rows: list[Row] = []
    for mi, m in enumerate(tasks):
        if m > workers:
            raise ValueError(f"{m}-task jobs need at least {m} workers, got {workers}")
        for li, load in enumerate(loads):
            rate = load * workers / (m * mean_task)
            end = max(horizon, min_jobs / rate)  # enough jobs even at low rates
            for policy in policies:
                job_set = poisson_jobs(
                    np.random.default_rng([seed, mi, li]), rate, m, mean_task, end=end
                )
                res = simulate_cluster(
                    job_set,
                    make_placement(policy, d),
                    workers,
                    1,
                    rtt,
                    np.random.default_rng([seed, mi, li, 1]),
                )
                sel = (res.arrival >= end / 5) & (res.arrival < end - 5 * mean_task)
                waited = res.waited[sel]
                _emit(
                    rows,
                    on_row,
                    {
                        "experiment": "zero-wait",
                        "policy": policy,
                        "tasks_per_job": m,
                        "load": load,
                        "workers": workers,
                        "d": d,
                        "analytic": round(zero_wait_probability(policy, load, m, d), 5),
                        "simulated": round(float(1.0 - waited.mean()), 5) if waited.size else None,
                        "measured_jobs": int(waited.size),
                        "seed": seed,
                    },
                )
    return rows


def _summary(resp: np.ndarray) -> dict[str, float | None]:
    if resp.size == 0:
        # null, not NaN: NaN is not valid JSON and these rows are printed as JSON.
        return {"mean_ms": None, "median_ms": None, "p95_ms": None}
    return {
        "mean_ms": _ms(resp.mean()),
        "median_ms": _ms(np.median(resp)),
        "p95_ms": _ms(np.percentile(resp, 95)),
    }


def priority_experiment(
    lp_loads: Sequence[float] = (0.0, 0.25, 0.5, 0.75, 1.75),
    hp_load: float = 0.25,
    workers: int = 100,
    slots: int = 4,
    tasks_per_job: int = 10,
    horizon: float = 20.0,
    seed: int = 1,
    d: float = 2,
    rtt: float = 0.001,
    mean_task: float = 0.1,
    on_row: Callable[[Row], None] | None = None,
) -> list[Row]:
    """Sparrow Table 3: strict priorities at the workers, batch + late binding.

    A high-priority user (level 0) offers ``hp_load`` of the cluster, a
    low-priority user (level 1) each of ``lp_loads`` (may exceed 1: the run
    is finite, ``horizon`` seconds of arrivals, then drains).  Rows report
    both users' response times for jobs that arrived after the first 10% of
    the horizon.  Raises ValueError for negative loads.
    """
    if hp_load < 0 or any(x < 0 for x in lp_loads):
        raise ValueError("loads must be >= 0")
    cap = workers * slots
    rows: list[Row] = []
    for li, lp in enumerate(lp_loads):
        # The high-priority stream is the same at every point, so the rows
        # differ only by the low-priority load (common random numbers).
        parts = [
            poisson_jobs(
                np.random.default_rng([seed, 0]),
                hp_load * cap / (tasks_per_job * mean_task),
                tasks_per_job,
                mean_task,
                end=horizon,
                user=0,
                priority=0,
            ),
            poisson_jobs(
                np.random.default_rng([seed, li + 1]),
                lp * cap / (tasks_per_job * mean_task),
                tasks_per_job,
                mean_task,
                end=horizon,
                user=1,
                priority=1,
            ),
        ]
        res = simulate_cluster(
            JobSet.concat(parts),
            BatchLateBinding(d),
            workers,
            slots,
            rtt,
            np.random.default_rng([seed, li, 1]),
            queue_factory=PriorityQueue,
        )
        keep = res.arrival >= 0.1 * horizon
        row: Row = {"experiment": "priority", "hp_load": hp_load, "lp_load": lp}
        for name, u in (("hp", 0), ("lp", 1)):
            sel = keep & (res.user == u)
            for k, v in _summary(res.response[sel]).items():
                row[f"{name}_{k}"] = v
            row[f"{name}_jobs"] = int(sel.sum())
        row["optimal_ms"] = _ms(res.optimal[keep].mean())
        row.update(
            {"workers": workers, "slots": slots, "tasks_per_job": tasks_per_job, "seed": seed}
        )
        _emit(rows, on_row, row)
    return rows


def max_min_shares(demands: Sequence[float], capacity: float = 1.0) -> list[float]:
    """Max-min fair (equal-weight) allocation of ``capacity`` to the demands.

    Raises ValueError for a negative demand or capacity.
    """
    if capacity < 0 or any(x < 0 for x in demands):
        raise ValueError("demands and capacity must be >= 0")
    alloc = [0.0] * len(demands)
    left = capacity
    active = sorted(range(len(demands)), key=lambda i: demands[i])
    while active:
        share = left / len(active)
        i = active[0]
        if demands[i] <= share:
            alloc[i] = demands[i]
            left -= demands[i]
            active.pop(0)
        else:
            for i in active:
                alloc[i] = share
            break
    return alloc


def _shares(res: ClusterResult, users: int, cap: float, t_end: float, bin_s: float) -> np.ndarray:
    """Fraction of cluster slot-time used by each user in each time bin."""
    edges = np.arange(0.0, t_end + 1e-9, bin_s)
    out = np.zeros((edges.size - 1, users))
    for b in range(edges.size - 1):
        lo, hi = edges[b], edges[b + 1]
        overlap = np.clip(np.minimum(res.task_end, hi) - np.maximum(res.task_start, lo), 0, None)
        out[b] = np.bincount(res.task_user, weights=overlap, minlength=users)[:users]
    return out / (cap * bin_s)


def fairshare_experiment(
    demands: Sequence[float] = (0.0, 0.25, 0.5, 0.25, 0.0),
    phase: float = 10.0,
    user0_load: float = 1.0,
    workers: int = 100,
    slots: int = 4,
    tasks_per_job: int = 10,
    bin_s: float = 1.0,
    seed: int = 1,
    d: float = 2,
    rtt: float = 0.001,
    mean_task: float = 0.1,
    on_row: Callable[[Row], None] | None = None,
) -> list[Row]:
    """Sparrow Figure 11: weighted fair sharing (equal weights) at the workers.

    User 0 offers ``user0_load`` of the cluster throughout; user 1 offers
    ``demands[k]`` during phase k.  One row per ``bin_s`` time bin with each
    user's measured share of slot-time and its max-min fair share.
    """
    if user0_load < 0 or any(x < 0 for x in demands) or phase <= 0 or bin_s <= 0:
        raise ValueError("loads must be >= 0, phase and bin_s > 0")
    cap = workers * slots
    per_job = tasks_per_job * mean_task
    gen = np.random.default_rng([seed, 0])
    t_end = phase * len(demands)
    parts = [poisson_jobs(gen, user0_load * cap / per_job, tasks_per_job, mean_task, end=t_end)]
    for k, dem in enumerate(demands):
        if dem > 0:
            parts.append(
                poisson_jobs(
                    gen,
                    dem * cap / per_job,
                    tasks_per_job,
                    mean_task,
                    start=k * phase,
                    end=(k + 1) * phase,
                    user=1,
                )
            )
    res = simulate_cluster(
        JobSet.concat(parts),
        BatchLateBinding(d),
        workers,
        slots,
        rtt,
        np.random.default_rng([seed, 1]),
        queue_factory=lambda: _fair_queue(),
        record_tasks=True,
    )
    sh = _shares(res, 2, cap, t_end, bin_s)
    rows: list[Row] = []
    for b in range(sh.shape[0]):
        t = (b + 0.5) * bin_s
        k = min(int(t // phase), len(demands) - 1)
        fair = max_min_shares([user0_load, demands[k]])
        _emit(
            rows,
            on_row,
            {
                "experiment": "fairshare",
                "t_s": round(t, 3),
                "user1_demand": demands[k],
                "share0": round(float(sh[b, 0]), 4),
                "share1": round(float(sh[b, 1]), 4),
                "fair0": round(fair[0], 4),
                "fair1": round(fair[1], 4),
                "seed": seed,
            },
        )
    return rows


def _fair_queue() -> WorkerQueue:
    return WeightedFairQueue({0: 1.0, 1: 1.0})


def hfsp_experiment(
    sigmas: Sequence[float] = (0.0, 0.125, 0.25, 0.5, 1.0),
    policies: Sequence[str] = ("ps", "srpt", "hfsp"),
    jobs: int = 10_000,
    shape: float = 0.25,
    load: float = 0.9,
    slots: int = 10,
    mean_size: float = 20.0,
    task_size: float = 1.0,
    reps: int = 1,
    seed: int = 1,
    on_row: Callable[[Row], None] | None = None,
) -> list[Row]:
    """HFSP Figure 2: mean sojourn time vs log-normal size-estimation error.

    Estimates are ``size * exp(sigma * z)``, z standard normal drawn once per
    job and reused for every sigma and policy.  ``normalized`` divides by
    SRPT with exact sizes (sigma = 0), the optimum the study normalises to.
    Raises ValueError for an unknown policy, a negative sigma or load outside (0, 1).
    """
    _check_policies(policies, ("fifo", "ps", "srpt", "hfsp"))
    _check_open_load(load)
    if any(s < 0 for s in sigmas):
        raise ValueError("sigma must be >= 0")
    if reps < 1:
        raise ValueError("reps must be >= 1")
    means: dict[tuple[float, str], list[float]] = {}
    base: list[float] = []
    for r in range(reps):
        rng = np.random.default_rng([seed, r])
        work = weibull_workload(rng, jobs, shape, load, slots, mean_size)
        z = rng.standard_normal(jobs)
        win = _window(jobs, 0.05)
        base.append(
            float(simulate_size_based(work, work.size, "srpt", slots, task_size)[win].mean())
        )
        for s in sigmas:
            est = work.size * np.exp(s * z)
            for p in policies:
                soj = simulate_size_based(work, est, p, slots, task_size)
                means.setdefault((s, p), []).append(float(soj[win].mean()))
    ref = float(np.mean(base))
    rows: list[Row] = []
    for s in sigmas:
        for p in policies:
            m = float(np.mean(means[(s, p)]))
            _emit(
                rows,
                on_row,
                {
                    "experiment": "hfsp",
                    "sigma": s,
                    "policy": p,
                    "mean_sojourn": round(m, 4),
                    "normalized": round(m / ref, 4),
                    "jobs": jobs,
                    "reps": reps,
                    "shape": shape,
                    "load": load,
                    "slots": slots,
                    "seed": seed,
                },
            )
    return rows
