"""Snapshots, the worker's side: stop at the barrier the controller names, write, go on; and
start a resumed job from a snapshot's position and values.

The barrier is a stage instance number ``S``. Numbers are global (every worker emits the same
n-th instance), so when every worker has emitted exactly the instances before ``S`` and each has
finished its own tasks of them, every instance before ``S`` is complete everywhere and no piece
or signal is in flight: each worker's partitions, with the interpreter's position (``pc``, loop
counters, ``seq``), are a consistent cut of the job. The protocol:

1. :class:`~canary.messages.SnapshotAsk`: the worker stops emitting where it is (``seq``) and
   replies with that position (:class:`~canary.messages.SnapshotPosition`). Its running and
   queued tasks go on.
2. :class:`~canary.messages.SnapshotAt` names ``S``, the largest position of any worker, so no
   worker has passed it. The worker emits up to ``S`` and waits until it has no task left, is
   not waiting for a signal's value and stands before instance ``S``.
3. It hands its partitions to the runtime (:class:`~canary.messages.WriteSnapshot`); once they
   are written (:class:`~canary.messages.SnapshotSaved`) it tells the controller
   (:class:`~canary.messages.SnapshotWritten`) and goes on at once: the controller commits.

Resuming: the state starts at the snapshot's position with emission held; on its first placement
it asks the runtime for the values of the partitions it now owns
(:class:`~canary.messages.ReadSnapshot`), installs them (:class:`~canary.messages.SnapshotLoaded`)
and carries on from instance ``S``. Pieces other workers send meanwhile wait as early pieces do,
and a partition moved away meanwhile leaves once its values are in.
"""

from __future__ import annotations

from typing import Any

from canary.messages import (
    CONTROLLER,
    ReadSnapshot,
    SnapshotAsk,
    SnapshotAt,
    SnapshotLoaded,
    SnapshotPosition,
    SnapshotSaved,
    SnapshotWritten,
    WriteSnapshot,
)
from canary.program import OP_IF, OP_STAGE, OP_WHILE
from canary.worker.core import WorkerCore

# _stop_at when nothing holds emission: every seq is below it (one comparison on the hot path)
NO_STOP = 1 << 62


class Snapshots(WorkerCore):
    """Taking part in snapshots and resuming from one (mixed into ``WorkerState``)."""

    def _init_snapshots(self, restore: dict[str, Any] | None) -> None:
        self._stop_at = NO_STOP  # emit no stage instance numbered this or higher
        self._snap_stop = NO_STOP  # the snapshot's part of that
        self._snap: int | None = None  # the snapshot under way
        self._snap_seq: int | None = None  # its barrier, once named
        self._snap_writing = False
        self._restoring = False
        if restore is not None:
            self.pc = int(restore["pc"])
            self.counters = [int(c) for c in restore["counters"]]
            self.seq = int(restore["seq"])
            self.program_tasks = int(restore["program_tasks"])
            self._restoring = True
            self._hold()

    def _hold(self) -> None:
        """Emission stops at the snapshot's barrier, and where it is until a resumed job's
        values are in."""
        self._stop_at = self.seq if self._restoring else self._snap_stop

    def position(self) -> dict[str, Any]:
        """Where the interpreter stands: enough to continue exactly here (see module doc)."""
        op = self.program.ops[self.pc]
        if op[0] in (OP_STAGE, OP_WHILE, OP_IF):  # a loop's or branch's test is its signal stage
            st = self.program.stages[op[1]]
            # without the driver line: stored in the manifest and shown when a run resumes
            # from it, by when the driver may have been edited above the statement
            where = f"before {st.label(tuple(self.counters), declared=False)}"
        else:
            where = "at the end of the program" if self.ended else f"at op {self.pc}"
        return {"seq": self.seq, "pc": self.pc, "counters": list(self.counters),
                "program_tasks": self.program_tasks, "where": where}

    # ---------------------------------------------------------------- taking one
    def _on_snapshot_ask(self, ev: SnapshotAsk, out: list[Any]) -> None:
        self._snap, self._snap_seq, self._snap_writing = ev.snap, None, False
        self._snap_stop = self.seq
        self._hold()
        self._send_out(CONTROLLER, SnapshotPosition(self._next_eid(), ev.snap, self.worker,
                                                    self.seq, self.ended), out)

    def _on_snapshot_at(self, ev: SnapshotAt, out: list[Any]) -> None:
        if ev.snap != self._snap:
            return  # an abandoned snapshot this worker already went past
        if ev.seq is None:
            self._end_snapshot()
            return
        assert ev.seq >= self.seq, f"snapshot barrier {ev.seq} behind worker at {self.seq}"
        self._snap_seq = self._snap_stop = ev.seq
        self._hold()

    def _snapshot_when_quiet(self, out: list[Any]) -> None:
        """Write once everything before the barrier is finished here (see module doc)."""
        if (self._snap_writing or self.seq != self._snap_seq or self.live or self.await_seq
                is not None or self.running is not None or self._inline or self.failed
                or self._restoring):
            return
        assert self._snap is not None and self._snap_seq is not None
        self._snap_writing = True
        arrays = []
        for (did, i), p in sorted(self.parts.items()):
            if p.value is not None:
                arrays.append((self.program.datasets[did].name, i, p.value, p.last_seq))
        out.append(WriteSnapshot(self._snap, self._snap_seq, arrays, self._cause))

    def _on_snapshot_saved(self, ev: SnapshotSaved, out: list[Any]) -> None:
        if ev.snap != self._snap:
            return
        self._send_out(CONTROLLER, SnapshotWritten(
            self._next_eid(), ev.snap, self.worker, ev.error, ev.entries, self.position(),
            self.tasks_run, self.sent.get("ReportPart", 0)), out)
        self._end_snapshot()

    def _end_snapshot(self) -> None:
        self._snap = self._snap_seq = None
        self._snap_writing = False
        self._snap_stop = NO_STOP
        self._hold()

    # ---------------------------------------------------------------- resuming from one
    def _restore_request(self, out: list[Any]) -> None:
        """After the first placement of a resumed job: ask for the owned partitions' values."""
        keys = [(self.program.datasets[did].name, i) for did, i in sorted(self.parts)]
        out.append(ReadSnapshot(keys, self._cause))

    def _on_snapshot_loaded(self, ev: SnapshotLoaded, out: list[Any]) -> None:
        names = {d.name: d.id for d in self.program.datasets}
        for (name, i), got in ev.values.items():
            if got is not None:
                p = self.parts[(names[name], i)]
                p.value, p.last_seq = got
        self._restoring = False
        self._hold()

