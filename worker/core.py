"""What every part of the worker's state machine shares: its data, and the few steps they all
take (sending a message, numbering it, yielding).

``WorkerState`` (:mod:`canary.worker.state`) is assembled from one class per concern, each
subclassing :class:`WorkerCore`: :class:`~canary.worker.interpreter.Interpreter`,
:class:`~canary.worker.access.AccessQueues`, :class:`~canary.worker.fusion.Fusion` and
:class:`~canary.worker.moves.DataMoves`. The methods a part offers the others are declared here,
so each part's use of another is visible in one place.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any

import numpy as np

from canary.messages import Piece, PieceBatch, Send, Signal, TaskDone, TaskFailed, Yield
from canary.partition_map import PartitionMap
from canary.program import Program, Stage
from canary.worker.config import WorkerConfig
from canary.worker.tasks import Partition, Task

# Messages other workers wait for: once one is decided, the interpreter emits nothing more before
# it has left (see Interpreter._advance: it yields).
_HURRIED = (Piece, PieceBatch, Signal)


class WorkerCore:
    """The worker's data (set up by each part's ``_init_*``) and the steps every part takes."""

    # ---- identity and configuration
    program: Program
    worker: int  # 0-based worker index; its MPI rank is worker + 1
    rank: int
    n_workers: int
    config: WorkerConfig
    window: int  # the run-ahead window now (Interpreter._fit_window), read on the hot path
    inline: bool  # config.inline
    _urgent_max_bytes: int  # config.urgent_max_bytes
    _group: list[int]  # dataset id -> co-location group
    _tasks_per_instance: list[int]  # stage id -> tasks of one instance on all workers
    _fusable: list[int]  # stage id -> its group if a compute stage (may join a stretch), else -1

    # ---- placement and local partitions
    map: PartitionMap | None  # None until the first Placement
    parts: dict[tuple[int, int], Partition]  # (dataset id, index) -> local partition
    local: list[list[int]]  # group -> local partition indices, ascending

    # ---- tasks (AccessQueues)
    tasks: dict[int, Task]  # tid -> task not finished
    _tid: int
    ready_urgent: deque[Task]  # ready, to run first: signals and small scatters
    ready: deque[Task]  # ready, in the order they became so
    running: Task | None  # handed to the runtime, its TaskDone not yet in
    _order_rng: random.Random | None  # config.ready_order_seed's picks (tests)
    _plans: dict[tuple[int, str], dict[int, tuple[Any, ...]]]  # per-task tables, built once

    # ---- the interpreter (Interpreter)
    pc: int
    counters: list[int]  # loop counters, innermost last
    seq: int  # the next stage instance's number
    await_seq: int | None  # the signal instance the interpreter waits for
    ended: bool
    signals: dict[int, bool]  # signal seq -> value, until the interpreter uses it
    live: dict[int, int]  # seq -> local tasks not finished
    program_tasks: int  # tasks of all workers emitted so far, in program order
    report_marks: dict[int, int]  # report seq -> program_tasks when it was emitted
    _emit_pending: bool  # stopped to let messages leave; goes on at the next event
    _hurry: bool  # a message or an urgent task was decided in this handle call

    # ---- fused stretches (Fusion)
    max_fused: int  # most tasks the next stretch may stand for
    fused_live: int
    stretches_run: int
    lone_stages: set[int]  # compute stages emitted as ordinary tasks from now on
    slow_stages: set[int]  # likewise, their tasks too long to fuse
    _untimed: set[int]
    _ran_alone: set[int]

    # ---- data moves (DataMoves)
    gathers: dict[tuple[int, int], Task]  # (seq, dst partition) -> its gather task
    early: dict[tuple[int, int, int], dict[int, np.ndarray]]  # (seq, dataset, j): before gather
    held: list[Piece]  # pieces routed by a placement this worker has not seen yet
    _scatters_left: dict[int, int]  # seq -> local scatter tasks not yet run (batching)
    _batches: dict[int, dict[int, list[Piece]]]  # seq -> worker -> pieces kept for one message
    _batchable: dict[int, frozenset[int]]
    _inline: list[Task]  # ready small moves, completed by DataMoves._drain
    inline_run: int

    # ---- moves (Migration)
    moves_out: dict[int, Any]  # move -> MoveOut: partitions this worker hands over
    moves_in: dict[int, Any]  # move -> MoveIn: partitions it takes over, until installed
    _moving: dict[tuple[int, int], Any]  # (group, index) under way -> its move
    _hold_emission: int  # offers waiting for their cut
    _cuts: list[tuple[int, int, int, int, bool]]  # (cut, move, group, index, starts), sorted

    # ---- snapshots (Snapshots)
    _stop_at: int  # emit no stage instance numbered this or higher (a snapshot's barrier)
    _snap_stop: int  # the snapshot's part of _stop_at
    _snap: int | None  # the snapshot under way
    _snap_seq: int | None  # its barrier, once the controller has named it
    _restoring: bool  # a resumed job's values are not in yet

    # ---- load (reported on each Tick)
    busy: dict[tuple[int, int], float]  # (group, index) -> seconds of its tasks this period
    _task_group: list[tuple[int, int]]  # stage id -> group of its tasks, of its gathers
    _tasks_reported: int
    _last_tick: float

    # ---- progress, counts and the log
    tasks_run: int
    done_sent: bool
    failed: bool
    sent: dict[str, int]  # message type -> count
    log: deque[tuple[Any, ...]] | None  # see WorkerState.story
    _cause: int  # eid of the event being handled
    _eid: int

    # ---------------------------------------------------------------- shared steps
    def _next_eid(self) -> int:
        self._eid += 1
        return (self.rank << 40) | self._eid

    def _send(self, dest: int, msg: Any) -> Send:
        name = type(msg).__name__
        self.sent[name] = self.sent.get(name, 0) + 1
        return Send(dest, msg, self._cause)

    def _send_out(self, dest: int, msg: Any, out: list[Any]) -> None:
        out.append(self._send(dest, msg))
        if type(msg) in _HURRIED:
            self._hurry = True
            if self.log is not None:
                self.log.append((self._cause, "send", msg.seq, msg.seq, -1, dest, msg.eid))

    def _yield(self) -> Yield:
        if self.log is not None:
            self.log.append((self._cause, "yield", self.seq, self.seq, -1, -1, 0))
        return Yield(self._cause)

    # ---------------------------------------------------------------- offered by the parts
    def _on_task_done(self, ev: TaskDone, out: list[Any]) -> None:  # WorkerState
        raise NotImplementedError

    def _on_task_failed(self, ev: TaskFailed, out: list[Any]) -> None:  # WorkerState
        raise NotImplementedError

    def _ready(self, t: Task, out: list[Any]) -> None:  # AccessQueues
        raise NotImplementedError

    def _pump(self, p: Partition, out: list[Any]) -> None:  # AccessQueues
        raise NotImplementedError

    def _pump_task(self, t: Task, out: list[Any]) -> None:  # AccessQueues
        raise NotImplementedError

    def _new_task(self, seq: int, st: Stage, kind: str, part: int, it: tuple[int, ...],
                  out: list[Any] | None) -> Task:  # AccessQueues
        raise NotImplementedError

    def _plan(self, st: Stage, kind: str) -> dict[int, tuple[Any, ...]]:  # AccessQueues
        raise NotImplementedError

    def _fuse(self, out: list[Any]) -> bool | None:  # Fusion
        raise NotImplementedError

    def _drain(self, out: list[Any]) -> None:  # DataMoves
        raise NotImplementedError

    def _is_inline_move(self, t: Task) -> bool:  # DataMoves
        raise NotImplementedError

    def _deliver(self, seq: int, dataset: int, j: int, src: int, array: np.ndarray,
                 out: list[Any]) -> None:  # DataMoves
        raise NotImplementedError

    def _on_piece(self, ev: Piece, out: list[Any]) -> None:  # DataMoves
        raise NotImplementedError

    def _route_moving(self, ev: Piece, j: int, mv: Any, out: list[Any]) -> None:  # Migration
        raise NotImplementedError

    def _owner_for(self, g: int, j: int, seq: int) -> int:  # Migration
        raise NotImplementedError

    def _switch_at_cuts(self, out: list[Any]) -> None:  # Migration
        raise NotImplementedError

    def _next_cut(self, g: int) -> int | None:  # Migration
        raise NotImplementedError
