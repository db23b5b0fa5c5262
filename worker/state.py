"""The worker as a pure state machine: ``handle(event) -> list[instruction]``.

No MPI, no clock, no kernel call in here: the runtime (``canary.worker.runtime`` over MPI,
``canary.local_runner`` in-process) feeds every message received and every task finished to
:meth:`WorkerState.handle` and carries out what it returns. Nothing else changes the state.

The machine is assembled from one module per concern, each behind ``handle``:

* :mod:`canary.worker.interpreter` walks the program and emits stage instances;
* :mod:`canary.worker.access` queues and grants per-partition accesses, and picks the next task;
* :mod:`canary.worker.fusion` emits runs of compute instances as one fused task;
* :mod:`canary.worker.moves` sends, routes and gathers pieces.

Per local partition it keeps the metadata a partition needs to move (``last_seq``, the queue of
pending accesses, ``frozen``; see :class:`canary.worker.tasks.Partition`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

from canary.messages import (
    CONTROLLER,
    Failed,
    Hello,
    LoadReport,
    MigrateAccept,
    MigrateArray,
    MigrateData,
    MigrateOffer,
    MigrateOut,
    Piece,
    PieceBatch,
    Placement,
    ReportPart,
    Resume,
    Signal,
    SnapshotAsk,
    SnapshotAt,
    SnapshotLoaded,
    SnapshotSaved,
    TaskDone,
    TaskFailed,
    Tick,
    worker_rank,
)
from canary.partition_map import PartitionMap
from canary.program import COMPUTE, WRITE, Program
from canary.worker.access import AccessQueues
from canary.worker.config import WorkerConfig
from canary.worker.fusion import Fusion
from canary.worker.interpreter import Interpreter
from canary.worker.migration import Migration, MoveIn, MoveOut
from canary.worker.moves import DataMoves, builtin_gather
from canary.worker.snapshots import Snapshots
from canary.worker.tasks import (
    K_COMPUTE,
    K_FUSED,
    K_GATHER,
    K_LOAD,
    K_REPORT,
    K_SCATTER,
    K_SIGNAL,
    Partition,
    Task,
)


class StoryRecord(NamedTuple):
    """One step of a worker's log (see :meth:`WorkerState.story`).

    ``cause`` is the ``eid`` of the event being handled when it happened; ``what`` is one of
    ``emit`` (a stage instance was emitted; ``part`` is its stage id), ``ready`` (a task's
    accesses were all granted and its pieces all in), ``run`` (handed to the runtime), ``done``
    / ``failed`` (its ``TaskDone`` / ``TaskFailed`` arrived; ``eid`` is that event's),
    ``inline`` (a small move completed in ``handle``), ``send`` / ``recv`` (a piece or signal
    left or arrived; ``eid`` is the message's, ``part`` the source partition or the peer rank)
    and ``yield``. A fused task covers stage instances ``seq..seq_end``.
    """

    cause: int
    what: str
    seq: int
    seq_end: int
    tid: int
    part: int
    eid: int


class WorkerState(Interpreter, AccessQueues, Fusion, DataMoves, Migration, Snapshots):
    """State of worker ``worker`` (0-based) of ``n_workers`` running ``program``.

    Contract: ``start()`` once, then ``handle(event)`` for every message received, every task
    finished and every ``Resume``. Instructions returned, in the order to carry them out:

    * :class:`canary.messages.Send`: send the message (at once: other workers may wait on it);
    * :class:`canary.worker.tasks.RunTask`: run the task (see :meth:`task_call`) and feed its
      ``TaskDone``/``TaskFailed`` back. At most one task is out at a time, urgent ones first
      (signals and small scatters, whose messages other workers wait for), then in the order
      they became ready; with ``config.ready_order_seed`` (tests) in a seeded random order;
    * :class:`canary.messages.Yield`: the interpreter stopped so that the messages before it
      leave first; feed ``Resume`` after sending them (any other event resumes as well).

    After the program ends and every local task is done, exactly one
    :class:`canary.messages.Done` is sent to the controller. A failed task sends one
    :class:`canary.messages.Failed` and nothing runs after it. Every instruction carries the
    ``eid`` of the event that caused it; :meth:`story` tells why a stage instance's tasks ran.
    Raises KeyError for an event of an unknown type.
    """

    def __init__(self, program: Program, worker: int, n_workers: int,
                 config: WorkerConfig | None = None, restore: dict[str, Any] | None = None,
                 **fields: Any) -> None:
        self.program = program.finalize()
        self.worker = worker
        self.rank = worker_rank(worker)
        self.n_workers = n_workers
        self.config = config = WorkerConfig.from_env({}, **fields) if config is None else config
        self.window = config.window
        self.inline = config.inline
        self._urgent_max_bytes = config.urgent_max_bytes
        self.log: deque[tuple[Any, ...]] | None = (
            deque(maxlen=config.story_size) if config.story_size else None)
        self._cause = 0  # eid of the event being handled
        self.map: PartitionMap | None = None
        self.parts: dict[tuple[int, int], Partition] = {}
        self.local: list[list[int]] = []  # group -> local partition indices
        self._group = [program.group_of(d) for d in program.datasets]
        self.tasks: dict[int, Task] = {}
        self._tid = 0
        self.tasks_run = 0
        self.done_sent = False
        self.failed = False
        self.sent: dict[str, int] = {}
        self._eid = 0
        self._tasks_per_instance = [program.tasks_per_instance(st) for st in program.stages]
        # stage id -> its co-location group if it is a compute stage (may join a stretch), else -1
        self._fusable = [self._group[(st.reads or st.writes)[0].id] if st.kind == COMPUTE else -1
                         for st in program.stages]
        # stage id -> (group of the partitions its tasks touch, the same for its gathers)
        self._task_group = [(self._group[(st.reads or st.writes)[0].id] if st.reads or st.writes
                             else -1, self._group[st.dst.id] if st.dst is not None else -1)
                            for st in program.stages]
        self.busy: dict[tuple[int, int], float] = {}  # (group, index) -> task seconds, this period
        self._tasks_reported = 0
        self._last_tick = 0.0
        self._init_interpreter()
        self._init_access()
        self._init_fusion()
        self._init_moves()
        self._init_migration()
        self._init_snapshots(restore)

    # ---------------------------------------------------------------- public API
    def start(self, reports: bool = False) -> list[Any]:
        """Announce this worker and its program digest to the controller.

        ``reports``: the runtime will feed a :class:`Tick` every ``config.report_s``, whose load
        reports size the run-ahead window (:meth:`Interpreter._fit_window`). The window then
        starts at its floor, since nothing is known of the pace yet: started at its most, a
        worker that only waits for others emitted 64 instances at once, and in a loop of slow
        instances the first snapshot waited for all of them. Without reports (``window_s`` 0,
        or a runner that sends none) it stays at its most."""
        if reports and self.config.window_s > 0:
            self.window = self.config.window_floor
        p = self.program
        return [self._send(CONTROLLER, Hello(self._next_eid(), self.worker, p.digest,
                                             p.statements(), p.statement_sites()))]

    def handle(self, event: Any) -> list[Any]:
        """Apply one event; return the instructions it causes (see the class docstring)."""
        out: list[Any] = []
        self._cause = event.eid
        self._hurry = False
        if type(event) is TaskDone:
            # The hot path. Only a retired stage instance can unblock the interpreter (room in
            # the run-ahead window, a local signal's value, the end), so advance only then, or
            # when it stopped to let messages leave.
            task = event.task
            if task is self.running:
                self.running = None
            if self.log is not None:
                self.log.append((event.eid, "done", task.seq if task.stretch is None
                                 else task.stretch.instances[0][1], task.seq, task.tid,
                                 task.part, event.eid))
            live = len(self.live)
            self._on_task_done(event, out)
            if self._inline:
                self._drain(out)
            if self.moves_out:  # a moving partition leaves once its last task is done
                self._ship_when_quiet(out)
            if (self._emit_pending or len(self.live) < live) and not self.failed:
                self._advance(out)
            if self._snap_seq is not None:
                self._snapshot_when_quiet(out)
        else:
            _HANDLERS[type(event)](self, event, out)
            if self._inline:
                self._drain(out)
            if self.moves_out:
                self._ship_when_quiet(out)
            if self.map is not None and not self.failed:
                self._advance(out)
            if self._snap_seq is not None:
                self._snapshot_when_quiet(out)
        self._dispatch(out)
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
            if type(st.gather) is str:
                return builtin_gather, (pieces, st, self.rank, self.worker)
            return st.gather, (pieces,)
        if kind == K_SIGNAL:
            return st.fn, (self.parts[(st.reads[0].id, 0)].value,)
        if kind == K_REPORT:
            return _identity, (self.parts[(st.reads[0].id, task.part)].value,)
        if kind == K_LOAD:
            return st.fn, (task.part, st.partitions)
        raise AssertionError(kind)

    def story(self, seq: int) -> list[StoryRecord]:
        """Every logged step that concerns stage instance ``seq``, oldest first: when it was
        emitted, and for each of its tasks why it became ready and ran (the ``cause`` of each
        record is an event's ``eid``; ``story_of_event`` finds what that event was). The log
        keeps the last ``config.story_size`` records."""
        if self.log is None:
            return []
        return [StoryRecord(*r) for r in self.log if r[2] <= seq <= r[3]]

    def story_of_event(self, eid: int) -> list[StoryRecord]:
        """The logged steps that were that event (a task's ``done``, a message's ``recv``)."""
        if self.log is None:
            return []
        return [StoryRecord(*r) for r in self.log if r[6] == eid]

    def validate_state(self) -> None:
        """Check invariants; raise AssertionError naming the broken one."""
        if self.map is None:
            return
        self.map.validate_state()
        outgoing = {(mv.group, mv.index) for mv in self.moves_out.values()}
        incoming = {(mv.group, mv.index) for mv in self.moves_in.values()}
        for (did, i), p in self.parts.items():
            g = self._group[did]
            assert (self.map.owner(g, i) == self.worker or (g, i) in outgoing), (
                f"holds ({did},{i}) it neither owns nor is handing over")
            assert not (p.writer and p.readers), f"partition ({did},{i}) has a writer and readers"
            assert p.readers >= 0
            assert not p.frozen or (g, i) in incoming, f"({did},{i}) frozen with no move"
        cut_pending = {(c[2], c[3]) for c in self._cuts}
        for g, idxs in enumerate(self.local):
            assert idxs == sorted(idxs), f"local partitions of group {g} out of order"
            assert set(idxs) ^ set(self.map.local(g, self.worker)) <= (
                {i for gg, i in outgoing | cut_pending | incoming if gg == g}), (
                f"local partitions of group {g} disagree with the map outside any move")
        for t in self.tasks.values():
            assert t.waiting >= 0, f"{t!r} waits on a negative count"
        assert all(n > 0 for n in self.live.values())
        # pieces are kept only for an instance whose local scatter tasks have not all run
        assert set(self._batches) <= set(self._scatters_left) <= set(self.live), "stale batch"
        assert sum(self.live.values()) == len(self.tasks), "live counts disagree with tasks"
        assert not self._inline, "a ready move was left undone"
        queued = list(self.ready_urgent) + list(self.ready)
        assert len(set(map(id, queued))) == len(queued), "a task is queued to run twice"
        assert all(t.waiting == 0 and t.tid in self.tasks for t in queued), "a queued task is not ready"
        assert self.running is None or self.running.tid in self.tasks, "the running task is gone"
        assert self.running not in queued, "the running task is also queued"
        assert self._hold_emission == sum(mv.cut is None for mv in self.moves_out.values())
        assert all(isinstance(mv, (MoveIn, MoveOut)) for mv in self._moving.values())
        # snapshots: nothing is emitted at or past a barrier or before a resumed job's values
        assert self.seq <= self._stop_at, "emitted past a snapshot's barrier"
        assert self.config.window_floor <= self.window <= self.config.window, \
            "window out of range"
        assert not (self._restoring and self.tasks), "ran a task before the snapshot was read"
        assert self._snap_seq is None or self._snap is not None

    # ---------------------------------------------------------------- events
    def _on_placement(self, ev: Placement, out: list[Any]) -> None:
        if self.map is None:
            self.map = ev.map.copy()
            groups = self.program.groups
            self.local = [ev.map.local(g, self.worker) for g in range(len(groups))]
            for g, grp in enumerate(groups):
                for d in grp:
                    for i in self.local[g]:
                        self.parts[(d.id, i)] = Partition(d.id, i)
            self._plans.clear()
            self._batchable.clear()
            offers, self._offers_before_placement = self._offers_before_placement, []
            for offer in offers:
                self._on_migrate_offer(offer, out)
            if self._restoring:
                self._restore_request(out)
        else:
            self.merge_map(ev.map)
        held, self.held = self.held, []
        for piece in held:
            self._on_piece(piece, out)

    def _on_signal(self, ev: Signal, out: list[Any]) -> None:
        if self.log is not None:
            self.log.append((self._cause, "recv", ev.seq, ev.seq, -1, -1, ev.eid))
        self.signals[ev.seq] = ev.value

    def _on_resume(self, ev: Resume, out: list[Any]) -> None:
        """Nothing to apply: ``handle`` goes on emitting where it stopped."""

    def _on_tick(self, ev: Tick, out: list[Any]) -> None:
        """Report the load since the last report: task seconds and bytes per local partition
        (every partition of a group index moves together), and the runtime's idle time."""
        busy = self.busy
        rows = []
        for g, idxs in enumerate(self.local):
            datasets = self.program.groups[g]
            for i in idxs:
                nbytes = 0
                for d in datasets:
                    v = self.parts[(d.id, i)].value
                    if v is not None:
                        nbytes += v.nbytes
                rows.append((g, i, busy.get((g, i), 0.0), nbytes))
        interval = ev.now - self._last_tick
        self._last_tick = ev.now
        self._fit_window(interval)
        self.busy = {}
        tasks, self._tasks_reported = self.tasks_run - self._tasks_reported, self.tasks_run
        self._send_out(CONTROLLER, LoadReport(self._next_eid(), self.worker, interval,
                                              tuple(rows), ev.idle, tasks, self.seq,
                                              self.done_sent, ev.cpu, ev.cpu_wait, self.pc,
                                              tuple(self.counters), ev.polls_hot,
                                              ev.mem_free, ev.mem_total, ev.mem_pool), out)

    def _on_task_failed(self, ev: TaskFailed, out: list[Any]) -> None:
        if ev.task is self.running:
            self.running = None
        if self.log is not None:
            t = ev.task
            self.log.append((self._cause, "failed", t.seq, t.seq, t.tid, t.part, ev.eid))
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
            if kind == K_COMPUTE and ev.seconds is not None and st.id in self._untimed:
                self._time_task(st, ev.seconds)
        elif kind == K_FUSED:
            stretch = task.stretch
            assert stretch is not None
            for p, v in res:
                p.value = v
            self.fused_live -= 1
            self.stretches_run += 1
            self.tasks_run += stretch.tasks - 1
            if ev.seconds is not None:
                if self.config.adapt_fused:
                    self._tune_fusion(task, ev.seconds)
                g = self._fusable[st.id]
                share = ev.seconds / len(stretch.idxs)
                for i in stretch.idxs:  # the rows ran one after the other, alike
                    self.busy[(g, i)] = self.busy.get((g, i), 0.0) + share
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
        if ev.seconds is not None and kind is not K_FUSED:
            key = (self._task_group[st.id][kind is K_GATHER], task.part)
            self.busy[key] = self.busy.get(key, 0.0) + ev.seconds
        del self.tasks[task.tid]
        self.tasks_run += 1
        left = self.live[seq] - 1
        if left:
            self.live[seq] = left
        else:
            del self.live[seq]
            self.report_marks.pop(seq, None)


def _identity(x: Any) -> Any:
    return x


# The class's, not each state's: a dict of bound methods on the state made a reference cycle,
# which kept an ended job's partitions (hundreds of MB on a pool worker) until Python's next
# full collection.
_HANDLERS: dict[type, Callable[[WorkerState, Any, list[Any]], None]] = {
    Placement: WorkerState._on_placement,
    TaskDone: WorkerState._on_task_done,
    TaskFailed: WorkerState._on_task_failed,
    Piece: WorkerState._on_piece,
    PieceBatch: WorkerState._on_piece_batch,
    Signal: WorkerState._on_signal,
    Resume: WorkerState._on_resume,
    Tick: WorkerState._on_tick,
    MigrateOut: WorkerState._on_migrate_out,
    MigrateOffer: WorkerState._on_migrate_offer,
    MigrateAccept: WorkerState._on_migrate_accept,
    MigrateData: WorkerState._on_migrate_data,
    MigrateArray: WorkerState._on_migrate_array,
    SnapshotAsk: WorkerState._on_snapshot_ask,
    SnapshotAt: WorkerState._on_snapshot_at,
    SnapshotSaved: WorkerState._on_snapshot_saved,
    SnapshotLoaded: WorkerState._on_snapshot_loaded,
}
