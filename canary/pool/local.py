"""Several jobs on one simulated pool, in one process: the pool's state machines on a seeded
discrete-event transport in virtual time (as :func:`canary.run_local` runs one job).

Each job is a declared :class:`~canary.Program` (no driver script): its "driver" declares at
once wherever the pool starts it. Messages get random delays, keeping MPI's order per sender
and receiver; every task takes a random virtual duration (``LocalJob.task_time`` on average),
during which its worker runs nothing else, even if its job ends meanwhile (a task is never
preempted: the worker's next task starts when it is over). The same seed gives the same run,
decisions included; every job must give the answer of its solo run under every seed.
"""

from __future__ import annotations

import heapq
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from canary.controller.jobs import JobsController
from canary.controller.state import ControllerState
from canary.errors import JobAborted
from canary.messages import (
    CONTROLLER,
    Failed,
    Piece,
    PieceBatch,
    ReportPart,
    Resume,
    Send,
    TaskDone,
    local_event_id,
    run_callback,
)
from canary.pool.messages import (
    Cancel,
    Declared,
    Envelope,
    JobCallback,
    JobSpec,
    Release,
    RunJobTask,
    StartDriver,
    Submit,
    YieldJob,
)
from canary.program import Program
from canary.result import JobResult
from canary.worker.config import WorkerConfig
from canary.worker.execute import run_task
from canary.worker.jobs import JobsWorker
from canary.worker.tasks import K_LOAD

__all__ = ["LocalJob", "LocalPoolRun", "run_jobs_local"]


@dataclass
class LocalJob:
    """A job for :func:`run_jobs_local`: submitted at virtual time ``at``, cancelled at
    ``cancel_at`` if given. Its tasks take ``task_time`` virtual seconds on average, or
    ``kind_time[kind]`` for a task of that kind (``"compute"``, ``"gather"``, ... as in
    :mod:`canary.worker.tasks`)."""

    program: Program
    user: str = "user"
    priority: int = 0
    weight: float = 1.0
    workers: int = 0
    at: float = 0.0
    cancel_at: float | None = None
    task_time: float = 1.0
    kind_time: dict[str, float] = field(default_factory=dict)


@dataclass
class LocalPoolRun:
    """What happened: per job (1-based ids, in the order given) its result or the error it
    ended with, when it was submitted and ended (virtual time), and per worker the job of
    every task it ran, in order, and when each ran (``spans``: ``(start, end, job, task
    kind)``)."""

    results: dict[int, JobResult | BaseException] = field(default_factory=dict)
    submitted: dict[int, float] = field(default_factory=dict)
    ended: dict[int, float] = field(default_factory=dict)
    ran: list[list[int]] = field(default_factory=list)
    spans: list[list[tuple[float, float, int, str]]] = field(default_factory=list)
    placed: dict[int, tuple[int, ...]] = field(default_factory=dict)


