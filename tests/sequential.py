"""A sequential reference interpreter of a :class:`canary.Program`, for tests only.

:func:`run_sequential` runs a program the plainest way there is: one stage instance after
another in program order, every partition of every dataset held in one dict, every function
called from Python. It is written from the documented semantics of ``Program`` (the docstrings
of ``load``, ``compute``, ``scatter_gather``, ``broadcast``, ``reduce``, ``report``, ``loop``,
``while_``, ``if_`` and ``else_``) and the instruction list ``Program.ops``, and shares no code
with the engine's execution (``canary.worker``, ``canary.controller``, the runners): a test that
compares the engine with it cannot pass through a bug the two have in common.

Storage rule: no two stored partitions ever share memory, as in the engine, so every value is
copied where it is stored (an in-place kernel on one partition never changes another).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from canary.program import (
    COMPUTE,
    LOAD,
    OP_END,
    OP_FOR,
    OP_IF,
    OP_JUMP,
    OP_NEXT,
    OP_PUSH,
    OP_STAGE,
    OP_WHILE,
    REPORT,
    SCATTER_GATHER,
    Program,
    ReportEvent,
    Stage,
)

Partitions = dict[tuple[int, int], np.ndarray]  # (dataset id, partition) -> value


class SequentialError(Exception):
    """A stage's function raised or returned something of the wrong shape; the message names
    the stage, its loop iteration and the partition."""


def run_sequential(program: Program) -> dict[str, list[np.ndarray]]:
    """Run ``program`` sequentially; return ``{dataset name: [partition arrays]}`` holding, for
    each reported dataset, its value at its last ``report`` (the shape of
    ``JobResult.results``).

    Finalizes the program (as running it does). Report callbacks are called in program order
    with a :class:`canary.ReportEvent` whose ``tasks`` is the number of tasks the program has
    run up to and including that report and whose ``seconds`` is 0. Raises
    :class:`SequentialError` when user code raises or returns a malformed result.
    """
    return _Interpreter(program.finalize()).run()


class _Interpreter:
    def __init__(self, program: Program) -> None:
        self.program = program
        self.parts: Partitions = {}
        self.results: dict[str, list[np.ndarray]] = {}
        self.counters: list[int] = []  # one per enclosing loop: iterations completed
        self.tasks = 0

    def run(self) -> dict[str, list[np.ndarray]]:
        ops = self.program.ops
        stages = self.program.stages
        pc = 0
        while True:
            op = ops[pc]
            code = op[0]
            if code == OP_STAGE:
                self.stage(stages[op[1]])
                pc += 1
            elif code == OP_PUSH:
                self.counters.append(0)
                pc += 1
            elif code == OP_FOR:
                _, count, exit_pc = op
                if self.counters[-1] == count:
                    self.counters.pop()
                    pc = exit_pc
                else:
                    pc += 1
            elif code == OP_WHILE:
                _, stage_id, max_iter, exit_pc = op
                # the bound is checked first: at max_iter the condition is not evaluated again
                if (max_iter >= 0 and self.counters[-1] == max_iter) \
                        or not self.signal(stages[stage_id]):
                    self.counters.pop()
                    pc = exit_pc
                else:
                    pc += 1
            elif code == OP_NEXT:
                self.counters[-1] += 1
                pc = op[1]
            elif code == OP_IF:
                pc = pc + 1 if self.signal(stages[op[1]]) else op[2]
            elif code == OP_JUMP:
                pc = op[1]
            elif code == OP_END:
                return self.results
            else:
                raise AssertionError(f"unknown instruction {op!r} at {pc}")

    # ---------------------------------------------------------------- stages
    def stage(self, st: Stage) -> None:
        if st.kind == LOAD:
            n = st.writes[0].partitions
            for i in range(n):
                res = self.call(st, i, st.fn, i, n)
                self.store(st, i, st.writes, self.outputs(st, i, res))
            self.tasks += n
        elif st.kind == COMPUTE:
            n = st.writes[0].partitions
            for i in range(n):
                res = self.call(st, i, st.fn, *self.inputs(st, i))
                self.store(st, i, st.writes, self.outputs(st, i, res))
            self.tasks += n
        elif st.kind == SCATTER_GATHER:
            self.scatter_gather(st)
        elif st.kind == REPORT:
            self.report(st)
        else:
            raise AssertionError(f"{st.label()}: kind {st.kind!r} is not run as a stage")

    def scatter_gather(self, st: Stage) -> None:
        assert st.dst is not None
        p, q = st.reads[0].partitions, st.dst.partitions
        inbox: dict[int, dict[int, np.ndarray]] = {j: {} for j in range(q)}
        for i in range(p):
            if st.fn is None:
                (piece,) = self.inputs(st, i)
                pieces = [piece] * len(st.targets[i])
            elif st.one_piece:
                piece = self.array(st, i, self.call(st, i, st.fn, *self.inputs(st, i)), "piece")
                pieces = [piece] * len(st.targets[i])
            else:
                res = self.call(st, i, st.fn, *self.inputs(st, i))
                if not _is_sequence(res) or len(res) != len(st.targets[i]):
                    raise SequentialError(
                        f"{self.where(st, i)}: scatter returned {_count(res)} for "
                        f"{len(st.targets[i])} target(s) {list(st.targets[i])}")
                pieces = [self.array(st, i, v, "piece") for v in res]
            for j, piece in zip(st.targets[i], pieces):
                inbox[j][i] = piece.copy()  # each destination owns its copy
        for j in range(q):
            arrived = [inbox[j][i] for i in sorted(inbox[j])]
            value = self.call(st, j, _gather_fn(st), arrived)
            self.store(st, j, (st.dst,), (self.array(st, j, value, "gathered value"),))
        self.tasks += p + q

    def signal(self, st: Stage) -> bool:
        value = self.call(st, 0, st.fn, self.parts[(st.reads[0].id, 0)])
        self.tasks += 1
        if not isinstance(value, (bool, np.bool_)) and not (
                isinstance(value, (int, np.integer)) and value in (0, 1)):
            raise SequentialError(f"{self.where(st, 0)}: a signal must return a bool, "
                                  f"got {value!r}")
        return bool(value)

    def report(self, st: Stage) -> None:
        (ds,) = st.reads
        values = [self.parts[(ds.id, i)].copy() for i in range(ds.partitions)]
        self.tasks += ds.partitions
        self.results[ds.name] = values
        if st.callback is not None:
            st.callback(ReportEvent(st.name, ds.name, tuple(self.counters), values,
                                    self.tasks, 0.0))

    # --------------------------------------------------------------- helpers
    def inputs(self, st: Stage, i: int) -> list[np.ndarray]:
        return [self.parts[(d.id, i)] for d in st.reads]

    def call(self, st: Stage, i: int, fn: Callable[..., Any] | None, *args: Any) -> Any:
        assert fn is not None, st.label()
        try:
            return fn(*args)
        except Exception as exc:
            raise SequentialError(f"{self.where(st, i)} raised {exc!r}") from exc

    def outputs(self, st: Stage, i: int, res: Any) -> list[np.ndarray]:
        values = res if isinstance(res, tuple) else (res,)
        if len(values) != len(st.writes):
            raise SequentialError(
                f"{self.where(st, i)} returned {_count(res)} for {len(st.writes)} output(s) "
                f"({', '.join(d.name for d in st.writes)})")
        return [self.array(st, i, v, f"output '{d.name}'") for v, d in zip(values, st.writes)]

    def array(self, st: Stage, i: int, value: Any, what: str) -> np.ndarray:
        arr = np.asarray(value)
        if arr.dtype == object:
            raise SequentialError(f"{self.where(st, i)}: {what} is not a numeric array "
                                  f"({type(value).__name__})")
        return arr

    def store(self, st: Stage, i: int, datasets: tuple[Any, ...],
              values: list[np.ndarray] | tuple[np.ndarray, ...]) -> None:
        for d, v in zip(datasets, values):
            self.parts[(d.id, i)] = np.array(v, copy=True)

    def where(self, st: Stage, i: int) -> str:
        return f"{st.label(tuple(self.counters))}, partition {i}"


def _gather_fn(st: Stage) -> Callable[[list[np.ndarray]], np.ndarray]:
    if callable(st.gather):
        return st.gather
    return {"sum": _sum, "replace": _replace, "concat": _concat}[st.gather]


def _sum(pieces: list[np.ndarray]) -> np.ndarray:
    total = pieces[0]
    for piece in pieces[1:]:  # in source-partition order, as documented
        total = total + piece
    return total


def _replace(pieces: list[np.ndarray]) -> np.ndarray:
    (piece,) = pieces
    return piece


def _concat(pieces: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(pieces, axis=0)


def _is_sequence(res: Any) -> bool:
    """A list, a tuple or a numba typed List of pieces (not one array, not a string)."""
    return isinstance(res, Sequence) and not isinstance(res, (str, bytes))


def _count(res: Any) -> str:
    n = len(res) if _is_sequence(res) else 1
    return f"{n} value(s)"
