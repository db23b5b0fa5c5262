"""The controller as a pure state machine: ``handle(event) -> list[instruction]``.

It checks that every worker declared the same program, places partition groups (the versioned
partition map), relays nothing per task, collects reports for rank 0's callbacks and result,
and ends the job when every worker is done, or aborts it when one fails. While a job runs
smoothly it receives only reports (if the driver asked for them) and, at the end, ``Done``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from canary.controller.progress import ProgressMeter
from canary.controller.snapshots import ControllerSnapshots
from canary.errors import CanaryError, ProgramMismatchError, TaskError
from canary.messages import (
    Abort,
    Callback,
    Done,
    Fail,
    Failed,
    Finish,
    Hello,
    LoadReport,
    MigrateDone,
    MigrateOut,
    MigrateShipped,
    MoveRequest,
    Placement,
    Progress,
    ReportPart,
    Send,
    Shutdown,
    SnapshotCommitted,
    SnapshotPosition,
    SnapshotWritten,
    Tick,
    size_text,
    worker_rank,
)
from canary.partition_map import PartitionMap
from canary.program import Program, ReportEvent
from canary.sites import declared_at
from canary.snapshot import SnapshotConfig

#: A worker with a core of its own that waits for a CPU more than this share of the time ...
SHARED_CORE_WAIT = 0.25
#: ... in this many load reports in a row is named once (another process runs on its core).
SHARED_CORE_REPORTS = 3


class ControllerState(ControllerSnapshots):
    """Controller of ``n_workers`` workers running ``program``.

    Contract: instructions are :class:`Send`, :class:`Callback` (a report is complete),
    :class:`Progress` (a line for the user), :class:`Finish` (all workers done, no partition
    moving and every held callback given; exactly once) and :class:`Fail` (abort with a reason
    and the error to raise: :class:`TaskError` for a failed task,
    :class:`ProgramMismatchError` for a worker that declared another program; at most once,
    after which events are ignored).

    Moves: a :class:`MoveRequest`, or the ``policy`` on a :class:`Tick`, names partitions to
    move. For each, the controller bumps the entry's version, sends the map update to every
    worker and :class:`MigrateOut` to the source, and counts the partition as moving until the
    destination's :class:`MigrateDone`; a moving partition is not moved again before that.

    Callbacks run in program order for each reported dataset. A moved partition's parts of
    later reports come from its new worker and can reach rank 0 before its old worker's parts
    of earlier ones (MPI orders each sender's messages, not several senders'); so while a
    source has not said :class:`MigrateShipped` (which follows its report parts), completed
    reports wait, and are then called in program order.

    Snapshots (``checkpoint``; see :mod:`canary.controller.snapshots`): on a :class:`Tick` when
    one is due, and :class:`CommitSnapshot` once every worker has written its part (numbered
    from ``first_snapshot``). A job resumed from a snapshot starts with its reports
    (``resumed_results``) and its task count (``resumed["tasks_run"]``, the manifest's).

    Progress (``progress_s`` > 0; see :mod:`canary.controller.progress`): on a :class:`Tick`
    at ``progress_s / 2`` seconds into the job and then at least ``progress_s`` apart, a
    :class:`Progress` line saying how long the job has run, where the slowest worker stands
    (loop, line, iteration), and the task rate; it begins with ``progress_heading``. None
    with ``progress_s`` 0 (the default).
    """

    def __init__(self, program: Program, n_workers: int, policy: Any = None,
                 stall_s: float = 10.0, checkpoint: SnapshotConfig | None = None,
                 first_snapshot: int = 1, resumed: dict[str, Any] | None = None,
                 resumed_results: dict[str, list[np.ndarray]] | None = None,
                 progress_s: float = 0.0, progress_heading: str = "canary",
                 own_cores: Sequence[bool] | None = None) -> None:
        if n_workers < 1:
            raise ValueError(
                f"a job needs at least one worker (rank 0 is the controller): launch with "
                f"mpiexec -n 2 or more, got {n_workers} worker(s)"
            )
        self.program = program.finalize()
        self.n_workers = n_workers
        self.digest = program.digest
        self.hello: dict[int, Hello] = {}
        self.map: PartitionMap | None = None
        self.done: dict[int, Done] = {}
        self.reports: dict[int, dict[int, ReportPart]] = {}
        self.results: dict[str, list[np.ndarray]] = dict(resumed_results or {})
        # the stage instance of each result: reports of one dataset can complete out of
        # program order (see _on_report), and the result is the latest in program order
        self.result_seqs: dict[str, int] = {}
        self.finished = False
        self.failed: str | None = None
        self.received: dict[str, int] = {}
        self.sent: dict[str, int] = {}
        self._eid = 0
        self._cause = 0  # eid of the message being handled
        self.policy = policy  # decides moves on each Tick (see canary.controller.balance)
        self.in_flight: dict[int, tuple[int, int, int, int, str]] = {}  # move -> g, i, src, dst, why
        self.unshipped: set[int] = set()  # moves whose source has not said MigrateShipped
        self.held: list[tuple[int, Callback]] = []  # (stage instance, callback) waiting for them
        self.migrations = 0
        self.bytes_migrated = 0
        self._moves = 0
        # Progress as the workers' load reports show it: a worker whose reports stop, or show
        # it busy with no task finished, for stall_s seconds is named in a warning.
        self.stall_s = stall_s
        self._now = 0.0
        self._progress_at = [0.0] * n_workers  # when each last showed progress
        self._warned_at = [0.0] * n_workers
        # A worker with a core of its own (own_cores: canary.idle.has_own_core, from the ranks'
        # placements) that keeps waiting for its CPU shares it with a process the placement
        # does not count, and is said once: the job runs slower than its placement promises.
        self.own_cores = list(own_cores) if own_cores is not None else [False] * n_workers
        self._waiting_shares: list[list[float]] = [[] for _ in range(n_workers)]
        self._said_shared: set[int] = set()
        self._init_snapshots(checkpoint, first_snapshot, resumed)
        # a line on where the job stands every progress_s seconds (0: none), from the same
        # load reports (see canary.controller.progress)
        self.progress_meter = (ProgressMeter(self.program, n_workers, progress_s,
                                             self.tasks_base, progress_heading)
                               if progress_s > 0 else None)

    def handle(self, event: Any) -> list[Any]:
        """Apply one message from a worker; return instructions, each carrying the message's
        ``eid`` as its cause."""
        name = type(event).__name__
        if not isinstance(event, (Tick, MoveRequest, SnapshotCommitted)):  # from this rank
            self.received[name] = self.received.get(name, 0) + 1
        if self.failed is not None or self.finished:
            return []
        self._cause = event.eid
        if isinstance(event, Hello):
            return self._on_hello(event)
        if isinstance(event, ReportPart):
            return self._on_report(event)
        if isinstance(event, Done):
            self.done[event.worker] = event
            return self._finish_if_done()
        if isinstance(event, Failed):
            return self._fail(event.message, TaskError)
        if isinstance(event, MigrateDone):
            return self._on_migrate_done(event)
        if isinstance(event, MigrateShipped):
            self.unshipped.discard(event.move)
            if self.unshipped:
                return []
            held, self.held = sorted(self.held, key=lambda h: h[0]), []
            return [callback for _, callback in held] + self._finish_if_done()
        if isinstance(event, LoadReport):
            return self._on_load(event)
        if isinstance(event, Tick):
            self._now = event.now
            out = self._stalled()
            line = None if self.progress_meter is None else self.progress_meter.due(event.now)
            if line is not None:
                out.append(Progress(line, self._cause))
            if self.map is None:
                return out
            out += self._maybe_snapshot()
            if self.policy is None or len(self.done) == self.n_workers or self.snapshot:
                return out
            out += self._move(self.policy.decide(event.now, self))
            out += [Progress(f"canary: {line}", self._cause) for line in self.policy.notes]
            self.policy.notes.clear()
            return out
        if isinstance(event, MoveRequest):
            if self.map is None:
                raise ValueError("no partition can move before the job is placed")
            if self.snapshot is not None:  # the map stays as it is until the snapshot is taken
                return []
            return self._move([(g, i, d, event.reason) for g, i, d in event.moves])
        if isinstance(event, SnapshotPosition):
            return self._on_snapshot_position(event)
        if isinstance(event, SnapshotWritten):
            return self._on_snapshot_written(event)
        if isinstance(event, SnapshotCommitted):
            return self._on_snapshot_committed(event)
        raise TypeError(f"controller cannot handle {event!r}")

    @property
    def tasks_run(self) -> int:
        return self.tasks_base + sum(d.tasks_run for d in self.done.values())

    def validate_state(self) -> None:
        if self.map is not None:
            self.map.validate_state()
            assert len(self.map.owners) == len(self.program.groups)
            for g, i, _, dst, _ in self.in_flight.values():
                assert self.map.owner(g, i) == dst, f"move of ({g},{i}) disagrees with the map"
        assert len({(g, i) for g, i, *_ in self.in_flight.values()}) == len(self.in_flight)
        assert len(self.done) <= self.n_workers
        assert not self.finished or not self.in_flight
        assert self.snapshot is None or not self.in_flight, "a partition moved during a snapshot"
        assert self.unshipped <= set(range(1, self._moves + 1))
        assert not self.held or self.unshipped, "callbacks held with no move to wait for"
        assert not self.finished or not self.unshipped

    def moving(self, group: int, index: int) -> bool:
        """Whether partition ``index`` of ``group`` is under way (it may not move again yet)."""
        return any(g == group and i == index for g, i, *_ in self.in_flight.values())

    # ------------------------------------------------------------------------
    def _move(self, moves: list[tuple[int, int, int, str]]) -> list[Any]:
        """Start the moves that are possible now (skipping a partition already moving or
        already at its destination); raises ValueError for a group, index or worker that does
        not exist."""
        assert self.map is not None
        out: list[Any] = []
        started: list[tuple[int, int, int, int, int]] = []
        for g, i, dest, why in moves:
            if not (0 <= g < len(self.map.owners) and 0 <= i < len(self.map.owners[g])):
                raise ValueError(f"no partition {i} of group {g}")
            if not 0 <= dest < self.n_workers:
                raise ValueError(f"no worker {dest} (the job has {self.n_workers})")
            src = self.map.owner(g, i)
            if src == dest or self.moving(g, i):
                continue
            self._moves += 1
            self.map.move(g, i, dest)
            self.in_flight[self._moves] = (g, i, src, dest, why)
            self.unshipped.add(self._moves)
            started.append((self._moves, g, i, src, dest))
        if not started:
            return out
        update = self.map.copy()  # what the workers see: later moves must not change it
        out += self._broadcast(lambda: Placement(self._next_eid(), update))
        out += [self._send(worker_rank(src), MigrateOut(self._next_eid(), move, g, i, dest,
                                                        self.map.version(g, i)))
                for move, g, i, src, dest in started]
        return out

    def _on_load(self, ev: LoadReport) -> list[Any]:
        w = ev.worker
        # a worker that finished tasks, mostly waited for others, or is done is not stuck
        if ev.tasks or ev.done or ev.idle > 0.5 * ev.interval:
            self._progress_at[w] = self._now
        if self.policy is not None:
            self.policy.report(ev, self._now)
        if self.progress_meter is not None:
            self.progress_meter.report(ev)
        return self._shared_core(ev)

    def _shared_core(self, ev: LoadReport) -> list[Any]:
        """Once per worker: a line naming a worker that has a core of its own yet waited for
        a CPU more than ``SHARED_CORE_WAIT`` of the time in ``SHARED_CORE_REPORTS`` load
        reports in a row."""
        w = ev.worker
        if not self.own_cores[w] or w in self._said_shared:
            return []
        share = ev.cpu_wait / ev.interval if ev.interval > 0 else 0.0
        shares = self._waiting_shares[w]
        if share <= SHARED_CORE_WAIT:
            shares.clear()
            return []
        shares.append(share)
        if len(shares) < SHARED_CORE_REPORTS:
            return []
        self._said_shared.add(w)
        share = sum(shares) / len(shares)
        remedy = ("balancing moves work off it where that makes the job faster"
                  if self.policy is not None else "canary run --balance on would move work "
                  "off it where that makes the job faster")
        return [Progress(f"canary: worker {w} (rank {worker_rank(w)}) has a core of its own but "
                         f"waited for it {share:.0%} of the time in its last "
                         f"{SHARED_CORE_REPORTS} load reports: another process runs on its "
                         f"core, and the job runs slower than it would alone ({remedy})",
                         self._cause)]

    def _stalled(self) -> list[Any]:
        out: list[Any] = []
        if self.map is None:
            return out
        pending = self.snapshot
        if pending is not None:
            # a worker that has answered the snapshot waits for the others: no task is due from
            # it; one that has not is named, as any other (it was not: a stopped worker went
            # unnamed for as long as the snapshot waited for it)
            step = "written its part of" if pending.seq is not None else "answered"
            answered = pending.written if pending.seq is not None else pending.positions
            for w in answered:
                self._progress_at[w] = self._now
        for w in range(self.n_workers):
            since = self._progress_at[w] if pending is None else \
                max(self._progress_at[w], pending.started)
            quiet = self._now - since
            if (w not in self.done and quiet >= self.stall_s
                    and self._now - self._warned_at[w] >= self.stall_s):
                self._warned_at[w] = self._now
                # a kernel numba compiles on its first call looks like one stuck in a loop:
                # on a first run on a busy machine compiling takes tens of seconds
                # and a fused stretch reads no message while it runs (tasks finish inside it)
                what = (f"no task finished for {quiet:.0f} s (stopped, swapping, stuck in a "
                        "kernel, compiling one on a first run, or in a long fused stretch: "
                        "CANARY_MAX_FUSED=0 runs every task alone?)" if pending is None else
                        f"it has not {step} snapshot {pending.snap} for {quiet:.0f} s (stopped, "
                        "swapping, stuck in a kernel, in a long fused stretch, or writing to a "
                        "slow disk?)")
                out.append(Progress(f"canary: waiting for worker {w} (rank {worker_rank(w)}): "
                                    f"{what}", self._cause))
        return out

    def _on_migrate_done(self, ev: MigrateDone) -> list[Any]:
        g, i, src, dst, why = self.in_flight.pop(ev.move)
        self.migrations += 1
        self.bytes_migrated += ev.nbytes
        group = self.program.groups[g]
        # a dozen names (PageRank's edge blocks) hide the line's point: which worker, and why
        names = ", ".join(d.name for d in group) if len(group) <= 4 else \
            f"{', '.join(d.name for d in group[:3])} and the {len(group) - 3} other datasets " \
            "placed with them"
        # the time is the last tick's (a few per second): when, among the progress lines
        out: list[Any] = [Progress(f"canary: moved partition {i} of {names} from worker {src} to "
                                   f"worker {dst} ({size_text(ev.nbytes)}, {self._now:.1f} s "
                                   f"into the job): {why}", self._cause)]
        return out + self._finish_if_done()

    def _finish_if_done(self) -> list[Any]:
        # a source that had sent Done may still be shipping: its MigrateShipped comes later
        if len(self.done) < self.n_workers or self.in_flight or self.unshipped:
            return []
        self.finished = True
        return self._broadcast(lambda: Shutdown(self._next_eid())) + [Finish(self._cause)]

    # ------------------------------------------------------------------------
    def _on_hello(self, ev: Hello) -> list[Any]:
        if ev.digest != self.digest:
            return self._fail(_mismatch(self.program, ev), ProgramMismatchError)
        self.hello[ev.worker] = ev
        if len(self.hello) < self.n_workers:
            return []
        self.map = PartitionMap.initial([g[0].partitions for g in self.program.groups],
                                        self.n_workers)
        placed = self.map
        return self._broadcast(lambda: Placement(self._next_eid(), placed.copy()))

    def _on_report(self, ev: ReportPart) -> list[Any]:
        stage = self.program.stages[ev.stage]
        ds = stage.reads[0]
        parts = self.reports.setdefault(ev.seq, {})
        parts[ev.index] = ev
        if len(parts) < ds.partitions:
            return []
        del self.reports[ev.seq]
        values = [parts[i].array for i in range(ds.partitions)]
        if self.snapshot is not None:
            self._before_report(ds.name, ev.seq, values)
        # A partition that moved sends its parts of later reports from its new worker, which
        # may reach this rank before its old worker's parts of an earlier report (MPI orders
        # only one sender's messages): that earlier report, completing last, is not the latest
        if ev.seq > self.result_seqs.get(ds.name, -1):
            self.results[ds.name] = values
            self.result_seqs[ds.name] = ev.seq
        if stage.callback is None:
            return []
        rep = ReportEvent(stage.name, ds.name, ev.iteration, values,
                          max(p.tasks for p in parts.values()),
                          max(p.seconds for p in parts.values()))
        callback = Callback(stage.callback, rep, self._cause, stage.site)
        if self.unshipped:  # an earlier report's part may still be on its way
            self.held.append((ev.seq, callback))
            return []
        return [callback]

    def _fail(self, reason: str, error: type[CanaryError]) -> list[Any]:
        self.failed = reason
        return self._broadcast(lambda: Abort(self._next_eid(), reason)) + [
            Fail(reason, error, self._cause)]

    def _next_eid(self) -> int:
        self._eid += 1
        return self._eid

    def _broadcast(self, make: Callable[[], Any]) -> list[Any]:
        """Send every worker a message of its own, ``make()`` (each gets its own eid)."""
        return [self._send(worker_rank(w), make()) for w in range(self.n_workers)]

    def _send(self, dest: int, msg: Any) -> Send:
        name = type(msg).__name__
        self.sent[name] = self.sent.get(name, 0) + 1
        return Send(dest, msg, self._cause)


def _mismatch(program: Program, hello: Hello) -> str:
    """Why worker ``hello.worker``'s program is not ``program`` (rank 0's): the first statement
    that differs, with the driver line that declared it on each side where known."""
    mine, theirs = program.statements(), hello.statements
    rank = worker_rank(hello.worker)
    for k, (a, b) in enumerate(zip(mine, theirs)):
        if a != b:
            here = declared_at(program.statement_sites(), k)
            there = declared_at(hello.sites, k)
            return (
                f"rank {rank} declared a different program than rank 0 "
                f"(statement {k}: rank 0 has '{a}'{here}; rank {rank} has '{b}'{there}). "
                "The driver must declare the same statements on every rank: do not branch on "
                "the rank, time or unseeded randomness while declaring"
            )
    return (
        f"rank {rank} declared a different program than rank 0 "
        f"({len(theirs)} statements vs {len(mine)}). The driver must declare the same "
        "statements on every rank"
    )
