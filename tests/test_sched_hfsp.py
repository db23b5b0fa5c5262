"""Job-level size-based policies (PS, SRPT, HFSP with aging) on hand-computed cases."""

import pytest

from canary.sched.hfsp import HfspJobs, HfspQueue, PsJobs, SrptJobs, make_job_scheduler
from canary.sched.queues import Item


def order(s, now: float, n: int) -> list:  # type: ignore[no-untyped-def]
    return [s.dispatch(now) for _ in range(n)]


def test_srpt_serves_smallest_estimate_first() -> None:
    s = SrptJobs()
    for job, est in [("A", 5.0), ("B", 2.0), ("C", 9.0)]:
        s.add_job(job, 1, 0.0, estimate=est)  # type: ignore[arg-type]
    assert order(s, 0.0, 4) == ["B", "A", "C", None]


def test_srpt_remaining_shrinks_with_attained_service() -> None:
    s = SrptJobs()
    s.add_job(1, 3, 0.0, estimate=6.0)
    s.add_job(2, 1, 0.0, estimate=5.0)
    assert s.dispatch(0.0) == 2
    assert s.dispatch(0.0) == 1
    s.task_finished(1, 2.0, 2.0)  # job 1 has attained 2 of its estimated 6
    s.add_job(3, 1, 2.0, estimate=4.5)
    assert s.dispatch(2.0) == 1  # its remaining 4 beats the newcomer's 4.5 (job 2 has no task left)


def test_ps_balances_running_tasks() -> None:
    s = PsJobs()
    s.add_job(1, 3, 0.0)
    s.add_job(2, 3, 0.0)
    assert order(s, 0.0, 4) == [1, 2, 1, 2]
    s.task_finished(2, 1.0, 1.0)
    assert s.dispatch(1.0) == 2  # job 2 now runs fewer tasks


def test_hfsp_virtual_processor_sharing_clock() -> None:
    h = HfspJobs(capacity=1.0)
    h.add_job(1, 2, 0.0, estimate=4.0)
    h.add_job(2, 2, 1.0, estimate=1.5)
    # Alone until t=1: V=1.  Job 2's virtual finish 2.5, job 1's 4.
    assert h.dispatch(1.0) == 2
    assert h.virtual_time(3.0) == pytest.approx(2.0)  # two jobs: V grows at 1/2
    assert h.virtual_jobs == 2
    assert h.virtual_time(4.5) == pytest.approx(3.0)  # job 2 left at t=4 (V=2.5)
    assert h.virtual_jobs == 1
    assert h.virtual_time(6.0) == pytest.approx(4.0)
    assert h.virtual_jobs == 0


def test_hfsp_orders_by_virtual_finish_not_remaining_size() -> None:
    # Job 1 (est 10) has aged: by t=8 it got V=8 of virtual service, so it
    # finishes virtually before a newcomer of size 3 (V + 3 = 11 > 10).
    h = HfspJobs(capacity=1.0)
    h.add_job(1, 5, 0.0, estimate=10.0)
    h.add_job(2, 1, 8.0, estimate=3.0)
    assert h.dispatch(8.0) == 1
    s = SrptJobs()
    s.add_job(1, 5, 0.0, estimate=10.0)
    s.add_job(2, 1, 8.0, estimate=3.0)
    assert s.dispatch(8.0) == 2  # SRPT ignores waiting time


def test_hfsp_late_jobs_share_while_srpt_serves_one() -> None:
    h, s = HfspJobs(capacity=1.0), SrptJobs()
    for sched in (h, s):
        sched.add_job("X", 10, 0.0, estimate=1.0)  # type: ignore[arg-type]
        sched.add_job("Y", 10, 0.0, estimate=1.0)  # type: ignore[arg-type]
    assert h.virtual_time(3.0) == pytest.approx(1.0)  # both virtually done at t=2
    assert h.is_late("X") and h.is_late("Y")  # type: ignore[arg-type]
    assert order(h, 3.0, 4) == ["X", "Y", "X", "Y"]
    assert order(s, 3.0, 4) == ["X", "X", "X", "X"]


