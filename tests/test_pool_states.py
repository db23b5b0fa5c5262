"""The pool's pure state machines: queue policies, Sparrow placement and job routing as exact
decisions, and whole multi-job runs in-process (answers, isolation, cancel)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import canary
from canary.controller.jobs import JobsController
from canary.errors import JobAborted, TaskError
from canary.messages import CONTROLLER, Hello, Send, worker_rank
from canary.pool.local import LocalJob, run_jobs_local
from canary.pool.messages import (
    Cancel,
    Declared,
    DriverEnded,
    Envelope,
    JobEnd,
    JobNote,
    JobSpec,
    JobStart,
    Probe,
    ProbeReply,
    Release,
    Request,
    Reserve,
    StartDriver,
    Submit,
    Unreserve,
)
from canary.sched.placement import make_placement
from canary.sched.queues import WeightedFairQueue
from canary.worker.jobs import JobQueue, JobsWorker, instance_bound
from tests.conftest import declared_at


def program(name: str, parts: int = 3, iters: int = 6, scale: float = 1.0,
            fail_at: float | None = None) -> canary.Program:
    """A small iterative job: broadcast, compute, reduce, reported at the end."""
    p = canary.Program(name)
    x = p.dataset("x", parts)
    s = p.dataset("s", 1)
    local = p.dataset("local", parts)
    p.load([x], lambda i, n: np.arange(4.0) + i * scale, name="load")
    p.load([s], lambda i, n: np.zeros(4), name="init")

    def step(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        if fail_at is not None and b[0] > fail_at:
            raise ValueError("the kernel failed on purpose")
        return a * 1.01 + b * 0.001

    with p.loop(iters):  # declared: the loop of program()
        p.broadcast(s, local)
        p.compute(step, [x, local], [x])
        p.reduce(x, s)
    p.report(s, name="final")
    return p


# ---------------------------------------------------------------- queue policies
def reducing_job(name: str, iters: int) -> canary.Program:
    """Two partitions, each iteration a compute (the time) and a reduce onto one partition
    (next to nothing): a task that feeds another worker, whose state yields after it."""
    p = canary.Program(name)
    x = p.dataset("x", 2)
    s = p.dataset("s", 1)
    p.load([x], lambda i, n: np.full(4, float(i)), name="load")
    with p.loop(iters):
        p.compute(lambda a: a + 1.0, [x], [x])
        p.reduce(x, s)
    p.report(s, name="final")
    return p


def _drain(q: JobQueue, now: float = 0.0) -> list[int]:
    order = []
    while len(q):
        got = q.pop(now)
        assert got is not None
        order.append(got[0])
        q.finished(got[0], 0.001, now)
    return order


def test_fifo_serves_jobs_in_arrival_order_whatever_the_order_their_tasks_became_ready() -> None:
    q = JobQueue("fifo")
    q.add_job(1, 0, 0, 1.0, 0.0)
    q.add_job(2, 0, 0, 1.0, 0.0)
    q.push(2, "b", 0.0)
    q.push(1, "a", 0.0)
    q.push(2, "b2", 0.0)
    assert _drain(q) == [1, 2, 2]


def test_priority_serves_the_lower_level_first_and_arrival_order_within_a_level() -> None:
    q = JobQueue("priority")
    q.add_job(1, 0, 1, 1.0, 0.0)
    q.add_job(2, 0, 0, 1.0, 0.0)
    q.add_job(3, 0, 1, 1.0, 0.0)
    for key in (1, 3, 2):
        q.push(key, None, 0.0)
    assert _drain(q) == [2, 1, 3]


def test_weighted_fair_gives_users_service_in_proportion_to_their_weights() -> None:
    q = JobQueue("fair")
    q.add_job(1, 0, 0, 1.0, 0.0)  # user 0, weight 1
    q.add_job(2, 1, 0, 2.0, 0.0)  # user 1, weight 2
    served = []
    for _ in range(30):  # each job keeps one unit ready, as a job's state does
        for key in (1, 2):
            if key not in [k for k, _ in q._units.items() if q._units[k]]:
                q.push(key, None, 0.0)
        got = q.pop(0.0)
        assert got is not None
        served.append(got[0])
        q.finished(got[0], 0.001, 0.0)
    assert served.count(2) == 2 * served.count(1)


class _ScriptedState:
    """A job's state that hands out one task per event; with ``yields`` its state first
    stops after each task (a ``Yield``: its output must leave before it goes on), as a
    task whose result another worker waits for does."""

    def __init__(self, job: int, yields: bool) -> None:
        self.job, self.yields, self.n = job, yields, 0

    def handle(self, msg: object) -> list[object]:
        from canary.messages import Resume, TaskDone, Yield
        from canary.worker.tasks import RunTask

        if type(msg) is TaskDone and self.yields:
            return [Yield()]
        assert type(msg) in (TaskDone, Resume)
        self.n += 1
        return [RunTask(f"{self.job}.{self.n}")]  # type: ignore[arg-type]


def test_a_job_that_yielded_keeps_its_fair_turn() -> None:
    """The worker picks nothing while a job's state has yielded: that job's next task comes
    with the Resume. Picking at once found its queue empty, and the fair policy restarted it
    behind the other job each time: weights 1 and 2 got one task each, turn about."""
    from canary.messages import Resume, TaskDone
    from canary.pool.messages import RunJobTask, YieldJob

    w = JobsWorker(0, 1, "fair")
    for job, user, weight in ((1, "one", 1.0), (2, "two", 2.0)):
        w.handle(JobStart(job, job, 0, (1,), JobSpec(user=user, weight=weight)))
        w.jobs[job].state = _ScriptedState(job, yields=job == 1)  # type: ignore[assignment]
    out = w.handle(Envelope(1, Resume(10)), 0.0) + w.handle(Envelope(2, Resume(11)), 0.0)
    ran = [out[0].job]
    assert out == [RunJobTask.match(job=1)]
    eid, now = 20, 0.0
    for _ in range(11):
        job = ran[-1]
        now += 1.0
        eid += 1
        out = w.handle(Envelope(job, TaskDone(eid, None, None, 1.0)), now)
        if job == 1:  # it yielded: nothing is picked until it resumed
            assert out == [YieldJob(1)]
            eid += 1
            out = w.handle(Envelope(1, Resume(eid)), now)
        assert out == [RunJobTask.match()]
        ran.append(out[0].job)
    assert ran.count(2) == 2 * ran.count(1)


def test_weighted_fair_share_holds_on_a_pool_whose_tasks_feed_another_worker() -> None:
    """Two users with weights 1 and 2, one job each on both workers; each iteration's compute
    sends its partition to the reduce on the other worker (its state yields after it). While
    the weight-2 job runs, the weight-1 job gets a third of each worker's CPU time."""

    for seed in range(3):
        # compute takes the time, the rest (the reduce, the loads) next to nothing
        run = run_jobs_local([LocalJob(reducing_job(u, 300), user=u, weight=w, task_time=0.01,
                                       kind_time={"compute": 1.0})
                              for u, w in (("one", 1.0), ("two", 2.0))],
                             workers=2, policy="fair", seed=seed, mean_delay=0.01)
        for spans in run.spans:  # while the weight-2 job computes on the worker
            lo = min(a for a, _, j, kind in spans if j == 2 and kind == "compute")
            hi = max(b for _, b, j, kind in spans if j == 2 and kind == "compute")
            used = {1: 0.0, 2: 0.0}
            for a, b, j, _ in spans:
                used[j] += max(0.0, min(b, hi) - max(a, lo))
            assert used[1] / (used[1] + used[2]) == pytest.approx(1 / 3, abs=0.02), seed


