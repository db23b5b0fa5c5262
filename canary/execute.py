"""Running one task: call its function and check what it returned.

Shared by the MPI runtime and the in-process harness so both validate results identically.
This is the only place user code (kernels, loaders, signals, gathers) is called on a worker.
"""

from __future__ import annotations

import traceback
from collections.abc import Sequence
from typing import Any

import numpy as np

from canary.messages import TaskDone, TaskFailed
from worker.state import K_COMPUTE, K_GATHER, K_LOAD, K_SCATTER, K_SIGNAL, Task, WorkerState


class ResultError(TypeError):
    """A task returned something of the wrong shape for its stage."""


def run_task(state: WorkerState, task: Task) -> TaskDone | TaskFailed:
    """Run ``task`` and return the event to feed back to ``state``.

    Never raises for a failure of user code: an exception (or a malformed result) becomes a
    :class:`TaskFailed` whose message names the rank, the stage, the partition and the
    traceback, which the worker forwards to the controller.
    """
    kind = task.kind
    if kind == K_COMPUTE:  # the hot path: no (fn, args) tuple, one type check per output
        try:
            res = task.stage.fn(*[p.value for p in task.reads])  # type: ignore[misc]
            if type(res) is np.ndarray and len(task.writes) == 1 and not res.dtype.hasobject:
                return TaskDone(0, task, (_unaliased(res, task.writes[0], task.reads),))
            return TaskDone(0, task, tuple(_unaliased(v, w, task.reads)
                                           for v, w in zip(_outputs(task, res), task.writes)))
        except Exception:
            return _failed(state, task)
    fn, args = state.task_call(task)
    try:
        res = fn(*args)
        if kind == K_LOAD:
            res = _outputs(task, res)
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
    except Exception:
        return _failed(state, task)
    return TaskDone(0, task, res)


def _unaliased(value: np.ndarray, dest: Any, reads: tuple[Any, ...]) -> np.ndarray:
    """``value``, copied if it is (a direct view of) an input partition other than ``dest``.

    A kernel may return its input to update it in place (input and output the same dataset),
    but returning another dataset's partition, or a slice of it, would make two partitions
    share memory, and a later in-place update of one would silently change the other.
    """
    base = value.base
    for r in reads:
        if r is not dest:
            v = r.value
            if value is v or base is v:
                return value.copy()
    return value


def _failed(state: WorkerState, task: Task) -> TaskFailed:
    msg = (f"rank {state.rank} (worker {state.worker}): {task.label()} failed:\n"
           f"{traceback.format_exc()}")
    return TaskFailed(0, task, msg)


def _outputs(task: Task, res: Any) -> tuple[np.ndarray, ...]:
    writes = task.stage.writes
    if len(writes) == 1 and not isinstance(res, tuple):
        res = (res,)
    if not isinstance(res, tuple) or len(res) != len(writes):
        got = len(res) if isinstance(res, tuple) else 1
        raise ResultError(
            f"returned {got} value(s) but the stage declares {len(writes)} output(s) "
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
    if isinstance(v, np.ndarray):
        if v.dtype == object:
            raise ResultError(f"{what} is an object array; return numeric numpy arrays")
        return v
    arr = np.asarray(v)
    if arr.dtype == object:
        raise ResultError(f"{what} must be a numpy array (or number), got {type(v).__name__}")
    return arr


def _signal(v: Any) -> bool:
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)) and v in (0, 1):
        return bool(v)
    raise ResultError(f"a signal function must return a bool, got {v!r}")
