"""Simulator for size-based scheduling (HFSP's estimation-error study).

A pool of ``slots`` identical slots is fed by one central queue -- an
:class:`~canary.sched.hfsp.HfspQueue` wrapping the job-level policy under
test (``ps``, ``srpt``, ``hfsp`` or ``fifo``), the same object a worker would
use.  Job j has size ``S_j`` (slot-seconds), split into ``ceil(S_j /
task_size)`` equal tasks; the policy sees only the *estimate* given to it
(``S_j * exp(sigma * z_j)`` in the experiment).  Tasks are not preempted, so
``task_size`` sets how closely the slot pool approximates the preemptive
single server of the original study.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np

from canary.sched.hfsp import HfspQueue
from canary.sched.queues import Item

__all__ = ["SizeWorkload", "simulate_size_based", "weibull_workload"]


@dataclass
class SizeWorkload:
    """Jobs for the size-based study: arrival times (sorted) and sizes."""

    arrival: np.ndarray
    size: np.ndarray

    def __post_init__(self) -> None:
        if self.arrival.shape != self.size.shape:
            raise ValueError("arrival and size need one entry per job")
        if self.size.size and self.size.min() <= 0:
            raise ValueError("job sizes must be > 0")
        if np.any(np.diff(self.arrival) < 0):
            raise ValueError("arrival times must be sorted")


def weibull_workload(
    rng: np.random.Generator, num_jobs: int, shape: float, load: float, slots: int, mean_size: float
) -> SizeWorkload:
    """Poisson arrivals, Weibull(shape) sizes of the given mean, offered ``load``.

    Shape < 1 is heavy-tailed (0.25 in the PSBS/HFSP studies).  Raises
    ValueError unless ``0 < load < 1`` (the open system is unstable at load
    >= 1), ``shape > 0``, ``num_jobs >= 1`` and ``mean_size > 0``.
    """
    if not 0 < load < 1:
        raise ValueError(f"load must be in (0, 1) for an open system, got {load}")
    if shape <= 0 or num_jobs < 1 or mean_size <= 0 or slots < 1:
        raise ValueError("need shape > 0, num_jobs >= 1, mean_size > 0 and slots >= 1")
    scale = mean_size / math.gamma(1.0 + 1.0 / shape)
    size = scale * rng.weibull(shape, size=num_jobs)
    size = np.maximum(size, mean_size * 1e-6)  # keep sizes strictly positive
    rate = load * slots / mean_size
    arrival = np.cumsum(rng.exponential(1.0 / rate, size=num_jobs))
    return SizeWorkload(arrival, size)


def simulate_size_based(
    work: SizeWorkload,
    estimates: np.ndarray,
    policy: str,
    slots: int,
    task_size: float,
) -> np.ndarray:
    """Return each job's sojourn time (finish - arrival) under ``policy``.

    Deterministic (no randomness).  Every arrival and task end at one instant is applied
    before any free slot is given out, so the policy chooses among all jobs present at that
    moment.  Raises ValueError for ``slots < 1``,
    ``task_size <= 0``, estimates of the wrong shape or negative, or an
    unknown policy.
    """
    if slots < 1 or task_size <= 0:
        raise ValueError(f"need slots >= 1 and task_size > 0, got {slots}, {task_size}")
    if estimates.shape != work.size.shape or (estimates.size and estimates.min() < 0):
        raise ValueError("need one non-negative estimate per job")
    queue = HfspQueue(policy, capacity=float(slots), default_task_size=task_size)
    n = work.size.size
    ntasks = np.maximum(1, np.ceil(work.size / task_size - 1e-9)).astype(np.int64)
    tdur = work.size / ntasks
    left = ntasks.copy()
    finish = np.zeros(n)
    heap: list[tuple[float, int, int, Item | None]] = []
    seq = 0
    for j in range(n):
        heap.append((float(work.arrival[j]), seq, j, None))
        seq += 1
    heapq.heapify(heap)
    free = slots
    while heap:
        now = heap[0][0]
        # Every arrival and task end at this instant first, then the free slots: a slot handed
        # out between two simultaneous events would not see a job that arrives at that moment.
        while heap and heap[0][0] == now:
            _, _, j, item = heapq.heappop(heap)
            if item is None:  # arrival: all tasks become runnable at once
                k = int(ntasks[j])
                est = float(estimates[j])
                for _ in range(k):
                    queue.push(Item(j, 0, 0, 1.0, k, est, None), now)
            else:  # a task finished
                free += 1
                queue.task_finished(item, now, float(tdur[j]))
                left[j] -= 1
                if left[j] == 0:
                    finish[j] = now
        while free and len(queue):
            nxt = queue.pop(now)
            assert nxt is not None
            free -= 1
            heapq.heappush(heap, (now + float(tdur[nxt.job]), seq, nxt.job, nxt))
            seq += 1
    return finish - work.arrival
