"""Per-partition access queues, and the run queue that decides which ready task runs next.

Every task queues one access (read or write) on each local partition it touches, in program
order. Accesses are granted in that order: consecutive reads together, a write alone. A task
whose accesses are all granted (and, for a gather, whose pieces have all arrived) is *ready*;
the worker runs one task at a time, the next picked urgent-first (signals and small scatters,
whose messages other workers wait for), then in the order tasks became ready.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any

from canary.program import WRITE, Stage
from canary.worker.core import WorkerCore
from canary.worker.tasks import K_GATHER, K_SIGNAL, RunTask, Task, is_urgent


class AccessQueues(WorkerCore):
    """Granting accesses and choosing the next task (mixed into ``WorkerState``)."""

    def _init_access(self) -> None:
        self.ready_urgent: deque[Task] = deque()
        self.ready: deque[Task] = deque()
        self.running: Task | None = None  # handed to the runtime, its TaskDone not yet in
        seed = self.config.ready_order_seed
        self._order_rng = None if seed is None else random.Random(seed)
        # (stage id, kind) -> {partition index: (accesses, reads, writes)}: the per-task tables
        # of the hot path, built on first use; cleared whenever the local partitions change.
        self._plans: dict[tuple[int, str], dict[int, tuple[Any, ...]]] = {}

    def _plan(self, st: Stage, kind: str) -> dict[int, tuple[Any, ...]]:
        """Per local partition ``i`` of ``st``'s ``kind`` side: (accesses, reads, writes) as
        tuples of this worker's partitions, so spawning a task and calling its function look
        nothing up."""
        parts = self.parts
        if kind == K_GATHER:
            assert st.dst is not None
            idxs = self.local[self._group[st.dst.id]]
            accesses: tuple[tuple[Any, int], ...] = ((st.dst, WRITE),)
            reads: tuple[Any, ...] = ()
            writes: tuple[Any, ...] = ()
        else:
            idxs = [0] if kind == K_SIGNAL else self.local[self._group[(st.reads or st.writes)[0].id]]
            accesses, reads, writes = st.accesses, st.reads, st.writes
        plan = {i: (tuple((parts[(d.id, i)], mode) for d, mode in accesses),
                    tuple(parts[(d.id, i)] for d in reads),
                    tuple(parts[(d.id, i)] for d in writes)) for i in idxs}
        self._plans[(st.id, kind)] = plan
        return plan

    def _new_task(self, seq: int, st: Stage, kind: str, part: int,
                  it: tuple[int, ...], out: list[Any] | None) -> Task:
        """Create a task and queue its accesses; grant what can be granted unless ``out`` is
        None (the caller still has to set the task up: a gather's pieces)."""
        plan = self._plans.get((st.id, kind))
        if plan is None:
            plan = self._plan(st, kind)
        acc, rd, wr = plan[part]
        t = Task(self._tid, seq, st, kind, part, it, acc, rd, wr)
        self._tid += 1
        self.tasks[t.tid] = t
        for p, mode in acc:
            p.queue.append((t, mode))
        if out is not None:
            self._pump_task(t, out)
        return t

    def _pump_task(self, t: Task, out: list[Any]) -> None:
        for p, _ in t.accesses:
            q = p.queue
            if q and q[0][0] is t:
                self._pump(p, out)
        if t.waiting == 0 and not t.accesses:
            self._ready(t, out)

    def _pump(self, p: Any, out: list[Any]) -> None:
        """Grant ``p``'s queued accesses in order: consecutive reads together, a write alone.
        Nothing is granted on a frozen partition."""
        if p.frozen:
            return
        q = p.queue
        while q:
            t, mode = q[0]
            if mode == WRITE and not p.writer and not p.readers:  # the common case first
                p.writer = True
                q.popleft()
                t.waiting -= 1
                if t.waiting == 0:
                    self._ready(t, out)
                break
            if mode != WRITE:
                if p.writer:
                    break
                p.readers += 1
            else:
                if p.writer or p.readers:
                    break
                p.writer = True
            q.popleft()
            t.waiting -= 1
            if t.waiting == 0:
                self._ready(t, out)
            if mode == WRITE:
                break

    def _ready(self, t: Task, out: list[Any]) -> None:
        """``t`` may run now: complete it in ``handle`` if it is a small move of canary's own
        (see ``DataMoves._is_inline_move``), else queue it to run."""
        if self.inline and self._is_inline_move(t):
            self._inline.append(t)
            return
        if self.log is not None:
            self.log.append((self._cause, "ready", t.seq, t.seq, t.tid, t.part, 0))
        if is_urgent(t, self._urgent_max_bytes):
            self.ready_urgent.append(t)
            self._hurry = True  # stop emitting so that it runs first (see Interpreter)
        else:
            self.ready.append(t)

    def _dispatch(self, out: list[Any]) -> None:
        """Hand the runtime the next task if none is out. While emission waits for messages to
        leave (``_emit_pending``), only an urgent task goes out, else a ``Yield``."""
        if self.running is not None or self.failed:
            if self._emit_pending and not self.failed:
                out.append(self._yield())
            return
        urgent = self.ready_urgent
        if self._emit_pending:
            if not urgent:
                out.append(self._yield())
                return
            t = self._pick(urgent, None)
        elif urgent or self.ready:
            t = self._pick(urgent, self.ready)
        else:
            return
        self.running = t
        if self.log is not None:
            self.log.append((self._cause, "run", t.seq if t.stretch is None
                             else t.stretch.instances[0][1], t.seq, t.tid, t.part, 0))
        out.append(RunTask(t, self._cause))

    def _pick(self, urgent: deque[Task], normal: deque[Task] | None) -> Task:
        rng = self._order_rng
        if rng is None:
            return urgent.popleft() if urgent else normal.popleft()  # type: ignore[union-attr]
        pool = [urgent] if normal is None else [q for q in (urgent, normal) if q]
        sizes = [len(q) for q in pool]
        k = rng.randrange(sum(sizes))
        for q, n in zip(pool, sizes):
            if k < n:
                t = q[k]
                del q[k]
                return t
            k -= n
        raise AssertionError("unreachable: k < sum(sizes)")