def test_hfsp_gives_the_lowest_mean_response_on_a_mixed_workload() -> None:
    """Mostly small jobs and a few large ones, Poisson arrivals at load 0.7 on two workers
    (issue 20's size-based figure, in-process). A large job whose estimate came out low goes
    late; it must share the core with newcomers rather than hold it to its end."""

    for seed in (1, 2):
        rng = np.random.default_rng(seed)
        large = rng.random(40) < 0.1
        large[13] = True
        iters = np.where(large, 100, 4)
        arrivals = np.cumsum(rng.exponential(float(iters.mean()) / 0.7, 40))
        mean = {}
        for policy in ("fifo", "fair", "hfsp"):
            run = run_jobs_local([LocalJob(reducing_job(f"j{k}", int(n)), at=float(at), task_time=0.01,
                                           kind_time={"compute": 1.0})
                                  for k, (n, at) in enumerate(zip(iters, arrivals))],
                                 workers=2, policy=policy, seed=seed, mean_delay=0.01)
            assert all(isinstance(r, canary.JobResult) for r in run.results.values())
            mean[policy] = np.mean([run.ended[k] - run.submitted[k] for k in run.ended])
        assert mean["hfsp"] < mean["fair"] < mean["fifo"], (seed, mean)


def test_hfsp_serves_an_untrained_job_first_then_the_smaller_estimate() -> None:
    q = JobQueue("hfsp")
    q.add_job(1, 0, 0, 1.0, 0.0)
    q.add_job(2, 0, 0, 1.0, 0.0)
    q.set_estimate(1, 100.0, 0.0)  # job 1 trained: large
    q.push(1, None, 0.0)
    q.push(2, None, 0.0)
    assert q.pop(0.0) == (2, None)  # untrained (estimate 0): first
    q.finished(2, 0.01, 0.01)
    q.set_estimate(2, 1.0, 0.01)
    q.push(2, None, 0.01)
    assert q.pop(0.02) == (2, None)  # smaller remaining size
    q.finished(2, 0.01, 0.03)
    assert q.pop(0.03) == (1, None)


def test_hfsp_worker_drops_a_cancelled_job_from_the_virtual_system_and_keeps_a_done_one() -> None:
    """PSBS keeps a job that finished in its virtual system to its virtual end; a job that
    was cancelled will never run again and must not keep its share of it (it slowed virtual
    time for the others, which newcomers then passed)."""
    from canary.messages import Abort, Shutdown
    from canary.sched.hfsp import HfspJobs

    w = JobsWorker(0, 1, "hfsp")
    for job in (1, 2, 3):
        w.handle(JobStart(job, job, 0, (1,), JobSpec()), 0.0)
        w.queue.set_estimate(job, 10.0, 0.0)  # trained: 10 s each, virtually to t=30
    jobs = w.queue._jobs
    assert isinstance(jobs, HfspJobs) and jobs.virtual_jobs == 3
    w.handle(Envelope(1, Abort(5, "cancelled by `canary cancel`")), 3.0)
    assert jobs.virtual_jobs == 2
    w.handle(Envelope(2, Shutdown(6)), 4.0)  # done
    assert jobs.virtual_jobs == 2
    # V(3) = 1, then two jobs share: V(4) = 1.5, and jobs 2 and 3 end virtually at 4 + 2 * 8.5
    assert jobs.virtual_time(20.9) < 10.0 and jobs.virtual_jobs == 2
    assert jobs.virtual_time(21.0) == pytest.approx(10.0) and jobs.virtual_jobs == 0


def test_a_removed_job_leaves_nothing_in_the_queue() -> None:
    for policy in ("fifo", "priority", "fair", "hfsp"):
        q = JobQueue(policy)
        q.add_job(1, 0, 0, 1.0, 0.0)
        q.add_job(2, 1, 0, 1.0, 0.0)
        q.push(1, "a", 0.0)
        q.push(2, "b", 0.0)
        assert q.remove_job(1) == ["a"]
        assert _drain(q) == [2], policy
        assert 1 not in q


