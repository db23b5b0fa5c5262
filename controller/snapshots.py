"""Snapshots, the controller's side: when to take one, which stage instance is the barrier, and
when it is committed (the workers' side and the protocol: :mod:`canary.worker.snapshots`).

Every ``every_s`` seconds of run time (the first once that much has passed), when no partition
is moving, the controller asks every worker where it stands (:class:`SnapshotAsk`; each stops
emitting there), names the furthest position as the barrier (:class:`SnapshotAt`), and once
every worker has written its part (:class:`SnapshotWritten`) hands the manifest to its runtime
to commit (:class:`CommitSnapshot`). No move starts while a snapshot is under way. A worker that
fails to write (a full disk) abandons the snapshot, not the job: the previous one stays the
latest, and a warning says so. A snapshot asked for when some worker has already reached the end
of the program is abandoned (there is nothing left to save).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from canary.messages import (
    CommitSnapshot,
    Progress,
    Send,
    SnapshotAsk,
    SnapshotAt,
    SnapshotCommitted,
    SnapshotPosition,
    SnapshotWritten,
    size_text,
    worker_rank,
)
from canary.program import Program
from canary.snapshot import CHECKSUM, FORMAT, SnapshotConfig

_POSITION_KEYS = ("seq", "pc", "counters", "program_tasks")


class PendingSnapshot:
    """A snapshot under way: the positions workers gave, its barrier, the parts written."""

    def __init__(self, snap: int, started: float) -> None:
        self.snap = snap
        self.started = started
        self.positions: dict[int, SnapshotPosition] = {}
        self.seq: int | None = None  # the barrier, once every position is in
        self.written: dict[int, SnapshotWritten] = {}
        # report values replaced by reports at or past the barrier before the commit: the
        # snapshot keeps the values as they stood at the barrier (with their stage instance)
        self.before: dict[str, tuple[int, list[np.ndarray] | None]] = {}


class ControllerSnapshots:
    """Taking snapshots (mixed into ``ControllerState``)."""

    program: Program
    n_workers: int
    results: dict[str, list[np.ndarray]]
    result_seqs: dict[str, int]
    in_flight: dict[int, Any]
    done: dict[int, Any]
    received: dict[str, int]
    _now: float
    _cause: int

    def _init_snapshots(self, config: SnapshotConfig | None, first_id: int,
                        resumed: dict[str, Any] | None) -> None:
        self.checkpoint = config
        self.snapshot: PendingSnapshot | None = None
        self._next_snap = first_id
        self._last_snap_at = 0.0
        self.snapshots_committed = 0
        # a snapshot holds every worker still for a moment: the move policy reads this to leave
        # those moments out of its before-and-after comparison of the job's pace
        self.snapshots_started = 0
        self.tasks_base = 0 if resumed is None else int(resumed["tasks_run"])
        self._committing: dict[int, tuple[str, int]] = {}  # snap -> (position, bytes)

    def _send(self, dest: int, msg: Any) -> Send:  # ControllerState
        raise NotImplementedError

    def _next_eid(self) -> int:  # ControllerState
        raise NotImplementedError

    def _broadcast(self, make: Any) -> list[Any]:  # ControllerState
        raise NotImplementedError

    def _maybe_snapshot(self) -> list[Any]:
        """On a tick: start a snapshot if one is due and nothing stands in its way."""
        cfg = self.checkpoint
        if (cfg is None or self.snapshot is not None or self.in_flight or self.done
                or self._now - self._last_snap_at < cfg.every_s):
            return []
        snap = self._next_snap
        self._next_snap += 1
        self._last_snap_at = self._now
        self.snapshots_started += 1
        self.snapshot = PendingSnapshot(snap, self._now)
        return self._broadcast(lambda: SnapshotAsk(self._next_eid(), snap))

    def _abandon(self, why: str | None) -> list[Any]:
        pending = self.snapshot
        assert pending is not None
        self.snapshot = None
        out: list[Any] = self._broadcast(lambda: SnapshotAt(self._next_eid(), pending.snap, None))
        if why is not None:
            out.append(Progress(f"canary: warning: snapshot {pending.snap} failed ({why}); the "
                                "previous snapshot stays the latest and the job goes on",
                                self._cause))
        return out

    def _on_snapshot_position(self, ev: SnapshotPosition) -> list[Any]:
        pending = self.snapshot
        if pending is None or ev.snap != pending.snap:
            return []
        pending.positions[ev.worker] = ev
        if len(pending.positions) < self.n_workers:
            return []
        if any(p.ended for p in pending.positions.values()):
            return self._abandon(None)  # the program is over: nothing left to save
        seq = max(p.seq for p in pending.positions.values())
        pending.seq = seq
        return self._broadcast(lambda: SnapshotAt(self._next_eid(), pending.snap, seq))

    def _before_report(self, name: str, seq: int, values: list[np.ndarray]) -> None:
        """A report instance ``seq`` of dataset ``name`` completes with ``values``: keep the
        value it replaces if it is past the barrier of the snapshot under way, and a report
        before the barrier that completes after one past it (a moved partition's parts come
        from two workers) is the value at the barrier if it is the latest such."""
        pending = self.snapshot
        if pending is None or pending.seq is None:
            return
        if seq >= pending.seq:
            if name not in pending.before:
                pending.before[name] = (self.result_seqs.get(name, -1), self.results.get(name))
        elif name in pending.before and seq > pending.before[name][0]:
            pending.before[name] = (seq, values)

    def _on_snapshot_written(self, ev: SnapshotWritten) -> list[Any]:
        pending = self.snapshot
        if pending is None or ev.snap != pending.snap:
            return []
        if ev.error is not None:
            return self._abandon(f"worker {ev.worker} (rank {worker_rank(ev.worker)}) could not "
                                 f"write its part: {ev.error}")
        pending.written[ev.worker] = ev
        if len(pending.written) < self.n_workers:
            return []
        first = pending.written[0].position
        for w, part in pending.written.items():
            if any(part.position[k] != first[k] for k in _POSITION_KEYS):
                return self._abandon(f"workers 0 and {w} stand at different positions "
                                     f"({first} and {part.position}): an engine bug")
        reports = sum(p.reports_sent for p in pending.written.values())
        assert self.received.get("ReportPart", 0) >= reports, "a report before the barrier is missing"
        self.snapshot = None
        results = dict(self.results)
        for name, (_, values) in pending.before.items():
            if values is None:
                results.pop(name, None)
            else:
                results[name] = values
        cfg = self.checkpoint
        assert cfg is not None
        entries = [e for w in sorted(pending.written) for e in pending.written[w].entries]
        manifest: dict[str, Any] = {
            "format": FORMAT, "checksum": CHECKSUM, "id": pending.snap, "program": self.program.name,
            "digest": self.program.digest, "statements": self.program.statements(),
            "sources": self.program.sources(),
            "script": cfg.script, "args": list(cfg.args), "workers": self.n_workers,
            "position": first, "run_seconds": round(self._now, 3),
            "tasks_run": self.tasks_base + sum(p.tasks_run for p in pending.written.values()),
            "bytes": sum(int(e["nbytes"]) for e in entries), "arrays": entries,
        }
        rows = [(name, k, v) for name, vals in sorted(results.items()) for k, v in enumerate(vals)]
        self._committing[pending.snap] = (str(first["where"]), int(manifest["bytes"]))
        return [CommitSnapshot(pending.snap, manifest, rows, self._cause)]

    def _on_snapshot_committed(self, ev: SnapshotCommitted) -> list[Any]:
        where, nbytes = self._committing.pop(ev.snap, ("?", 0))
        if ev.error is not None:
            return [Progress(f"canary: warning: snapshot {ev.snap} could not be committed "
                             f"({ev.error}); the previous snapshot stays the latest and the job "
                             "goes on", self._cause)]
        self.snapshots_committed += 1
        return [Progress(f"canary: snapshot {ev.snap} committed ({where}, "
                         f"{size_text(nbytes)})", self._cause)]
