"""Running one task: call its function and check what it returned.

Shared by the MPI runtime and the in-process harness so both validate results identically.
This is the only place user code (kernels, loaders, signals, gathers) is called on a worker.
"""

from __future__ import annotations

import sys
import time
import weakref
from collections.abc import Callable, Sequence
from time import perf_counter
from typing import Any

import numpy as np

from canary.messages import TaskDone, TaskFailed
from canary.result import NEVER_WRITTEN
from canary.worker.chain import CHAINS, is_compile_error
from canary.worker.state import WorkerState
from canary.worker.tasks import (
    K_COMPUTE,
    K_FUSED,
    K_GATHER,
    K_LOAD,
    K_SCATTER,
    K_SIGNAL,
    Stretch,
    Task,
    failure_text,
    task_place,
)


class ResultError(TypeError):
    """A task returned something of the wrong shape for its stage."""


def run_task(state: WorkerState, task: Task, eid: int = 0,
             on_task: Callable[..., None] | None = None) -> TaskDone | TaskFailed:
    """Run ``task`` and return the event to feed back to ``state``, with id ``eid`` and, on a
    :class:`TaskDone`, the seconds the task took.

    ``on_task(stage, seq, iteration, partition, start, end)`` (tracing only) is called after
    each task inside a fused stretch, with ``time.time()`` stamps; the stretch then calls every
    kernel from Python, so that each task is timed alone.

    Never raises for a failure of user code: an exception (or a malformed result) becomes a
    :class:`TaskFailed` whose message names the rank, the stage, the partition and the
    traceback, which the worker forwards to the controller.
    """
    kind = task.kind
    t0 = perf_counter()
    if kind == K_COMPUTE:  # the hot path: no (fn, args) tuple, one type check per output
        try:
            res = task.stage.fn(*[p.value for p in task.reads])  # type: ignore[misc]
            if type(res) is np.ndarray and len(task.writes) == 1 and not res.dtype.hasobject:
                return TaskDone(eid, task, (_unaliased(res, task.writes[0], task.reads),),
                                perf_counter() - t0)
            outs = _outputs(task.stage.writes, res)
            return TaskDone(eid, task, tuple(_unaliased(v, w, task.reads)
                                             for v, w in zip(outs, task.writes)),
                            perf_counter() - t0)
        except (Exception, SystemExit):  # sys.exit in a kernel: its task fails, named
            return _failed(state, task, eid)
    if kind == K_FUSED:
        assert task.stretch is not None
        return _run_stretch(state, task, task.stretch, eid, t0, on_task)
    fn, args = state.task_call(task)
    try:
        res = fn(*args)
        if kind == K_LOAD:
            res = _outputs(task.stage.writes, res)
            res = _owned(state, task, res)  # `res` no longer holds the loader's own return
        elif kind == K_SCATTER:
            res = _pieces(task, res)
        elif kind == K_GATHER:
            res = _array(res, f"gather of '{task.stage.dst.name}'")  # type: ignore[union-attr]
            for piece in args[0]:  # a gather must not hand back (a view of) a shared piece
                if res is piece or res.base is piece:
                    res = res.copy()
                    break
        elif kind == K_SIGNAL:
            res = _signal(res)
    except (Exception, SystemExit):
        if kind == K_GATHER and not args[0]:  # a custom gather of nothing: say why it got none
            return _failed(state, task, eid, f"{task.label()} (no source partition lists it in "
                                             "its targets, so its gather got no pieces)")
        return _failed(state, task, eid)
    return TaskDone(eid, task, res, perf_counter() - t0)


