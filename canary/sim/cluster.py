"""Discrete-event simulator of a Sparrow-style cluster.

Workers have ``slots`` execution slots and one queue each (any
:class:`~canary.sched.queues.WorkerQueue`).  Jobs arrive at given times;
a scheduler places each with a placement policy from
:mod:`canary.sched.placement` -- the very objects a real scheduler would use.

Timing model (all network hops take ``rtt / 2``):

* early binding (random, per-task, batch): probes reach the workers at
  ``arrival + rtt/2`` and read their load (queued + running); the scheduler
  decides on the replies and the tasks reach their workers at
  ``arrival + 3*rtt/2`` (random skips the probes: ``arrival + rtt/2``).
* late binding: reservations reach the workers at ``arrival + rtt/2``.  A
  worker with a free slot takes the next reservation from its queue, holds
  the slot and asks the scheduler for a task; the reply (task or no-op) comes
  back one ``rtt`` later.  Because every hop has the same delay, requests
  reach the scheduler in the order they were sent, so the simulator asks the
  plan at send time -- the same answers the scheduler would give on arrival.
  Cancellations reach workers one ``rtt`` after the last task was handed out.
  A worker with a :class:`~canary.sched.queues.WeightedFairQueue` drops the
  job's reservations as the cancellation arrives, so that the queue gives back
  what their pushes charged (they never ran); with any other queue a worker
  drops a cancelled reservation for free when it pops it, which changes no
  other item's turn. A reservation that arrives with its job's cancellation
  (``rtt = 0``) is not queued at all. A reservation answered with no task
  (its job's tasks all launched before the cancellation arrived) held the slot
  for the round trip but served its user nothing: a fair queue gives back
  what it charged (``WeightedFairQueue.release``).

The event queue is a binary heap of ``(time, seq, kind, a, b)`` tuples; ties
are broken by insertion order so runs are deterministic for a given seed.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from canary.sched.hfsp import HfspQueue
from canary.sched.placement import (
    BatchLateBinding,
    BatchSampling,
    EarlyBindingPlan,
    LateBindingPlan,
    PerTaskSampling,
    RandomPlacement,
)
from canary.sched.queues import FifoQueue, Item, WeightedFairQueue, WorkerQueue

__all__ = ["ClusterResult", "JobSet", "poisson_jobs", "simulate_cluster"]

_ARRIVE, _PROBE, _TASKS, _RESERVE, _FINISH, _NOOP = range(6)

Placement = RandomPlacement | PerTaskSampling | BatchSampling | BatchLateBinding


@dataclass
class JobSet:
    """Jobs to simulate: arrival times (sorted), task durations, user, priority."""

    arrival: np.ndarray
    durations: list[np.ndarray]
    user: np.ndarray
    priority: np.ndarray

    def __post_init__(self) -> None:
        n = self.arrival.size
        if len(self.durations) != n or self.user.size != n or self.priority.size != n:
            raise ValueError("arrival, durations, user and priority must have one entry per job")
        if n and np.any(np.diff(self.arrival) < 0):
            raise ValueError("job arrival times must be sorted")
        for d in self.durations:
            if d.size < 1:
                raise ValueError("every job needs at least one task")
            if d.min() < 0:
                raise ValueError("task durations must be >= 0")

    @staticmethod
    def concat(sets: list[JobSet]) -> JobSet:
        """Merge job sets (e.g. one per user) into one, ordered by arrival."""
        arr = np.concatenate([s.arrival for s in sets])
        order = np.argsort(arr, kind="stable")
        durs = [d for s in sets for d in s.durations]
        return JobSet(
            arr[order],
            [durs[i] for i in order],
            np.concatenate([s.user for s in sets])[order],
            np.concatenate([s.priority for s in sets])[order],
        )


def poisson_jobs(
    rng: np.random.Generator,
    rate: float,
    tasks_per_job: int,
    mean_task: float,
    *,
    num_jobs: int | None = None,
    start: float = 0.0,
    end: float | None = None,
    user: int = 0,
    priority: int = 0,
    distribution: str = "exp",
) -> JobSet:
    """Poisson job arrivals at ``rate`` jobs/s, either ``num_jobs`` or until ``end``.

    Task durations: ``exp`` (exponential), ``const`` or ``pareto`` (shape 2,
    same mean).  Raises ValueError on a non-positive rate or mean, or an
    unknown distribution.
    """
    if rate < 0 or mean_task <= 0 or tasks_per_job < 1:
        raise ValueError("rate must be >= 0, mean_task > 0 and tasks_per_job >= 1")
    if rate == 0:
        arr = np.empty(0)
    elif num_jobs is not None:
        arr = start + np.cumsum(rng.exponential(1.0 / rate, size=num_jobs))
    else:
        if end is None:
            raise ValueError("give num_jobs or end")
        n_guess = int(rate * (end - start) * 1.2 + 50)
        arr = start + np.cumsum(rng.exponential(1.0 / rate, size=n_guess))
        while arr[-1] < end:
            more = arr[-1] + np.cumsum(rng.exponential(1.0 / rate, size=n_guess))
            arr = np.concatenate([arr, more])
        arr = arr[arr < end]
    n = arr.size
    shape = (n, tasks_per_job)
    if distribution == "exp":
        d = rng.exponential(mean_task, size=shape)
    elif distribution == "const":
        d = np.full(shape, mean_task)
    elif distribution == "pareto":
        d = (rng.pareto(2.0, size=shape) + 1.0) * (mean_task / 2.0)
    else:
        raise ValueError(f"unknown task duration distribution {distribution!r}")
    return JobSet(arr, list(d), np.full(n, user), np.full(n, priority))


@dataclass
class ClusterResult:
    """Per-job outcomes (index = job index in the JobSet) and optional task log."""

    arrival: np.ndarray
    finish: np.ndarray
    optimal: np.ndarray  # longest task: the response time with zero wait and no network
    waited: np.ndarray  # True if any task of the job queued at its worker
    user: np.ndarray
    priority: np.ndarray
    events: int
    task_start: np.ndarray = field(default_factory=lambda: np.empty(0))
    task_end: np.ndarray = field(default_factory=lambda: np.empty(0))
    task_user: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))

    @property
    def response(self) -> np.ndarray:
        return self.finish - self.arrival


class _Job:
    __slots__ = ("plan", "left", "finish", "waited", "cancel_at", "durs", "user", "prio", "arrival")

    def __init__(self, durs: np.ndarray, user: int, prio: int, arrival: float) -> None:
        self.plan: EarlyBindingPlan | LateBindingPlan | None = None
        self.left = durs.size
        self.finish = 0.0
        self.waited = False
        self.cancel_at = float("inf")
        self.durs = durs
        self.user = user
        self.prio = prio
        self.arrival = arrival


def simulate_cluster(
    jobs: JobSet,
    placement: Placement,
    num_workers: int,
    slots: int = 1,
    rtt: float = 0.001,
    rng: np.random.Generator | None = None,
    queue_factory: Callable[[], WorkerQueue] = FifoQueue,
    record_tasks: bool = False,
) -> ClusterResult:
    """Run every job to completion and return per-job response data.

    Guarantees: deterministic for a given ``rng`` state; every task runs
    exactly once; a worker never runs more than ``slots`` tasks at a time.
    Raises ValueError for ``num_workers < 1``, ``slots < 1`` or ``rtt < 0``, and for
    :class:`~canary.sched.hfsp.HfspQueue` workers under late binding: a reservation that finds
    no task left would count as a task of its job running for ever in the queue's size-based
    policy, which has no way to take back a task it was told of.
    """
    if num_workers < 1 or slots < 1:
        raise ValueError(f"need num_workers >= 1 and slots >= 1, got {num_workers}, {slots}")
    if rtt < 0:
        raise ValueError(f"rtt must be >= 0, got {rtt}")
    if rng is None:
        rng = np.random.default_rng(0)
    half = rtt / 2.0
    late = placement.late_binding
    n_jobs = jobs.arrival.size
    queues = [queue_factory() for _ in range(num_workers)]
    if late and any(isinstance(q, HfspQueue) for q in queues):
        raise ValueError("HfspQueue workers need early binding (the tasks themselves queued): "
                         "under late binding a reservation that finds no task left would stay "
                         "a running task of its job in the size-based policy for ever")
    busy = [0] * num_workers
    load = np.zeros(num_workers, dtype=np.int64)  # queued + running, what a probe reads
    fair_queues = [q for q in queues if isinstance(q, WeightedFairQueue)]
    cancel_on_arrival = len(fair_queues) == num_workers
    # cancellations on their way: (time they reach the workers, seq, job, the workers still
    # holding its reservations); only kept for fair queues
    cancels: list[tuple[float, int, int, list[int]]] = []
    js = [
        _Job(jobs.durations[i], int(jobs.user[i]), int(jobs.priority[i]), float(jobs.arrival[i]))
        for i in range(n_jobs)
    ]
    heap: list[tuple[float, int, int, int, object]] = []
    seq = 0
    for i in range(n_jobs):
        heap.append((js[i].arrival, seq, _ARRIVE, i, None))
        seq += 1
    heapq.heapify(heap)
    push = heapq.heappush
    pop = heapq.heappop
    t_start: list[float] = []
    t_end: list[float] = []
    t_user: list[int] = []
    events = 0

    def deliver_cancellations(now: float) -> None:
        # Called before any push or pop: a queue must see a cancellation from its time on, or a
        # pop could serve a cancelled reservation and a push be tagged behind one.
        while cancels and cancels[0][0] <= now:
            _, _, job_id, holders = pop(cancels)
            for holder in holders:
                load[holder] -= fair_queues[holder].discard(job_id)

    def serve(w: int, now: float) -> None:
        # Fill free slots of worker w from its queue.
        nonlocal seq
        q = queues[w]
        while busy[w] < slots:
            if cancels:
                deliver_cancellations(now)
            item = q.pop(now)
            if item is None:
                return
            job = js[item.job]
            if late:
                plan = job.plan
                assert isinstance(plan, LateBindingPlan)
                if now >= job.cancel_at:
                    load[w] -= 1  # cancelled reservation: dropped without a round trip
                    continue
                busy[w] += 1
                t = plan.request(w)
                if plan.all_launched and job.cancel_at == float("inf"):
                    holders = plan.cancellations()
                    job.cancel_at = now + rtt
                    if cancel_on_arrival:
                        push(cancels, (job.cancel_at, seq, item.job, holders))
                        seq += 1
                if t is None:
                    push(heap, (now + rtt, seq, _NOOP, w, item))
                    seq += 1
                    continue
                start = now + rtt
                if now > job.arrival + half + 1e-12:  # the reservation queued
                    job.waited = True
                dur = float(job.durs[t])
            else:
                busy[w] += 1
                start = now
                t, arrived = item.payload
                if now > arrived + 1e-12:
                    job.waited = True
                dur = float(job.durs[t])
            end = start + dur
            if record_tasks:
                t_start.append(start)
                t_end.append(end)
                t_user.append(job.user)
            push(heap, (end, seq, _FINISH, w, (item, dur)))
            seq += 1

    while heap:
        now, _, kind, a, b = pop(heap)
        events += 1
        if cancels:
            deliver_cancellations(now)
        if kind == _FINISH:
            w = a
            fin_item: Item = b[0]  # type: ignore[index]
            dur: float = b[1]  # type: ignore[index]
            busy[w] -= 1
            load[w] -= 1
            queues[w].task_finished(fin_item, now, dur)
            job = js[fin_item.job]
            job.left -= 1
            if now > job.finish:
                job.finish = now
            serve(w, now)
        elif kind == _NOOP:
            w = a
            busy[w] -= 1
            load[w] -= 1
            noop_queue = queues[w]
            if isinstance(noop_queue, WeightedFairQueue):  # it served no task: no charge
                noop_queue.release(b, now)  # type: ignore[arg-type]
            serve(w, now)
        elif kind == _ARRIVE:
            job = js[a]
            m = job.durs.size
            new_plan = placement.plan(m, num_workers, rng)
            job.plan = new_plan
            if isinstance(new_plan, LateBindingPlan):
                push(heap, (now + half, seq, _RESERVE, a, None))
            elif new_plan.probes.size:
                push(heap, (now + half, seq, _PROBE, a, None))
            else:
                push(heap, (now + half, seq, _TASKS, a, new_plan.assign(new_plan.probes)))
            seq += 1
        elif kind == _PROBE:
            eplan = js[a].plan
            assert isinstance(eplan, EarlyBindingPlan)
            where = eplan.assign(load[eplan.probes])
            push(heap, (now + rtt, seq, _TASKS, a, where))
            seq += 1
        elif kind == _TASKS:
            job = js[a]
            where = b  # type: ignore[assignment]
            np.add.at(load, where, 1)
            for t, w in enumerate(where.tolist()):  # type: ignore[union-attr]
                queues[w].push(Item(a, job.user, job.prio, 1.0, job.durs.size, None, (t, now)), now)
                if busy[w] < slots:
                    serve(w, now)
        else:  # _RESERVE
            job = js[a]
            lplan = job.plan
            assert isinstance(lplan, LateBindingPlan)
            for w in lplan.reservations.tolist():
                if now >= job.cancel_at:
                    # at rtt 0 the first reservations launched every task: the rest would
                    # reach their workers with the cancellation
                    break
                load[w] += 1
                queues[w].push(Item(a, job.user, job.prio, 1.0, job.durs.size, None, None), now)
                if busy[w] < slots:
                    serve(w, now)

    finish = np.array([j.finish for j in js])
    return ClusterResult(
        arrival=jobs.arrival.copy(),
        finish=finish,
        optimal=np.array([float(j.durs.max()) for j in js]),
        waited=np.array([j.waited for j in js], dtype=bool),
        user=jobs.user.copy(),
        priority=jobs.priority.copy(),
        events=events,
        task_start=np.asarray(t_start),
        task_end=np.asarray(t_end),
        task_user=np.asarray(t_user, dtype=np.int64),
    )