def test_removing_a_job_leaves_the_other_users_fair_shares_as_they_were() -> None:
    """Users of equal weight, one with 1 s tasks and one with 0.1 s tasks, share CPU time
    equally while other jobs' reservations come and go (batch-late's withdrawn ones).
    Removing a job rebuilt the fair queue by popping and pushing every other item again,
    which charged each its cost a second time: the user of long tasks lost a turn at every
    removal, and with one every 3 picks got 0.5 % of the core."""
    q = JobQueue("fair")
    q.add_job(1, 0, 0, 1.0, 0.0)
    q.add_job(2, 1, 0, 1.0, 0.0)
    q.push(1, None, 0.0)
    q.push(2, None, 0.0)
    used, now = {1: 0.0, 2: 0.0}, 0.0
    for step in range(600):
        if step % 3 == 0:  # a reservation of another user's job, withdrawn while queued
            q.add_job(-100 - step, 2, 0, 1.0, now)
            q.push(-100 - step, "reservation", now)
            assert q.remove_job(-100 - step) == ["reservation"]
        got = q.pop(now)
        assert got is not None
        seconds = 1.0 if got[0] == 1 else 0.1
        now += seconds
        used[got[0]] += seconds
        q.finished(got[0], seconds, now)
        q.push(got[0], None, now)
    assert used[1] / (used[1] + used[2]) == pytest.approx(0.5, abs=0.02)


def test_cancelling_jobs_with_a_task_queued_leaves_their_users_share_as_it_was() -> None:
    """Users of equal weight and 1 s tasks: user 0 runs two jobs at once, one of which is
    cancelled every 4 picks, its task queued, and replaced at once; user 1 runs one job. The
    fair queue kept each dropped task charged to user 0, which lost a turn per cancel: 0.377
    of the core instead of 0.5."""
    q = JobQueue("fair")
    for key, user in ((1, 0), (2, 0), (3, 1)):
        q.add_job(key, user, 0, 1.0, 0.0)
        q.push(key, None, 0.0)
    live, used, now, new = [1, 2], {0: 0.0, 1: 0.0}, 0.0, 10
    for step in range(600):
        got = q.pop(now)
        assert got is not None
        key = got[0]
        now += 1.0
        used[int(key == 3)] += 1.0
        q.finished(key, 1.0, now)
        q.push(key, None, now)
        if step % 4 == 3:
            gone = live.pop(0)
            assert q.remove_job(gone) == [None]  # its task was queued
            q.add_job(new, 0, 0, 1.0, now)
            q.push(new, None, now)
            live.append(new)
            new += 1
    assert used[0] / (used[0] + used[1]) == pytest.approx(0.5, abs=0.01)


def test_the_latest_job_of_a_user_sets_the_users_weight_on_a_worker() -> None:
    # an older job's start (its JobStart comes after the newer job's reservation) set the
    # user's weight back to the older job's
    w = JobsWorker(0, 2, "fair")
    w.handle(Reserve(1, 1, JobSpec(user="ann", weight=1.0, workers=2)))
    w.handle(Reserve(2, 2, JobSpec(user="ann", weight=3.0, workers=2)))
    w.handle(JobStart(3, 1, 0, (1,), JobSpec(user="ann", weight=1.0, workers=2)))
    items = w.queue._items
    assert isinstance(items, WeightedFairQueue)
    assert items.weights[w.user_id("ann")] == 3.0


def test_bad_queue_input_is_rejected_with_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown queue policy 'lifo'"):
        JobQueue("lifo")
    q = JobQueue("fair")
    with pytest.raises(ValueError, match="weight must be > 0"):
        q.add_job(1, 0, 0, -1.0, 0.0)
    # the in-process pool's message delays: a mean of 0 was a ZeroDivisionError
    with pytest.raises(ValueError, match="mean_delay must be > 0"):
        run_jobs_local([LocalJob(program("a", 2, 2))], mean_delay=0.0)


def test_instance_bound_counts_loops_at_their_bounds() -> None:
    p = program("bound", iters=6).finalize()
    # two loads, three stages per iteration, one report
    assert instance_bound(p.ops) == 2 + 6 * 3 + 1


# ---------------------------------------------------------------- placement decisions
def test_batch_late_reserves_d_times_m_workers_and_binds_the_first_m_to_ask() -> None:
    ctrl = JobsController(4, "batch-late", d=2.0, seed=7)
    spec = JobSpec("drv.py", (), "ann", 0, 1.0, workers=2)
    out = ctrl.handle(Submit(1, 1, spec))
    expected = make_placement("batch-late", 2.0).plan(2, 4, np.random.default_rng(7))
    reserved = list(dict.fromkeys(expected.reservations.tolist()))
    assert len(reserved) == 4
    assert out == [Send(w + 1, Reserve(k, 1, spec), 1) for k, w in enumerate(reserved, 1)]
    first, second, third, fourth = reserved
    assert ctrl.handle(Request(10, 1, first)) == []
    out = ctrl.handle(Request(11, 1, second))
    ranks = (first + 1, second + 1)
    late = sorted({third, fourth})
    assert out == [Send(first + 1, JobStart(5, 1, 0, ranks, spec), 11),
                   Send(second + 1, JobStart(6, 1, 1, ranks, spec), 11),
                   StartDriver(1, 0, 3, spec, 11),
                   JobNote.match(job=1),
                   Send(late[0] + 1, Unreserve(7, 1), 11),
                   Send(late[1] + 1, Unreserve(8, 1), 11)]
    # a request that crossed the cancellation gets a no
    assert ctrl.handle(Request(12, 1, third)) == [Send(third + 1, Unreserve(9, 1), 12)]


