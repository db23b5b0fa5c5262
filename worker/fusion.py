"""Fused compute stretches: a run of compute stage instances emitted as one task.

Scheduling a task alone costs a few µs of Python (create it, queue its accesses, grant them,
call the kernel, store the result, release the accesses). Where the program has a run of compute
stages with no communication in between, a worker emits the run as one fused task
(:class:`canary.worker.tasks.Stretch`), sized from the measured time of the last one
(:func:`stretch_budget`).
"""

from __future__ import annotations

from typing import Any

from canary.program import OP_STAGE, WRITE, Stage
from canary.worker.chain import is_numba_kernel
from canary.worker.config import WorkerConfig
from canary.worker.core import WorkerCore
from canary.worker.interpreter import _LOOP_CONTROL, loop_control
from canary.worker.tasks import K_FUSED, Stretch, Task


class Fusion(WorkerCore):
    """Emitting and sizing fused stretches (mixed into ``WorkerState``)."""

    def _init_fusion(self) -> None:
        self.max_fused = self.config.max_fused
        self.fused_live = 0  # fused tasks emitted and not finished
        self.stretches_run = 0
        # Compute stages whose tasks, run as a one-instance stretch, took lone_task_s or more:
        # they run as ordinary tasks from then on (see _tune_fusion).
        self.lone_stages: set[int] = set()
        # Compute stages whose tasks took fuse_max_s or more in a stretch: fusing saves nothing
        # on them, and a stretch of them held every message for its whole length (a stretch
        # covers every local partition, and is sized from the last one's time). They run as
        # ordinary tasks from then on, so that a message waits at most one task.
        self.slow_stages: set[int] = set()
        # Compute stages not yet timed (by a stretch, or an ordinary task: _time_task); with
        # adapt_fused off nothing is learnt, and none is treated as untimed.
        self._untimed = ({sid for sid, g in enumerate(self._fusable) if g >= 0}
                         if self.config.adapt_fused else set())
        self._ran_alone: set[int] = set()  # untimed numba stages that ran an ordinary task

    def _fuse(self, out: list[Any]) -> bool | None:
        """Emit the compute-only stretch starting at ``pc`` as one fused task.

        A stretch is the run of compute stage instances of one co-location group that the
        program reaches from ``pc`` through static loop control only (no signal, no
        communication, no other group), up to ``max_fused`` tasks. Its task takes a write
        access on every local partition the instances touch, queued in program order like any
        task's, so it runs once everything emitted before it has released them. Returns True if
        emitted (``pc``, the loop counters and ``seq`` then stand after the stretch, exactly as
        if each instance had been emitted alone), False if the stage should be emitted as
        ordinary tasks (the stretch would stand for fewer than 2, or be one instance of a stage
        in ``lone_stages``, or the stage is slow or not yet timed, see below), and None while
        another stretch runs, or a slow or untimed stage's earlier tasks, and the stage's
        partitions are busy: the interpreter then waits rather than falling back to ordinary
        tasks (which would keep a compute loop out of fused mode for good). Waiting cannot
        deadlock: everything emitted so far, on every worker, can finish without anything
        emitted later.
        """
        st0 = self.program.stages[self.program.ops[self.pc][1]]
        g = self._fusable[st0.id]
        idxs = self.local[g]
        if not idxs:
            return False
        if st0.id in self.slow_stages or (st0.id in self._untimed
                                          and len(idxs) > self.config.max_fused):
            # Tasks too slow to fuse, or a stage not yet timed whose one instance on every
            # local partition is more than a first stretch (_time_task times it): its tasks
            # run alone, so that a message waits one task; and one instance at a time, since
            # a snapshot's barrier or a move's cut comes after everything emitted, and the
            # run-ahead window of such instances would be minutes of work
            return False if self._quiet(st0, idxs) else None
        if st0.id in self.lone_stages and len(self._stretch(g, 2)[0]) == 1:
            return False  # long tasks between communications: see _tune_fusion
        if self.fused_live and not self._quiet(st0, idxs):
            if len(idxs) > 1 or len(self._stretch(g, 2)[0]) > 1:
                return None
            return False  # a lone task: nothing to wait for
        limit = max(1, self.max_fused // len(idxs))
        cut = self._next_cut(g) if self._cuts else None
        if cut is not None:  # a move changes this group's local partitions at the cut
            limit = min(limit, cut - self.seq)
        limit = min(limit, self._stop_at - self.seq)  # a snapshot's barrier ends the stretch
        instances, datasets, pc, counters = self._stretch(g, limit)
        if (self._untimed and len(instances) * len(idxs) > self.config.max_fused
                and any(st.id in self._untimed for st, _ in instances)):
            # a stage never timed may take anything: a stretch sized from other stages' time
            # (a fast loop's, before a slow one) is sized as a worker's first instead
            limit = max(1, self.config.max_fused // len(idxs))
            instances, datasets, pc, counters = self._stretch(g, limit)
        if len(instances) * len(idxs) < 2:
            return False
        limited = len(instances) == limit and bool(self._stretch(g, 1, pc, counters)[0])
        seq0 = self.seq
        fused: list[tuple[Stage, int, tuple[int, ...]]] = []
        for k, (st, it) in enumerate(instances):
            fused.append((st, seq0 + k, it))
            self.program_tasks += self._tasks_per_instance[st.id]
        self.seq = seq0 + len(instances)
        self.pc = pc
        self.counters[:] = counters
        parts = [{d: self.parts[(d, i)] for d in sorted(datasets)} for i in idxs]
        last_seq = fused[-1][1]
        if self.log is not None:
            self.log.append((self._cause, "emit", seq0, last_seq, -1, st0.id, 0))
        acc = tuple((p, WRITE) for row in parts for p in row.values())
        t = Task(self._tid, last_seq, st0, K_FUSED, idxs[0], instances[0][1], acc)
        t.stretch = Stretch(fused, list(idxs), parts, limited)
        self._tid += 1
        self.tasks[t.tid] = t
        for p, _ in acc:
            p.queue.append((t, WRITE))
        self._pump_task(t, out)
        self.live[last_seq] = 1
        self.fused_live += 1
        return True

    def _stretch(self, g: int, limit: int, pc: int | None = None,
                 counters: list[int] | None = None
                 ) -> tuple[list[tuple[Stage, tuple[int, ...]]], set[int], int, list[int]]:
        """Look ahead from ``pc`` and ``counters`` (the interpreter's, by default; changing
        nothing): the compute instances of group ``g`` the program reaches through static loop
        control only, at most ``limit`` of them; with the datasets they touch, and the ``pc``
        and loop counters after them."""
        ops = self.program.ops
        stages = self.program.stages
        fusable = self._fusable
        pc = self.pc if pc is None else pc
        counters = list(self.counters if counters is None else counters)
        instances: list[tuple[Stage, tuple[int, ...]]] = []
        datasets: set[int] = set()
        seen: set[int] = set()
        steps = 0
        while len(instances) < limit and steps < 4 * limit + 16:
            steps += 1
            op = ops[pc]
            code = op[0]
            if code == OP_STAGE:
                st = stages[op[1]]
                if fusable[st.id] != g or st.id in self.slow_stages:
                    break
                instances.append((st, tuple(counters)))
                if st.id not in seen:
                    seen.add(st.id)
                    datasets.update([d.id for d in st.reads + st.writes])
                pc += 1
            elif code in _LOOP_CONTROL:
                pc = loop_control(op, pc, counters)
            else:
                break
        return instances, datasets, pc, counters

    def _quiet(self, st: Stage, idxs: list[int]) -> bool:
        """Whether no access to a local partition ``st`` touches is granted or queued."""
        parts = self.parts
        for d in st.reads + st.writes:
            for i in idxs:
                p = parts[(d.id, i)]
                if p.queue or p.writer or p.readers:
                    return False
        return True

    def _tune_fusion(self, task: Task, seconds: float) -> None:
        """Learn from a fused ``task`` that took ``seconds``: size the next stretches
        (:func:`stretch_budget`); if it was one stage instance (communication on both sides,
        not a size limit) of tasks of ``lone_task_s`` or more, emit that stage's later
        instances as ordinary tasks (``lone_stages``); and if its tasks took ``fuse_max_s`` or
        more, emit all its stages' later instances as ordinary tasks (``slow_stages``). Either
        only once the time cannot include compiling a kernel: not a numba kernel's first
        timed stretch."""
        stretch = task.stretch
        assert stretch is not None
        per_task = seconds / stretch.tasks
        self.max_fused = stretch_budget(per_task, len(stretch.idxs), self.config)
        stages = {st.id: st for st, _, _ in stretch.instances}
        compiled = all(sid not in self._untimed or not is_numba_kernel(st.fn)
                       for sid, st in stages.items())
        if per_task >= self.config.fuse_max_s and compiled:
            self.slow_stages.update(stages)
        if len(stretch.instances) == 1 and not stretch.limited:
            sid = stretch.instances[0][0].id
            if per_task >= self.config.lone_task_s and compiled:
                self.lone_stages.add(sid)
        self._untimed.difference_update(stages)

    def _time_task(self, st: Stage, seconds: float) -> None:
        """Learn from an ordinary task of compute stage ``st``, never timed in a stretch, that
        took ``seconds``: the stage is timed (and slow, at ``fuse_max_s`` or more) once the
        time cannot include compiling a kernel: not a numba kernel's first task."""
        if is_numba_kernel(st.fn) and st.id not in self._ran_alone:
            self._ran_alone.add(st.id)
            return
        if seconds >= self.config.fuse_max_s:
            self.slow_stages.add(st.id)
        self._untimed.discard(st.id)


def stretch_budget(per_task_s: float, rows: int, config: WorkerConfig) -> int:
    """The ``max_fused`` (tasks per stretch) for stretches over ``rows`` partitions whose tasks
    take ``per_task_s`` seconds: about ``fuse_target_s`` seconds or ``fuse_min_instances``
    instances, whichever is more, but at most ``fuse_max_s`` seconds; always in
    ``[2, max_fused_cap]``."""
    per_task_s = max(per_task_s, 1e-8)
    want = max(config.fuse_target_s / per_task_s, config.fuse_min_instances * rows)
    return int(min(max(min(want, config.fuse_max_s / per_task_s), 2), config.max_fused_cap))
