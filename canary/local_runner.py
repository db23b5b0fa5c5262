"""Run a whole job in one process: controller and workers on an in-memory transport.

The transport is a seeded discrete-event simulation in virtual time: every message gets a
random delay and every task a random duration, and the only ordering kept is the one MPI
guarantees (messages from one sender to one receiver arrive in the order sent). Messages of
different senders therefore interleave in a seed-dependent order, and ready tasks on a worker
are picked in a seed-dependent order. The same job must give the same answer under every seed.
"""

from __future__ import annotations

import heapq
import random
import time
from functools import partial
from typing import Any

import numpy as np

from canary.controller.state import ControllerState
from canary.errors import JobAborted, TaskError
from canary.messages import (
    CONTROLLER,
    Callback,
    Fail,
    Finish,
    Piece,
    PieceBatch,
    ReportPart,
    Send,
    Shutdown,
)
from canary.program import Program
from canary.result import JobResult
from canary.worker.execute import run_task
from canary.worker.state import RunTask, WorkerState


def validate_cluster(ctrl: ControllerState, states: list[WorkerState]) -> None:
    """Cross-role invariant: every partition of every dataset is held by exactly one worker,
    the owner that the controller's map names, at the controller's entry version.

    Raises AssertionError naming the partition. Checked only once placement has reached every
    worker (before that, workers hold nothing).
    """
    if ctrl.map is None or any(s.map is None for s in states):
        return
    program = ctrl.program
    held: dict[tuple[int, int], int] = {}
    for s in states:
        for key in s.parts:
            assert key not in held, f"partition {key} held by workers {held[key]} and {s.worker}"
            held[key] = s.worker
    for d in program.datasets:
        g = program.group_of(d)
        for i in range(d.partitions):
            owner = ctrl.map.owner(g, i)
            assert held.get((d.id, i)) == owner, (
                f"partition {i} of '{d.name}' is held by {held.get((d.id, i))}, map says {owner}")
            w = states[owner]
            assert w.map is not None and w.map.version(g, i) == ctrl.map.version(g, i), (
                f"worker {owner} holds partition {i} of '{d.name}' at another map version")


def run_local(
    program: Program,
    workers: int = 2,
    seed: int = 0,
    window: int = 64,
    mean_delay: float = 1.0,
    mean_task: float = 1.0,
    validate: bool = False,
    max_events: int = 50_000_000,
    max_fused: int = 1024,
) -> JobResult:
    """Run ``program`` on ``workers`` simulated workers; return the job's result.

    Raises :class:`TaskError` with the failing task's message if user code fails, and
    RuntimeError if the job deadlocks (no event left before every worker is done), which
    would be an engine bug. ``validate=True`` checks every state's invariants after each event.
    ``max_fused`` bounds the tasks a fused compute stretch stands for (below 2: no fusion).
    """
    program.finalize()
    rng = random.Random(seed)
    ctrl = ControllerState(program, workers)
    states = [WorkerState(program, w, workers, window, max_fused) for w in range(workers)]
    heap: list[tuple[float, int, int, Any]] = []
    last_arrival: dict[tuple[int, int], float] = {}
    ready: list[list[RunTask]] = [[] for _ in range(workers)]
    busy = [False] * workers
    counter = 0
    now = 0.0
    outcome: list[Any] = []
    t0 = time.perf_counter()

    def push(t: float, dest: int, item: Any) -> None:
        nonlocal counter
        counter += 1
        heapq.heappush(heap, (t, counter, dest, item))

    def send(src: int, msg: Send) -> None:
        m = msg.message
        if isinstance(m, (Piece, ReportPart)):  # MPI delivers a copy; so do we
            m.array = np.array(m.array, copy=True)
        elif isinstance(m, PieceBatch):
            for piece in m.pieces:
                piece.array = np.array(piece.array, copy=True)
        key = (src, msg.dest)
        t = max(now + rng.expovariate(1.0 / mean_delay), last_arrival.get(key, 0.0) + 1e-9)
        last_arrival[key] = t
        push(t, msg.dest, m)

    for w, st in enumerate(states):  # as worker.runtime does: messages leave when decided,
        st.send_now = partial(send, w + 1)  # and emission pauses for a loop body's scatter
        st.pause_for_sends = True

    def apply_worker(w: int, instrs: list[Any]) -> None:
        for ins in instrs:
            if isinstance(ins, RunTask):
                ready[w].append(ins)
            else:
                send(w + 1, ins)
        # A paused interpreter resumes at the latest when nothing is ready (the runtime's rule
        # is "once the urgent tasks have run"; a random earlier resume covers every order).
        if states[w].paused and (not ready[w] or rng.random() < 0.5):
            apply_worker(w, states[w].resume())
            return
        maybe_start(w)

    def maybe_start(w: int) -> None:
        if busy[w] or not ready[w]:
            return
        k = rng.randrange(len(ready[w]))
        ready[w][k], ready[w][-1] = ready[w][-1], ready[w][k]
        ins = ready[w].pop()
        busy[w] = True
        ev = run_task(states[w], ins.task)
        push(now + rng.expovariate(1.0 / mean_task), -(w + 1), ev)

    for w, st in enumerate(states):
        apply_worker(w, st.start())
    events = 0
    while heap and not outcome:
        now, _, dest, item = heapq.heappop(heap)
        events += 1
        if events > max_events:
            raise RuntimeError(f"run_local: more than {max_events} events; raise max_events")
        if dest < 0:  # a task finished on worker -dest-1
            w = -dest - 1
            busy[w] = False
            apply_worker(w, states[w].handle(item))
            if validate:
                states[w].validate_state()
                validate_cluster(ctrl, states)
        elif dest == CONTROLLER:
            if isinstance(item, ReportPart):
                item.seconds = time.perf_counter() - t0  # wall time, as on MPI
            for ins in ctrl.handle(item):
                if isinstance(ins, Send):
                    if not isinstance(ins.message, Shutdown):
                        send(CONTROLLER, ins)
                elif isinstance(ins, Callback):
                    ins.fn(ins.event)
                elif isinstance(ins, (Finish, Fail)):
                    outcome.append(ins)
            if validate:
                ctrl.validate_state()
                validate_cluster(ctrl, states)
        else:
            w = dest - 1
            apply_worker(w, states[w].handle(item))
            if validate:
                states[w].validate_state()
                validate_cluster(ctrl, states)
    if not outcome:
        stuck = [(s.worker, s.pc, s.seq, len(s.tasks)) for s in states]
        raise RuntimeError(f"run_local: job stopped making progress (worker, pc, seq, tasks): {stuck}")
    if isinstance(outcome[0], Fail):
        reason = outcome[0].reason
        if " failed:\n" in reason:
            raise TaskError(reason)
        raise JobAborted(reason)
    worker_sent: dict[str, int] = {}
    for s in states:
        for k, v in s.sent.items():
            worker_sent[k] = worker_sent.get(k, 0) + v
    return JobResult(ctrl.results, ctrl.tasks_run, workers, time.perf_counter() - t0,
                     dict(ctrl.received),
                     dict(ctrl.sent), 0.0, worker_sent)
