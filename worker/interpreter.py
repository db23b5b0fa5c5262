"""The interpreter: walks the program's flattened ops and emits stage instances.

Every worker takes the same path through the program (branches follow broadcast signals), so
the n-th stage instance a worker emits is the n-th on every worker: its number ``seq`` names it
globally. Emitting an instance creates the tasks on the partitions this worker holds and queues
their accesses. The interpreter stops when the run-ahead window is full, when it waits for a
signal's value, and when messages it has just decided should leave before it goes on (a
``Yield``: emitting a loop body costs ~5 µs a task, which the other workers would otherwise
wait through).
"""

from __future__ import annotations

import math
from typing import Any

from canary.messages import CONTROLLER, Done
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
    SIGNAL,
    Stage,
)
from canary.worker.core import WorkerCore
from canary.worker.tasks import K_COMPUTE, K_GATHER, K_LOAD, K_REPORT, K_SCATTER, K_SIGNAL, Task

_KIND_OF = {LOAD: K_LOAD, COMPUTE: K_COMPUTE, REPORT: K_REPORT, SIGNAL: K_SIGNAL}
_LOOP_CONTROL = frozenset((OP_NEXT, OP_FOR, OP_PUSH, OP_JUMP))


class Interpreter(WorkerCore):
    """Program position, loop counters, signal values, emission (mixed into ``WorkerState``)."""

    def _init_interpreter(self) -> None:
        self.pc = 0
        self.counters: list[int] = []
        self.seq = 0  # the next stage instance's number
        self.await_seq: int | None = None  # the signal instance the interpreter waits for
        self.ended = False
        self.signals: dict[int, bool] = {}  # signal seq -> value, until the interpreter uses it
        self.live: dict[int, int] = {}  # seq -> local tasks not finished
        self.program_tasks = 0  # tasks of all workers emitted so far, in program order
        self.report_marks: dict[int, int] = {}  # report seq -> program_tasks when emitted
        self._emit_pending = False  # stopped to let messages leave; goes on at the next event
        self._hurry = False  # a message or urgent task was decided in this handle call
        self._seq_at_tick = 0  # self.seq at the last load report (the pace since: _fit_window)

    def _advance(self, out: list[Any]) -> None:
        ops = self.program.ops
        stages = self.program.stages
        counters = self.counters
        self._emit_pending = False
        while True:
            op = ops[self.pc]
            code = op[0]
            if code == OP_STAGE:
                if (len(self.live) >= self.window or self._hold_emission
                        or self.seq >= self._stop_at):
                    break
                if self._hurry:
                    self._emit_pending = True
                    break
                if self._cuts and self._cuts[0][0] <= self.seq:
                    self._switch_at_cuts(out)
                st = stages[op[1]]
                if st.kind == COMPUTE and self.max_fused > 1:
                    fused = self._fuse(out)
                    if fused:
                        continue
                    if fused is None:  # the next stretch waits for the running one
                        break
                self._emit(st, out)
                if self._inline:
                    self._drain(out)
                self.pc += 1
            elif code in _LOOP_CONTROL:
                self.pc = loop_control(op, self.pc, counters)
            elif code == OP_WHILE:
                if self.await_seq is None and 0 <= op[2] <= counters[-1]:
                    counters.pop()
                    self.pc = op[3]
                    continue
                value = self._await_signal(stages[op[1]], out)
                if value is None:
                    break
                if value:
                    self.pc += 1
                else:
                    counters.pop()
                    self.pc = op[3]
            elif code == OP_IF:
                value = self._await_signal(stages[op[1]], out)
                if value is None:
                    break
                self.pc = self.pc + 1 if value else op[2]
            elif code == OP_END:
                if self._cuts and self._cuts[0][0] <= self.seq:  # a move's cut at the very end
                    self._switch_at_cuts(out)
                self.ended = True
                if not self.live and not self.done_sent:
                    self.done_sent = True
                    self._send_out(CONTROLLER, Done(self._next_eid(), self.worker,
                                                    self.tasks_run, dict(self.sent)), out)
                break
            else:  # pragma: no cover - ops are produced by Program only
                raise AssertionError(op)

    def _fit_window(self, interval: float) -> None:
        """Size the run-ahead window from the pace since the last load report: about
        ``config.window_s`` seconds of stage instances, between ``config.window_min`` and
        ``config.window``. It grows at once, and shrinks by at most half per report, so that
        one slow period (a pause for a snapshot or a move, a compile) does not starve the
        next. The pace counts the instances this worker emitted: one that waits on others
        emits at their pace, one that waits on the window at the rate instances retire.

        A window too small to hide latency would lower the pace it is sized from, and so stay
        small; that needs instances that each stay half a second or more in a window of
        ``window_min`` while the worker idles, which messages (micro- to milliseconds) do not
        cause."""
        cfg = self.config
        emitted, self._seq_at_tick = self.seq - self._seq_at_tick, self.seq
        if cfg.window_s <= 0 or interval <= 0:
            return
        target = max(cfg.window_floor,
                     min(cfg.window, math.ceil(emitted / interval * cfg.window_s)))
        self.window = target if target >= self.window else max(target, self.window // 2)

    def _await_signal(self, stage: Stage, out: list[Any]) -> bool | None:
        """Emit the signal instance on first visit; return its value once known, else None."""
        if self.await_seq is None:
            if (len(self.live) >= self.window or self._hold_emission
                    or self.seq >= self._stop_at):
                return None
            if self._hurry:
                self._emit_pending = True
                return None
            if self._cuts and self._cuts[0][0] <= self.seq:
                self._switch_at_cuts(out)
            self.await_seq = self.seq
            self._emit(stage, out)
        value = self.signals.pop(self.await_seq, None)
        if value is not None:
            self.await_seq = None
        return value

    def _emit(self, st: Stage, out: list[Any]) -> None:
        """Create the local tasks of the next stage instance and queue their accesses."""
        seq = self.seq
        self.seq += 1
        self.program_tasks += self._tasks_per_instance[st.id]
        it = tuple(self.counters)
        if self.log is not None:
            self.log.append((self._cause, "emit", seq, seq, -1, st.id, 0))
        n = 0
        if st.kind == SCATTER_GATHER:
            assert st.dst is not None
            src_local = self.local[self._group[st.reads[0].id]]
            for i in src_local:
                self._new_task(seq, st, K_SCATTER, i, it, out)
            n += len(src_local)
            if len(src_local) > 1:
                self._scatters_left[seq] = len(src_local)
            dst_local = self.local[self._group[st.dst.id]]
            for j in dst_local:
                t = self._new_task(seq, st, K_GATHER, j, it, None)
                t.pieces = self.early.pop((seq, st.dst.id, j), {})
                t.waiting += len(st.sources[j]) - len(t.pieces)
                self.gathers[(seq, j)] = t
                self._pump_task(t, out)
            n += len(dst_local)
        elif st.kind == SIGNAL:
            if self.local[self._group[st.reads[0].id]]:
                self._new_task(seq, st, K_SIGNAL, 0, it, out)
                n = 1
        else:
            kind = _KIND_OF[st.kind]
            plan = self._plans.get((st.id, kind))
            if plan is None:
                plan = self._plan(st, kind)
            if kind == K_REPORT and plan:
                # only where a task of the report runs here: the mark goes with the instance's
                # last local task (state._on_task_done), and a worker holding no partition of
                # the dataset (every worker but one, for a model) would keep one per iteration
                self.report_marks[seq] = self.program_tasks
            tasks = self.tasks
            tid = self._tid
            for i, (acc, rd, wr) in plan.items():  # _new_task inlined: the hot path
                t = Task(tid, seq, st, kind, i, it, acc, rd, wr)
                tasks[tid] = t
                tid += 1
                for p, mode in acc:
                    q = p.queue
                    q.append((t, mode))
                    if q[0][0] is t:
                        self._pump(p, out)
                if not acc:
                    self._ready(t, out)
            self._tid = tid
            n = len(plan)
        if n:
            self.live[seq] = self.live.get(seq, 0) + n


def loop_control(op: tuple[Any, ...], pc: int, counters: list[int]) -> int:
    """Apply a static loop-control op (next, for, push, jump) at ``pc`` to the loop
    ``counters`` (in place); return the next pc. The interpreter and the stretch look-ahead
    share it, so a fused stretch ends exactly where lone instances would have."""
    code = op[0]
    if code == OP_NEXT:
        counters[-1] += 1
        return int(op[1])
    if code == OP_FOR:
        if counters[-1] >= op[1]:
            counters.pop()
            return int(op[2])
        return pc + 1
    if code == OP_PUSH:
        counters.append(0)
        return pc + 1
    if code == OP_JUMP:
        return int(op[1])
    raise AssertionError(op)

