"""The controller's thin MPI shell: feed worker messages to ControllerState, act on its output."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from itertools import count
from typing import Any

from mpi4py import MPI

from canary.controller.state import ControllerState
from canary.errors import JobAborted
from canary.idle import Backoff, freeze_startup_objects
from canary.messages import (
    CONTROLLER,
    Bye,
    Callback,
    CommitSnapshot,
    Fail,
    Failed,
    Finish,
    LoadReport,
    Progress,
    ReportPart,
    Send,
    SnapshotCommitted,
    Tick,
    local_event_id,
    run_callback,
)
from canary.mpi_transport import MpiTransport
from canary.program import Program
from canary.result import JobResult
from canary.snapshot import Manifest, SnapshotConfig, commit, load_results, next_id
from canary.trace import Tracer


def run_controller(program: Program, comm: MPI.Comm, max_sleep: float = 1e-2,
                   tracer: Tracer | None = None, policy: Any = None,
                   tick_s: float = 0.1, stall_s: float = 10.0, close_s: float = 10.0,
                   checkpoint: SnapshotConfig | None = None,
                   resume_from: Manifest | None = None, progress_s: float = 0.0,
                   own_cores: Sequence[bool] | None = None) -> JobResult:
    """Run rank 0 until every worker is done; return the job's result.

    Raises :class:`JobAborted` with the reason (a failed task's message, or a program mismatch)
    after telling every worker to abort. CPU time spent in report callbacks (user code) is
    excluded from ``controller_cpu_seconds``. A ``tracer`` records every message. The state
    gets a ``Tick`` every ``tick_s`` seconds (its move ``policy``, from
    :mod:`canary.controller.balance`, acts then, and it notices a worker that makes no
    progress); each partition moved and each such worker is said on stderr. It returns once
    every worker has answered the Shutdown (see :func:`await_byes`), or after ``close_s``.
    With ``progress_s`` > 0 it says where the job stands every ``progress_s`` seconds, the
    first after half that (:mod:`canary.controller.progress`).

    With ``checkpoint`` it takes snapshots (committing each: see :func:`canary.snapshot.commit`);
    with ``resume_from`` the job starts from that snapshot (its reports and task count).
    ``own_cores`` says which workers have a core of their own (:func:`canary.idle.has_own_core`):
    one of those that keeps waiting for its CPU is named once on stderr.
    """
    freeze_startup_objects()  # the imports' objects: no full collection walks them again
    state = ControllerState(
        program, comm.Get_size() - 1, policy, stall_s, checkpoint=checkpoint,
        first_snapshot=next_id(checkpoint.directory) if checkpoint is not None else 1,
        resumed=None if resume_from is None else resume_from.data,
        resumed_results=None if resume_from is None else load_results(resume_from),
        progress_s=progress_s, own_cores=own_cores)
    tx = MpiTransport(comm)
    backoff = Backoff(max_sleep=max_sleep)
    t0 = time.perf_counter()
    c0 = time.process_time()
    user_cpu = 0.0
    ticks = count(1)
    said = False  # the reason the job failed is on stderr
    next_tick = t0 + tick_s
    while True:
        got = tx.poll()
        if got is None and time.perf_counter() >= next_tick:
            now = time.perf_counter()
            next_tick = now + tick_s
            got = (CONTROLLER, Tick(local_event_id(CONTROLLER, next(ticks)), now - t0))
        if got is None:
            tx.progress()
            backoff.sleep()
            continue
        msg = got[1]
        kind = type(msg)
        if tracer is not None and kind is not Tick:
            tracer.recv(got[0], msg)
            if kind is LoadReport:
                tracer.load_report(msg)
        if kind is ReportPart:
            msg.seconds = time.perf_counter() - t0
        # Reports, load reports and its own ticks are not latency-critical: the controller
        # stays asleep-ish through them, so a chatty driver and the periodic load reports keep
        # it near idle.
        if kind is not ReportPart and kind is not LoadReport and kind is not Tick:
            backoff.reset()
        instrs = state.handle(msg)
        # Say why before the workers hear of it: told to abort, a worker ends the job itself if
        # this rank's MPI_Abort does not (hydra once in tens of jobs loses it), and the reason
        # must be on stderr by then.
        if state.failed is not None and not said:
            said = _say_why(state.failed)
        while instrs:
            ins = instrs.pop(0)
            if isinstance(ins, Send):
                if tracer is not None:
                    tracer.send(ins.dest, ins.message)
                tx.send(ins.dest, ins.message)
            elif isinstance(ins, Callback):
                u0 = time.process_time()
                failed = run_callback(ins)
                user_cpu += time.process_time() - u0
                if failed is not None:  # before anything else: the job must not finish
                    instrs[:0] = state.handle(Failed(local_event_id(CONTROLLER, next(ticks)),
                                                     -1, failed))
            elif isinstance(ins, Progress):
                print(ins.line, file=sys.stderr, flush=True)
            elif isinstance(ins, CommitSnapshot):
                assert checkpoint is not None
                error = commit(checkpoint.directory, checkpoint.keep, ins.snap,
                               ins.manifest, ins.results)
                instrs += state.handle(SnapshotCommitted(
                    local_event_id(CONTROLLER, next(ticks)), ins.snap, error))
            elif isinstance(ins, Finish):
                result = JobResult(state.results, state.tasks_run, state.n_workers,
                                   time.perf_counter() - t0, dict(state.received), dict(state.sent),
                                   time.process_time() - c0 - user_cpu,
                                   _sum_counts([d.messages_sent for d in state.done.values()]),
                                   state.migrations, state.bytes_migrated,
                                   state.snapshots_committed,
                                   None if resume_from is None else resume_from.id,
                                   reports=state.program.reported)
                await_byes(tx, state.n_workers, close_s, tracer)
                tx.flush()
                return result
            elif isinstance(ins, Fail):
                if not said:
                    said = _say_why(ins.reason)
                tx.flush(timeout=2.0)
                # this rank aborts the job either way; a mismatch keeps its own class
                raise (ins.error if issubclass(ins.error, JobAborted) else JobAborted)(ins.reason)


def _say_why(reason: str) -> bool:
    """Print why the job failed on stderr; returns True (it has been said)."""
    print(f"canary: job aborted: {reason}", file=sys.stderr, flush=True)
    return True


def await_byes(tx: MpiTransport, n_workers: int, timeout: float,
               tracer: Tracer | None = None) -> None:
    """After the Shutdowns: receive, and drop, what the workers still send (a load report sent
    before the Shutdown reached them) until each has said :class:`Bye`, or ``timeout`` seconds
    have passed (the results are complete either way; a worker that cannot answer is mpiexec's
    to end). Returns normally in both cases."""
    left = set(range(n_workers))
    end = time.monotonic() + timeout
    backoff = Backoff(max_sleep=1e-3)
    while left and time.monotonic() < end:
        got = tx.poll()
        if got is None:
            tx.progress()
            backoff.sleep()
            continue
        backoff.reset()
        if tracer is not None:
            tracer.recv(got[0], got[1])
        if type(got[1]) is Bye:
            left.discard(got[1].worker)


def _sum_counts(counts: list[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in counts:
        for k, v in c.items():
            out[k] = out.get(k, 0) + v
    return out