def test_batch_sampling_probes_and_places_on_the_least_loaded() -> None:
    ctrl = JobsController(4, "batch", d=2.0, seed=3)
    spec = JobSpec("drv.py", workers=1)
    out = ctrl.handle(Submit(1, 1, spec))
    probed = [ins.dest - 1 for ins in out]
    assert out == [Send(w + 1, Probe(k, 1), 1) for k, w in enumerate(probed, 1)]
    assert len(probed) == 2
    assert ctrl.handle(ProbeReply(20, 1, probed[0], 5)) == []
    out = ctrl.handle(ProbeReply(21, 1, probed[1], 1))
    assert out[0] == Send(probed[1] + 1, JobStart(3, 1, 0, (probed[1] + 1,), spec), 21)


def test_cancel_while_placing_withdraws_every_reservation() -> None:
    ctrl = JobsController(3, "batch-late", seed=1)
    out = ctrl.handle(Submit(1, 1, JobSpec(workers=1)))
    reserved = [ins.dest for ins in out]
    out = ctrl.handle(Cancel(2, 1, "no longer wanted"))
    assert out == [Send(r, Unreserve(k, 1), 2) for k, r in enumerate(reserved, len(reserved) + 1)]
    assert ctrl.info(1).state == "ended"


def _running(workers: int = 2) -> tuple[JobsController, tuple[int, ...]]:
    """A controller with job 1 running on ``workers`` of 2 workers: its ranks."""
    ctrl = JobsController(2, "batch-late", d=1.0, seed=0)
    out = ctrl.handle(Submit(1, 1, JobSpec("drv.py", workers=workers)))
    for k, ins in enumerate(out, 10):
        ctrl.handle(Request(k, 1, ins.dest - 1))
    assert ctrl.info(1).state == "running"
    return ctrl, tuple(worker_rank(w) for w in ctrl.info(1).workers)


def test_drivers_that_exit_0_without_a_program_end_the_job_quietly() -> None:
    # `canary submit app.py --help`: it was "job aborted: the driver on worker 1 gave up"
    ctrl, ranks = _running()
    assert ctrl.handle(DriverEnded(20, 1, 1, "its driver exited with status 0", True)) == []
    assert ctrl.info(1).state == "running"  # rank 0's driver may still declare a program
    out = ctrl.handle(DriverEnded(21, 1, -1, "its driver exited with status 0", True))
    eids = [ins.message.eid for ins in out[:-1]]
    assert out == [Send(r, JobEnd(k, 1, None), 21) for k, r in zip(eids, ranks)] + \
        [Release(1, None, JobAborted, None, 21)]
    assert ctrl.info(1).state == "ended" and ctrl.info(1).reason is None


@pytest.mark.parametrize("exits, declares", [(1, -1), (-1, 1)])
def test_a_driver_that_exits_0_while_another_declares_a_program_aborts_the_job(
        exits: int, declares: int) -> None:
    # rank 0's exit after a worker's declaration ended the job as done, the program dropped
    ctrl, _ = _running()
    p = program("p", 2, 2)
    exit_0 = "its driver exited with status 0"
    if exits > 0:  # the worker's driver ends, then rank 0's declares
        events: list[Any] = [DriverEnded(20, 1, exits, exit_0, True), Declared(21, 1, p)]
    else:  # the worker's declaration waits for rank 0's, whose driver ends instead
        events = [Envelope(1, Hello(20, declares, p.digest, p.statements())),
                  DriverEnded(21, 1, exits, exit_0, True)]
    out = [ins for ev in events for ins in ctrl.handle(ev)]
    where = {-1: "rank 0", 1: "worker 1 (rank 2)"}
    assert ctrl.info(1).state == "ended"
    reason = ctrl.info(1).reason
    assert reason is not None and reason.startswith(
        f"the driver on {where[exits]} exited with status 0 without running a program, and "
        f"the one on {where[declares]} declared a program")
    assert Release(1, reason, JobAborted, None, 21) in out


@pytest.mark.parametrize("worker, where", [(1, "worker 1 (rank 2)"), (-1, "rank 0")])
def test_a_driver_that_fails_or_exits_after_declaring_aborts_the_job_naming_it(
        worker: int, where: str) -> None:
    ctrl, _ = _running()
    ctrl.handle(DriverEnded(20, 1, worker, "its driver failed: ValueError: bad row"))
    assert ctrl.info(1).reason == f"the job stopped on {where}: its driver failed: ValueError: " \
                                  "bad row"
    ctrl, _ = _running()
    ctrl.handle(Declared(20, 1, program("p", 2, 2)))
    ctrl.handle(DriverEnded(21, 1, worker, "its driver exited with status 0 before the job "
                                           "ended", True))  # clean, but after declaring
    assert ctrl.info(1).state == "ended"
    assert ctrl.info(1).reason == f"the job stopped on {where}: its driver exited with " \
                                  "status 0 before the job ended"


# ---------------------------------------------------------------- a worker's routing
def test_a_worker_asks_for_the_job_when_its_reservation_reaches_the_front() -> None:
    w = JobsWorker(0, 2, "priority")
    spec = JobSpec(priority=0)
    assert w.handle(Reserve(1, 5, spec)) == [Send(CONTROLLER, Request(1, 5, 0), 1)]
    assert w.handle(Probe(2, 6)) == [Send(CONTROLLER, ProbeReply(2, 6, 0, 1), 2)]
    assert w.handle(Unreserve(3, 5)) == []
    assert w.load == 0