def _run_stretch(state: WorkerState, task: Task, stretch: Stretch, eid: int, t0: float,
                 on_task: Callable[..., None] | None = None) -> TaskDone | TaskFailed:
    """Run a fused stretch: every compute instance on one partition index, then the next.

    Outputs are checked exactly as for a lone compute task (same shapes, same aliasing rule).
    The result is ``[(Partition, value), ...]`` for every partition the stretch wrote. A failure
    names the very instance and partition that failed, as a lone task's would.
    """
    out: list[tuple[Any, Any]] = []
    instances = stretch.instances
    by_stage = {st: _step(st) for st in dict.fromkeys(st for st, _, _ in instances)}
    steps = [by_stage[st] for st, _, _ in instances]
    first = steps[0][1]
    inplace = first if all(s[1] is not None and s[1] == first for s in by_stage.values()) else None
    fns = [s[0] for s in steps]
    ndarray = np.ndarray
    if on_task is not None:
        inplace = None  # the general path below times every task
    runner = CHAINS.runner(fns, stretch.tasks) if inplace is not None else None
    progress = np.zeros(1, np.int64) if runner is not None else None
    for i, row in zip(stretch.idxs, stretch.parts):
        n = 0
        v: Any = None
        vals: dict[int, Any] | None = None
        try:
            if runner is not None:  # compiled: the kernels call each other from machine code
                assert inplace is not None
                assert progress is not None
                loop, reps, tail = runner
                progress[0] = 0
                try:
                    v0 = row[inplace].value
                    v = loop(v0, reps, tail, progress)
                except Exception as exc:
                    if not is_compile_error(exc):
                        n = int(progress[0])
                        raise
                    CHAINS.failed(fns)  # nothing ran: redo this partition in Python
                    runner = None
                else:
                    if v is None:  # updated in place
                        v = v0
                    elif type(v) is not ndarray or v.dtype.hasobject:
                        n = len(fns) - 1
                        v = _outputs(instances[n][0].writes, v)[0]
                    out.append((row[inplace], v))
                    continue
            if inplace is not None:  # every stage updates one dataset: v = f(v), the hot case
                v = row[inplace].value
                for fn in fns:
                    v = fn(v)
                    if type(v) is not ndarray or v.dtype.hasobject:
                        v = _outputs(instances[n][0].writes, v)[0]
                    n += 1
                out.append((row[inplace], v))
                continue
            vals = {d: p.value for d, p in row.items()}
            for fn, _, rids, wids, others in steps:
                if on_task is not None:
                    began = time.time()
                res = fn(*[vals[d] for d in rids])
                if type(res) is ndarray and len(wids) == 1 and not res.dtype.hasobject:
                    outs: tuple[np.ndarray, ...] = (res,)
                else:
                    outs = _outputs(instances[n][0].writes, res)
                for d, v, oth in zip(wids, outs, others):
                    vals[d] = _alias_free(v, [vals[r] for r in oth]) if oth else v
                if on_task is not None:
                    on_task(*instances[n], i, began, time.time())
                n += 1
            out.extend((row[d], vals[d]) for d in stretch.written)
        except (Exception, SystemExit):
            st, _seq, it = instances[n]
            # the failed instance's inputs: its datasets' values so far in this stretch
            inputs = ([(d, i, vals[d]) for d in steps[n][2]] if vals is not None else
                      [(inplace, i, v)] if inplace is not None and runner is None else [])
            return _failed(state, task, eid, f"{st.label(it)}, compute task on partition {i} "
                                             f"(in a {stretch.describe()})", inputs)
    return TaskDone(eid, task, out, perf_counter() - t0)


def _step(st: Any) -> tuple[Any, int | None, tuple[int, ...], tuple[int, ...],
                            tuple[tuple[int, ...], ...]]:
    """(fn, the dataset it updates in place or None, read ids, write ids, for each write the
    other read ids its output must not alias) of a compute stage, built once per stage."""
    step = _STEPS.get(st)
    if step is None:
        rids = tuple(d.id for d in st.reads)
        wids = tuple(d.id for d in st.writes)
        others = tuple(tuple(r for r in rids if r != w) for w in wids)
        inplace = wids[0] if len(wids) == 1 and rids == wids else None
        step = _STEPS[st] = (st.fn, inplace, rids, wids, others)
    return step


_STEPS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _unaliased(value: np.ndarray, dest: Any, reads: tuple[Any, ...]) -> np.ndarray:
    """``value``, copied if it is (a direct view of) an input partition other than ``dest``.

    A kernel may return its input to update it in place (input and output the same dataset),
    but returning another dataset's partition, or a slice of it, would make two partitions
    share memory, and a later in-place update of one would silently change the other.
    """
    return _alias_free(value, [r.value for r in reads if r is not dest])


def _refcounts(outs: tuple[np.ndarray, ...]) -> list[int]:
    return [sys.getrefcount(v) for v in outs]


# the count of an array only the outputs' tuple holds, as this interpreter counts references
_FRESH_REFS = _refcounts((np.empty(1),))[0]


def _owned(state: WorkerState, task: Task, outs: tuple[np.ndarray, ...]
           ) -> tuple[np.ndarray, ...]:
    """``outs`` (a loader's outputs), with a copy of each that a kernel may update in place
    (:attr:`Program.updated_in_place`) and that is not the worker's alone: a view (a slice of
    the caller's array, of another partition) or an array something else holds too (a module
    global, a template a closure returns for every partition).

    Updated in place, such a partition would change the caller's data or another partition,
    and the answer would depend on the run (a second one starts from other values) and on
    which partitions share a worker. Arrays a loader makes (read from a file, generated) are
    kept as they are, and so are datasets no kernel updates in place, which may share memory
    freely: copying every loaded array would double a worker's peak memory while it loads."""
    updated = state.program.updated_in_place
    if not any(d.id in updated for d in task.stage.writes):
        return outs
    counts = _refcounts(outs)
    return tuple(np.array(v, copy=True)
                 if d.id in updated and (v.base is not None or n > _FRESH_REFS) else v
                 for v, n, d in zip(outs, counts, task.stage.writes))


def _alias_free(value: np.ndarray, others: list[Any]) -> np.ndarray:
    """``value``, copied if it is one of ``others`` or a direct view of one."""
    base = value.base
    for v in others:
        if value is v or base is v:
            return value.copy()
    return value


