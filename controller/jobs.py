"""Rank 0 of a pool shared by several jobs, as a pure state machine: ``handle(event)``.

For each submitted job it is the job's Sparrow scheduler, then its controller:

* **Placement.** The job's placement policy object (:mod:`canary.sched.placement`, the
  simulator's) plans for ``m`` job workers (``JobSpec.workers`` or the whole pool). Random:
  the plan's workers at once. Per-task and batch sampling: a :class:`Probe` to each probed
  worker, then the plan's choice from the loads they report. Batch sampling with late binding:
  a :class:`Reserve` to each of the ``d*m`` workers; each queues it under its queue policy and
  sends :class:`Request` when it reaches the front; the first ``m`` get the job and every other
  a cancellation (:class:`Unreserve`). Each job has its own plan: jobs are placed concurrently,
  with no lock between them. A worker picked more than once counts once.
* **Running.** :class:`JobStart` tells each chosen worker its index and the pool ranks of the
  job's workers; the driver starts on rank 0 (:class:`StartDriver`), and once it declared the
  program (:class:`Declared`) the job's own
  :class:`~canary.controller.state.ControllerState` runs it unchanged, on job ranks translated
  to pool ranks. Its traffic stays what it is under ``canary run``.
* **Progress.** With ``progress_s`` > 0, each job's controller says where the job stands as
  under ``canary run`` (:mod:`canary.controller.progress`), in a :class:`JobNote` naming the
  job: on a :class:`Tick` at ``progress_s / 2`` seconds after the job was placed, then at
  least ``progress_s`` apart, from the load reports its workers send on their own ticks.
* **Ending.** The job's ``Finish`` releases rank 0's driver with the result, its ``Fail`` with
  the error; a driver that gave up on any rank (:class:`DriverEnded`) or a :class:`Cancel`
  aborts the job (its controller's ``Abort``, or :class:`JobEnd` before it has one). Nothing
  of one job touches another.

Randomness only from the seeded generator; no clock: the time is the latest :class:`Tick`'s
(``Submit`` order is the arrival order).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from canary.controller.state import ControllerState
from canary.errors import JobAborted
from canary.messages import (
    Callback,
    Fail,
    Failed,
    Finish,
    Hello,
    Progress,
    ReportPart,
    Send,
    Tick,
    worker_rank,
)
from canary.pool.messages import Cancel as CancelJob
from canary.pool.messages import (
    Declared,
    DriverEnded,
    Envelope,
    JobCallback,
    JobEnd,
    JobInfo,
    JobNote,
    JobStart,
    Probe,
    ProbeReply,
    Release,
    Request,
    Reserve,
    StartDriver,
    StopPool,
    Submit,
    Unreserve,
)
from canary.program import Program
from canary.sched.placement import EarlyBindingPlan, LateBindingPlan, make_placement

__all__ = ["JobsController"]


@dataclass
class _Job:
    info: JobInfo
    m: int = 0
    plan: EarlyBindingPlan | LateBindingPlan | None = None
    probes: list[int] = field(default_factory=list)
    loads: dict[int, int] = field(default_factory=dict)
    reserved: list[int] = field(default_factory=list)
    bound: list[int] = field(default_factory=list)
    ranks: tuple[int, ...] = ()
    state: ControllerState | None = None
    placed_at: float = 0.0  # the pool's clock when the job was placed: its own clock's 0
    inbox: list[Any] = field(default_factory=list)
    #: workers whose driver exited with status 0 before declaring a program: the job has
    #: none if rank 0's driver does the same; if it declares one, the drivers diverged
    clean_exits: list[int] = field(default_factory=list)


def _where(worker: int) -> str:
    """A driver's place in a job's messages: rank 0, or the worker and its pool rank (the
    number in its log's name)."""
    return "rank 0" if worker < 0 else f"worker {worker} (rank {worker_rank(worker)})"


class JobsController:
    """Rank 0 of a pool of ``n_workers`` workers placing jobs with policy ``placement``
    (``random``, ``per-task``, ``batch``, ``batch-late``) and probe ratio ``d``.

    Events: :class:`Submit`, :class:`ProbeReply`, :class:`Request`, :class:`Declared`,
    ``Envelope(job, message)`` from a job worker (or rank 0's ``Failed`` for a report
    callback of the job that raised, as a lone job's runner feeds it), :class:`DriverEnded`,
    :class:`Cancel`, :class:`Tick` (the pool's clock, seconds: each running job's controller
    gets it as seconds since the job was placed), :class:`StopPool` (local: tell every worker
    to leave). Instructions: ``Send(pool rank, message)``, :class:`StartDriver` (rank 0's
    driver), :class:`JobCallback`, :class:`JobNote` (a placement, a progress line),
    :class:`Release` (rank 0's driver returns the job's controller state on success, raises on
    failure; exactly once per started job).

    ``jobs`` keeps a :class:`JobInfo` per job until :meth:`forget`. Raises ValueError for an
    unknown placement policy or a job id submitted twice.
    """

    def __init__(self, n_workers: int, placement: str = "batch-late", d: float = 2.0,
                 seed: int = 0, progress_s: float = 0.0) -> None:
        if n_workers < 1:
            raise ValueError(f"a pool needs at least one worker, got {n_workers}")
        self.n_workers = n_workers
        self.progress_s = progress_s  # each job's period between progress lines (0: none)
        self._now = 0.0  # the latest Tick's
        self.placement = make_placement(placement, d)
        self.rng = np.random.default_rng(seed)
        self.jobs: dict[int, _Job] = {}
        self._eid = 0
        self._cause = 0

    @property
    def active(self) -> list[int]:
        """Jobs not yet ended."""
        return [k for k, j in self.jobs.items() if j.info.state != "ended"]

    def info(self, job: int) -> JobInfo:
        return self.jobs[job].info

    def forget(self, job: int) -> None:
        """Drop an ended job's record (its memory with it)."""
        j = self.jobs.get(job)
        if j is not None and j.info.state == "ended":
            del self.jobs[job]

    def handle(self, event: Any) -> list[Any]:
        out: list[Any] = []
        self._cause = event.eid
        kind = type(event)
        if kind is Envelope:
            self._on_job_message(event, out)
        elif kind is Submit:
            self._on_submit(event, out)
        elif kind is ProbeReply:
            self._on_probe_reply(event, out)
        elif kind is Request:
            self._on_request(event, out)
        elif kind is Declared:
            self._on_declared(event, out)
        elif kind is DriverEnded:
            self._on_driver_ended(event, out)
        elif kind is Tick:
            self._on_tick(event, out)
        elif kind is CancelJob:
            j = self.jobs.get(event.job)
            if j is not None:
                self._abort(j, event.reason, out)
        elif kind is StopPool:
            out += [self._send(worker_rank(w), StopPool(self._next_eid()))
                    for w in range(self.n_workers)]
        else:
            raise TypeError(f"the pool's rank 0 cannot handle {event!r}")
        return out

    # ------------------------------------------------------------------ placement
    def _on_submit(self, ev: Submit, out: list[Any]) -> None:
        if ev.job in self.jobs:
            raise ValueError(f"job {ev.job} was submitted twice")
        spec = ev.spec
        j = _Job(JobInfo(ev.job, spec))
        self.jobs[ev.job] = j
        m = min(spec.workers or self.n_workers, self.n_workers)
        j.m = m
        plan = self.placement.plan(m, self.n_workers, self.rng)
        j.plan = plan
        if isinstance(plan, LateBindingPlan):
            j.reserved = list(dict.fromkeys(plan.reservations.tolist()))
            j.m = min(m, len(j.reserved))
            out += [self._send(worker_rank(w), Reserve(self._next_eid(), ev.job, spec))
                    for w in j.reserved]
            return
        if plan.probes.size == 0:
            self._start(j, plan.assign([]).tolist(), out)
            return
        j.probes = plan.probes.tolist()
        out += [self._send(worker_rank(w), Probe(self._next_eid(), ev.job))
                for w in dict.fromkeys(j.probes)]

    def _on_probe_reply(self, ev: ProbeReply, out: list[Any]) -> None:
        j = self.jobs.get(ev.job)
        if j is None or j.info.state != "placing":
            return
        j.loads[ev.worker] = ev.load
        if len(j.loads) < len(set(j.probes)):
            return
        assert isinstance(j.plan, EarlyBindingPlan)
        self._start(j, j.plan.assign([j.loads[w] for w in j.probes]).tolist(), out)

    def _on_request(self, ev: Request, out: list[Any]) -> None:
        j = self.jobs.get(ev.job)
        if (j is None or j.info.state != "placing" or ev.worker in j.bound
                or not isinstance(j.plan, LateBindingPlan) or j.plan.request(ev.worker) is None):
            out.append(self._send(worker_rank(ev.worker), Unreserve(self._next_eid(), ev.job)))
            return
        j.bound.append(ev.worker)
        if len(j.bound) < j.m:
            return
        late = [w for w in j.plan.cancellations() if w not in j.bound]
        self._start(j, j.bound, out)
        out += [self._send(worker_rank(w), Unreserve(self._next_eid(), ev.job)) for w in late]

    def _start(self, j: _Job, workers: list[int], out: list[Any]) -> None:
        chosen = list(dict.fromkeys(workers))
        j.ranks = tuple(worker_rank(w) for w in chosen)
        j.placed_at = self._now
        j.info.state = "running"
        j.info.workers = tuple(chosen)
        job = j.info.job
        out += [self._send(r, JobStart(self._next_eid(), job, i, j.ranks, j.info.spec))
                for i, r in enumerate(j.ranks)]
        out.append(StartDriver(job, 0, len(j.ranks) + 1, j.info.spec, self._cause))
        out.append(JobNote(job, f"canary pool: job {job} placed on worker(s) "
                                f"{', '.join(map(str, chosen))} "
                                f"({self.placement.name} placement)", self._cause))

    # ------------------------------------------------------------------ running
    def _on_declared(self, ev: Declared, out: list[Any]) -> None:
        j = self.jobs.get(ev.job)
        if j is None or j.info.state != "running" or j.state is not None:
            return
        if j.clean_exits:
            w = j.clean_exits[0]
            self._abort(j, f"the driver on {_where(w)} exited with status 0 without running a "
                           "program, and the one on rank 0 declared a program: every rank "
                           "runs the same driver, so it must not choose by rank, host, time "
                           "or an unseeded random", out)
            return
        program: Program = ev.program
        try:
            j.state = ControllerState(program, len(j.ranks), None, stall_s=float("inf"),
                                      progress_s=self.progress_s,
                                      progress_heading=f"canary pool: job {j.info.job}")
        except Exception as exc:  # noqa: BLE001 - one job's failure must not end the pool
            self._abort(j, f"{type(exc).__name__}: {exc}", out)
            return
        inbox, j.inbox = j.inbox, []
        for msg in inbox:
            self._feed(j, msg, out)

    def _on_tick(self, ev: Tick, out: list[Any]) -> None:
        """The pool's clock to each running job's controller, as the job's own: seconds since
        it was placed (under ``canary run``, since its controller started)."""
        self._now = ev.now
        for j in self.jobs.values():
            if j.state is not None and j.info.state == "running":
                self._feed(j, Tick(ev.eid, ev.now - j.placed_at), out)

    def _on_job_message(self, ev: Envelope, out: list[Any]) -> None:
        j = self.jobs.get(ev.job)
        if j is None or j.info.state == "ended":
            return  # a late message of a job that ended
        if j.state is None:
            j.inbox.append(ev.message)
            return
        self._feed(j, ev.message, out)

    def _feed(self, j: _Job, msg: Any, out: list[Any]) -> None:
        assert j.state is not None
        if type(msg) is ReportPart:
            # a report's iteration is its loop counters, outermost first: one sent in the
            # outermost loop's k-th pass (from 0) shows k + 1 passes reached; one outside any
            # loop says nothing of them
            if msg.iteration:
                j.info.iteration = max(j.info.iteration, int(msg.iteration[0]) + 1)
            j.info.reports += 1
        try:
            instrs = j.state.handle(msg)
        except Exception as exc:  # noqa: BLE001 - one job's failure must not end the pool
            self._abort(j, f"{type(exc).__name__}: {exc}", out)
            return
        self._apply(j, instrs, out)

    def _apply(self, j: _Job, instrs: list[Any], out: list[Any]) -> None:
        job = j.info.job
        for ins in instrs:
            kind = type(ins)
            if kind is Send:
                out.append(Send(j.ranks[ins.dest - 1], Envelope(job, ins.message), ins.cause))
            elif kind is Callback:
                out.append(JobCallback(job, ins, ins.cause))
            elif kind is Progress:
                out.append(JobNote(job, ins.line, ins.cause))
            elif kind is Finish:
                j.info.state = "ended"
                out.append(Release(job, None, JobAborted, j.state, ins.cause))
            elif kind is Fail:
                j.info.state = "ended"
                j.info.reason = ins.reason
                out.append(Release(job, ins.reason, ins.error, None, ins.cause))

    def _abort(self, j: _Job, reason: str, out: list[Any]) -> None:
        """End the job with ``reason``: through its controller when it has one (every worker
        gets its ``Abort``), else with :class:`JobEnd` to its workers or :class:`Unreserve` to
        the workers still holding its reservations."""
        info = j.info
        if info.state == "ended":
            return
        job = info.job
        if info.state == "placing":
            targets = j.reserved or list(dict.fromkeys(j.probes))
            out += [self._send(worker_rank(w), Unreserve(self._next_eid(), job))
                    for w in targets]
            info.state = "ended"
            info.reason = reason
            return  # no driver started: nothing to release
        if j.state is not None and not j.state.finished and j.state.failed is None:
            before = len(out)
            self._apply(j, j.state.handle(Failed(self._next_eid(), -1, reason)), out)
            for k in range(before, len(out)):  # not a task of the job that failed
                ins = out[k]
                if type(ins) is Release:
                    out[k] = Release(job, reason, JobAborted, None, ins.cause)
            return
        self._end_undeclared(j, reason, out)

    def _end_undeclared(self, j: _Job, reason: str | None, out: list[Any]) -> None:
        """End a job whose drivers run but declared no program: :class:`JobEnd` to its workers
        and its drivers released, with ``reason`` (None: it has no program, and ends well)."""
        out += [self._send(r, JobEnd(self._next_eid(), j.info.job, reason)) for r in j.ranks]
        j.info.state = "ended"
        j.info.reason = reason
        out.append(Release(j.info.job, reason, JobAborted, None, self._cause))

    def _on_driver_ended(self, ev: DriverEnded, out: list[Any]) -> None:
        """A driver ended before its job did, or the job's state failed on a worker. A driver
        that exited with status 0 before any program was declared (``--help``) ends the job
        without one, once rank 0's has done so (the workers' may end first); any other end
        aborts the job."""
        j = self.jobs.get(ev.job)
        if j is None:
            return
        if ev.clean and j.state is None and j.info.state == "running":
            if ev.worker >= 0:
                j.clean_exits.append(ev.worker)
                return
            declared = [m.worker for m in j.inbox if type(m) is Hello]
            if declared:  # (a worker's Hello still on its way is not seen: it gets JobEnd)
                self._abort(j, f"the driver on rank 0 exited with status 0 without running a "
                               f"program, and the one on {_where(declared[0])} declared a "
                               "program: every rank runs the same driver, so it must not "
                               "choose by rank, host, time or an unseeded random", out)
                return
            self._end_undeclared(j, None, out)
            return
        self._abort(j, f"the job stopped on {_where(ev.worker)}: {ev.message}", out)

    # ------------------------------------------------------------------ helpers
    def _send(self, dest: int, msg: Any) -> Send:
        return Send(dest, msg, self._cause)

    def _next_eid(self) -> int:
        self._eid += 1
        return self._eid