def test_a_worker_binds_one_job_at_a_time_and_asks_for_the_next_once_it_started() -> None:
    from canary.messages import Placement
    from canary.partition_map import PartitionMap
    from canary.pool.messages import Declared, RunJobTask

    w = JobsWorker(0, 2, "fifo")
    spec = JobSpec(workers=1)
    assert w.handle(Reserve(1, 5, spec)) == [Send(CONTROLLER, Request(1, 5, 0), 1)]
    # job 5 is being asked for: the core is promised to it, so 6 and 7 wait their turn
    assert w.handle(Reserve(2, 6, spec)) == []
    assert w.handle(Reserve(3, 7, spec)) == []
    assert w.load == 3
    # declined: the next reservation in line is asked for at once
    assert w.handle(Unreserve(4, 5)) == [Send(CONTROLLER, Request(2, 6, 0), 4)]
    assert w.handle(Unreserve(5, 7)) == []  # withdrawn while waiting aside
    assert w.handle(Reserve(6, 8, spec)) == []
    assert w.handle(JobStart(7, 6, 0, (1,), spec)) == [StartDriver(6, 1, 2, spec, 7)]
    p = program("six", parts=1, iters=1)
    assert w.handle(Declared(8, 6, p)) == [Send.match(dest=0)]  # Hello; not started yet
    out = w.handle(Envelope(6, Placement(9, PartitionMap.initial(
        [g[0].partitions for g in p.finalize().groups], 1))))
    # started here (its map arrived): job 8 is asked for (FIFO: its reservation came before
    # job 6 was placed here) and job 6's first task runs
    assert out == [Send(CONTROLLER, Request(3, 8, 0), 9), RunJobTask.match(job=6)]


def test_a_worker_does_not_wait_for_a_job_on_several_workers() -> None:
    # two such jobs each waiting on one of two workers would wait for each other for ever
    w = JobsWorker(0, 2, "fifo")
    assert w.handle(Reserve(1, 5, JobSpec(workers=2))) == [Send(CONTROLLER, Request(1, 5, 0), 1)]
    assert w.handle(Reserve(2, 6, JobSpec())) == [Send(CONTROLLER, Request(2, 6, 0), 2)]
    assert w.binding is None


def test_a_jobs_messages_before_its_driver_declared_wait_and_late_ones_are_dropped() -> None:
    from canary.messages import Placement, Shutdown
    from canary.partition_map import PartitionMap
    from canary.pool.messages import Declared

    w = JobsWorker(1, 2, "fifo")
    spec = JobSpec()
    assert w.handle(JobStart(1, 9, 0, (2,), spec)) == [StartDriver(9, 1, 2, spec, 1)]
    p = program("early", parts=2, iters=1)
    placement = Placement(2, PartitionMap.initial([g[0].partitions for g in
                                                   p.finalize().groups], 1))
    assert w.handle(Envelope(9, placement)) == []  # not declared yet: kept
    out = w.handle(Declared(3, 9, p))
    # Hello to the job's controller (pool rank 0), then the first task of the job
    assert out[0] == Send.match(dest=0)
    assert type(out[0].message) is Envelope and out[0].message.job == 9
    assert any(type(i).__name__ == "RunJobTask" for i in out)
    assert w.handle(Envelope(9, Shutdown(4))) == [Release(9, None, JobAborted, None, 4)]
    assert w.handle(Envelope(9, Shutdown(5))) == []  # the job is gone here


# ---------------------------------------------------------------- whole runs in-process
@pytest.mark.parametrize("policy", ["fifo", "priority", "fair", "hfsp"])
@pytest.mark.parametrize("placement", ["random", "per-task", "batch", "batch-late"])
def test_jobs_sharing_a_pool_give_their_solo_answers(policy: str, placement: str) -> None:
    solo_a = canary.run_local(program("a", 4, 8, 1.0), workers=2).value("s")
    solo_b = canary.run_local(program("b", 3, 5, 2.0), workers=3).value("s")
    for seed in range(3):
        run = run_jobs_local([LocalJob(program("a", 4, 8, 1.0)),
                              LocalJob(program("b", 3, 5, 2.0), user="bob", priority=1,
                                       at=0.5)],
                             workers=3, policy=policy, placement=placement, seed=seed,
                             validate=True)
        a, b = run.results[1], run.results[2]
        assert isinstance(a, canary.JobResult) and isinstance(b, canary.JobResult)
        assert np.array_equal(a.value("s"), solo_a) and np.array_equal(b.value("s"), solo_b)


def test_strict_priority_runs_the_urgent_job_whenever_it_has_a_ready_task() -> None:
    run = run_jobs_local([LocalJob(program("low", 2, 10), priority=1),
                          LocalJob(program("high", 2, 3), priority=0, at=6.0)],
                         workers=1, policy="priority", placement="random", seed=0,
                         mean_delay=0.01)
    ran = run.ran[0]
    first_high, last_high = ran.index(2), len(ran) - 1 - ran[::-1].index(2)
    # once the urgent job started on the one worker, nothing else ran until it was done
    assert set(ran[first_high:last_high + 1]) == {2}
    assert ran[:first_high] and set(ran[:first_high]) == {1} and ran[-1] == 1


def test_a_failing_job_ends_alone_and_the_others_finish() -> None:
    good = canary.run_local(program("good", 3, 6), workers=2).value("s")
    for seed in range(3):
        run = run_jobs_local([LocalJob(program("good", 3, 6)),
                              LocalJob(program("bad", 3, 6, fail_at=0.5)),
                              LocalJob(program("good2", 3, 6), at=3.0)],
                             workers=2, seed=seed, validate=True)
        assert isinstance(run.results[2], TaskError)
        assert "the kernel failed on purpose" in str(run.results[2])
        for k in (1, 3):
            res = run.results[k]
            assert isinstance(res, canary.JobResult) and np.array_equal(res.value("s"), good)


