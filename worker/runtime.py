"""The worker's thin MPI shell: carry out the state machine's instructions, feed it events.

It sends what the state says to send, runs the one task the state hands out and feeds back its
``TaskDone``, feeds ``Resume`` after a ``Yield``, and polls MPI between tasks. Every decision
(which task runs next, when to stop emitting so that messages leave) is the state's.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from itertools import count
from typing import Any

from mpi4py import MPI

from canary.errors import JobAborted, TaskError
from canary.idle import (
    Backoff,
    CorePlacement,
    core_placement,
    cpu_times,
    freeze_startup_objects,
    has_own_core,
    tight_timer_slack,
)
from canary.memory import memory_pool, memory_room
from canary.messages import (
    CONTROLLER,
    Abort,
    Bye,
    MigrateData,
    MigrateDone,
    MigrateOffer,
    MigrateOut,
    ReadSnapshot,
    Resume,
    Send,
    Shutdown,
    SnapshotLoaded,
    SnapshotSaved,
    TaskDone,
    TaskFailed,
    Tick,
    WriteSnapshot,
    local_event_id,
)
from canary.mpi_transport import MpiTransport, Recycler
from canary.numba_load import load_array_functions
from canary.program import Program
from canary.snapshot import Manifest, load_part, save_part
from canary.trace import Tracer
from canary.worker.chain import CHAINS
from canary.worker.config import WorkerConfig
from canary.worker.execute import run_task
from canary.worker.state import WorkerState
from canary.worker.tasks import K_FUSED, K_SIGNAL, RunTask, Task


def run_worker(program: Program, comm: MPI.Comm, config: WorkerConfig | None = None,
               stats: dict[str, float] | None = None,
               tracer: Tracer | None = None, checkpoint_dir: str | None = None,
               resume_from: Manifest | None = None,
               placements: Sequence[CorePlacement] | None = None) -> WorkerState:
    """Run this rank as worker ``comm.rank - 1`` until the controller says Shutdown.

    ``config`` defaults to :meth:`WorkerConfig.from_env` (the ``CANARY_*`` variables). Raises
    :class:`TaskError` (after telling the controller) if a task fails, and :class:`JobAborted`
    if the controller aborts the job. If ``stats`` is given it receives ``t_first``/``cpu_first``
    (``time.perf_counter()`` and ``time.process_time()`` when the first task became runnable)
    and ``t_done``/``cpu_done`` (when the worker had sent Done): the busy window the scheduler
    benchmark measures. With a :class:`canary.trace.Tracer`, every task and message is recorded
    (the only cost when it is None is one test per task). Snapshot parts are written under
    ``checkpoint_dir``; with ``resume_from`` the worker starts at that snapshot's position and reads
    the partitions it is given from it (raising :class:`canary.snapshot.SnapshotError` if they
    cannot be read). ``placements`` (every worker's host and cores, in worker order; default:
    every worker placed as this one) tell whether this worker has a core to itself, and so
    polls hot for a while when it runs out of work (:func:`canary.idle.has_own_core`).
    """
    config = WorkerConfig.from_env() if config is None else config
    load_array_functions()
    freeze_startup_objects()  # the imports' objects: no full collection walks them again
    CHAINS.compile_after = config.compile_after
    rank = comm.Get_rank()
    state = WorkerState(program, rank - 1, comm.Get_size() - 1, config,
                        restore=None if resume_from is None else resume_from.position)
    recycler = Recycler(config.recycle_bytes)  # pages of received arrays, kept a while
    tx = MpiTransport(comm, recycler)
    # With a core per worker, poll hot for a while after each burst of work: the message a
    # worker waits for (a piece, a signal) usually comes within that, and is then seen at once
    # rather than up to one sleep later. Oversubscribed, spinning would steal the sender's CPU.
    tight_timer_slack()
    if placements is None:
        placements = [core_placement()] * state.n_workers
    own_core = has_own_core(state.worker, placements)
    if tracer is not None:
        tracer.placement(*placements[state.worker], own_core)
    backoff = config.idle_backoff(own_core)
    ids = count(1)
    handle = state.handle
    send = tx.send
    # A loop-only tracer records signal tasks and nothing else (see canary.trace): every other
    # task and message takes the untraced path.
    full = tracer is not None and not tracer.loop_only
    trace_recv = trace_fused = trace_task = None
    if tracer is not None:
        clock = tracer.clock
        trace_task = tracer.task
        trace_send = tracer.send if full else None
        # move -> when it began here, bytes recycled then, its group and partition index
        moves: dict[int, tuple[float, int, int, int]] = {}
        span = tracer.span

        def trace_recv(src: int, msg: Any) -> None:
            if full:
                tracer.recv(src, msg)
            kind = type(msg)
            if kind is MigrateOut or kind is MigrateOffer:
                moves[msg.move] = (clock(), recycler.recycled_bytes, msg.group, msg.index)

        def send(dest: int, msg: Any) -> None:
            if trace_send is not None:
                trace_send(dest, msg)
            kind = type(msg)
            if kind is MigrateData or kind is MigrateDone:
                out = kind is MigrateData
                began, recycled, group, index = moves.pop(
                    msg.move, (clock(), recycler.recycled_bytes, -1, -1))
                # the values follow the source's MigrateData: only the destination knows
                # their size when its span ends
                span("migrate out" if out else "migrate in", began, clock(),
                     {"move": msg.move, "group": group, "index": index} if out else
                     {"move": msg.move, "group": group, "index": index, "bytes": msg.nbytes,
                      "recycled": recycler.recycled_bytes - recycled})
            tx.send(dest, msg)

        if full:
            trace_fused = tracer.fused_task

    def carry(instrs: list[Any], task: Task | None, resume: bool) -> tuple[Task | None, bool]:
        """Carry out ``instrs``: send, keep the task handed out, note a yield. (The two loops
        below do the same inline: they are the hot path.)"""
        for ins in instrs:
            if type(ins) is Send:
                send(ins.dest, ins.message)
            elif type(ins) is RunTask:
                task = ins.task
            else:
                task, resume = other(ins, task, resume)
        return task, resume

    def other(ins: Any, task: Task | None, resume: bool) -> tuple[Task | None, bool]:
        """An instruction other than Send and RunTask: a yield, or a snapshot's I/O (whose
        event goes straight back to the state)."""
        if type(ins) is WriteSnapshot:
            assert checkpoint_dir is not None, "a snapshot without a checkpoint directory"
            entries, error = save_part(checkpoint_dir, ins.snap, state.worker, ins.arrays)
            ev: Any = SnapshotSaved(local_event_id(rank, next(ids)), ins.snap, entries, error)
        elif type(ins) is ReadSnapshot:
            assert resume_from is not None, "asked to read a snapshot the job does not resume"
            ev = SnapshotLoaded(local_event_id(rank, next(ids)), load_part(resume_from, ins.keys))
        else:  # Yield
            return task, True
        return carry(handle(ev), task, resume)

    cpu_then = cpu_times()
    tick_then = 0.0
    pool = memory_pool()

    def tick(now: float, idle: float) -> Tick:
        """The report tick, with the CPU time used and waited for since the last one, and the
        memory this worker's machine has left for it (about 0.1 ms to read, twice a second)."""
        nonlocal cpu_then, tick_then
        cpu_now = cpu_times()
        on_cpu, waited = cpu_now[0] - cpu_then[0], cpu_now[1] - cpu_then[1]
        cpu_then = cpu_now
        hot = backoff.note_cpu_wait(waited, now - tick_then)
        tick_then = now
        free, total = memory_room()
        return Tick(local_event_id(rank, next(ids)), now, idle, on_cpu, waited, hot, free, total,
                    pool)

    task: Task | None = None  # handed out by the state, not yet run
    resume = False  # the state yielded: feed it Resume once the sends before it are out
    for ins in state.start(reports=True):  # a load report every config.report_s
        send(ins.dest, ins.message)
    # MPI is polled between batches of tasks, not after every task (an Iprobe costs about as
    # much as scheduling a task): the batch adapts so that it lasts about poll_interval_s,
    # which bounds the extra latency of a message to that plus one task (a poll finds a message
    # that came during the batch: see MpiTransport._probe).
    batch = 1
    poll_interval = config.poll_interval_s
    max_batch = config.max_batch
    perf_counter = time.perf_counter
    slowdown = config.slowdown
    t0 = perf_counter()
    report_s = config.report_s
    next_report = t0 + report_s
    idle = 0.0  # seconds spent waiting with nothing to run since the last report
    idle_since: float | None = None  # when the current wait began (polls and sleeps included)
    while True:
        got = tx.poll()
        while got is not None:
            if idle_since is not None:
                idle += perf_counter() - idle_since
                idle_since = None
            msg = got[1]
            if trace_recv is not None:
                trace_recv(got[0], msg)
            if type(msg) is Shutdown:
                if stats is not None:  # Done may have gone out just before this poll
                    _note_done(stats, state)
                send(CONTROLLER, Bye(local_event_id(rank, next(ids)), state.worker))
                tx.flush()
                return state
            if type(msg) is Abort:
                raise JobAborted(msg.reason)
            for ins in handle(msg):
                if type(ins) is Send:
                    send(ins.dest, ins.message)
                elif type(ins) is RunTask:
                    task = ins.task
                else:
                    task, resume = other(ins, task, resume)
            if stats is not None and task is not None and "t_first" not in stats:
                stats["t_first"] = time.perf_counter()
                stats["cpu_first"] = time.process_time()
            got = tx.poll()
        if task is not None or resume:
            backoff.reset()
            t_batch = perf_counter()
            if idle_since is not None:
                idle += t_batch - idle_since
                idle_since = None
            n = 0
            while n < batch and (task is not None or resume):
                if task is not None:
                    n += 1
                    cur, task = task, None
                    eid = local_event_id(rank, next(ids))
                    if cur.kind is K_FUSED:
                        ev: Any = run_task(state, cur, eid, trace_fused)
                    elif trace_task is None or (not full and cur.kind is not K_SIGNAL):
                        ev = run_task(state, cur, eid)
                    else:
                        t_start = clock()
                        ev = run_task(state, cur, eid)
                        trace_task(cur, t_start, clock(), type(ev) is TaskDone)
                    if slowdown > 1.0 and type(ev) is TaskDone and ev.seconds is not None:
                        _spin(ev.seconds * (slowdown - 1.0))  # a slower machine, for experiments
                        ev.seconds *= slowdown
                else:
                    ev = Resume(local_event_id(rank, next(ids)))
                resume = False
                for ins in handle(ev):
                    if type(ins) is Send:
                        send(ins.dest, ins.message)
                    elif type(ins) is RunTask:
                        task = ins.task
                    else:
                        task, resume = other(ins, task, resume)
                if type(ev) is TaskFailed:
                    _wait_for_abort(tx, ev.message)
            now = perf_counter()
            if n == batch:
                dt = now - t_batch
                if dt < poll_interval * 0.5 and batch < max_batch:
                    batch *= 2
                elif dt > poll_interval and batch > 1:
                    batch //= 2
            if now >= next_report:
                next_report = now + report_s
                task, resume = carry(handle(tick(now - t0, idle)), task, resume)
                idle = 0.0
            continue
        if stats is not None:
            _note_done(stats, state)
        now = perf_counter()
        if idle_since is None:
            idle_since = now
        if now >= next_report:
            next_report = now + report_s
            task, resume = carry(handle(tick(now - t0, idle + now - idle_since)), task, resume)
            idle = 0.0
            idle_since = now
            if task is not None or resume:
                continue
        tx.progress()
        backoff.sleep()


def _note_done(stats: dict[str, float], state: WorkerState) -> None:
    """Record ``t_done``/``cpu_done`` the first time this is called after the worker sent Done."""
    if state.done_sent and "t_done" not in stats:
        stats["t_done"] = time.perf_counter()
        stats["cpu_done"] = time.process_time()


def _spin(seconds: float) -> None:
    """Busy-wait ``seconds`` (not sleep: a slower machine's CPU is busy all the while)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _wait_for_abort(tx: MpiTransport, message: str, timeout: float = 10.0) -> None:
    """After reporting a failure, let the controller abort the job (it prints one message);
    if it does not within ``timeout`` seconds, fail here."""
    end = time.monotonic() + timeout
    backoff = Backoff(max_sleep=1e-2)
    while time.monotonic() < end:
        got = tx.poll()
        if got is not None and isinstance(got[1], Abort):
            raise JobAborted(got[1].reason)
        tx.progress()
        backoff.sleep()
    raise TaskError(message)
