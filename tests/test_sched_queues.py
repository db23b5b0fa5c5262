"""Worker queue policies on hand-computed sequences."""

import random

import pytest

from canary.sched.hfsp import HfspJobs, HfspQueue, SrptJobs
from canary.sched.queues import FifoQueue, Item, PriorityQueue, WeightedFairQueue, make_queue


def drain(q) -> list:  # type: ignore[no-untyped-def]
    out = []
    while (it := q.pop(0.0)) is not None:
        out.append(it.payload)
    return out


def test_fifo_keeps_arrival_order() -> None:
    q = FifoQueue()
    for i in range(4):
        q.push(Item(job=i, payload=i), 0.0)
    assert len(q) == 4
    assert drain(q) == [0, 1, 2, 3]
    assert q.pop(0.0) is None


def test_strict_priority_serves_lower_levels_first_fifo_within() -> None:
    q = PriorityQueue()
    for name, prio in [("a", 1), ("b", 0), ("c", 1), ("d", 0), ("e", 2)]:
        q.push(Item(job=0, priority=prio, payload=name), 0.0)
    assert drain(q) == ["b", "d", "a", "c", "e"]
    with pytest.raises(ValueError, match="priority"):
        q.push(Item(job=0, priority=-1), 0.0)


def test_priority_interleaved_push_pop() -> None:
    q = PriorityQueue()
    q.push(Item(job=0, priority=1, payload="lo1"), 0.0)
    assert q.pop(0.0).payload == "lo1"  # type: ignore[union-attr]
    q.push(Item(job=0, priority=1, payload="lo2"), 0.0)
    q.push(Item(job=0, priority=0, payload="hi"), 0.0)
    assert drain(q) == ["hi", "lo2"]


def test_wfq_equal_weights_alternate() -> None:
    q = WeightedFairQueue({0: 1.0, 1: 1.0})
    for i in range(4):
        q.push(Item(job=0, user=0, payload=f"u0-{i}"), 0.0)
    for i in range(2):
        q.push(Item(job=1, user=1, payload=f"u1-{i}"), 0.0)
    assert drain(q) == ["u0-0", "u1-0", "u0-1", "u1-1", "u0-2", "u0-3"]


def test_wfq_weights_two_to_one() -> None:
    q = WeightedFairQueue({0: 2.0, 1: 1.0})
    for _ in range(4):
        q.push(Item(job=0, user=0, payload=0), 0.0)
    for _ in range(2):
        q.push(Item(job=1, user=1, payload=1), 0.0)
    # Start tags: user 0 -> 0, .5, 1, 1.5; user 1 -> 0, 1 (ties by arrival).
    assert drain(q) == [0, 1, 0, 0, 1, 0]


def test_wfq_idle_user_gets_no_credit() -> None:
    q = WeightedFairQueue()
    for _ in range(10):
        q.push(Item(job=0, user=0, payload=0), 0.0)
    for _ in range(6):
        q.pop(0.0)  # virtual time is now 5
    q.push(Item(job=1, user=1, payload=1), 0.0)
    q.push(Item(job=1, user=1, payload=1), 0.0)
    # User 1 starts at tag 5, not 0: it alternates instead of taking 6 turns in a row.
    assert drain(q)[:4] == [1, 0, 1, 0]


def test_wfq_measured_charge_shares_by_what_items_took_not_their_estimate() -> None:
    # Both users' items are pushed at the estimate 1; user 0's take 3 each, user 1's take 1.
    # Charged by estimate they alternate; charged by what they took, user 1 gets 3 turns
    # for each of user 0's, as equal weights of CPU time want.
    def served(charge: str) -> list[int]:
        q = WeightedFairQueue({0: 1.0, 1: 1.0}, charge=charge)
        took = {0: 3.0, 1: 1.0}
        for u in (0, 1):
            q.push(Item(job=u, user=u, payload=u), 0.0)
        order = []
        for _ in range(12):  # each user keeps one item queued, as a pool's job does
            item = q.pop(0.0)
            assert item is not None
            order.append(item.user)
            q.task_finished(item, 0.0, took[item.user])
            q.push(Item(job=item.user, user=item.user, payload=item.user), 0.0)
        return order

    assert served("cost").count(1) == 6
    assert served("measured").count(1) == 9