def test_a_job_whose_report_callback_raises_ends_alone_in_process_as_on_a_host() -> None:
    # run_jobs_local called the callback bare: its exception ended the whole run, every other
    # job with it, where a pool's host (canary.pool.host) ends that job alone
    def callback(ev: canary.ReportEvent) -> None:
        raise ValueError("the callback failed on purpose")

    good = canary.run_local(program("good", 3, 6), workers=2).value("s")
    bad = program("bad", 3, 2)
    bad.report(bad.datasets[1], callback=callback, name="noisy")  # declared: noisy
    run = run_jobs_local([LocalJob(bad), LocalJob(program("good", 3, 6), at=0.5)], workers=2,
                         seed=1, validate=True)
    # what canary run says of it: which report, its driver line (the traceback shows the
    # callback, not the report that called it), the traceback; the pool said only
    # "its report callback raised: ValueError(...)"
    with pytest.raises(TaskError) as alone:
        canary.run_local(bad, workers=2)
    said = str(run.results[1])
    assert isinstance(run.results[1], TaskError) and said == str(alone.value), said
    assert said.startswith("rank 0 (controller): report 'noisy' of 's' (iteration (), declared "
                           f"at {declared_at('# declared: noisy')}), its callback failed:\n")
    assert said.endswith("ValueError: the callback failed on purpose"), said
    res = run.results[2]
    assert isinstance(res, canary.JobResult) and np.array_equal(res.value("s"), good)


def test_a_cancelled_job_ends_with_the_reason_and_frees_the_workers() -> None:
    run = run_jobs_local([LocalJob(program("long", 2, 200), cancel_at=20.0),
                          LocalJob(program("short", 2, 4))], workers=2, seed=4, validate=True)
    assert isinstance(run.results[1], JobAborted)
    assert "cancelled by its submitter" in str(run.results[1])
    assert isinstance(run.results[2], canary.JobResult)


def test_a_job_whose_driver_gave_up_on_a_worker_is_dropped_there_when_aborted() -> None:
    # the worker marked the job broken and then ignored every message of it, its Abort
    # included: the job stayed on the worker for good, counted in every probe's load
    from canary.messages import Abort

    w = JobsWorker(0, 1, "fifo")
    w.handle(JobStart(1, 1, 0, (1,), JobSpec()))
    w.handle(Declared(2, 1, program("p", parts=1, iters=1)))
    out = w.handle(DriverEnded(3, 1, 0, "its driver failed: boom"))
    assert out == [Send(CONTROLLER, DriverEnded.match(job=1, worker=0), 3)]
    assert w.handle(Envelope(1, Abort(4, "the job stopped on worker 0"))) == [
        Release(1, "the job stopped on worker 0", JobAborted, None, 4)]
    assert not w.jobs and w.load == 0


def test_in_process_a_job_cancelled_mid_task_holds_its_worker_until_the_task_ends() -> None:
    # a task is never preempted: run_jobs_local freed the core at the cancel and ran the
    # next job's task alongside the cancelled one's, two at once in virtual time
    for seed in range(4):
        run = run_jobs_local([LocalJob(program("long", 2, 20), task_time=0.01,
                                       kind_time={"fused": 5.0}, cancel_at=12.0),
                              LocalJob(program("short", 2, 20), task_time=0.5)],
                             workers=1, policy="fair", placement="random", seed=seed,
                             mean_delay=0.01, validate=True)
        assert isinstance(run.results[1], JobAborted) and isinstance(run.results[2],
                                                                     canary.JobResult)
        spans = sorted(run.spans[0])
        assert all(b[0] >= a[1] for a, b in zip(spans, spans[1:])), seed


def test_a_task_handed_out_for_a_job_that_ends_frees_the_core_for_the_next() -> None:
    from canary.messages import Abort, Placement
    from canary.partition_map import PartitionMap
    from canary.pool.messages import Declared, RunJobTask

    w = JobsWorker(0, 1, "fifo")
    for job in (1, 2):
        w.handle(JobStart(job * 10, job, 0, (1,), JobSpec()))
        p = program(f"p{job}", parts=1, iters=1)
        w.handle(Declared(job * 10 + 1, job, p))
        w.handle(Envelope(job, Placement(job * 10 + 2, PartitionMap.initial(
            [g[0].partitions for g in p.finalize().groups], 1))))
    assert w.running is not None and w.running[0] == 1
    out = w.handle(Envelope(1, Abort(30, "cancelled")))
    assert out[0] == Release(1, "cancelled", JobAborted, None, 30)
    assert out[1] == RunJobTask.match(job=2)
    assert w.state_of(1) is None


# ---------------------------------------------------------------- waking rank 0
def test_a_submission_wakes_rank_0_through_the_pools_pipe(tmp_path: Path) -> None:
    from canary.pool.spool import Spool

    sp = Spool(tmp_path)
    assert not sp.wake()  # no pool reading: nothing to tell, and no error
    fd = sp.open_wake()
    assert fd is not None
    try:
        job = sp.new_job({"script": "x.py"})
        assert os.read(fd, 16) == b"!"  # the submission said so
        assert sp.take("queue") == [job]
    finally:
        os.close(fd)


def test_a_ranks_idle_wait_ends_when_woken() -> None:
    from canary.pool.host import IdleWait

    idle = IdleWait(spins=0)
    idle.sleep(1e-4)
    assert idle._idle == 1 and idle._sleep == 2 * idle.min_sleep  # slept; the next is longer
    idle.wake()
    idle.sleep(60.0)  # woken: returns at once and starts over from the shortest sleep
    assert idle._idle == 0 and idle._sleep == idle.min_sleep


