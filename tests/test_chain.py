"""Fused compute stretches run as one numba-compiled loop: same answers as task by task."""

from __future__ import annotations

import re

import numba
import numpy as np
import pytest

import canary
import canary.worker.execute
from canary import Program, TaskError
from canary.worker.chain import MAX_BODIES, ChainCache, split_period
from tests.conftest import declared_at


@numba.njit(cache=True)
def _inc(v: np.ndarray) -> np.ndarray:
    v[0] += 1.0
    return v


@numba.njit(cache=True)
def _scale(v: np.ndarray) -> np.ndarray:
    v[1] = v[1] * 1.5 + v[0]
    return v


@numba.njit(cache=True)
def _fail_at_5(v: np.ndarray) -> np.ndarray:
    if v[0] == 5.0:
        raise ValueError("reached five")
    return v


@numba.njit(cache=True)
def _fresh(v: np.ndarray) -> np.ndarray:
    w = v[::-1].copy()  # a new buffer, not an in-place update
    w[0] += 0.25
    return w


@numba.njit(cache=True)
def _to_int(v: np.ndarray) -> np.ndarray:
    return v.astype(np.int64)


def test_split_period_finds_the_shortest_body() -> None:
    a, b, c = object(), object(), object()
    assert split_period([a, b, a, b, a]) == ((a, b), 2, 1)
    assert split_period([a, a, a]) == ((a,), 3, 0)
    assert split_period([a, b, c]) == ((a, b, c), 1, 0)
    assert split_period([a, b, a, c]) == ((a, b, a, c), 1, 0)


def loop_program(body: list, iters: int, parts: int = 3) -> Program:
    p = Program("chain")
    x = p.dataset("x", parts)
    p.load([x], lambda i, n: np.array([float(i), 1.0]))
    with p.loop(iters):
        for k, fn in enumerate(body):
            p.compute(fn, [x], [x], name=f"s{k}")  # declared: s0, s1, ...
    p.report(x)
    return p


@pytest.fixture
def chains(monkeypatch: pytest.MonkeyPatch) -> ChainCache:
    cache = ChainCache(compile_after=0)
    monkeypatch.setattr(canary.worker.execute, "CHAINS", cache)
    return cache


def values(r: canary.JobResult) -> list[list[float]]:
    return [v.tolist() for v in r.results["x"]]


@pytest.mark.parametrize("max_fused", [3, 7, 1024])
def test_compiled_loop_gives_the_task_by_task_answer(chains: ChainCache, max_fused: int) -> None:
    want = values(canary.run_local(loop_program([_inc, _scale], 9), workers=1, max_fused=0))
    got = values(canary.run_local(loop_program([_inc, _scale], 9), workers=2,
                                  max_fused=max_fused))
    assert got == want
    # short stretches may start mid-body or hold one stage: each distinct body compiles once
    assert chains.compiled == 1 if max_fused == 1024 else chains.compiled >= 1
    assert want[2] != [2.0, 1.0]  # the loop really ran


@pytest.mark.parametrize("body", [[_fresh], [_inc, _fresh], [_fresh, _inc, _scale]])
def test_compiled_loop_keeps_kernels_that_return_a_new_array(chains: ChainCache,
                                                              body: list) -> None:
    # the loop hands back None for an in-place update and the array otherwise: a new buffer
    # must reach the partition, not the (unchanged) input
    want = values(canary.run_local(loop_program(body, 8), workers=1, max_fused=0))
    got = values(canary.run_local(loop_program(body, 8), workers=1, max_fused=1024))
    assert chains.compiled == 1
    assert got == want
    assert want[1] != [1.0, 1.0]


def test_compiling_waits_for_enough_tasks() -> None:
    cache = ChainCache(compile_after=100)
    fns = [_inc] * 10
    assert cache.runner(fns, 60) is None and cache.runner(fns, 60) is None
    got = cache.runner(fns, 60)  # 120 tasks seen in Python: now worth compiling
    assert got is not None and got[1:] == (10, 0) and cache.compiled == 1


def test_python_kernels_are_never_compiled(chains: ChainCache) -> None:
    want = values(canary.run_local(loop_program([lambda v: v + 1.0], 5), max_fused=0))
    assert values(canary.run_local(loop_program([lambda v: v + 1.0], 5))) == want
    assert chains.compiled == 0


def test_a_body_numba_cannot_compile_falls_back_to_python(chains: ChainCache) -> None:
    """The dtype changes from stage to stage, so the compiled loop's ``v`` has no single type."""
    want = values(canary.run_local(loop_program([_to_int, _inc], 3), max_fused=0))
    assert values(canary.run_local(loop_program([_to_int, _inc], 3))) == want
    assert chains.compiled == 0


def test_failure_inside_a_compiled_loop_names_instance_and_partition(chains: ChainCache) -> None:
    # Partition i starts at x[0] = i and _inc adds 1 per iteration. A stretch runs partition by
    # partition, so partition 0 goes first and fails in iteration 4 (after 5 increments).
    at = re.escape(declared_at("# declared: s0, s1, ..."))
    with pytest.raises(TaskError, match=rf"(?s)stage 's1' \(id 2, iteration \(4,\), declared at "
                                        rf"{at}\), compute task on partition 0 .*reached five"):
        canary.run_local(loop_program([_inc, _fail_at_5], 9), workers=1)
    assert chains.compiled == 1


def test_a_process_running_many_programs_keeps_few_of_their_kernels() -> None:
    # Each program a process runs (a pool worker's jobs, a driver calling canary.run in a loop)
    # may declare kernels of its own: the cache counted every body it ever saw, holding its
    # kernels and what they hold (closures, globals) for the process's whole life.
    import gc
    import weakref

    cache = ChainCache(compile_after=10**9)  # counted, never compiled
    first: list[weakref.ref] = []
    for k in range(MAX_BODIES + 40):
        big = np.full(1000, float(k))  # what a job's kernel holds
        python_kernel = lambda v, big=big: v + big[0]  # noqa: E731
        numba_kernel = numba.njit(lambda v: v)  # a dispatcher of its own, never compiled here
        assert cache.runner([python_kernel] * 4, 4) is None
        assert cache.runner([numba_kernel] * 4, 4) is None
        if k == 0:
            first = [weakref.ref(python_kernel), weakref.ref(numba_kernel)]
        del python_kernel, numba_kernel, big
    gc.collect()
    assert len(cache.python_tasks) == MAX_BODIES and not cache.loops
    assert [r() for r in first] == [None, None]
    # a body still in use keeps counting towards compiling it
    cache.compile_after = 8
    assert cache.runner([_inc] * 4, 8) is None
    got = cache.runner([_inc] * 4, 8)
    assert got is not None and cache.compiled == 1