def test_wfq_rejects_bad_weights_and_cost() -> None:
    with pytest.raises(ValueError, match="weights"):
        WeightedFairQueue({0: 0.0})
    with pytest.raises(ValueError, match="cost"):
        WeightedFairQueue().push(Item(job=0, cost=-1.0), 0.0)
    with pytest.raises(ValueError, match="charge is 'cost' or 'measured'"):
        WeightedFairQueue(charge="wall")


def test_make_queue_builds_each_policy_with_its_options() -> None:
    assert isinstance(make_queue("fifo"), FifoQueue)
    assert isinstance(make_queue("priority"), PriorityQueue)
    fair = make_queue("fair", weights={0: 2.0, 1: 1.0})
    assert isinstance(fair, WeightedFairQueue) and fair.weights == {0: 2.0, 1: 1.0}
    hfsp = make_queue("hfsp", policy="srpt")
    assert isinstance(hfsp, HfspQueue) and isinstance(hfsp.jobs, SrptJobs) and len(hfsp) == 0
    assert isinstance(make_queue("hfsp").jobs, HfspJobs)  # HFSP by default
    with pytest.raises(ValueError, match="unknown queue policy"):
        make_queue("lifo")


def test_discard_drops_one_jobs_items_and_keeps_the_others_order() -> None:
    q = PriorityQueue()
    for name, job, prio in [("a", 1, 1), ("b", 2, 0), ("c", 1, 0), ("d", 2, 1)]:
        q.push(Item(job=job, priority=prio, payload=name), 0.0)
    assert q.discard(1) == 2 and len(q) == 2
    assert drain(q) == ["b", "d"]
    f = WeightedFairQueue()
    for name, job, user in [("a", 1, 0), ("b", 2, 1), ("c", 1, 0), ("d", 2, 1), ("e", 3, 0)]:
        f.push(Item(job=job, user=user, payload=name), 0.0)
    assert f.discard(1) == 2 and len(f) == 3
    # e's tag (2) was stacked behind a's and c's, which never ran: it moves forward to 0
    assert drain(f) == ["b", "e", "d"]


def test_wfq_discard_releases_what_the_dropped_items_were_charged() -> None:
    # Equal weights, cost 1. User 0: a (job 1) tag 0, b (job 2) tag 1; user 1: c, d tags 0, 1.
    # Job 1 is cancelled with a queued: b moves to 0 and user 0's finish tag back to 1, as if
    # a had never been pushed. Left charged, user 0 lost a turn to user 1: c, b, d, e.
    q = WeightedFairQueue()
    for name, job, user in [("a", 1, 0), ("b", 2, 0), ("c", 3, 1), ("d", 3, 1)]:
        q.push(Item(job=job, user=user, payload=name), 0.0)
    assert q.discard(1) == 1
    q.push(Item(job=2, user=0, payload="e"), 0.0)  # tag max(V=0, F_0=1) = 1 (was 2)
    assert drain(q) == ["b", "c", "d", "e"]


def test_wfq_discard_keeps_an_item_that_was_popped_charged() -> None:
    # Weight 2 for user 0 (cost 1 -> 0.5 of virtual time): a (job 1) tag 0, b (job 1) 0.5,
    # c (job 2) 1; user 1's d tag 0. a and d are popped (V = 0): a ran, and stays charged when
    # job 1 is dropped. Only b's 0.5 is released: c moves to 0.5, user 0's finish tag 1.5 -> 1.
    q = WeightedFairQueue({0: 2.0})
    for name, job, user in [("a", 1, 0), ("b", 1, 0), ("c", 2, 0), ("d", 3, 1)]:
        q.push(Item(job=job, user=user, payload=name), 0.0)
    assert [q.pop(0.0).payload for _ in range(2)] == ["a", "d"]  # type: ignore[union-attr]
    assert q.discard(1) == 1
    assert q._finish == {0: 1.0, 1: 1.0}
    q.push(Item(job=2, user=0, payload="f"), 0.0)  # tag 1 (was 1.5)
    q.push(Item(job=3, user=1, payload="e"), 0.0)  # tag 1, pushed after f
    assert drain(q) == ["c", "f", "e"]