def test_a_pool_starting_marks_lost_what_a_pool_that_died_there_left_unfinished(
        tmp_path: Path) -> None:
    # they came back as "running" for ever under the new pool, and a cancel did nothing
    from canary.pool import client
    from canary.pool.spool import Spool, read_json, write_json

    sp = Spool(tmp_path)
    jobs = [sp.new_job({"script": "x.py"}) for _ in range(3)]
    assert sp.take("queue") == jobs  # read by the pool that died
    jobs.append(sp.new_job({"script": "x.py"}))  # still queued when it died
    for job, state in zip(jobs, ("running", "placing", "done")):
        write_json(sp.status_file(job), {"job": job, "state": state, "started": 1.0})
    assert sp.mark_lost() == [jobs[0], jobs[1], jobs[3]]
    said = {job: read_json(sp.status_file(job)) for job in jobs}
    assert [said[j]["state"] for j in jobs] == ["lost", "lost", "done", "lost"]
    assert said[jobs[0]]["error"] == f"the pool ended before the job (see {sp.log_file})"
    assert said[jobs[3]]["error"].startswith("the pool ended before the job started")
    assert sp.take("queue") == []  # the new pool will not run it
    assert sp.mark_lost() == []  # and says it once
    with pytest.raises(client.PoolError, match=r"already ended \(lost\)"):
        client.cancel(jobs[0], tmp_path)