def _failed(state: WorkerState, task: Task, eid: int, label: str | None = None,
            inputs: Sequence[tuple[int, int, Any]] | None = None) -> TaskFailed:
    """The event for the exception being handled: where it happened, and the user code's
    traceback. A malformed result (:class:`ResultError`, raised by canary's own checks) and
    canary's own errors (unreadable input read inside a task) are said in one line, since
    canary's frames would say nothing to the user. So is an input that has no value (its
    writers never ran): the cause, rather than what the kernel made of a None. ``inputs``
    (dataset id, partition, value) are the failed function's; default: the task's reads."""
    exc = sys.exc_info()[1]
    assert exc is not None
    label = label or task.label()
    where = task_place(state.rank, state.worker, label)
    if inputs is None:
        inputs = [(p.dataset, p.index, p.value) for p in task.reads]
    unset = next(((d, k) for d, k, value in inputs if value is None), None)
    if unset is not None and not isinstance(exc, ResultError):
        name = state.program.datasets[unset[0]].name
        return TaskFailed(eid, task, f"{where} failed: partition {unset[1]} of '{name}' has no "
                                     f"value: {NEVER_WRITTEN}")
    if isinstance(exc, ResultError):
        return TaskFailed(eid, task, f"{where}: {exc}")
    return TaskFailed(eid, task, failure_text(state.rank, state.worker, label, exc))


def _outputs(writes: tuple[Any, ...], res: Any) -> tuple[np.ndarray, ...]:
    if len(writes) == 1 and not isinstance(res, tuple):
        res = (res,)
    if not isinstance(res, tuple) or len(res) != len(writes):
        got = len(res) if isinstance(res, tuple) else 1
        # a list of as many arrays as outputs is one array to numpy: say what to change
        listed = (f" (a {type(res).__name__} of {len(res)} is one value: make it a tuple)"
                  if isinstance(res, list) and len(res) == len(writes) else "")
        raise ResultError(
            f"returned {got} value(s){listed} but the stage declares {len(writes)} output(s) "
            f"({', '.join(d.name for d in writes)}); return a tuple with one array per output"
        )
    return tuple(_array(v, f"output '{d.name}'") for v, d in zip(res, writes))


def _pieces(task: Task, res: Any) -> Any:
    st = task.stage
    # Pieces delivered on this worker are not copied by any transport; one that is (a view of)
    # the input partition could change under a later in-place update before its gather runs.
    if st.one_piece:
        return _unaliased(_array(res, "scatter piece"), None, task.reads)
    targets = st.targets[task.part]
    # Any sequence of arrays: a list, a tuple, or a numba typed List returned by a jitted scatter.
    is_seq = isinstance(res, Sequence) and not isinstance(res, (str, bytes))
    if not is_seq or len(res) != len(targets):
        got = len(res) if is_seq else type(res).__name__
        raise ResultError(
            f"scatter must return one piece per target ({len(targets)} for source partition "
            f"{task.part}), got {got}"
        )
    return [_unaliased(_array(v, "scatter piece"), None, task.reads) for v in res]


def _array(v: Any, what: str) -> np.ndarray:
    """``v`` as a numeric numpy array; raises :class:`ResultError` for what is not one (an
    object array, text, a ragged list)."""
    if isinstance(v, np.ndarray):
        if v.dtype == object:
            raise ResultError(f"{what} is an object array; return numeric numpy arrays")
        if isinstance(v, np.ma.MaskedArray):  # the mask would be dropped without a word
            raise ResultError(f"{what} is a masked array, and canary keeps plain arrays: "
                              "return a.filled(value) or the data and the mask as two outputs")
        arr = v
    else:
        try:
            arr = np.asarray(v)
        except ValueError as exc:  # a ragged list
            raise ResultError(f"{what} must be a numpy array (or number), got a "
                              f"{type(v).__name__} numpy cannot make one of ({exc})") from None
        if arr.dtype == object:
            big = isinstance(v, int) and not isinstance(v, bool)  # past int64: numpy's object
            raise ResultError(f"{what} must be a numpy array (or number), got "
                              f"{'an int too large for int64' if big else type(v).__name__}")
    if arr.dtype.kind in "USV":  # text or raw bytes: sums and reduces of it are nonsense
        raise ResultError(f"{what} is an array of {arr.dtype} (text or raw bytes, from a "
                          f"{type(v).__name__}); return numeric numpy arrays")
    return arr


def _signal(v: Any) -> bool:
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)) and v in (0, 1):
        return bool(v)
    hint = ""
    if isinstance(v, np.ndarray) and v.size == 1:  # `v < 3` on a one-number partition
        hint = ("; it made a one-element array (comparing the partition, not its number?): "
                "return bool(...) of it, or compare v[0]")
    raise ResultError(f"a signal function must return a bool, got {v!r}{hint}")