def test_hfsp_late_jobs_share_one_slot_whose_task_ends_before_the_next_pick() -> None:
    # A pool's worker: one slot, each task finished before the next dispatch, so no late job
    # has a task running at a pick. An under-estimated large job (late from t=1) must not
    # hold the slot until it ends: a newcomer, late at once with estimate 0, shares it.
    h = HfspJobs(capacity=1.0)
    h.add_job("big", 100, 0.0, estimate=1.0)  # type: ignore[arg-type]
    ran, now = [], 0.0
    for step in range(8):
        if step == 3:
            h.add_job("new", 3, now, estimate=0.0)  # type: ignore[arg-type]
        job = h.dispatch(now)
        assert job is not None
        ran.append(job)
        now += 1.0
        h.task_finished(job, now, 1.0)
    assert h.is_late("big")  # type: ignore[arg-type]
    # the newcomer has the least service since it became late, then they take turns
    assert ran == ["big"] * 3 + ["new", "new", "big", "new", "big"]


def test_hfsp_a_cancelled_job_leaves_the_virtual_system_at_once() -> None:
    # A (estimate 6) and C (5) from t=0: V grows at 1/2, so V(2) = 1. C is cancelled at t=2:
    # alone from then, A's V grows at 1, so V(4) = 3 and B (3.5) arriving at t=4 finishes
    # virtually at 6.5, after A's 6: A is served first. Kept to its virtual finish (5), C
    # held V(4) at 2, B's finish at 5.5, and B passed A although C would never run again.
    h = HfspJobs(capacity=1.0)
    h.add_job("A", 2, 0.0, estimate=6.0)  # type: ignore[arg-type]
    h.add_job("C", 2, 0.0, estimate=5.0)  # type: ignore[arg-type]
    assert h.virtual_time(2.0) == pytest.approx(1.0)
    h.remove_job("C")  # type: ignore[arg-type]  # at the latest time given, 2
    assert h.virtual_jobs == 1
    assert h.virtual_time(4.0) == pytest.approx(3.0)
    h.add_job("B", 1, 4.0, estimate=3.5)  # type: ignore[arg-type]
    assert h.dispatch(4.0) == "A"
    # A and B share from t=4 at 1/2 each: A ends virtually at t=10 (V=6), B at 10.5 (V=6.5)
    assert h.virtual_time(10.0) == pytest.approx(6.0) and h.virtual_jobs == 1
    assert h.virtual_time(10.5) == pytest.approx(6.5) and h.virtual_jobs == 0


def test_hfsp_a_job_that_finished_stays_in_the_virtual_system_to_its_virtual_finish() -> None:
    # As PSBS: the virtual system is PS at the estimated sizes, and a job done early for real
    # was served ahead of it, not made smaller. The case above with C done (not cancelled) at
    # t=2, by its last task or by remove_job(finished=True): V(4) = 2 and B (5.5) passes A (6).
    for via_remove in (False, True):
        h = HfspJobs(capacity=1.0)
        h.add_job("A", 2, 0.0, estimate=6.0)  # type: ignore[arg-type]
        h.add_job("C", 2 if via_remove else 1, 0.0, estimate=5.0)  # type: ignore[arg-type]
        assert h.dispatch(0.0) == "C"
        h.task_finished("C", 2.0, 2.0)  # type: ignore[arg-type]
        if via_remove:  # e.g. a worker that ran every task of C it got
            h.remove_job("C", 2.0, finished=True)  # type: ignore[arg-type]
        assert "C" not in h and h.virtual_jobs == 2  # type: ignore[operator]
        assert h.virtual_time(4.0) == pytest.approx(2.0)
        h.add_job("B", 1, 4.0, estimate=3.5)  # type: ignore[arg-type]
        assert h.dispatch(4.0) == "B"


def test_hfsp_removing_a_job_that_is_already_late_changes_nothing_virtual() -> None:
    h = HfspJobs(capacity=1.0)
    h.add_job("A", 3, 0.0, estimate=1.0)  # type: ignore[arg-type]
    h.add_job("B", 3, 0.0, estimate=4.0)  # type: ignore[arg-type]
    assert h.virtual_time(3.0) == pytest.approx(2.0)  # A ended virtually at t=2
    assert h.is_late("A") and h.virtual_jobs == 1  # type: ignore[arg-type]
    h.remove_job("A", 3.0)  # type: ignore[arg-type]
    assert h.virtual_jobs == 1
    assert h.virtual_time(5.0) == pytest.approx(4.0) and h.virtual_jobs == 0


