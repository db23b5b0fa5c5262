"""The in-process harness: every role in one process on a seeded, reordering transport."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import canary
from canary import Program, TaskError
from tests.conftest import declared_at


def shuffle_program(P: int = 5, Q: int = 3, iterations: int = 4) -> Program:
    """A P->Q shuffle with a custom gather, a while loop and an if/else, all in one."""
    p = Program("mixed")
    x, y, tot, c = p.dataset("x", P), p.dataset("y", Q), p.dataset("tot", 1), p.dataset("c", 1)
    p.load([x], lambda i, n: np.arange(6.0) * (i + 1))
    p.load([c], lambda i, n: np.zeros(1))
    with p.loop(iterations):
        p.scatter_gather(x, y, lambda a: [a[j::Q] for j in range(Q)], "concat", name="shuffle")
        p.compute(lambda a: a * 0.5 + 1.0, [y], [y], name="halve")
        p.reduce(y, tot, op=lambda ps: np.array([sum(float(np.sum(q)) for q in ps)]))
    with p.while_(lambda v: v[0] < 3, on=c, max_iter=10):
        p.compute(lambda v: v + 1, [c], [c], name="count")
    with p.if_(lambda v: v[0] == 3, on=c):
        p.compute(lambda v: v * 100, [c], [c], name="then")
    with p.else_():
        p.compute(lambda v: v * 0, [c], [c], name="else")
    p.report(tot)
    p.report(y)
    p.report(c)
    return p


def expected(P: int = 5, Q: int = 3) -> tuple[float, list[np.ndarray]]:
    x = [np.arange(6.0) * (i + 1) for i in range(P)]
    y = [np.concatenate([a[j::Q] for a in x]) * 0.5 + 1.0 for j in range(Q)]
    return float(sum(np.sum(b) for b in y)), y


@pytest.mark.parametrize("workers", [1, 2, 3, 7])
def test_same_answer_for_every_seed_and_worker_count(workers: int) -> None:
    tot, ys = expected()
    for seed in range(12):
        r = canary.run_local(shuffle_program(), workers=workers, seed=seed, validate=True,
                             shuffle_ready=seed % 2 == 1)
        assert r.value("tot")[0] == tot
        for got, want in zip(r.results["y"], ys):
            np.testing.assert_array_equal(got, want)
        assert r.value("c")[0] == 300.0
        # loads 5+1; per iteration scatter 5 + gather 3 + halve 3 + reduce 3+1; while: 4 signals
        # + 3 bodies; if: 1 signal + 1 branch; reports 1 + 3 + 1
        assert r.tasks_run == 6 + 4 * 15 + 7 + 2 + 5
        assert r.controller_received["Done"] == workers


def test_controller_traffic_is_independent_of_iterations_and_partitions() -> None:
    counts = {
        (P, it): canary.run_local(shuffle_program(P, 3, it), workers=3).scheduling_messages
        for P, it in [(3, 1), (3, 20), (12, 20)]
    }
    assert len(set(counts.values())) == 1
    assert counts[(3, 1)] == 3 * 2 + 3 * 2  # Hello+Done in, Placement+Shutdown out, per worker


@pytest.mark.parametrize("max_fused", [0, 1024], ids=["tasks", "fused"])
def test_kernel_failure_raises_task_error_with_stage_and_partition(max_fused: int) -> None:
    p = Program("fail")
    x = p.dataset("x", 4)
    p.load([x], lambda i, n: np.array([float(i)]))

    def bad(v: np.ndarray) -> np.ndarray:
        if v[0] == 3.0:
            raise ValueError("bad partition")
        return v

    with p.loop(3):
        p.compute(lambda v: v + 0.0, [x], [x], name="pass")
        p.compute(bad, [x], [x], name="check")  # declared: check
    at = re.escape(declared_at("# declared: check"))
    with pytest.raises(TaskError, match=rf"stage 'check' \(id 2, iteration \(0,\), declared at "
                                        rf"{at}\), compute task on partition 3") as failed:
        canary.run_local(p, workers=2, max_fused=max_fused)
    # the traceback begins at the kernel, not in the worker's runtime that called it
    said = str(failed.value)
    frames = re.findall(r'File "([^"]+)", line \d+, in (\S+)', said)
    assert [name for _, name in frames] == ["bad"], said
    assert said.rstrip().endswith("ValueError: bad partition"), said


def test_wrong_result_shape_is_reported_not_silently_used() -> None:
    p = Program("shape")
    x, y = p.dataset("x", 2), p.dataset("y", 2)
    p.load([x], lambda i, n: np.ones(2))
    p.compute(lambda v: (v, v), [x], [y], name="two_for_one")
    with pytest.raises(TaskError, match="returned 2 value"):
        canary.run_local(p, workers=1)
    q = Program("scatter")
    a, b = q.dataset("a", 2), q.dataset("b", 3)
    q.load([a], lambda i, n: np.ones(3))
    q.scatter_gather(a, b, lambda v: [v], "concat", name="short")
    with pytest.raises(TaskError, match="one piece per target"):
        canary.run_local(q, workers=2)
    # text became '<U5' partitions (summed as text); a ragged list leaked numpy's traceback
    for kernel, says in [(lambda v: "hello", r"output 'y' is an array of <U5 \(text or raw "
                                             r"bytes, from a str\); return numeric numpy arrays"),
                         (lambda v: [[1.0], [2.0, 3.0]], r"output 'y' must be a numpy array \(or "
                                                         r"number\), got a list numpy cannot make "
                                                         r"one of \(.*inhomogeneous"),
                         # 'got int': an int is a number
                         (lambda v: 2 ** 70, r"output 'y' must be a numpy array \(or number\), "
                                             r"got an int too large for int64"),
                         # its mask was dropped without a word
                         (lambda v: np.ma.masked_array(v, [1, 0]), r"output 'y' is a masked array"),
                         ]:
        r = Program("text")
        x, y = r.dataset("x", 2), r.dataset("y", 2)
        r.load([x], lambda i, n: np.ones(2))
        r.compute(kernel, [x], [y], name="kernel")
        r.report(y)
        with pytest.raises(TaskError, match=r"compute task on partition \d: " + says):
            canary.run_local(r, workers=2)


def test_a_list_for_two_outputs_is_told_to_be_a_tuple() -> None:
    p = Program("two_outputs")
    x, y, z = p.dataset("x", 1), p.dataset("y", 1), p.dataset("z", 1)
    p.load([x], lambda i, n: np.ones(2))
    p.compute(lambda v: [v * 1, v * 2], [x], [y, z], name="pair")
    p.report(y)
    with pytest.raises(TaskError, match=r"returned 1 value\(s\) \(a list of 2 is one value: "
                                        r"make it a tuple\) but the stage declares 2 output"):
        canary.run_local(p, workers=1)


@pytest.mark.parametrize("n", [3, 20_000])  # moved inline (small) or by a gather task (large)
@pytest.mark.parametrize("odd", [1, 4])  # one element would broadcast over the others silently
def test_pieces_a_builtin_gather_cannot_combine_fail_the_stage(n: int, odd: int) -> None:
    def shapes_vary(i: int, _: int) -> np.ndarray:
        return np.ones(n if i != 2 else odd)

    p = Program("sum")
    a, s = p.dataset("a", 4), p.dataset("s", 1)
    p.load([a], shapes_vary)
    p.reduce(a, s)  # declared: reduce_a
    p.report(s)
    said = rf"2 x \({n},\) float64, \({odd},\) float64, \({n},\) float64 \(in source-partition"
    at = re.escape(declared_at("# declared: reduce_a"))
    with pytest.raises(TaskError, match=rf"stage 'reduce_a' \(id 1, declared at {at}\), gather "
                                        rf"task on partition 0 failed:\na 'sum' gather adds "
                                        rf"pieces of one shape.*{said}"):
        canary.run_local(p, workers=2)
    q = Program("concat")
    a, b = q.dataset("a", 4), q.dataset("b", 1)
    q.load([a], lambda i, _: shapes_vary(i, _).reshape(1, -1))
    q.scatter_gather(a, b, lambda v: [v], "concat", name="rows", one_piece=True)  # declared: rows
    q.report(b)
    at = re.escape(declared_at("# declared: rows"))
    with pytest.raises(TaskError, match=rf"stage 'rows' \(id 1, declared at {at}\), gather task "
                                        r"on partition 0 failed:\na 'concat' gather stacks "
                                        r"pieces along their first axis, so their other axes "
                                        r"must match"):
        canary.run_local(q, workers=2)


def test_a_sum_gathers_pieces_in_the_dtype_numpy_adds_them_in() -> None:
    # the first piece's int32 wrapped 2**31 - 1 + 5 + 5 around; its float32 dropped 1e-8
    p = Program("dtypes")
    a, f = p.dataset("a", 3), p.dataset("f", 3)
    ta, tf = p.dataset("ta", 1), p.dataset("tf", 1)
    p.load([a], lambda i, n: np.array([2**31 - 1], np.int32) if i == 0 else np.array([5]))
    p.load([f], lambda i, n: np.array([1.0], np.float32) if i == 0 else np.array([1e-8]))
    p.reduce(a, ta)
    p.reduce(f, tf)
    p.report(ta)
    p.report(tf)
    r = canary.run_local(p, workers=2)
    want_a = np.array([2**31 - 1], np.int32) + np.array([5]) + np.array([5])
    want_f = np.array([1.0], np.float32) + np.array([1e-8]) + np.array([1e-8])
    assert r.value("ta").dtype == want_a.dtype and r.value("ta")[0] == want_a[0]
    assert r.value("tf").dtype == want_f.dtype and r.value("tf")[0] == want_f[0]


@pytest.mark.parametrize("n", [3, 20_000])  # moved inline (small) or by a gather task (large)
@pytest.mark.parametrize(("dtype", "value", "says"), [
    (np.int32, 2**30, "a 'sum' gather in int32 overflowed: the total of 4 x"),
    (np.int64, 2**62, "a 'sum' gather in int64 overflowed"),
    (np.int64, -(2**62) - 1, "a 'sum' gather in int64 overflowed"),
    (np.uint8, 200, "a 'sum' gather in uint8 overflowed"),
    (np.bool_, True, "a 'sum' gather of bool pieces would be a logical or"),
])
def test_an_integer_sum_that_overflows_or_a_bool_sum_fails_the_stage(
        n: int, dtype: type, value: int, says: str) -> None:
    # numpy wrapped 4 x 2**30 in int32 around to 0, and added bools as an or: exit 0, wrong
    p = Program("ints")
    a, s = p.dataset("a", 4), p.dataset("s", 1)
    p.load([a], lambda i, _: np.full(n, value, dtype))
    p.reduce(a, s, name="total")  # declared: total, overflowing ints
    p.report(s)
    at = re.escape(declared_at("# declared: total, overflowing ints"))
    with pytest.raises(TaskError, match=rf"stage 'total' \(id 1, declared at {at}\), gather task "
                                        rf"on partition 0 failed:\n{re.escape(says)}"):
        canary.run_local(p, workers=2)
    if dtype is not np.bool_:  # up to the edge of the range, the sum is exact
        edge = np.iinfo(dtype).max // 4
        q = Program("fits")
        b, t = q.dataset("b", 4), q.dataset("t", 1)
        q.load([b], lambda i, _: np.full(n, edge if value > 0 else -edge, dtype))
        q.reduce(b, t)
        q.report(t)
        got = canary.run_local(q, workers=2).value("t")
        assert got.dtype == dtype and (got == (4 * edge if value > 0 else -4 * edge)).all()


@pytest.mark.parametrize("n", [3, 20_000])  # moved inline (small) or by a gather task (large)
def test_a_sum_that_overflows_warns_naming_its_stage_not_canarys_code(n: int) -> None:
    # numpy's own warning pointed at worker/moves.py's `acc += p`
    p = Program("overflow")
    a, s = p.dataset("a", 4), p.dataset("s", 1)
    p.load([a], lambda i, _: np.full(n, 1e308))
    p.reduce(a, s, name="total")  # declared: total, overflowing floats
    p.report(s)
    at = re.escape(declared_at("# declared: total, overflowing floats"))
    with pytest.warns(RuntimeWarning) as said:
        r = canary.run_local(p, workers=2)
    assert np.isinf(r.value("s")).all()
    texts = [str(w.message) for w in said]
    assert any(re.match(rf"rank \d \(worker \d\): stage 'total' \(id 1, declared at {at}\): "
                        r"overflow encountered in the 'sum' gather into 's'", t)
               for t in texts), texts
    assert all(w.filename == "canary" for w in said), [(w.filename, w.lineno) for w in said]


@pytest.mark.parametrize("gather", ["sum", "concat"])
def test_a_destination_without_pieces_is_a_declaration_error(gather: str) -> None:
    # it failed at run time with an IndexError out of the worker's state machine
    p = Program("empty")
    a, o = p.dataset("a", 4), p.dataset("o", 3)
    p.load([a], lambda i, n: np.ones(5))
    with pytest.raises(canary.DeclarationError,
                       match=rf"scatter-gather 'to_first': partition 1 of 'o' gets no piece, "
                             rf"and gather '{gather}' needs at least one per destination"):
        p.scatter_gather(a, o, lambda v: [v], gather, targets=lambda i: [0], name="to_first")


def test_a_custom_gather_that_fails_on_no_pieces_is_told_it_got_none() -> None:
    # a custom gather is called with [] where no source targets its partition; its failure
    # said only numpy's "need at least one array to concatenate"
    p = Program("empty_custom")
    a, o = p.dataset("a", 3), p.dataset("o", 4)
    p.load([a], lambda i, n: np.ones(2))
    p.scatter_gather(a, o, lambda v: [v],  # declared: spread
                     lambda pieces: np.concatenate(pieces), targets=[[0], [1], [2]], name="spread")
    p.report(o)
    at = re.escape(declared_at("# declared: spread"))  # a call over lines: by its first line
    with pytest.raises(TaskError, match=rf"stage 'spread' \(id 1, declared at {at}\), gather task "
                                        r"on partition 3 \(no source partition lists it in its "
                                        r"targets, so its gather got no pieces\) failed:"):
        canary.run_local(p, workers=2)


def test_concat_stacks_one_number_partitions_and_names_shapes_it_cannot_stack() -> None:
    # numpy's own words were 'zero-dimensional arrays cannot be concatenated'
    p = Program("scalars")
    a, b, v = p.dataset("a", 3), p.dataset("b", 2), p.dataset("v", 1)
    p.load([a], lambda i, n: np.float64(i) * np.ones(()))
    p.load([b], lambda i, n: np.zeros((2, 3)) if i == 0 else np.zeros((2, 4)))
    p.reduce(a, v, op="concat")  # was 'their other axes must match, got 3 x () float64'
    p.report(a)
    p.report(b)
    p.report(v)
    r = canary.run_local(p, workers=2)
    assert r.concat("a").tolist() == [0.0, 1.0, 2.0] == r.value("v").tolist()
    with pytest.raises(ValueError, match=r"dataset 'b': its partitions cannot be stacked along "
                                         r"their first axis, their shapes are \(2, 3\), \(2, 4\)"):
        r.concat("b")


def test_a_report_event_value_of_several_partitions_raises_and_fails_the_job() -> None:
    # it was partition 0 alone, silently
    p = Program("events")
    x = p.dataset("x", 3)
    p.load([x], lambda i, n: np.full(2, float(i)))
    p.report(x, callback=lambda ev: ev.value)  # declared: report_x
    # and a callback that raises fails the job as a kernel would, naming the report and its line
    at = re.escape(declared_at("# declared: report_x"))
    with pytest.raises(TaskError, match=rf"(?s)^rank 0 \(controller\): report 'report_x' of 'x' "
                                        rf"\(iteration \(\), declared at {at}\), its callback "
                                        r"failed:\nTraceback.*"
                                        r"ValueError: dataset 'x' has 3 partitions: "
                                        r"ReportEvent\.value is for a one-partition dataset; "
                                        r"\.values lists them"):
        canary.run_local(p, workers=2)


def test_a_dataset_whose_writers_never_ran_is_named_where_it_is_read() -> None:
    # its partitions stayed None: a kernel failed on None * 2, a result gave None or an object
    # array, concat a numpy error
    def program(use: bool) -> Program:
        p = Program("unwritten")
        x, z = p.dataset("x", 3), p.dataset("z", 3)
        p.load([x], lambda i, n: np.arange(4.0) + i)
        with p.loop(0):
            p.compute(lambda v: v + 1, [x], [z], name="make_z")
        if use:
            p.compute(lambda v: v * 2, [z], [z], name="use_z")  # declared: use_z
        p.report(z)
        return p

    result = canary.run_local(program(False), workers=2)
    with pytest.raises(ValueError, match=r"dataset 'z': partition 0 has no value: no statement "
                                         r"that writes the dataset has run \(its writers are in "
                                         r"a loop of no passes, or in a branch not taken\)"):
        result.concat("z")
    for max_fused in (1, 64):  # a lone task, or a fused stretch
        at = re.escape(declared_at("# declared: use_z"))
        with pytest.raises(TaskError, match=rf"stage 'use_z' \(id 2, declared at {at}\), compute "
                                            r"task on partition \d.* failed: partition \d of 'z' "
                                            r"has no value: no statement"):
            canary.run_local(program(True), workers=2, max_fused=max_fused)


def test_a_result_names_what_was_not_reported_and_what_has_several_partitions() -> None:
    p = Program("reported")
    a, s = p.dataset("a", 3), p.dataset("s", 1)
    p.load([a], lambda i, n: np.full(2, float(i)))
    p.reduce(a, s)
    p.report(a)
    result = canary.run_local(p, workers=2)
    np.testing.assert_array_equal(result.concat("a"), [0, 0, 1, 1, 2, 2])
    with pytest.raises(KeyError, match=r"dataset 's' was not reported: declare p.report\(dataset\) "
                                       r"in the program \(reported: a\)"):
        result.value("s")
    with pytest.raises(KeyError, match="dataset 'x' was not reported"):
        result.concat("x")
    # not partition 0 alone, silently
    with pytest.raises(ValueError, match=r"dataset 'a' has 3 partitions: value\(\) is for a "
                                         r"one-partition dataset; concat\('a'\) stacks them"):
        result.value("a")


def test_a_result_says_a_report_that_never_ran_was_declared() -> None:
    p = Program("report_in_branch")
    s = p.dataset("s", 1)
    p.load([s], lambda i, n: np.zeros(1))
    with p.if_(lambda v: bool(v[0] > 0), on=s, name="never"):
        p.report(s)
    result = canary.run_local(p, workers=2)
    # not "declare p.report(dataset) in the program": the program has one
    with pytest.raises(KeyError, match=r"dataset 's' has no reported value: its report never "
                                       r"ran \(it is in a loop of no passes, or in a branch "
                                       r"not taken\)"):
        result.value("s")


def test_signal_must_return_a_bool() -> None:
    p = Program("sig")
    c = p.dataset("c", 1)
    p.load([c], lambda i, n: np.zeros(1))
    with p.while_(lambda v: v, on=c):
        p.compute(lambda v: v, [c], [c])
    with pytest.raises(TaskError, match="must return a bool"):
        canary.run_local(p, workers=2)


def test_a_signal_that_made_a_one_element_array_is_told_how_to_return_a_bool() -> None:
    p = Program("sig")
    c = p.dataset("c", 1)
    p.load([c], lambda i, n: np.zeros(1))
    with p.while_(lambda v: v < 3, on=c):
        p.compute(lambda v: v + 1, [c], [c])
    with pytest.raises(TaskError, match=r"got array\(\[ True\]\); it made a one-element array "
                                        r"\(comparing the partition, not its number\?\): "
                                        r"return bool\(...\) of it, or compare v\[0\]"):
        canary.run_local(p, workers=2)


def _double_in_place(v: np.ndarray) -> np.ndarray:
    v *= 2.0
    return v


@pytest.mark.parametrize("max_fused", [0, 1024], ids=["tasks", "fused"])
@pytest.mark.parametrize("copy_kernel", [lambda x: x, lambda x: x[1:]], ids=["same", "view"])
def test_output_aliasing_another_dataset_is_copied(copy_kernel: object, max_fused: int) -> None:
    """b = a (or a view of a), then a is doubled in place: b must keep the old values."""
    p = Program("alias")
    a, b = p.dataset("a", 1), p.dataset("b", 1)
    p.load([a], lambda i, n: np.array([1.0, 1.0]))
    p.compute(copy_kernel, [a], [b], name="copy")  # type: ignore[arg-type]
    p.compute(_double_in_place, [a], [a], name="double")
    p.report(a)
    p.report(b)
    r = canary.run_local(p, workers=1, max_fused=max_fused)
    assert r.value("a").tolist() == [2.0, 2.0]
    assert set(r.value("b").tolist()) == {1.0}


def test_gather_returning_a_shared_piece_is_copied() -> None:
    p = Program("alias_gather")
    a, c = p.dataset("a", 1), p.dataset("c", 1)
    p.load([a], lambda i, n: np.array([1.0]))
    p.scatter_gather(a, c, None, lambda ps: ps[0], one_piece=True, name="pass")
    p.compute(_double_in_place, [a], [a], name="double")
    p.report(a)
    p.report(c)
    r = canary.run_local(p, workers=1)
    assert r.value("a").tolist() == [2.0] and r.value("c").tolist() == [1.0]


def test_scatter_may_return_a_numba_typed_list() -> None:
    import numba
    from numba.typed import List

    @numba.njit(cache=False)
    def split(x: np.ndarray) -> List:
        out = List()
        out.append(x[:2].copy())
        out.append(x[2:].copy())
        return out

    p = Program("typed_list")
    a, b = p.dataset("a", 2), p.dataset("b", 2)
    p.load([a], lambda i, n: np.arange(4.0) + 10 * i)
    p.scatter_gather(a, b, split, "concat", name="split")
    p.report(b)
    r = canary.run_local(p, workers=2)
    assert r.results["b"][0].tolist() == [0.0, 1.0, 10.0, 11.0]
    assert r.results["b"][1].tolist() == [2.0, 3.0, 12.0, 13.0]


def test_cluster_invariant_catches_a_partition_held_twice() -> None:
    from canary.controller.state import ControllerState
    from canary.local_runner import validate_cluster
    from canary.messages import Placement
    from canary.partition_map import PartitionMap
    from canary.worker.state import Partition, WorkerState

    p = shuffle_program().finalize()
    sizes = [g[0].partitions for g in p.groups]
    ctrl = ControllerState(p, 2)
    ctrl.map = PartitionMap.initial(sizes, 2)
    states = [WorkerState(p, w, 2) for w in range(2)]
    for s in states:
        s.handle(Placement(1, PartitionMap.initial(sizes, 2)))
    validate_cluster(ctrl, states)
    x = p.datasets[0]
    states[1].parts[(x.id, 0)] = Partition(x.id, 0)  # x[0] belongs to worker 0
    with pytest.raises(AssertionError, match=r"held by workers 0 and 1"):
        validate_cluster(ctrl, states)
    del states[0].parts[(x.id, 0)]  # now only worker 1 holds it, and the map names worker 0
    with pytest.raises(AssertionError, match=r"partition 0 of 'x' is held by 1, map says 0"):
        validate_cluster(ctrl, states)
    states[0].parts[(x.id, 0)] = states[1].parts.pop((x.id, 0))
    validate_cluster(ctrl, states)
    ctrl.map.versions[p.group_of(x)][0] += 1  # the owner's map is behind the controller's
    with pytest.raises(AssertionError, match=r"worker 0 holds partition 0 of 'x' at another "):
        validate_cluster(ctrl, states)


def test_a_loaded_partition_a_kernel_updates_in_place_is_the_workers_own() -> None:
    # A loader may return a template, a global or slices of the caller's array. Updated in
    # place, a shared one changed the caller's data, another partition, and a second run's
    # starting values: the answer depended on the run and on which partitions share a worker.
    template = np.ones(2)
    p = Program("shared_loader")
    x = p.dataset("x", 2)
    p.load([x], lambda i, n: template, name="load_template")
    p.compute(_double_in_place, [x], [x], name="double")
    p.report(x)
    for workers in (1, 2, 1):
        r = canary.run_local(p, workers=workers)
        assert [v.tolist() for v in r.results["x"]] == [[2.0, 2.0], [2.0, 2.0]]
    assert template.tolist() == [1.0, 1.0]
    whole = np.arange(6.0)
    q = Program("slices")
    y = q.dataset("y", 3)
    q.load([y], lambda i, n: whole[2 * i:2 * i + 2])
    q.compute(_double_in_place, [y], [y])
    q.report(y)
    for _ in range(2):
        assert canary.run_local(q, workers=1).concat("y").tolist() == \
            (2 * np.arange(6.0)).tolist()
    assert whole.tolist() == np.arange(6.0).tolist()
    # one array loaded into a dataset updated in place and into one only read
    g = Program("one_global_two_datasets")
    w, ref = g.dataset("w", 1), g.dataset("ref", 1)
    g.load([w], lambda i, n: whole)
    g.load([ref], lambda i, n: whole)
    g.compute(_double_in_place, [w], [w])
    g.report(w)
    g.report(ref)
    r = canary.run_local(g, workers=1)
    assert r.value("w").tolist() == (2 * whole).tolist()
    assert r.value("ref").tolist() == whole.tolist() == np.arange(6.0).tolist()


def test_a_fresh_loaded_array_or_one_no_kernel_updates_is_not_copied() -> None:
    import weakref

    made: list[weakref.ref[np.ndarray]] = []

    def fresh(i: int, n: int) -> np.ndarray:
        a = np.full(3, float(i))
        made.append(weakref.ref(a))  # no reference of ours: the worker's may be the only one
        return a

    kept = np.zeros(3)
    p = Program("no_copies")
    x, y, z = p.dataset("x", 2), p.dataset("y", 2), p.dataset("z", 2)
    p.load([x], fresh)
    p.load([y], lambda i, n: kept)  # read only: shared, as nothing changes it
    p.compute(_double_in_place, [x], [x])
    p.compute(lambda a, b: a + b, [x, y], [z])
    p.report(z)
    from canary.messages import Placement
    from canary.partition_map import PartitionMap
    from canary.worker.execute import run_task
    from canary.worker.state import WorkerState

    st = WorkerState(p.finalize(), 0, 1)
    st.start()
    out = st.handle(Placement(1, PartitionMap.initial([g[0].partitions for g in p.groups], 1)))
    ev = run_task(st, out[0].task, 1)
    assert ev.outputs[0] is made[0]()  # the loader's own array, not a copy
    loads = [t for t in st.tasks.values() if t.stage.writes[:1] == (y,)]
    ev = run_task(st, loads[0], 2)
    assert ev.outputs[0] is kept


def test_a_runner_given_no_program_or_a_result_given_a_dataset_says_what_it_wants() -> None:
    # AttributeErrors out of the runner, and "dataset 'Dataset('x', ...)' was not reported"
    for run in (canary.run_local, canary.run):
        with pytest.raises(TypeError, match=r"expected a canary.Program .*got 'prog'"):
            run("prog")  # type: ignore[arg-type]
    p = Program("one")
    x = p.dataset("x", 1)
    p.load([x], lambda i, n: np.ones(2))
    p.report(x)
    r = canary.run_local(p)
    with pytest.raises(TypeError, match=r"give the dataset's name, e.g. 'x', not Dataset"):
        r.value(x)  # type: ignore[arg-type]


@pytest.mark.parametrize("stages", [1, 3])  # a lone task, and a fused stretch of three
def test_a_kernel_that_calls_sys_exit_fails_its_task_by_name(stages: int) -> None:
    # SystemExit passed through the task: "rank 1 failed: SystemExit(0)", no stage named
    import sys

    def quits(v: np.ndarray) -> np.ndarray:
        sys.exit(0)

    p = Program("quits")
    x = p.dataset("x", 2)
    p.load([x], lambda i, n: np.ones(2))
    with p.loop(2):
        for k in range(stages - 1):
            p.compute(lambda v: v + 1, [x], [x], name=f"step{k}")
        p.compute(quits, [x], [x], name="quits")  # declared: quits
    p.report(x)
    at = re.escape(declared_at("# declared: quits"))
    with pytest.raises(TaskError, match=rf"stage 'quits' \(id \d+, iteration \(0,\), declared at "
                                        rf"{at}\), compute task on partition \d.* "
                                        r"failed:(.|\n)*SystemExit: 0"):
        canary.run_local(p, workers=2)


# Each builder declares one failing statement, on the line that ends with its marker. Unnamed,
# a stage is named for its function ("<lambda>", "reduce_x", "while_<lambda>"), and canary's own
# checks leave no traceback into the driver: the line is what points the user at the statement.
def _kernel_raises(p: Program, x: canary.Dataset) -> None:
    p.compute(lambda v: v[5], [x], [x])  # declared: a kernel that raises


def _two_results_for_one_output(p: Program, x: canary.Dataset) -> None:
    p.compute(lambda v: (v, v), [x], [x])  # declared: two results for one output


def _sum_of_unlike_pieces(p: Program, x: canary.Dataset) -> None:
    y, s = p.dataset("y", 3), p.dataset("s", 1)
    p.compute(lambda v: np.ones(2 if v[0] == 1 else 3), [x], [y], name="ragged")
    p.reduce(y, s)  # declared: a sum of unlike pieces


def _custom_gather_of_text(p: Program, x: canary.Dataset) -> None:
    s = p.dataset("s", 1)
    p.reduce(x, s, op=lambda pieces: "text")  # declared: a gather returning text


def _while_of_an_array(p: Program, x: canary.Dataset) -> None:
    s = p.dataset("s", 1)
    p.reduce(x, s)
    with p.while_(lambda v: v < 3, on=s):  # declared: a while_ signal that is no bool
        p.compute(lambda v: v + 1, [s], [s])


def _if_of_a_float(p: Program, x: canary.Dataset) -> None:
    s = p.dataset("s", 1)
    p.reduce(x, s)
    with p.if_(lambda v: v[0] * 0.5, on=s):  # declared: an if_ signal that is no bool
        p.compute(lambda v: v + 1, [s], [s])


def _load_of_text(p: Program, x: canary.Dataset) -> None:
    z = p.dataset("z", 2)
    p.load([z], lambda i, n: "text")  # declared: a load returning text


def _callback_raises(p: Program, x: canary.Dataset) -> None:
    def callback(ev: canary.ReportEvent) -> None:
        raise KeyError("no such metric")

    p.report(x, callback=callback)  # declared: a report callback that raises


def _case(build: Callable[[Program, canary.Dataset], None], marker: str, says: str) -> Any:
    return pytest.param(build, marker, says, id=marker.replace(" ", "_"))


@pytest.mark.parametrize(("build", "marker", "says"), [
    _case(_kernel_raises, "a kernel that raises",
          r"stage '<lambda>' \(id 1, declared at {at}\), compute task on partition \d[^\n]* "
          r"failed:\n.*IndexError"),
    _case(_two_results_for_one_output, "two results for one output",
          r"stage '<lambda>' \(id 1, declared at {at}\), compute task on partition \d[^\n]*: "
          r"returned 2 value\(s\)"),
    _case(_sum_of_unlike_pieces, "a sum of unlike pieces",
          r"stage 'reduce_y' \(id 2, declared at {at}\), gather task on partition 0 failed:\n"
          r"a 'sum' gather adds pieces of one shape"),
    _case(_custom_gather_of_text, "a gather returning text",
          r"stage 'reduce_x' \(id 1, declared at {at}\), gather task on partition 0: gather of "
          r"'s' is an array of <U4"),
    _case(_while_of_an_array, "a while_ signal that is no bool",
          r"stage 'while_<lambda>' \(id 2, iteration \(0,\), declared at {at}\), signal task on "
          r"partition 0: a signal function must return a bool, got array\("),
    _case(_if_of_a_float, "an if_ signal that is no bool",
          r"stage 'if_<lambda>' \(id 2, declared at {at}\), signal task on partition 0: a "
          r"signal function must return a bool, got "),
    _case(_load_of_text, "a load returning text",
          r"stage '<lambda>' \(id 1, declared at {at}\), load task on partition \d: output 'z' "
          r"is an array of <U4"),
    _case(_callback_raises, "a report callback that raises",
          r"^rank 0 \(controller\): report 'report_x' of 'x' \(iteration \(\), declared at "
          r"{at}\), its callback failed:\n.*KeyError: 'no such metric'"),
])
def test_a_failure_names_the_driver_line_that_declared_its_statement(
        build: Callable[[Program, canary.Dataset], None], marker: str, says: str) -> None:
    p = Program("sites")
    x = p.dataset("x", 3)
    p.load([x], lambda i, n: np.full(2, float(i)))
    build(p, x)
    at = re.escape(declared_at(f"# declared: {marker}"))
    with pytest.raises(TaskError) as failed:
        canary.run_local(p, workers=2)
    assert re.search(says.replace("{at}", at), str(failed.value), re.S), str(failed.value)
