"""A central scheduler, as Spark's driver is one, dispatching a job's tasks: the other side of
the Canary paper's §2.2 argument, computed from measured parameters.

A central controller sends every task to a worker and hears back when it is done, one at a
time, at ``rate`` tasks per second; the stages of an iteration are separated by barriers (a
stage's tasks are dispatched once the stage before has finished, as Spark's stages are). For a
fixed job (strong scaling) on ``W`` workers with ``k`` tasks per worker per iteration and
``C`` seconds of work per iteration in all:

* the work takes ``C / W`` a worker, while the controller needs ``k W / rate`` to dispatch
  the iteration's tasks: its load, ``k W / (C / W) = k W^2 / C`` tasks per second, grows with
  the square of the workers;
* the controller saturates where the two meet, at :func:`crossover_workers`
  ``W* = sqrt(rate C / k)``; past it an iteration takes about ``k W / rate``, longer with
  every worker added, while a job whose workers schedule their own tasks keeps its controller
  idle and goes on as its communication allows.

:func:`central_iteration_seconds` plays the dispatching out task by task (a discrete model,
not just the bound), so the two regimes and the bend between them come out of one model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def crossover_workers(rate: float, work_s: float, tasks_per_worker: float) -> float:
    """``sqrt(rate * work_s / tasks_per_worker)``: the workers at which a central scheduler
    dispatching ``rate`` tasks a second needs as long to dispatch an iteration's tasks
    (``tasks_per_worker`` each) as the workers need to run its ``work_s`` seconds of work.

    Raises ValueError unless every argument is positive.
    """
    if not (rate > 0 and work_s > 0 and tasks_per_worker > 0):
        raise ValueError(f"rate, work and tasks per worker must be positive, got {rate}, "
                         f"{work_s}, {tasks_per_worker}")
    return math.sqrt(rate * work_s / tasks_per_worker)


def central_iteration_seconds(stages: Sequence[Sequence[float]], workers: int, rate: float,
                              latency_s: float = 0.0) -> float:
    """Seconds one iteration takes under a central scheduler.

    ``stages``: the iteration's stages in order, each the durations (s) of its tasks. The
    controller dispatches a stage's tasks one every ``1 / rate`` seconds, task ``j`` to worker
    ``j mod workers``; a task starts ``latency_s`` after its dispatch or when its worker is
    free, whichever is later; the controller hears of its end ``latency_s`` later, and the
    next stage starts when it has heard of every task of this one (a barrier). Raises
    ValueError for no worker or a rate that is not positive.
    """
    if workers < 1 or not rate > 0:
        raise ValueError(f"need at least one worker and a positive rate, got {workers}, {rate}")
    gap = 1.0 / rate
    now = 0.0
    for durations in stages:
        free = [now] * workers
        end = now
        for j, d in enumerate(durations):
            dispatched = now + (j + 1) * gap
            w = j % workers
            start = max(dispatched + latency_s, free[w])
            free[w] = start + d
            end = max(end, free[w] + latency_s, dispatched)
        now = end
    return now


def strong_scaling_stages(work_s: float, tasks_per_worker: int, workers: int,
                          stages: int = 1) -> list[list[float]]:
    """An iteration of ``stages`` equal stages sharing ``work_s`` seconds of work, each with
    ``tasks_per_worker`` tasks per worker (the fixed job of the module doc, on ``workers``)."""
    n = tasks_per_worker * workers
    return [[work_s / stages / n] * n for _ in range(stages)]