def run_jobs_local(jobs: Sequence[LocalJob], workers: int = 2, policy: str = "fair",
                   placement: str = "batch-late", seed: int = 0, mean_delay: float = 0.1,
                   max_events: int = 5_000_000, validate: bool = False,
                   config: WorkerConfig | None = None) -> LocalPoolRun:
    """Run ``jobs`` on a pool of ``workers`` simulated workers; return what each gave.

    Raises RuntimeError if the pool stops making progress before every job ended (an engine
    bug) and ValueError for an unknown policy or a ``mean_delay`` (the mean of a message's
    seeded random delay, virtual seconds) that is not > 0. ``validate`` checks every job state's
    invariants after each event. A job whose report callback raises ends alone, with the
    :class:`canary.errors.TaskError` that ``canary.run_local`` raises for it (the report, its
    driver line, the traceback), as on a pool's host.
    """
    if not mean_delay > 0:  # the delays are exponential: a mean of 0 draws nothing
        raise ValueError(f"mean_delay must be > 0 (virtual seconds), got {mean_delay!r}")
    rng = random.Random(seed)
    ctrl = JobsController(workers, placement, seed=seed)
    config = config or WorkerConfig(adapt_fused=False)
    pool = [JobsWorker(w, workers, policy, config) for w in range(workers)]
    heap: list[tuple[float, int, int, Any]] = []
    last: dict[tuple[int, int], float] = {}
    busy = [0.0] * workers  # until when each worker's core runs its latest task
    counter = 0
    now = 0.0
    out = LocalPoolRun(ran=[[] for _ in range(workers)], spans=[[] for _ in range(workers)])
    by_id = {k + 1: job for k, job in enumerate(jobs)}
    t0 = time.perf_counter()

    def push(t: float, dest: int, item: Any) -> None:
        nonlocal counter
        counter += 1
        heapq.heappush(heap, (t, counter, dest, item))

    def eid(rank: int) -> int:
        return local_event_id(rank, counter + 1)

    def send(src: int, ins: Send) -> None:
        msg = ins.message
        inner = msg.message if type(msg) is Envelope else msg
        if isinstance(inner, (Piece, ReportPart)):  # MPI delivers a copy; so do we
            inner.array = np.array(inner.array, copy=True)
        elif isinstance(inner, PieceBatch):
            for piece in inner.pieces:
                piece.array = np.array(piece.array, copy=True)
        key = (src, ins.dest)
        t = max(now + rng.expovariate(1.0 / mean_delay), last.get(key, 0.0) + 1e-9)
        last[key] = t
        push(t, ins.dest, msg)

    def carry(rank: int, instrs: list[Any]) -> None:
        for ins in instrs:
            kind = type(ins)
            if kind is Send:
                send(rank, ins)
            elif kind is StartDriver:
                push(now, -rank, Declared(eid(rank), ins.job, by_id[ins.job].program))
            elif kind is RunJobTask:
                if now < busy[rank - 1]:
                    # the core still runs a task of a job that ended meanwhile (a task is never
                    # preempted): this one starts when that one is over
                    push(busy[rank - 1], -rank, ins)
                    continue
                job_state = pool[rank - 1].state_of(ins.job)
                if job_state is None:  # its job ended before it started: dropped, as on a host
                    continue
                ev = run_task(job_state, ins.task, eid(rank))
                if type(ev) is TaskDone:
                    if ins.task.kind == K_LOAD and workers > 1:  # a process's own copy
                        ev.outputs = tuple(np.array(v, copy=True) for v in ev.outputs)
                    job = by_id[ins.job]
                    mean = job.kind_time.get(ins.task.kind, job.task_time)
                    ev.seconds = rng.expovariate(1.0 / mean)
                    out.ran[rank - 1].append(ins.job)
                    out.spans[rank - 1].append((now, now + ev.seconds, ins.job, ins.task.kind))
                    busy[rank - 1] = now + ev.seconds
                    push(now + ev.seconds, -rank, Envelope(ins.job, ev))
                else:
                    push(now, -rank, Envelope(ins.job, ev))
            elif kind is YieldJob:
                push(now, -rank, Envelope(ins.job, Resume(eid(rank))))
            elif kind is JobCallback:
                failed = run_callback(ins.callback)
                if failed is not None:  # that job fails alone, as on a pool's host, not the run
                    carry(CONTROLLER, ctrl.handle(Envelope(ins.job, Failed(
                        eid(CONTROLLER), -1, failed))))
            elif kind is Release and rank == CONTROLLER:
                out.ended[ins.job] = now
                if ins.reason is None:
                    out.results[ins.job] = _result(ins.result, time.perf_counter() - t0)
                else:
                    out.results[ins.job] = ins.error(ins.reason)
            # JobNote, a worker's Release, StopPool: nothing to do in-process

    for k, job in by_id.items():
        spec = JobSpec(f"<program {job.program.name}>", (), job.user, job.priority, job.weight,
                       job.workers)
        push(job.at, CONTROLLER, Submit(local_event_id(CONTROLLER, 1 << 30 | k), k, spec))
        out.submitted[k] = job.at
        if job.cancel_at is not None:
            push(job.cancel_at, CONTROLLER, Cancel(local_event_id(CONTROLLER, 1 << 31 | k), k,
                                                   "cancelled by its submitter"))
    events = 0
    while heap and len(out.results) < len(by_id):
        now, _, dest, item = heapq.heappop(heap)
        events += 1
        if events > max_events:
            raise RuntimeError(f"run_jobs_local: more than {max_events} events")
        if dest == CONTROLLER:
            instrs = ctrl.handle(item)
            for k in ctrl.active:
                if k not in out.placed and ctrl.info(k).workers:
                    out.placed[k] = ctrl.info(k).workers
            carry(CONTROLLER, instrs)
            # a job cancelled while placing has no driver: it ends here
            for k, j in ctrl.jobs.items():
                if j.info.state == "ended" and k not in out.results and j.state is None \
                        and not j.ranks:
                    out.results[k] = JobAborted(j.info.reason or "ended")
                    out.ended[k] = now
        else:
            rank = abs(dest)
            w = pool[rank - 1]
            if type(item) is RunJobTask:  # handed out while the core was busy: it starts now
                carry(rank, [item])
                continue
            carry(rank, w.handle(item, now))
            if validate:
                for wj in w.jobs.values():
                    if wj.state is not None:
                        wj.state.validate_state()
    if len(out.results) < len(by_id):
        left = sorted(set(by_id) - set(out.results))
        raise RuntimeError(f"run_jobs_local: job(s) {left} never ended (an engine bug)")
    return out


def _result(state: ControllerState, seconds: float) -> JobResult:
    return JobResult(state.results, state.tasks_run, state.n_workers, seconds,
                     dict(state.received), dict(state.sent), math.nan, {}, state.migrations,
                     state.bytes_migrated, reports=state.program.reported)
