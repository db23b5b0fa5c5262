"""The sequential reference interpreter (``tests/sequential.py``) on small hand-written programs.

Each expected value is worked out here with plain numpy from what the program says, not by
running anything, so the reference cannot agree with the engine by sharing its mistakes.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from canary import Program, ReportEvent
from tests.conftest import declared_at
from tests.sequential import SequentialError, run_sequential


def _rows(i: int, n: int) -> np.ndarray:
    return np.arange(3.0) + 10.0 * i


def test_a_loop_of_computes_runs_its_body_count_times() -> None:
    p = Program("loop")
    x = p.dataset("x", 3)
    p.load(x, _rows)
    with p.loop(3):
        p.compute(lambda v: 2.0 * v + 1.0, [x], [x], name="affine")
    p.report(x)
    got = run_sequential(p)
    # three times v -> 2v + 1 is v -> 8v + 7
    assert [v.tolist() for v in got["x"]] == [(8.0 * _rows(i, 3) + 7.0).tolist()
                                              for i in range(3)]


def test_nested_loops_report_every_iteration_with_its_loop_counters() -> None:
    p = Program("nested")
    x = p.dataset("x", 2)
    p.load(x, lambda i, n: np.array([float(i)]))
    events: list[ReportEvent] = []
    with p.loop(2):
        with p.loop(3):
            p.compute(lambda v: v + 1.0, [x], [x])
            p.report(x, events.append)
    got = run_sequential(p)
    assert [e.iteration for e in events] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert [[v[0] for v in e.values] for e in events] == [[k, k + 1.0] for k in range(1, 7)]
    assert [e.dataset for e in events] == ["x"] * 6
    # load 2 tasks, then per inner iteration 2 compute + 2 report tasks
    assert [e.tasks for e in events] == [2 + 4 * k for k in range(1, 7)]
    assert [v.tolist() for v in got["x"]] == [[6.0], [7.0]]


def test_the_result_is_the_last_report_and_unreported_datasets_are_absent() -> None:
    p = Program("last")
    x, y = p.dataset("x", 1), p.dataset("y", 1)
    p.load([x, y], lambda i, n: (np.array([1.0]), np.array([5.0])))
    p.report(x)
    p.compute(lambda v: v * 3.0, [x], [x])
    p.report(x)
    p.compute(lambda v: np.multiply(v, 3.0, out=v), [x], [x])  # in place, after the report
    got = run_sequential(p)
    assert list(got) == ["x"]
    assert got["x"][0].tolist() == [3.0]


# (limit, max_iter, final value, times the condition is checked): it is checked before each
# iteration, but not again once max_iter iterations have run
@pytest.mark.parametrize(("limit", "max_iter", "expected", "checked"),
                         [(10.0, 4, 4.0, 4), (2.0, 5, 2.0, 3), (10.0, None, 10.0, 11),
                          (10.0, 0, 0.0, 0)])
def test_while_stops_on_its_condition_or_after_max_iter(limit: float, max_iter: int | None,
                                                        expected: float, checked: int) -> None:
    p = Program("while")
    c = p.dataset("c", 1)
    p.load(c, lambda i, n: np.zeros(1))
    checks: list[float] = []

    def below(v: np.ndarray) -> bool:
        checks.append(float(v[0]))
        return bool(v[0] < limit)

    with p.while_(below, on=c, max_iter=max_iter):
        p.compute(lambda v: v + 1.0, [c], [c])
    p.report(c)
    assert run_sequential(p)["c"][0].tolist() == [expected]
    assert checks == [float(k) for k in range(checked)]


@pytest.mark.parametrize(("start", "expected"), [(4.0, 40.0), (3.0, -3.0)])
def test_if_else_takes_exactly_one_branch(start: float, expected: float) -> None:
    p = Program("branch")
    c = p.dataset("c", 1)
    p.load(c, lambda i, n: np.array([start]))
    with p.if_(lambda v: bool(v[0] % 2 == 0), on=c):
        p.compute(lambda v: v * 10.0, [c], [c])
    with p.else_():
        p.compute(lambda v: -v, [c], [c])
    p.report(c)
    assert run_sequential(p)["c"][0].tolist() == [expected]


def test_if_without_else_skips_its_body_when_false() -> None:
    p = Program("skip")
    c = p.dataset("c", 1)
    p.load(c, lambda i, n: np.array([1.0]))
    with p.if_(lambda v: bool(v[0] > 5.0), on=c):
        p.compute(lambda v: v + 100.0, [c], [c])
    p.compute(lambda v: v + 1.0, [c], [c])
    p.report(c)
    assert run_sequential(p)["c"][0].tolist() == [2.0]


def test_a_shuffle_sends_each_piece_to_its_target_and_concats_in_source_order() -> None:
    p = Program("shuffle")
    a = p.dataset("a", 3)
    b = p.dataset("b", 2)
    p.load(a, lambda i, n: np.arange(4.0) + 10.0 * i)

    def split(v: np.ndarray) -> list[np.ndarray]:
        return [v[v % 2 == 0], v[v % 2 == 1]]  # even values to 0, odd to 1

    p.scatter_gather(a, b, split, "concat")
    p.report(b)
    got = run_sequential(p)
    parts = [np.arange(4.0) + 10.0 * i for i in range(3)]
    assert got["b"][0].tolist() == np.concatenate([v[v % 2 == 0] for v in parts]).tolist()
    assert got["b"][1].tolist() == np.concatenate([v[v % 2 == 1] for v in parts]).tolist()


def test_explicit_targets_sum_and_a_gather_function_see_pieces_in_source_order() -> None:
    p = Program("targets")
    a = p.dataset("a", 3)
    s, order = p.dataset("s", 2), p.dataset("order", 2)
    p.load(a, lambda i, n: np.array([float(i + 1)]))
    targets = [[1], [0, 1], [0]]  # partition 0 of the output gets sources 1, 2; partition 1: 0, 1
    p.scatter_gather(a, s, lambda v: v * 10.0, "sum", targets=targets, one_piece=True)
    p.scatter_gather(a, order, None, lambda ps: np.concatenate(ps), targets=[[1], [0], [0]],
                     one_piece=True)
    p.report(s)
    p.report(order)
    got = run_sequential(p)
    assert [v.tolist() for v in got["s"]] == [[20.0 + 30.0], [10.0 + 20.0]]
    assert [v.tolist() for v in got["order"]] == [[2.0, 3.0], [1.0]]


def test_broadcast_gives_every_partition_its_own_copy() -> None:
    p = Program("broadcast")
    w = p.dataset("w", 1)
    local = p.dataset("local", 3)
    p.load(w, lambda i, n: np.array([1.0, 2.0]))
    p.broadcast(w, local)

    def scale_first(v: np.ndarray, index: np.ndarray) -> np.ndarray:
        if index[0] == 0:
            v *= 100.0  # in place: must not reach partitions 1 and 2 nor w
        return v

    idx = p.dataset("idx", 3)
    p.load(idx, lambda i, n: np.array([i]))
    p.compute(scale_first, [local, idx], [local])
    p.report(local)
    p.report(w)
    got = run_sequential(p)
    assert [v.tolist() for v in got["local"]] == [[100.0, 200.0], [1.0, 2.0], [1.0, 2.0]]
    assert got["w"][0].tolist() == [1.0, 2.0]


def test_a_gather_function_that_changes_its_pieces_leaves_the_sources_alone() -> None:
    p = Program("gather_in_place")
    a, b = p.dataset("a", 2), p.dataset("b", 1)
    p.load(a, lambda i, n: np.array([float(i + 1)]))

    def double_first(pieces: list[np.ndarray]) -> np.ndarray:
        pieces[0] *= 2.0
        return pieces[0]

    p.scatter_gather(a, b, None, double_first, targets=[[0], []], one_piece=True)
    p.report(a)
    p.report(b)
    got = run_sequential(p)
    assert [v.tolist() for v in got["a"]] == [[1.0], [2.0]]
    assert got["b"][0].tolist() == [2.0]


def test_reduce_sums_every_partition_and_a_callable_op_sees_partition_order() -> None:
    p = Program("reduce")
    g = p.dataset("g", 4)
    total, stacked = p.dataset("total", 1), p.dataset("stacked", 1)
    p.load(g, lambda i, n: np.array([float(i), 1.0]))
    p.reduce(g, total)
    p.reduce(g, stacked, op=lambda ps: np.array([v[0] for v in ps]))
    p.report(total)
    p.report(stacked)
    got = run_sequential(p)
    assert got["total"][0].tolist() == [0.0 + 1.0 + 2.0 + 3.0, 4.0]
    assert got["stacked"][0].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_a_compute_output_never_shares_memory_with_another_dataset() -> None:
    p = Program("alias_compute")
    x, y = p.dataset("x", 2), p.dataset("y", 2)
    p.load(x, lambda i, n: np.full(2, float(i)))
    p.compute(lambda v: v, [x], [y])  # y is handed x's own array
    p.compute(lambda v: np.add(v, 1.0, out=v), [x], [x])  # in place on x only
    p.report(x)
    p.report(y)
    got = run_sequential(p)
    assert [v.tolist() for v in got["x"]] == [[1.0, 1.0], [2.0, 2.0]]
    assert [v.tolist() for v in got["y"]] == [[0.0, 0.0], [1.0, 1.0]]


def test_partitions_loaded_from_one_array_do_not_share_it() -> None:
    shared = np.zeros(2)
    p = Program("alias_load")
    x = p.dataset("x", 2)
    p.load(x, lambda i, n: shared)  # the same array for both partitions
    p.compute(lambda v: np.add(v, 1.0, out=v), [x], [x])
    p.report(x)
    got = run_sequential(p)
    assert [v.tolist() for v in got["x"]] == [[1.0, 1.0], [1.0, 1.0]]
    assert shared.tolist() == [0.0, 0.0]


def test_several_outputs_and_a_zero_input_compute() -> None:
    p = Program("multi")
    x, y = p.dataset("x", 2), p.dataset("y", 2)
    p.load([x, y], lambda i, n: (np.array([float(i)]), np.array([float(n)])))
    p.compute(lambda a, b: (a + b, a - b), [x, y], [x, y])
    p.compute(lambda: np.array([7.0]), [], [y])
    p.report(x)
    p.report(y)
    got = run_sequential(p)
    assert [v.tolist() for v in got["x"]] == [[2.0], [3.0]]
    assert [v.tolist() for v in got["y"]] == [[7.0], [7.0]]


def test_a_kernel_with_the_wrong_number_of_outputs_is_named() -> None:
    p = Program("bad")
    x, y = p.dataset("x", 2), p.dataset("y", 2)
    p.load(x, _rows)
    p.compute(lambda v: v, [x], [x, y], name="halfdone")
    with pytest.raises(SequentialError, match=r"stage 'halfdone' .*partition 0 returned 1 "
                                              r"value\(s\) for 2 output\(s\) \(x, y\)"):
        run_sequential(p)


def test_a_scatter_with_the_wrong_number_of_pieces_is_named() -> None:
    p = Program("bad")
    a, b = p.dataset("a", 2), p.dataset("b", 3)
    p.load(a, _rows)
    p.scatter_gather(a, b, lambda v: [v, v], "concat", name="short")
    with pytest.raises(SequentialError, match=r"stage 'short' .*partition 0: scatter returned "
                                              r"2 value\(s\) for 3 target"):
        run_sequential(p)


def test_a_failing_kernel_names_stage_iteration_and_partition() -> None:
    p = Program("bad")
    x = p.dataset("x", 2)
    p.load(x, _rows)

    def boom(v: np.ndarray) -> np.ndarray:
        if v[0] >= 10.0:
            raise ValueError("no")
        return v

    with p.loop(2):
        p.compute(boom, [x], [x])  # declared: boom
    at = re.escape(declared_at("# declared: boom"))
    with pytest.raises(SequentialError, match=rf"stage 'boom' \(id 1, iteration \(0,\), "
                                              rf"declared at {at}\), partition 1 raised "
                                              r"ValueError"):
        run_sequential(p)


def test_a_signal_that_is_not_a_bool_is_named() -> None:
    p = Program("bad")
    c = p.dataset("c", 1)
    p.load(c, lambda i, n: np.zeros(1))
    with p.if_(lambda v: v, on=c, name="vague"):
        p.compute(lambda v: v, [c], [c])
    with pytest.raises(SequentialError, match="stage 'vague'.*must return a bool"):
        run_sequential(p)
