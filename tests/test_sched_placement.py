"""Placement policies on hand-computed cases (modelled on Sparrow's TaskPlacer tests)."""

import math

import numpy as np
import pytest

from canary.sched.placement import (
    BatchLateBinding,
    BatchSampling,
    ConstrainedPlan,
    ConstrainedSampling,
    EarlyBindingPlan,
    PerTaskSampling,
    RandomPlacement,
    make_placement,
)


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def test_bad_inputs_raise() -> None:
    with pytest.raises(ValueError, match="probe ratio"):
        BatchSampling(0.5)
    with pytest.raises(ValueError, match="probe ratio"):
        make_placement("per-task", d=0)
    # an infinite one crashed a pool's rank 0, and 1e9 made it grow to 3.6 GB
    for d in (math.inf, 1e9, 64.5):
        with pytest.raises(ValueError, match=r"probe ratio d must be between 1 and 64"):
            make_placement("batch-late", d=d)
    make_placement("batch-late", d=64)
    with pytest.raises(ValueError, match="unknown placement policy"):
        make_placement("round-robin")
    with pytest.raises(ValueError, match="at least one task"):
        BatchLateBinding().plan(0, 10, rng())
    with pytest.raises(ValueError, match="at least one worker"):
        RandomPlacement().plan(3, 0, rng())


def test_random_is_seeded_and_in_range() -> None:
    a = RandomPlacement().plan(50, 7, rng(3))
    b = RandomPlacement().plan(50, 7, rng(3))
    assert a.probes.size == 0
    wa = a.assign([])
    assert np.array_equal(wa, b.assign([]))
    assert wa.min() >= 0 and wa.max() < 7 and wa.size == 50


def test_per_task_probes_d_distinct_workers_per_task() -> None:
    plan = PerTaskSampling(3).plan(200, 10, rng())
    per = plan.probes.reshape(200, 3)
    assert all(len(set(row)) == 3 for row in per.tolist())


def test_per_task_more_probes_than_workers_probes_each_worker_once() -> None:
    plan = PerTaskSampling(5).plan(2, 3, rng())
    assert [sorted(r) for r in plan.probes.reshape(2, 3).tolist()] == [[0, 1, 2], [0, 1, 2]]


def test_per_task_picks_least_loaded_of_own_probes() -> None:
    plan = EarlyBindingPlan(2, np.array([3, 7, 5, 1]), "per-task", d=2)
    # task 0 probed 3 (load 2) and 7 (load 0); task 1 probed 5 and 1, both load 1.
    assert plan.assign([2, 0, 1, 1]).tolist() == [7, 5]


def test_batch_places_on_m_least_loaded() -> None:
    plan = EarlyBindingPlan(2, np.array([4, 2, 9, 6]), "batch")
    assert plan.assign([3, 0, 1, 0]).tolist() == [2, 6]
    plan3 = EarlyBindingPlan(3, np.array([4, 2, 9, 6]), "batch")
    assert plan3.assign([3, 0, 1, 0]).tolist() == [2, 6, 9]


def test_batch_with_fewer_probes_than_tasks_water_fills() -> None:
    plan = EarlyBindingPlan(4, np.array([0, 1]), "batch")
    # loads 0 and 2: worker 0 takes two tasks to reach 2, then ties go to worker 0 first.
    assert plan.assign([0, 2]).tolist() == [0, 0, 0, 1]


def test_batch_probes_ceil_dm_distinct_workers() -> None:
    plan = BatchSampling(1.5).plan(3, 100, rng())
    assert plan.probes.size == 5 and len(set(plan.probes.tolist())) == 5


def test_batch_more_probes_than_workers_probes_all_once() -> None:
    plan = BatchSampling(2).plan(3, 4, rng())
    assert sorted(plan.probes.tolist()) == [0, 1, 2, 3]


def test_assign_rejects_bad_replies() -> None:
    plan = EarlyBindingPlan(1, np.array([0, 1]), "batch")
    with pytest.raises(ValueError, match="probe replies"):
        plan.assign([1])
    with pytest.raises(ValueError, match="negative load"):
        plan.assign([1, -1])


def test_late_binding_reservations_on_distinct_workers() -> None:
    plan = BatchLateBinding(2).plan(10, 100, rng())
    assert plan.reservations.size == 20
    assert len(set(plan.reservations.tolist())) == 20


def test_late_binding_first_m_requests_win_then_no_task_left() -> None:
    plan = BatchLateBinding(2).plan(3, 50, rng(1))
    ws = plan.reservations.tolist()
    got = [plan.request(w) for w in ws[:4]]
    assert got == [0, 1, 2, None]
    assert plan.all_launched


def test_late_binding_cancellation_names_only_outstanding_workers() -> None:
    plan = BatchLateBinding(2).plan(2, 50, rng(2))
    ws = plan.reservations.tolist()
    assert plan.cancellations() == []  # tasks unlaunched: reservations still needed
    plan.request(ws[2])
    plan.request(ws[0])
    assert plan.cancellations() == sorted([ws[1], ws[3]])
    assert plan.cancellations() == []  # cancelled once only
    # A request that crossed the cancel on the wire gets the no-op.
    assert plan.request(ws[1]) is None
    with pytest.raises(ValueError, match="no outstanding reservation"):
        plan.request(ws[0])  # already used its single reservation, never cancelled
    with pytest.raises(ValueError, match="no outstanding reservation"):
        plan.request(10_000)


def test_late_binding_more_reservations_than_workers() -> None:
    plan = BatchLateBinding(2).plan(5, 3, rng())
    counts = sorted(np.bincount(plan.reservations, minlength=3).tolist())
    assert counts == [3, 3, 4]
    heavy = int(np.argmax(np.bincount(plan.reservations)))
    got = [plan.request(heavy) for _ in range(4)]
    assert got == [0, 1, 2, 3]
    with pytest.raises(ValueError):
        plan.request(heavy)


def test_constrained_shares_probe_information_across_tasks() -> None:
    # Sparrow's example: task 0 may run on {0,1,2}, task 1 on {2,3,4}.  Worker 2 was
    # probed (for task 0); task 1 uses that reply although its own probes went to 3.
    plan = ConstrainedPlan(
        [frozenset({0, 1, 2}), frozenset({2, 3, 4})], np.array([0, 2, 3]), np.array([0, 2, 3])
    )
    assert plan.assign([5, 0, 5]).tolist() == [2, 2]


def test_constrained_late_binding_gives_any_allowed_task() -> None:
    plan = ConstrainedPlan(
        [frozenset({0, 1, 2}), frozenset({2, 3, 4})],
        np.array([0, 1, 3, 4]),
        np.array([0, 1, 3, 4]),
    )
    assert plan.request(3) == 1
    assert plan.request(1) == 0
    assert plan.all_launched
    assert plan.request(0) is None
    assert plan.cancellations() == [4]


def test_constrained_sampling_respects_allowed_sets() -> None:
    allowed = [[0, 1, 2], [2, 3, 4], [7]]
    plan = ConstrainedSampling(2).plan(allowed, rng(4))
    assert set(plan.probes.tolist()) <= {0, 1, 2, 3, 4, 7}
    assert 7 in plan.probes.tolist()
    assert plan.reservations.size == 5  # 2 + 2 + 1 (only one worker allowed)
    where = plan.assign([0] * plan.probes.size)
    for t, w in enumerate(where.tolist()):
        assert w in allowed[t]
    with pytest.raises(ValueError, match="no allowed worker"):
        ConstrainedSampling().plan([[0], []], rng())