def test_wfq_discard_never_moves_a_tag_before_the_virtual_time() -> None:
    # Measured charge: p (user 0, estimate 3) took 0, so user 0's finish tag went back from 4
    # to 1 and b, pushed after a, got tag 1, before a's 3. Dropping a (job 1) releases its 1:
    # b would move to 0, but V is 1 (y was popped at 1): b stays at 1, and user 0's finish tag
    # goes to 1, so c starts at 1, beside b. Left charged, c started at 2, behind z.
    q = WeightedFairQueue(charge="measured")
    p = Item(job=9, user=0, cost=3.0, payload="p")
    q.push(p, 0.0)  # tag 0
    q.push(Item(job=8, user=1, payload="x"), 0.0)  # tag 0
    assert [q.pop(0.0).payload for _ in range(2)] == ["p", "x"]  # type: ignore[union-attr]
    q.push(Item(job=8, user=1, payload="y"), 0.0)  # tag 1
    q.push(Item(job=1, user=0, payload="a"), 0.0)  # tag 3
    q.task_finished(p, 0.0, 0.0)
    q.push(Item(job=2, user=0, payload="b"), 0.0)  # tag 1
    assert q.pop(0.0).payload == "y"  # type: ignore[union-attr]
    assert q.discard(1) == 1
    assert min(start for start, *_ in q._heap) == q._v == 1.0
    q.push(Item(job=8, user=1, payload="z"), 0.0)  # tag 2
    q.push(Item(job=2, user=0, payload="c"), 0.0)  # tag 1
    assert drain(q) == ["b", "c", "z"]


@pytest.mark.parametrize("charge", ["cost", "measured"])
def test_wfq_release_gives_back_what_an_item_that_ran_nothing_was_charged(charge: str) -> None:
    # Equal weights, cost 1. User 0: a tag 0, b tag 1; user 1: c, d tags 0, 1. a is popped
    # (V = 0) and found nothing to run (its job's tasks had gone elsewhere): released, b moves
    # to 0 and user 0's finish tag back to 1, as if a had never been pushed. Left charged,
    # user 0 lost a turn to user 1: c, b, d, e.
    q = WeightedFairQueue(charge=charge)
    a = Item(job=1, user=0, payload="a")
    for item in [a, Item(job=2, user=0, payload="b"), Item(job=3, user=1, payload="c"),
                 Item(job=3, user=1, payload="d")]:
        q.push(item, 0.0)
    assert q.pop(0.0) is a
    q.release(a, 0.0)
    assert q._finish == {0: 1.0, 1: 2.0} and len(q) == 3
    q.push(Item(job=2, user=0, payload="e"), 0.0)  # tag max(V=0, F_0=1) = 1 (was 2)
    assert drain(q) == ["b", "c", "d", "e"]


def test_wfq_charged_by_cost_serves_as_a_heap_of_every_item_would() -> None:
    # Charged by cost the queue keeps only each user's first item by its tag, the others in
    # push order; charged as measured, with no item finished, it keeps every item by its tag,
    # as the definition reads. The two must serve the same items in the same order and agree on
    # V and the finish tags through any pushes, pops and discards. Costs and weights are powers
    # of two, so the tags add up exactly either way and ties fall the same.
    for seed in range(200):
        rng = random.Random(seed)
        weights = {user: rng.choice([0.5, 1.0, 2.0, 4.0]) for user in range(3)}
        by_cost = WeightedFairQueue(weights)
        every_item = WeightedFairQueue(weights, charge="measured")
        popped: list[Item] = []
        for _ in range(60):
            step = rng.random()
            if step < 0.5:
                item = Item(job=rng.randrange(6), user=rng.randrange(3),
                            cost=rng.choice([0.0, 0.25, 1.0, 2.0]))
                by_cost.push(item, 0.0)
                every_item.push(item, 0.0)
            elif step < 0.75:
                item = by_cost.pop(0.0)  # type: ignore[assignment]
                assert item is every_item.pop(0.0)
                if item is not None:
                    popped.append(item)
            elif step < 0.85 and popped:  # one that ran nothing
                item = popped.pop(rng.randrange(len(popped)))
                by_cost.release(item, 0.0)
                every_item.release(item, 0.0)
            else:
                job = rng.randrange(6)
                assert by_cost.discard(job) == every_item.discard(job)
            assert len(by_cost) == len(every_item)
            assert by_cost._v == every_item._v and by_cost._finish == every_item._finish