def test_canary_jobs_into_a_reader_that_stops_early_ends_quietly(tmp_path: Path) -> None:
    # `canary jobs | head -1` printed "canary jobs: error: [Errno 32] Broken pipe"
    import subprocess
    import sys

    from canary.pool.spool import Spool

    sp = Spool(tmp_path)
    for job in range(1, 1501):  # more lines than a pipe holds (64 KB)
        sp.job_dir(job).mkdir(parents=True)
        (sp.job_dir(job) / "spec.json").write_text('{"script": "x.py", "user": "ann", '
                                                   '"priority": 0}')
    proc = subprocess.Popen([sys.executable, "-m", "canary.cli", "jobs", "--dir", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=Path(__file__).resolve().parent.parent)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().split()[0] == b"ID"
    proc.stdout.close()  # the reader stops, as `head -1` does
    assert proc.wait(timeout=60) == 141
    assert proc.stderr.read() == b""


def test_jobs_sharing_the_workers_each_say_how_far_they_are_as_a_lone_job_does() -> None:
    """A pool job printed no progress line: one that ran long looked hung. Each job's
    controller says it now, naming the job, on the job's own clock (from its placement), from
    its workers' load reports; the first half a period in, then a period apart."""
    from canary.messages import LoadReport, Tick
    from canary.program import OP_FOR

    def run(ctrl: JobsController) -> list[tuple[float, int, str]]:
        """Jobs 1 and 2 placed at 100 s and 120 s of the pool's clock; each of their workers
        reports every 0.5 s, at 10 iterations a second of the job's clock."""
        placed = {1: 100.0, 2: 120.0}
        programs = {job: program(f"long{job}", 3, 100_000) for job in placed}
        head = next(pc for pc, op in enumerate(programs[1].ops) if op[0] == OP_FOR)
        eids = iter(range(1, 1 << 20))
        notes = []
        for tick in range(1, 401):
            now = tick * 0.5
            notes += [(now, ins.job, ins.line) for ins in ctrl.handle(Tick(next(eids), now))
                      if type(ins) is JobNote and "placed on" not in ins.line]
            for job, at in placed.items():
                if now == at:
                    ctrl.handle(Submit(next(eids), job, JobSpec("drv.py")))
                    ctrl.handle(Declared(next(eids), job, programs[job]))
                elif now > at:
                    it = int((now - at) * 10)
                    for w in range(len(ctrl.info(job).workers)):
                        ctrl.handle(Envelope(job, LoadReport(
                            next(eids), w, 0.5, (), 0.1, 20, 2 + 3 * it, False, pc=head + 1,
                            counters=(it,))))
        return notes

    notes = run(JobsController(2, "random", progress_s=60.0))
    assert [(now, job) for now, job, _ in notes] == [(130.0, 1), (150.0, 2), (190.0, 1)]
    loop = re.escape(declared_at("# declared: the loop of program()"))
    for (_, job, line), seconds, it in zip(notes, ("30 s", "30 s", "90 s"), (295, 295, 895)):
        assert re.fullmatch(rf"canary pool: job {job}: {seconds}: loop\(100,000\) at {loop} "
                            rf"iteration {it}, stage instance {2 + 3 * it:,}; [\d.]+K? tasks, "
                            r"[\d.]+ tasks/s(, 10 iterations/s)?; workers 80% busy", line), line
    assert run(JobsController(2, "random")) == []  # progress_s 0, the default: none


def test_a_pool_worker_reports_each_jobs_load_on_the_jobs_clock() -> None:
    """For the jobs' progress lines, as a lone job's worker does; the run-ahead window stays at
    its most, as it was before a pool's jobs reported (its pace is its shared core's)."""
    from canary.messages import LoadReport, Tick
    from canary.worker.config import WorkerConfig

    w = JobsWorker(0, 1, "fifo")
    for job, at in ((1, 12.0), (2, 13.0), (3, 13.0)):
        w.handle(JobStart(job, job, 0, (1,), JobSpec()), at)
        if job != 3:  # job 3's driver has not declared: it has no state to report
            w.handle(Declared(10 + job, job, program(f"p{job}", 2, 1000)), at)
    out = w.handle(Tick(20, 14.0, 0.25), 14.0)
    sent = [(ins.dest, ins.message.job, ins.message.message) for ins in out
            if type(ins) is Send]
    assert [(dest, job) for dest, job, _ in sent] == [(CONTROLLER, 1), (CONTROLLER, 2)]
    reports = [msg for _, _, msg in sent]
    assert all(type(r) is LoadReport and r.worker == 0 and r.idle == 0.25 for r in reports)
    assert [r.interval for r in reports] == [2.0, 1.0]  # since each job was declared here
    out = w.handle(Tick(21, 14.5, 0.5), 14.5)
    assert [ins.message.message.interval for ins in out if type(ins) is Send] == [0.5, 0.5]
    for job in (1, 2):
        state = w.state_of(job)
        assert state is not None and state.window == WorkerConfig().window


def test_a_job_waiting_for_workers_is_told_which_jobs_hold_them() -> None:
    # a job stuck behind another's long task sat in "placing" for 75 s without a word
    from types import SimpleNamespace

    from canary.pool.host import WAIT_NOTE_S, ControllerHost

    ctrl, _ = _running()
    ctrl.handle(Submit(30, 2, JobSpec("drv.py", workers=1)))
    assert ctrl.info(2).state == "placing"
    notes: list[tuple[int, str]] = []
    host = SimpleNamespace(state=ctrl, status={1: {}, 2: {"placing": 100.0}}, wait_noted={},
                           note=lambda job, line: notes.append((job, line)))
    for now in (100 + WAIT_NOTE_S - 0.5, 100 + WAIT_NOTE_S + 1, 100 + 2 * WAIT_NOTE_S,
                100 + 2 * WAIT_NOTE_S + 1.5):
        ControllerHost._note_waiting(host, now)  # type: ignore[arg-type]
    workers = ", ".join(map(str, ctrl.info(1).workers))
    assert notes == [(2, f"canary pool: job 2 has waited {w:.0f} s for workers; the jobs "
                         f"running: 1 (on worker(s) {workers}) (a task is never preempted: a "
                         "long one holds its worker until it ends)")
                     for w in (WAIT_NOTE_S + 1, 2 * WAIT_NOTE_S + 1.5)]
    # a cancelled job is gone from the list at once, while its last task still holds workers
    ctrl.handle(Cancel(31, 1))
    notes.clear()
    ControllerHost._note_waiting(host, 100 + 3 * WAIT_NOTE_S + 2)  # type: ignore[arg-type]
    assert [line for _, line in notes] == [
        f"canary pool: job 2 has waited {3 * WAIT_NOTE_S + 2:.0f} s for workers; the jobs "
        "running: none; a worker may still be running the last task of a job that ended or was "
        "cancelled (a task is never preempted: a long one holds its worker until it ends)"]


def test_a_drivers_context_and_its_result_go_when_dropped_without_a_collection() -> None:
    # the context and the communicator its driver sees referred to each other: rank 0 kept a
    # finished job's result (300 MB) until Python's next full collection
    import gc
    import weakref
    from types import SimpleNamespace

    from canary.pool.host import JobContext

    ctx = JobContext(SimpleNamespace(), 1, 0, 2, JobSpec("drv.py"), None)  # type: ignore[arg-type]
    result = np.ones(10)
    ctx.release(result)
    assert ctx.comm.Get_rank() == 0 and ctx.comm.size == 2
    gone, held = weakref.ref(ctx), weakref.finalize(result, lambda: None)
    del ctx, result
    gc.disable()
    try:
        assert gone() is None and not held.alive
    finally:
        gc.enable()


def test_rank_0_keeps_nothing_of_a_cancelled_job_once_it_ended(tmp_path: Path) -> None:
    # each cancelled job's reason stayed in ControllerHost.cancelled for the pool's life: one
    # entry per cancel (a submitter's Ctrl-C, `canary cancel`), never dropped
    from itertools import count
    from types import SimpleNamespace

    from canary.pool.host import ControllerHost
    from canary.pool.spool import Spool

    host = ControllerHost.__new__(ControllerHost)  # rank 0's bookkeeping, without MPI
    host.rank, host.ids, host.spool = 0, count(1), Spool(tmp_path)
    host.state = JobsController(2, "batch-late", d=1.0, seed=0)
    host.logs, host.status, host.cancelled, host.wait_noted = {}, {}, {}, {}
    host.tx = SimpleNamespace(send=lambda dest, msg: None)
    for job in range(1, 41):
        host.spool.job_dir(job).mkdir(parents=True)
        host.job_status(job, state="placing")
        host.carry(host.state.handle(Submit(job, job, JobSpec("drv.py"))))
        host._cancel(job, f"its submitter (pid {job}) went away")
        assert host.spool.status_file(job).read_text().count('"cancelled"') == 1
    assert host.cancelled == {} and host.status == {} and host.state.jobs == {}


def test_a_unit_running_when_its_job_is_cancelled_is_charged_the_seconds_it_ran() -> None:
    """Users of equal weight: user 0 runs one 2 s task per job and cancels each job while
    that task runs (a job that failed, a `canary pool cancel`), then submits the next; user 1
    runs 1 s tasks. A unit is queued at its job's last task seconds (a new job's: 1 ms) and
    corrected when it finished; the queue forgot a removed job's running units, so the
    correction never came: user 0 was charged 1 ms for each 2 s and took all but 0.1% of the
    core instead of half."""
    q = JobQueue("fair")
    q.add_job(1, 1, 0, 1.0, 0.0)
    q.push(1, None, 0.0)
    used, now, job = {0: 0.0, 1: 0.0}, 0.0, 10
    q.add_job(job, 0, 0, 1.0, now)
    q.push(job, None, now)
    for _ in range(600):
        got = q.pop(now)
        assert got is not None
        key = got[0]
        seconds = 1.0 if key == 1 else 2.0
        if key != 1:  # cancelled while its task runs, and the user's next job submitted
            assert q.remove_job(key, now) == []
            job += 1
            q.add_job(job, 0, 0, 1.0, now)
            q.push(job, None, now)
        now += seconds
        used[int(key == 1)] += seconds
        q.finished(key, seconds, now)
        if key == 1:
            q.push(key, None, now)
    assert used[0] / (used[0] + used[1]) == pytest.approx(0.5, abs=0.02)