def test_estimates_from_task_count_then_first_tasks() -> None:
    h = HfspJobs(default_task_size=1.0, sample_tasks=2)
    h.add_job(1, 10, 0.0)
    assert h.estimate(1) == 10.0
    h.dispatch(0.0)
    h.dispatch(0.0)
    h.task_finished(1, 3.0, 3.0)
    assert h.estimate(1) == 10.0  # one sample is not enough
    h.task_finished(1, 5.0, 5.0)
    assert h.estimate(1) == 40.0  # mean(3, 5) * 10 tasks
    h.add_job(2, 4, 5.0)
    assert h.estimate(2) == 16.0  # prior: mean finished task duration 4


def test_estimate_update_moves_virtual_finish() -> None:
    h = HfspJobs(capacity=1.0, default_task_size=1.0, sample_tasks=1)
    h.add_job(1, 2, 0.0)  # estimate 2
    h.dispatch(0.0)
    h.task_finished(1, 0.5, 6.0)  # estimate 12: virtual finish moves 2 -> 12
    assert h.virtual_time(5.0) == pytest.approx(5.0)
    assert h.virtual_jobs == 1


def test_errors() -> None:
    h = HfspJobs()
    h.add_job(1, 1, 1.0)
    with pytest.raises(ValueError, match="already"):
        h.add_job(1, 1, 1.0)
    with pytest.raises(ValueError, match="backwards"):
        h.dispatch(0.5)
    with pytest.raises(ValueError, match="no running task"):
        h.task_finished(1, 2.0, 1.0)
    with pytest.raises(KeyError):
        h.task_finished(99, 2.0, 1.0)
    with pytest.raises(ValueError, match="at least one task"):
        h.add_job(2, 0, 2.0)
    with pytest.raises(ValueError, match="capacity"):
        HfspJobs(capacity=0)
    with pytest.raises(ValueError, match="unknown job policy"):
        make_job_scheduler("lottery")


def test_hfsp_queue_orders_items_by_job_policy() -> None:
    q = HfspQueue("srpt")
    q.push(Item(job=1, job_tasks=2, size_hint=8.0, payload="big-0"), 0.0)
    q.push(Item(job=1, job_tasks=2, size_hint=8.0, payload="big-1"), 0.0)
    q.push(Item(job=2, job_tasks=1, size_hint=1.0, payload="small"), 0.0)
    assert len(q) == 3
    first = q.pop(0.0)
    assert first is not None and first.payload == "small"
    q.task_finished(first, 1.0, 1.0)
    assert [q.pop(1.0).payload for _ in range(2)] == ["big-0", "big-1"]  # type: ignore[union-attr]
    assert q.pop(1.0) is None


def test_hfsp_queue_forgets_jobs_once_their_items_finish() -> None:
    q = HfspQueue("hfsp")
    it = Item(job=7, job_tasks=5, payload=0)
    q.push(it, 0.0)
    popped = q.pop(0.0)
    assert popped is it
    q.task_finished(it, 1.0, 1.0)
    assert 7 not in q.jobs


def test_hfsp_queue_a_job_whose_tasks_come_back_is_in_the_virtual_system_once() -> None:
    # One slot; job 7 has 2 tasks, estimated at 4. Its first task runs here from 0 to 1, and the
    # worker, having run all it had of the job, lets it go as finished: it stays in the virtual
    # system to its virtual finish (PSBS). Its second task comes at t=1, still the same job: one
    # job in the virtual system, so V grows at capacity / 1 = 1 a second and the job leaves it
    # at V = 4, t = 4, once. Registered a second time, the two halves of it would share the
    # virtual system at 1/2 each from t=1 and V(3) would be 2.
    q = HfspQueue("hfsp", capacity=1.0)
    hfsp = q.jobs
    assert isinstance(hfsp, HfspJobs)
    first, second = (Item(job=7, job_tasks=2, size_hint=4.0, payload=i) for i in range(2))
    q.push(first, 0.0)
    assert q.pop(0.0) is first
    q.task_finished(first, 1.0, 1.0)
    assert 7 not in hfsp and hfsp.virtual_jobs == 1
    q.push(second, 1.0)
    assert hfsp.virtual_jobs == 1
    assert hfsp.virtual_time(3.0) == pytest.approx(3.0)
    assert q.pop(3.0) is second
    q.task_finished(second, 3.5, 0.5)
    assert 7 not in hfsp and hfsp.virtual_jobs == 1
    assert hfsp.virtual_time(5.0) == pytest.approx(4.0) and hfsp.virtual_jobs == 0
