"""The controller as a pure state machine: ``handle(event) -> list[instruction]``.

It checks that every worker declared the same program, places partition groups (the versioned
partition map), relays nothing per task, collects reports for rank 0's callbacks and result,
and ends the job when every worker is done, or aborts it when one fails. While a job runs
smoothly it receives only reports (if the driver asked for them) and, at the end, ``Done``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from canary.errors import CanaryError, ProgramMismatchError, TaskError
from canary.messages import (
    Abort,
    Callback,
    Done,
    Fail,
    Failed,
    Finish,
    Hello,
    Placement,
    ReportPart,
    Send,
    Shutdown,
    worker_rank,
)
from canary.partition_map import PartitionMap
from canary.program import Program, ReportEvent


class ControllerState:
    """Controller of ``n_workers`` workers running ``program``.

    Contract: instructions are :class:`Send`, :class:`Callback` (a report is complete),
    :class:`Finish` (all workers done; exactly once) and :class:`Fail` (abort with a reason and
    the error to raise: :class:`TaskError` for a failed task, :class:`ProgramMismatchError` for
    a worker that declared another program; at most once, after which events are ignored).
    """

    def __init__(self, program: Program, n_workers: int) -> None:
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
        self.results: dict[str, list[np.ndarray]] = {}
        self.finished = False
        self.failed: str | None = None
        self.received: dict[str, int] = {}
        self.sent: dict[str, int] = {}
        self._eid = 0
        self._cause = 0  # eid of the message being handled

    def handle(self, event: Any) -> list[Any]:
        """Apply one message from a worker; return instructions, each carrying the message's
        ``eid`` as its cause."""
        name = type(event).__name__
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
            if len(self.done) == self.n_workers:
                self.finished = True
                return [self._send(worker_rank(w), Shutdown(self._next_eid()))
                        for w in range(self.n_workers)] + [Finish(self._cause)]
            return []
        if isinstance(event, Failed):
            return self._fail(event.message, TaskError)
        raise TypeError(f"controller cannot handle {event!r}")

    @property
    def tasks_run(self) -> int:
        return sum(d.tasks_run for d in self.done.values())

    def validate_state(self) -> None:
        if self.map is not None:
            self.map.validate_state()
            assert len(self.map.owners) == len(self.program.groups)
        assert len(self.done) <= self.n_workers

    # ------------------------------------------------------------------------
    def _on_hello(self, ev: Hello) -> list[Any]:
        if ev.digest != self.digest:
            return self._fail(_mismatch(self.program.statements(), ev.statements, ev.worker),
                              ProgramMismatchError)
        self.hello[ev.worker] = ev
        if len(self.hello) < self.n_workers:
            return []
        self.map = PartitionMap.initial([g[0].partitions for g in self.program.groups],
                                        self.n_workers)
        return [self._send(worker_rank(w), Placement(self._next_eid(), self.map))
                for w in range(self.n_workers)]

    def _on_report(self, ev: ReportPart) -> list[Any]:
        stage = self.program.stages[ev.stage]
        ds = stage.reads[0]
        parts = self.reports.setdefault(ev.seq, {})
        parts[ev.index] = ev
        if len(parts) < ds.partitions:
            return []
        del self.reports[ev.seq]
        values = [parts[i].array for i in range(ds.partitions)]
        self.results[ds.name] = values
        if stage.callback is None:
            return []
        rep = ReportEvent(stage.name, ds.name, ev.iteration, values,
                          max(p.tasks for p in parts.values()),
                          max(p.seconds for p in parts.values()))
        return [Callback(stage.callback, rep, self._cause)]

    def _fail(self, reason: str, error: type[CanaryError]) -> list[Any]:
        self.failed = reason
        return [self._send(worker_rank(w), Abort(self._next_eid(), reason))
                for w in range(self.n_workers)] + [Fail(reason, error, self._cause)]

    def _next_eid(self) -> int:
        self._eid += 1
        return self._eid

    def _send(self, dest: int, msg: Any) -> Send:
        name = type(msg).__name__
        self.sent[name] = self.sent.get(name, 0) + 1
        return Send(dest, msg, self._cause)


def _mismatch(mine: list[str], theirs: list[str], worker: int) -> str:
    for k, (a, b) in enumerate(zip(mine, theirs)):
        if a != b:
            return (
                f"rank {worker_rank(worker)} declared a different program than rank 0 "
                f"(statement {k}: rank 0 has '{a}', rank {worker_rank(worker)} has '{b}'). "
                "The driver must declare the same statements on every rank: do not branch on "
                "the rank, time or unseeded randomness while declaring"
            )
    return (
        f"rank {worker_rank(worker)} declared a different program than rank 0 "
        f"({len(theirs)} statements vs {len(mine)}). The driver must declare the same "
        "statements on every rank"
    )
