"""The worker's thin MPI shell: turn instructions into MPI sends and kernel calls."""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from canary.worker.execute import run_task
from canary.worker.state import K_COMPUTE, K_FUSED, K_SIGNAL, RunTask, Task, WorkerState, is_urgent
from mpi4py import MPI

from canary.env import env_number
from canary.errors import JobAborted, TaskError
from canary.idle import Backoff, tight_timer_slack, workers_fit_cores
from canary.messages import Abort, Send, Shutdown, TaskDone, TaskFailed
from canary.mpi_transport import MpiTransport
from canary.program import Program
from canary.trace import Tracer

POLL_INTERVAL = 5e-5  # seconds of tasks between two MPI polls while tasks are queued
MAX_BATCH = 64
# Hot polling after work, where every worker has a core (CANARY_SPIN_US). 50 ms covers the
# waits inside an iteration (a worker waiting for the others' pieces, or for the next
# iteration's signal): a worker that slept there was woken 0.7-4 ms late on this VM (LR 4M trace),
# and 50 instead of 1 ms made LR 4M 50.7 -> 46.0 ms and 400K 6.5 -> 6.0 ms an iteration.
SPIN_S = 5e-2


def run_worker(program: Program, comm: MPI.Comm, window: int = 64,
               max_sleep: float = 2.5e-4, stats: dict[str, float] | None = None,
               tracer: Tracer | None = None) -> WorkerState:
    """Run this rank as worker ``comm.rank - 1`` until the controller says Shutdown.

    Raises :class:`TaskError` (after telling the controller) if a task fails, and
    :class:`JobAborted` if the controller aborts the job. If ``stats`` is given it receives
    ``t_first``/``cpu_first`` (``time.perf_counter()`` and ``time.process_time()`` when the
    first task became runnable) and ``t_done``/``cpu_done`` (when the worker had sent Done):
    the busy window the scheduler benchmark measures. They are taken outside the per-task path.
    With a :class:`canary.trace.Tracer`, every task and message is recorded (the only cost
    when it is None is one test per task).
    """
    # CANARY_MAX_FUSED=0 turns fused compute stretches off (every task scheduled alone).
    state = WorkerState(program, comm.Get_rank() - 1, comm.Get_size() - 1, window,
                        int(env_number("CANARY_MAX_FUSED", 1024, integer=True)))
    tx = MpiTransport(comm)
    runq: deque[Task] = deque()
    urgent: deque[Task] = deque()  # runnable tasks that is_urgent: they run first
    # With a core per worker, poll hot for SPIN_S after each burst of work: the message a worker
    # waits for (a piece, a signal) usually comes within that, and is then seen at once rather
    # than up to one sleep later. Oversubscribed, spinning would steal the sender's CPU.
    spin_s = env_number("CANARY_SPIN_US", SPIN_S * 1e6) * 1e-6
    tight_timer_slack()
    backoff = Backoff(max_sleep=max_sleep, spins=200,
                      spin_s=spin_s if workers_fit_cores(comm.Get_size()) else 0.0)

    push = runq.append
    popleft = runq.popleft
    push_urgent = urgent.append
    pop_urgent = urgent.popleft
    handle = state.handle
    send = tx.send
    # A loop-only tracer records signal tasks and nothing else (see canary.trace): every other
    # task and message takes the untraced path.
    full = tracer is not None and not tracer.loop_only
    trace_recv = trace_fused = trace_task = None
    if tracer is not None:
        clock = tracer.clock
        trace_task = tracer.task
        if full:
            trace_recv, trace_fused = tracer.recv, tracer.fused_task
            trace_send = tracer.send

            def send(dest: int, msg: Any) -> None:
                trace_send(dest, msg)
                tx.send(dest, msg)

    # Messages leave as soon as the state machine decides them, not after it has emitted the
    # tasks that follow (a loop's next iteration): the other workers wait on them.
    state.send_now = lambda ins: send(ins.dest, ins.message)
    # Likewise a scatter emitted at the top of a loop body (a broadcast) runs before the rest
    # of the body is emitted: the interpreter pauses for it, and is resumed once it has run.
    state.pause_for_sends = True

    def apply(instrs: list[Any]) -> None:
        for ins in instrs:
            if type(ins) is RunTask:
                (push_urgent if is_urgent(ins.task) else push)(ins.task)
            else:
                assert isinstance(ins, Send)
                send(ins.dest, ins.message)

    # MPI is polled between batches of tasks, not after every task (an Iprobe costs ~0.5 µs,
    # as much as scheduling a task): the batch adapts so that a batch lasts about
    # POLL_INTERVAL seconds, which bounds the extra latency of a message to that plus one task.
    batch = 1
    perf_counter = time.perf_counter
    apply(state.start())
    while True:
        got = tx.poll()
        while got is not None:
            msg = got[1]
            if trace_recv is not None:
                trace_recv(got[0], msg)
            if isinstance(msg, Shutdown):
                tx.flush()
                return state
            if isinstance(msg, Abort):
                raise JobAborted(msg.reason)
            apply(state.handle(msg))
            if stats is not None and (runq or urgent) and "t_first" not in stats:
                stats["t_first"] = time.perf_counter()
                stats["cpu_first"] = time.process_time()
            got = tx.poll()
        if state.paused and not urgent:
            apply(state.resume())
        if runq or urgent:
            backoff.reset()
            t0 = perf_counter()
            n = 0
            while n < batch and (urgent or runq):
                n += 1
                task = pop_urgent() if urgent else popleft()
                if task.kind is K_FUSED:
                    t_start = perf_counter()
                    ev = run_task(state, task, trace_fused)
                    state.stretch_timed(task, perf_counter() - t_start)
                elif trace_task is None or (not full and task.kind is not K_SIGNAL):
                    ev = run_task(state, task)
                else:
                    t_start = clock()
                    ev = run_task(state, task)
                    trace_task(task, t_start, clock(), type(ev) is TaskDone)
                for ins in handle(ev):
                    if type(ins) is RunTask:
                        t = ins.task
                        if t.kind is not K_COMPUTE and is_urgent(t):
                            push_urgent(t)
                        else:
                            push(t)
                    else:
                        send(ins.dest, ins.message)
                if type(ev) is TaskFailed:
                    _wait_for_abort(tx, ev.message)
                if state.paused and not urgent:
                    apply(state.resume())
            if n == batch:
                dt = perf_counter() - t0
                if dt < POLL_INTERVAL * 0.5 and batch < MAX_BATCH:
                    batch *= 2
                elif dt > POLL_INTERVAL and batch > 1:
                    batch //= 2
            continue
        if stats is not None and state.done_sent and "t_done" not in stats:
            stats["t_done"] = time.perf_counter()
            stats["cpu_done"] = time.process_time()
        tx.progress()
        backoff.sleep()


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
