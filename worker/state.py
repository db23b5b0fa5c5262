"""The worker as a pure state machine: ``handle(event) -> list[instruction]``.

No MPI, no clock, no kernel call in here. The worker interprets the program's flattened ops in
program order (every worker takes the same path, since branches follow broadcast signals) and
emits stage instances numbered ``seq`` = 0, 1, 2, ... For each instance it creates the tasks on
the partitions it holds and queues each task's access on every partition it touches.

Per local partition we keep the metadata DESIGN.md §4 asks for: the last stage instance that
touched it (``last_seq``), a "do not spawn" flag (``frozen``, for migration) and the queue of
accesses waiting for it. A task is spawned (a ``RunTask`` instruction) the moment every access
it needs is granted (reads share, writes are exclusive, in program order) and, for a gather, all
its pieces have arrived. That lets stages run out of order where data allows, bounded by a
run-ahead window of live stage instances.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from canary.messages import (
    CONTROLLER,
    Done,
    Failed,
    Hello,
    Piece,
    PieceBatch,
    Placement,
    ReportPart,
    Send,
    Signal,
    TaskDone,
    TaskFailed,
    worker_rank,
)
from canary.partition_map import ACCEPT, HOLD, PartitionMap, route_incoming
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
    READ,
    REPORT,
    SCATTER_GATHER,
    SIGNAL,
    WRITE,
    Program,
    Stage,
)

# Task kinds (a scatter-gather instance has scatter tasks and gather tasks).
K_LOAD = "load"
K_COMPUTE = "compute"
K_SCATTER = "scatter"
K_GATHER = "gather"
K_SIGNAL = "signal"
K_REPORT = "report"
K_FUSED = "fused"  # a stretch of compute stage instances run back to back (see Stretch)

# A scatter of at most this many bytes is urgent (see is_urgent).
URGENT_MAX_BYTES = 1 << 16

_KIND_OF = {LOAD: K_LOAD, COMPUTE: K_COMPUTE, REPORT: K_REPORT, SIGNAL: K_SIGNAL}


class Task:
    """One task: a stage instance (``seq``) applied to partition ``part``."""

    __slots__ = ("tid", "seq", "stage", "kind", "part", "iteration", "waiting", "pieces", "accesses",
                 "reads", "writes", "stretch")

    def __init__(self, tid: int, seq: int, stage: Stage, kind: str, part: int,
                 iteration: tuple[int, ...], accesses: tuple[tuple[Partition, int], ...] = (),
                 reads: tuple[Partition, ...] = (), writes: tuple[Partition, ...] = ()) -> None:
        self.tid = tid
        self.seq = seq
        self.stage = stage
        self.kind = kind
        self.part = part
        self.iteration = iteration
        self.waiting = len(accesses)
        self.pieces: dict[int, np.ndarray] | None = None
        # Shared per-(stage, kind, partition) tables, built once (see WorkerState._plan).
        self.accesses = accesses  # (partition, READ/WRITE) in grant order
        self.reads = reads  # the partitions whose values are the task's arguments
        self.writes = writes  # the partitions its outputs replace (compute, load)
        self.stretch: Stretch | None = None  # K_FUSED only

    def label(self) -> str:
        if self.stretch is not None:
            return self.stretch.describe()
        return f"{self.stage.label(self.iteration)}, {self.kind} task on partition {self.part}"

    def __repr__(self) -> str:
        return f"Task({self.tid}, seq={self.seq}, {self.stage.name}/{self.kind}[{self.part}])"


class Stretch:
    """What a fused task runs: compute stage ``instances`` ``(stage, seq, iteration)`` in program
    order, on every local partition index in ``idxs`` of one co-location group.

    ``parts[k]`` maps a dataset id to this worker's :class:`Partition` of index ``idxs[k]``, for
    every dataset the instances touch. Compute stages read and write only same-index partitions,
    so running all instances on one index, then the next index, gives the same result as program
    order; the fused task holds a write access on every partition, so nothing else touches them
    meanwhile. ``tasks`` is the number of ordinary tasks this stands for.
    """

    __slots__ = ("instances", "idxs", "parts", "tasks", "written")

    def __init__(self, instances: list[tuple[Stage, int, tuple[int, ...]]], idxs: list[int],
                 parts: list[dict[int, Partition]]) -> None:
        self.instances = instances
        self.idxs = idxs
        self.parts = parts
        self.tasks = len(instances) * len(idxs)
        self.written = sorted({d.id for st, _, _ in instances for d in st.writes})

    def describe(self) -> str:
        first, last = self.instances[0], self.instances[-1]
        return (f"fused stretch of {len(self.instances)} compute stage instance(s) "
                f"(seq {first[1]}..{last[1]}) on partitions {self.idxs}")


class RunTask:
    """Instruction: run ``task`` (the runtime asks :meth:`WorkerState.task_call` what to call)."""

    __slots__ = ("task",)

    def __init__(self, task: Task) -> None:
        self.task = task

    def __repr__(self) -> str:
        return f"RunTask({self.task!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RunTask) and other.task is self.task


class Partition:
    """A local partition of one dataset and its access metadata."""

    __slots__ = ("dataset", "index", "value", "last_seq", "queue", "readers", "writer", "frozen")

    def __init__(self, dataset: int, index: int) -> None:
        self.dataset = dataset
        self.index = index
        self.value: np.ndarray | None = None
        self.last_seq = -1  # last stage instance that finished an access
        self.queue: deque[tuple[Task, int]] = deque()
        self.readers = 0
        self.writer = False
        self.frozen = False  # "do not spawn": set while the partition migrates


class WorkerState:
    """State of worker ``worker`` (0-based) of ``n_workers`` running ``program``.

    Contract: ``start()`` once, then ``handle(event)`` for every message received and every
    task finished. Instructions returned: :class:`RunTask` and :class:`Send`. After the program
    ends and every local task is done, exactly one :class:`Done` is sent to the controller.

    If ``send_now`` is set, every :class:`Send` after ``start()`` is handed to it the moment it
    is decided instead of being returned, in the same order. A runtime sets it so that a
    :class:`Signal` or :class:`Piece` leaves before ``handle`` goes on to emit the next
    iteration's tasks (~5 µs each, a few hundred µs for a large loop body), which the other
    workers would otherwise wait through.

    With ``inline`` (the default), a runnable task that only moves a few bytes with canary's
    own code (see :meth:`_ready`: a broadcast's or a reduce's small pieces)
    is completed inside ``handle`` instead of being returned as a :class:`RunTask`; it counts
    in ``tasks_run`` and ``inline_run`` and leaves no task span in a trace. ``inline=False``
    makes every such move a task, as large pieces and user gather functions always are.

    If ``pause_for_sends`` is set, the interpreter stops emitting right after a stage instance
    that made an urgent scatter runnable (:func:`is_urgent`; a broadcast's scatter at the top of
    a loop body) and sets ``paused``: the runtime runs that task, so its message leaves, then
    calls ``resume()`` for the rest. The runtime must call ``resume()`` whenever ``paused`` is set
    and no such task is waiting, or the program stalls; ``handle`` also resumes.
    """

    def __init__(self, program: Program, worker: int, n_workers: int, window: int = 64,
                 max_fused: int = 1024, inline: bool = True) -> None:
        self.program = program.finalize()
        self.worker = worker
        self.rank = worker_rank(worker)
        self.n_workers = n_workers
        self.window = window
        # Most tasks one fused stretch may stand for; below 2 fusion is off. The runtime tunes
        # it (a stretch is one kernel call sequence with no MPI polling in between).
        self.max_fused = max_fused
        self.send_now: Callable[[Send], None] | None = None
        # Compute stages whose tasks, run as a one-instance stretch, took LONE_TASK_S or more:
        # they run as ordinary tasks from then on (see stretch_timed).
        self.lone_stages: set[int] = set()
        self._timed_stages: set[int] = set()  # stages seen in a timed one-instance stretch
        self.pause_for_sends = False
        self.paused = False
        self.fused_live = 0
        self.stretches_run = 0
        self.map: PartitionMap | None = None
        self.parts: dict[tuple[int, int], Partition] = {}
        self.local: list[list[int]] = []  # group -> local partition indices
        self._group = [program.group_of(d) for d in program.datasets]
        # Interpreter.
        self.pc = 0
        self.counters: list[int] = []
        self.seq = 0
        self.await_seq: int | None = None
        self.ended = False
        self.signals: dict[int, bool] = {}
        # Tasks.
        self.live: dict[int, int] = {}  # seq -> local tasks not finished
        self.tasks: dict[int, Task] = {}
        self._tid = 0
        self.gathers: dict[tuple[int, int], Task] = {}
        self.early: dict[tuple[int, int], dict[int, np.ndarray]] = {}
        self.held: list[Piece] = []
        # Batching small remote pieces (see _scatter): seq -> local scatter tasks not yet run, and
        # seq -> destination worker -> the pieces kept for it until the last of them has run.
        self._scatters_left: dict[int, int] = {}
        self._batches: dict[int, dict[int, list[Piece]]] = {}
        self._batchable: dict[int, frozenset[int]] = {}  # stage id -> dsts (see _batchable_dsts)
        # Runnable data-movement tasks the state machine completes itself (see _ready).
        self.inline = inline
        self._inline: deque[Task] = deque()
        self.inline_run = 0
        self.tasks_run = 0
        self.program_tasks = 0  # tasks of all workers emitted so far, in program order
        self.report_marks: dict[int, int] = {}  # report seq -> program_tasks when emitted
        self.done_sent = False
        self.failed = False
        self.sent: dict[str, int] = {}
        self._eid = 0
        # (stage id, kind) -> {partition index: (accesses, reads, writes)}: the per-task tables
        # of the hot path, built on first use; cleared whenever the local partitions change.
        self._plans: dict[tuple[int, str], dict[int, tuple[Any, ...]]] = {}
        self._tasks_per_instance = [program.tasks_per_instance(st) for st in program.stages]
        # stage id -> its co-location group if it is a compute stage (may join a stretch), else -1
        self._fusable = [self._group[(st.reads or st.writes)[0].id] if st.kind == COMPUTE else -1
                         for st in program.stages]
        self._handlers: dict[type, Callable[[Any, list[Any]], None]] = {
            Placement: self._on_placement,
            TaskDone: self._on_task_done,
            TaskFailed: self._on_task_failed,
            Piece: self._on_piece,
            PieceBatch: self._on_piece_batch,
            Signal: self._on_signal,
        }

    # ---------------------------------------------------------------- public API
    def start(self) -> list[Any]:
        """Announce this worker and its program digest to the controller."""
        return [self._send(CONTROLLER, Hello(self._next_eid(), self.worker, self.program.digest,
                                             self.program.statements()))]

    def handle(self, event: Any) -> list[Any]:
        """Apply one event; return the instructions it causes. Raises KeyError on unknown events."""
        out: list[Any] = []
        if type(event) is TaskDone:
            # The hot path. Only a retired stage instance can unblock the interpreter (room in
            # the run-ahead window, a local signal's value, the end), so advance only then.
            live = len(self.live)
            self._on_task_done(event, out)
            if self._inline:
                self._drain(out)
            if len(self.live) < live and not self.failed:
                self._advance(out)
            return out
        self._handlers[type(event)](event, out)
        if self._inline:
            self._drain(out)
        if self.map is not None and not self.failed:
            self._advance(out)
        return out

    def task_call(self, task: Task) -> tuple[Any, tuple[Any, ...]]:
        """(function, arguments) the runtime must call to run ``task``."""
        st = task.stage
        kind = task.kind
        if kind == K_COMPUTE or kind == K_SCATTER:
            args = tuple([p.value for p in task.reads])
            if st.fn is None:  # scatter with no function: send the partition itself
                return _identity, args
            return st.fn, args
        if kind == K_GATHER:
            assert task.pieces is not None
            pieces = [task.pieces[s] for s in st.sources[task.part]]
            return _GATHERS.get(st.gather, st.gather), (pieces,)  # type: ignore[call-overload]
        if kind == K_SIGNAL:
            return st.fn, (self.parts[(st.reads[0].id, 0)].value,)
        if kind == K_REPORT:
            return _identity, (self.parts[(st.reads[0].id, task.part)].value,)
        if kind == K_LOAD:
            return st.fn, (task.part, st.partitions)
        raise AssertionError(kind)

    def resume(self) -> list[Any]:
        """Go on emitting after a pause (see ``pause_for_sends``); the instructions it causes."""
        out: list[Any] = []
        was, self.paused = self.paused, False
        if was and self.map is not None and not self.failed:
            self._advance(out)
        return out

    def stretch_timed(self, task: Task, seconds: float) -> None:
        """Learn from a fused ``task`` that took ``seconds``: size the next stretches
        (:func:`stretch_budget`), and if it was one stage instance (communication on both
        sides) of tasks of ``LONE_TASK_S`` or more (and not the stage's first such stretch),
        emit that stage's later instances as ordinary tasks. Fusing them saved at most a few
        µs a task, but held every output back until the last partition's kernel: the sends they
        feed left together at the end."""
        stretch = task.stretch
        assert stretch is not None
        per_task = seconds / stretch.tasks
        self.max_fused = stretch_budget(per_task, len(stretch.idxs))
        if len(stretch.instances) == 1:
            sid = stretch.instances[0][0].id
            # a stage's first stretch is not evidence: its first kernel call loads or compiles
            if per_task >= LONE_TASK_S and sid in self._timed_stages:
                self.lone_stages.add(sid)
            self._timed_stages.add(sid)

    def validate_state(self) -> None:
        """Check invariants; raise AssertionError naming the broken one."""
        if self.map is None:
            return
        self.map.validate_state()
        for (did, i), p in self.parts.items():
            g = self._group[did]
            assert self.map.owner(g, i) == self.worker, f"holds ({did},{i}) it does not own"
            assert not (p.writer and p.readers), f"partition ({did},{i}) has a writer and readers"
            assert p.readers >= 0
        for g, idxs in enumerate(self.local):
            assert idxs == self.map.local(g, self.worker)
        for t in self.tasks.values():
            assert t.waiting >= 0, f"{t!r} waits on a negative count"
        assert all(n > 0 for n in self.live.values())
        # pieces are kept only for an instance whose local scatter tasks have not all run
        assert set(self._batches) <= set(self._scatters_left) <= set(self.live), "stale batch"
        assert sum(self.live.values()) == len(self.tasks), "live counts disagree with tasks"
        assert not self._inline, "a ready move was left undone"

    # ---------------------------------------------------------------- events
    def _on_placement(self, ev: Placement, out: list[Any]) -> None:
        if self.map is None:
            self.map = ev.map
            groups = self.program.groups
            self.local = [ev.map.local(g, self.worker) for g in range(len(groups))]
            for g, grp in enumerate(groups):
                for d in grp:
                    for i in self.local[g]:
                        self.parts[(d.id, i)] = Partition(d.id, i)
            self._plans.clear()
            self._batchable.clear()
        else:
            self.map.merge(ev.map)
        held, self.held = self.held, []
        for piece in held:
            self._on_piece(piece, out)

    def _on_signal(self, ev: Signal, out: list[Any]) -> None:
        self.signals[ev.seq] = ev.value

    def _on_piece(self, ev: Piece, out: list[Any]) -> None:
        if self.map is None:  # data can overtake the placement (different senders)
            self.held.append(ev)
            return
        g = self._group[ev.dataset]
        for j, ver in zip(ev.dsts, ev.versions):
            action = route_incoming(self.worker, self.map.owner(g, j), self.map.version(g, j), ver)
            if action == ACCEPT:
                self._deliver(ev.seq, j, ev.src, ev.array, out)
            elif action == HOLD:
                self.held.append(Piece(ev.eid, ev.seq, ev.dataset, ev.src, (j,), (ver,), ev.array))
            else:
                self._send_out(worker_rank(self.map.owner(g, j)),
                               Piece(self._next_eid(), ev.seq, ev.dataset, ev.src, (j,),
                                     (self.map.version(g, j),), ev.array), out)

    def _on_piece_batch(self, ev: PieceBatch, out: list[Any]) -> None:
        for piece in ev.pieces:
            self._on_piece(piece, out)

    def _on_task_failed(self, ev: TaskFailed, out: list[Any]) -> None:
        self.failed = True
        self._send_out(CONTROLLER, Failed(self._next_eid(), self.worker, ev.message), out)

    def _on_task_done(self, ev: TaskDone, out: list[Any]) -> None:
        task: Task = ev.task
        st = task.stage
        kind = task.kind
        seq = task.seq
        res = ev.outputs
        if kind == K_COMPUTE or kind == K_LOAD:
            for p, v in zip(task.writes, res):
                p.value = v
        elif kind == K_FUSED:
            for p, v in res:
                p.value = v
            self.fused_live -= 1
            self.stretches_run += 1
            self.tasks_run += task.stretch.tasks - 1  # type: ignore[union-attr]
        elif kind == K_SCATTER:
            self._scatter(task, res, out)
        elif kind == K_GATHER:
            assert st.dst is not None
            self.parts[(st.dst.id, task.part)].value = res
            del self.gathers[(seq, task.part)]
        elif kind == K_SIGNAL:
            value = bool(res)
            self.signals[seq] = value
            for w in range(self.n_workers):
                if w != self.worker:
                    self._send_out(worker_rank(w), Signal(self._next_eid(), seq, value), out)
        elif kind == K_REPORT:
            mark = self.report_marks[seq]
            self._send_out(CONTROLLER, ReportPart(self._next_eid(), seq, st.id, task.iteration,
                                                  task.part, res, mark), out)
        for part, mode in task.accesses:
            if mode == WRITE:
                part.writer = False
            else:
                part.readers -= 1
            if seq > part.last_seq:
                part.last_seq = seq
            if part.queue:
                self._pump(part, out)
        del self.tasks[task.tid]
        self.tasks_run += 1
        left = self.live[seq] - 1
        if left:
            self.live[seq] = left
        else:
            del self.live[seq]
            self.report_marks.pop(seq, None)

    # ---------------------------------------------------------------- interpreter
    def _advance(self, out: list[Any]) -> None:
        ops = self.program.ops
        stages = self.program.stages
        counters = self.counters
        self.paused = False
        while True:
            op = ops[self.pc]
            code = op[0]
            if code == OP_STAGE:
                if len(self.live) >= self.window:
                    break
                st = stages[op[1]]
                if st.kind == COMPUTE and self.max_fused > 1:
                    fused = self._fuse(out)
                    if fused:
                        continue
                    if fused is None:  # the next stretch waits for the running one
                        break
                n0 = len(out)
                self._emit(st, out)
                if self._inline:
                    self._drain(out)
                self.pc += 1
                if (self.pause_for_sends and st.kind == SCATTER_GATHER
                        and any(type(i) is RunTask and is_urgent(i.task) for i in out[n0:])):
                    self.paused = True
                    break
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
                self.ended = True
                if not self.live and not self.done_sent:
                    self.done_sent = True
                    self._send_out(CONTROLLER, Done(self._next_eid(), self.worker,
                                                    self.tasks_run, dict(self.sent)), out)
                break
            else:  # pragma: no cover - ops are produced by Program only
                raise AssertionError(op)

    def _await_signal(self, stage: Stage, out: list[Any]) -> bool | None:
        """Emit the signal instance on first visit; return its value once known, else None."""
        if self.await_seq is None:
            if len(self.live) >= self.window:
                return None
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
                t.pieces = self.early.pop((seq, j), {})
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
            if kind == K_REPORT:
                self.report_marks[seq] = self.program_tasks
            plan = self._plans.get((st.id, kind))
            if plan is None:
                plan = self._plan(st, kind)
            tasks = self.tasks
            tid = self._tid
            for i, (acc, rd, wr) in plan.items():  # inlined _new_task: the hot path
                t = Task(tid, seq, st, kind, i, it, acc, rd, wr)
                tasks[tid] = t
                tid += 1
                for p, mode in acc:
                    q = p.queue
                    q.append((t, mode))
                    if q[0][0] is t:
                        self._pump(p, out)
                if not acc:
                    out.append(RunTask(t))
            self._tid = tid
            n = len(plan)
        if n:
            self.live[seq] = self.live.get(seq, 0) + n

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
        in ``lone_stages``), and None while another
        stretch runs and the stage's partitions are busy: the interpreter then waits rather
        than falling back to ordinary tasks (which would keep a compute loop out of fused mode
        for good). Waiting cannot deadlock: everything emitted so far, on every worker, can
        finish without anything emitted later.
        """
        st0 = self.program.stages[self.program.ops[self.pc][1]]
        g = self._fusable[st0.id]
        idxs = self.local[g]
        if not idxs:
            return False
        if st0.id in self.lone_stages and len(self._stretch(g, 2)[0]) == 1:
            return False  # long tasks between communications: see stretch_timed
        if self.fused_live and not self._quiet(st0, idxs):
            if len(idxs) > 1 or len(self._stretch(g, 2)[0]) > 1:
                return None
            return False  # a lone task: nothing to wait for
        instances, datasets, pc, counters = self._stretch(g, max(1, self.max_fused // len(idxs)))
        if len(instances) * len(idxs) < 2:
            return False
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
        acc = tuple((p, WRITE) for row in parts for p in row.values())
        t = Task(self._tid, last_seq, st0, K_FUSED, idxs[0], instances[0][1], acc)
        t.stretch = Stretch(fused, idxs, parts)
        self._tid += 1
        self.tasks[t.tid] = t
        for p, _ in acc:
            p.queue.append((t, WRITE))
        self._pump_task(t, out)
        self.live[last_seq] = 1
        self.fused_live += 1
        return True

    def _stretch(self, g: int, limit: int) -> tuple[list[tuple[Stage, tuple[int, ...]]], set[int],
                                                    int, list[int]]:
        """Look ahead from ``pc`` (changing nothing): the compute instances of group ``g`` the
        program reaches through static loop control only, at most ``limit`` of them; with the
        datasets they touch, and the ``pc`` and loop counters after them."""
        ops = self.program.ops
        stages = self.program.stages
        fusable = self._fusable
        pc = self.pc
        counters = list(self.counters)
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
                if fusable[st.id] != g:
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

    def _plan(self, st: Stage, kind: str) -> dict[int, tuple[Any, ...]]:
        """Per local partition ``i`` of ``st``'s ``kind`` side: (accesses, reads, writes) as
        tuples of this worker's :class:`Partition` objects, so spawning a task and calling its
        function look nothing up."""
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

    def _new_task(self, seq: int, st: Stage, kind: str, part: int, it: tuple[int, ...],
                  out: list[Any] | None) -> Task:
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

    def _ready(self, t: Task, out: list[Any]) -> None:
        """``t`` may run now: queue it for :meth:`_drain` if it only moves a few bytes with
        canary's own code (a replace, sum or concat gather, a scatter of the partition itself,
        at most ``URGENT_MAX_BYTES``), else hand it to the runtime. Run as a task, such a move
        cost ~20 µs of dispatch and bookkeeping for ~1 µs of copying, several of them on the
        path of every iteration (a broadcast's gathers, a reduce's scatters). A report stays a
        task: the runtime runs it after urgent ones, so a loop's signal, emitted after it,
        leaves first (inline, its send went ahead of the signal's; LR 400K 6.17 -> 5.84 ms)."""
        kind = t.kind
        if self.inline and kind is not K_COMPUTE and kind is not K_FUSED:
            st = t.stage
            if kind is K_GATHER:
                if type(st.gather) is str and t.pieces is not None and sum(
                        [a.nbytes for a in t.pieces.values()]) <= URGENT_MAX_BYTES:
                    self._inline.append(t)
                    return
            elif kind is K_SCATTER and st.fn is None and st.one_piece:
                v = t.reads[0].value
                if type(v) is np.ndarray and v.nbytes <= URGENT_MAX_BYTES:
                    self._inline.append(t)
                    return
        out.append(RunTask(t))

    def _drain(self, out: list[Any]) -> None:
        """Complete the tasks :meth:`_ready` queued, and those they make ready, in order."""
        q = self._inline
        while q:
            t = q.popleft()
            kind = t.kind
            st = t.stage
            if kind is K_GATHER:
                assert t.pieces is not None
                res: Any = _GATHERS[st.gather]([t.pieces[s] for s in st.sources[t.part]])
            else:
                # a copy, as a scatter task's piece: a local gather may get it, and a later
                # in-place kernel must not change it there
                res = np.array(t.reads[0].value, copy=True)
            self.inline_run += 1
            self._on_task_done(TaskDone(0, t, res), out)

    def _pump(self, p: Partition, out: list[Any]) -> None:
        """Grant queued accesses in order: consecutive reads together, a write alone."""
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
            if mode == READ:
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

    # ---------------------------------------------------------------- data movement
    def _scatter(self, task: Task, res: Any, out: list[Any]) -> None:
        st = task.stage
        assert st.dst is not None and self.map is not None
        g = self._group[st.dst.id]
        owners = self.map.owners[g]
        versions = self.map.versions[g]
        targets = st.targets[task.part]
        # Remote pieces leave before local ones are delivered: another worker waits on them,
        # while delivering a local one only makes a gather runnable here (a broadcast used to
        # deliver to its 4 local partitions first, then send to the other worker).
        local: list[tuple[int, np.ndarray]] = []
        remote: list[tuple[int, tuple[int, ...], np.ndarray]] = []  # (worker, dsts, piece)
        if st.one_piece:
            by_worker: dict[int, list[int]] = {}
            for j in targets:
                by_worker.setdefault(owners[j], []).append(j)
            for w, js in by_worker.items():
                if w == self.worker:
                    local.extend((j, res) for j in js)
                else:
                    remote.append((w, tuple(js), res))
        else:
            for j, piece in zip(targets, res):
                w = owners[j]
                if w == self.worker:
                    local.append((j, piece))
                else:
                    remote.append((w, (j,), piece))
        left = self._scatters_left.get(task.seq)
        batch = None if left is None else self._batches.setdefault(task.seq, {})
        for w, dsts, piece in remote:
            msg = Piece(self._next_eid(), task.seq, st.dst.id, task.part, dsts,
                        tuple(versions[j] for j in dsts), piece)
            if (batch is not None and piece.nbytes <= URGENT_MAX_BYTES
                    and self._batchable_dsts(st).issuperset(dsts)):
                batch.setdefault(w, []).append(msg)
            else:
                self._send_out(worker_rank(w), msg, out)
        if left is not None:  # this worker holds several of the instance's sources
            if left > 1:
                self._scatters_left[task.seq] = left - 1
            else:  # the instance's last local scatter ran: the pieces kept for it leave now
                del self._scatters_left[task.seq]
                for w, kept in self._batches.pop(task.seq).items():
                    self._send_out(worker_rank(w), kept[0] if len(kept) == 1
                                   else PieceBatch(self._next_eid(), tuple(kept)), out)
        for j, piece in local:
            self._deliver(task.seq, j, task.part, piece, out)

    def _batchable_dsts(self, st: Stage) -> frozenset[int]:
        """The destination partitions of ``st`` whose gathers need a piece from every source
        partition this worker holds: their pieces may wait for this worker's last scatter task
        of the instance and leave with it in one :class:`PieceBatch`, since such a gather cannot
        run before that last piece arrives anyway (a reduce's gather needs every source)."""
        got = self._batchable.get(st.id)
        if got is None:
            mine = set(self.local[self._group[st.reads[0].id]])
            got = frozenset(j for j, srcs in enumerate(st.sources) if mine <= set(srcs))
            self._batchable[st.id] = got
        return got

    def _deliver(self, seq: int, j: int, src: int, array: np.ndarray, out: list[Any]) -> None:
        t = self.gathers.get((seq, j))
        if t is None:
            self.early.setdefault((seq, j), {})[src] = array
            return
        assert t.pieces is not None
        if src in t.pieces:
            raise AssertionError(f"piece from partition {src} delivered twice to {t!r}")
        t.pieces[src] = array
        t.waiting -= 1
        if t.waiting == 0:
            self._ready(t, out)

    # ---------------------------------------------------------------- helpers
    def _next_eid(self) -> int:
        self._eid += 1
        return (self.rank << 40) | self._eid

    def _send(self, dest: int, msg: Any) -> Send:
        name = type(msg).__name__
        self.sent[name] = self.sent.get(name, 0) + 1
        return Send(dest, msg)

    def _send_out(self, dest: int, msg: Any, out: list[Any]) -> None:
        ins = self._send(dest, msg)
        if self.send_now is None:
            out.append(ins)
        else:
            self.send_now(ins)


# A fused stretch runs with no MPI polling: it should last about FUSE_TARGET seconds, but cover
# at least FUSE_MIN_INSTANCES stage instances (a stretch costs a few µs per partition row
# whatever its length, so a one-stage stretch saves nothing over lone tasks), and never run
# longer than FUSE_MAX seconds (a message waits at most that long for the next poll). A
# stretch holds no communication, so what waits is only what a later stage needs anyway:
# with 10 µs tasks on 2 MPI workers, 5 ms stretches cost 0.95 µs a task against 1.9 at 1 ms.
FUSE_TARGET = 5e-3
FUSE_MIN_INSTANCES = 8
FUSE_MAX = 2e-2
MAX_FUSED = 1 << 16
# A one-instance stretch of tasks this long is not worth fusing (see WorkerState.stretch_timed):
# a lone task costs ~5 µs more, <= 10% of such a task, while the fused stretch delays the sends
# of every partition but the last by the other kernels (LR 20K: ~130 µs an iteration).
LONE_TASK_S = 5e-5


def is_urgent(task: Task) -> bool:
    """Whether the runtime should run ``task`` before the compute tasks already queued: a
    signal, or a scatter whose source arrays total at most ``URGENT_MAX_BYTES``.

    A reduce's small piece then leaves right after its partition's kernel instead of after
    every other queued kernel, and the worker that can do nothing until the last piece is in
    waits that much less (LR 20K: 4 pieces over 175 -> ~45 µs). Large pieces (PageRank's
    mirror blocks, MBs) are not hurried: moving them is bandwidth-bound anyway, and sending
    them early kept more of them alive at once (PageRank 2^20: +38 MB peak on a worker).
    """
    kind = task.kind
    if kind is K_SIGNAL:
        return True
    if kind is not K_SCATTER:
        return False
    size = 0
    for p in task.reads:
        v = p.value
        size += v.nbytes if isinstance(v, np.ndarray) else URGENT_MAX_BYTES + 1
    return size <= URGENT_MAX_BYTES


def stretch_budget(per_task_s: float, rows: int) -> int:
    """The ``max_fused`` (tasks per stretch) for stretches over ``rows`` partitions whose tasks
    take ``per_task_s`` seconds: about ``FUSE_TARGET`` seconds or ``FUSE_MIN_INSTANCES``
    instances, whichever is more, but at most ``FUSE_MAX`` seconds; always in
    ``[2, MAX_FUSED]``."""
    per_task_s = max(per_task_s, 1e-8)
    want = max(FUSE_TARGET / per_task_s, FUSE_MIN_INSTANCES * rows)
    return int(min(max(min(want, FUSE_MAX / per_task_s), 2), MAX_FUSED))


_LOOP_CONTROL = frozenset((OP_NEXT, OP_FOR, OP_PUSH, OP_JUMP))


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


def _identity(x: Any) -> Any:
    return x


def gather_sum(pieces: list[np.ndarray]) -> np.ndarray:
    """Element-wise sum in the order given (source-partition order: deterministic)."""
    acc = np.array(pieces[0], dtype=np.result_type(pieces[0]), copy=True)
    for p in pieces[1:]:
        acc += p
    return acc


def gather_replace(pieces: list[np.ndarray]) -> np.ndarray:
    """The single piece, copied (it may be shared with the sender's partition)."""
    return np.array(pieces[0], copy=True)


def gather_concat(pieces: list[np.ndarray]) -> np.ndarray:
    """Pieces stacked along axis 0 in source order."""
    return np.concatenate(pieces, axis=0)


_GATHERS: dict[Any, Any] = {"sum": gather_sum, "replace": gather_replace, "concat": gather_concat}
