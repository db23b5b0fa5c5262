"""Run a whole job in one process: controller and workers on an in-memory transport.

The transport is a seeded discrete-event simulation in virtual time: every message gets a
random delay and every task a random duration, and the only ordering kept is the one MPI
guarantees (messages from one sender to one receiver arrive in the order sent). Messages of
different senders therefore interleave in a seed-dependent order. Each worker's state machine
decides which of its ready tasks runs next, exactly as over MPI (urgent first, then in order);
``shuffle_ready`` makes it pick in a seeded random order instead, so that tests see every
order a worker could run its tasks in. The same job must give the same answer under every seed.
The same seed gives the same run: nothing here depends on the wall clock (fused stretches keep
the size they start with, since virtual durations say nothing about real ones).
"""

from __future__ import annotations

import heapq
import numbers
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from canary.controller.balance import ChaosPolicy
from canary.controller.state import ControllerState
from canary.errors import JobStopped
from canary.messages import (
    CONTROLLER,
    Callback,
    CommitSnapshot,
    Fail,
    Failed,
    Finish,
    MoveRequest,
    Piece,
    PieceBatch,
    ReadSnapshot,
    ReportPart,
    Resume,
    Send,
    Shutdown,
    SnapshotCommitted,
    SnapshotLoaded,
    SnapshotSaved,
    Tick,
    WriteSnapshot,
    local_event_id,
    run_callback,
    worker_rank,
)
from canary.numba_load import load_array_functions
from canary.program import Program, check_program
from canary.result import JobResult
from canary.snapshot import (
    Manifest,
    SnapshotConfig,
    check_resumable,
    commit,
    load_part,
    load_results,
    next_id,
    read_manifest,
    save_part,
)
from canary.worker.config import WorkerConfig
from canary.worker.execute import run_task
from canary.worker.state import WorkerState
from canary.worker.tasks import RunTask


def validate_cluster(ctrl: ControllerState, states: list[WorkerState]) -> None:
    """Cross-role invariant: every partition of every dataset is held by exactly one worker,
    the owner that the controller's map names, at the controller's entry version; a partition
    under way is held by its source or its destination, or by neither while its values are on
    the wire (a frozen placeholder waiting for them holds nothing).

    Raises AssertionError naming the partition. Checked only once placement has reached every
    worker (before that, workers hold nothing).
    """
    if ctrl.map is None or any(s.map is None for s in states):
        return
    program = ctrl.program
    moving = {(g, i): (src, dst) for g, i, src, dst, _ in ctrl.in_flight.values()}
    held: dict[tuple[int, int], int] = {}
    for s in states:
        for key, p in s.parts.items():
            if p.frozen:
                continue
            assert key not in held, f"partition {key} held by workers {held[key]} and {s.worker}"
            held[key] = s.worker
    owners, versions = ctrl.map.owners, ctrl.map.versions
    worker_versions = [s.map.versions for s in states if s.map is not None]
    for d in program.datasets:
        g = program.group_of(d)
        for i in range(d.partitions):
            holder = held.get((d.id, i))
            if (g, i) in moving:
                assert holder is None or holder in moving[(g, i)], (
                    f"partition {i} of '{d.name}' is held by {holder} during its move "
                    f"{moving[(g, i)]}")
                continue
            owner = owners[g][i]
            assert holder == owner, (
                f"partition {i} of '{d.name}' is held by {holder}, map says {owner}")
            assert worker_versions[owner][g][i] == versions[g][i], (
                f"worker {owner} holds partition {i} of '{d.name}' at another map version")


# The two copies below are what separate processes give each rank for free; they are module
# functions so that canary.virtual_runner (the same roles in virtual time) makes them alike.
def deliver_copy(message: Any) -> None:
    """Give ``message`` its own arrays, as MPI delivers a copy: a later in-place kernel on the
    sender must not change what the receiver got."""
    if isinstance(message, (Piece, ReportPart)):
        if message.array is not None:  # a partition never written is reported as None, as MPI
            message.array = np.array(message.array, copy=True)
    elif isinstance(message, PieceBatch):
        for piece in message.pieces:
            piece.array = np.array(piece.array, copy=True)


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
    shuffle_ready: bool = False,
    config: WorkerConfig | None = None,
    chaos: int | None = None,
    inject: Callable[[ControllerState, list[WorkerState]], Sequence[tuple[int, int, int]]]
    | None = None,
    checkpoint: SnapshotConfig | None = None,
    resume: Manifest | str | None = None,
    stop_after: int | None = None,
    reports: float | None = None,
) -> JobResult:
    """Run ``program`` on ``workers`` simulated workers; return the job's result.

    Raises :class:`canary.TaskError` with the failing task's message if user code fails (the
    error the controller names), and RuntimeError if the job deadlocks (no event left before
    every worker is done), which would be an engine bug; ValueError, before anything runs, if
    ``workers`` is not an integer >= 1, ``seed`` one >= 0 or ``chaos`` None or one >= 0.
    ``validate=True`` checks every state's invariants and the cross-role invariant after each
    event. ``window`` and ``max_fused`` (below 2: no fusion) set the workers'
    :class:`WorkerConfig`, or ``config`` gives all of it.
    ``chaos=SEED`` moves random partitions to random workers at random moments (seeded; the
    controller's :class:`canary.controller.balance.ChaosPolicy`): the answer must not change.
    ``inject(controller, workers)`` (tests) is called after every event and returns moves
    ``(group, index, dest)`` to request at that moment.

    ``checkpoint`` takes snapshots into its directory (``every_s`` counts virtual time, in
    units of ``mean_task``); ``resume`` (a snapshot's folder or :class:`Manifest`) starts the
    job from that snapshot, on any number of workers, and raises
    :class:`canary.snapshot.SnapshotMismatchError` if it is of another program.
    ``stop_after=N`` stops the job after its N-th event, as a crash would, by raising
    :class:`canary.errors.JobStopped` (what has been committed stays on disk).
    ``reports=T``: every worker gets a ``Tick`` every ``T`` units of virtual time and sends a
    load report, as over MPI, so that its run-ahead window follows the pace (``window_s``
    counts virtual time).
    """
    if reports is not None and not (isinstance(reports, (int, float)) and reports > 0):
        raise ValueError(f"run_local: reports must be a number > 0 or None, got {reports!r}")
    for name, value, least in (("workers", workers, 1), ("chaos", chaos, 0), ("seed", seed, 0)):
        if value is None and name == "chaos":
            continue
        # a bool is an int to Python (chaos=True would have meant seed 1); numpy's ints are not
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
            raise ValueError(f"run_local: {name} must be an integer >= {least}"
                             f"{' (a seed) or None' if name == 'chaos' else ''}, got {value!r}")
    # random.Random takes no numpy integer
    workers, seed, chaos = int(workers), int(seed), None if chaos is None else int(chaos)
    check_program(program, "run_local")
    program.finalize()
    load_array_functions()
    rng = random.Random(seed)
    if config is None:
        config = WorkerConfig(window=window, max_fused=max_fused)
    snap = read_manifest(resume) if isinstance(resume, str) else resume
    if snap is not None:
        check_resumable(snap, program.digest, program.statements(), workers, program.sources(),
                        program.statement_sites())
    ctrl = ControllerState(program, workers,
                           None if chaos is None else ChaosPolicy(chaos, every=0.0, moves=2),
                           stall_s=float("inf"),  # virtual time: nothing stalls for real
                           checkpoint=checkpoint,
                           first_snapshot=next_id(checkpoint.directory) if checkpoint else 1,
                           resumed=None if snap is None else snap.data,
                           resumed_results=None if snap is None else load_results(snap))
    states = [WorkerState(program, w, workers, replace(
        config, adapt_fused=False, ready_order_seed=seed * 1009 + w if shuffle_ready else None),
        restore=None if snap is None else snap.position)
        for w in range(workers)]
    heap: list[tuple[float, int, int, Any]] = []
    last_arrival: dict[tuple[int, int], float] = {}
    counter = 0
    now = 0.0
    events = 0
    outcome: list[Any] = []
    t0 = time.perf_counter()

    def push(t: float, dest: int, item: Any) -> None:
        nonlocal counter
        counter += 1
        heapq.heappush(heap, (t, counter, dest, item))

    def send(src: int, msg: Send) -> None:
        m = msg.message
        deliver_copy(m)
        key = (src, msg.dest)
        t = max(now + rng.expovariate(1.0 / mean_delay), last_arrival.get(key, 0.0) + 1e-9)
        last_arrival[key] = t
        push(t, msg.dest, m)

    def apply_worker(w: int, instrs: list[Any]) -> None:
        """Carry out a worker's instructions as its MPI runtime would: send, run the task it
        hands out (done after a random virtual duration), resume after a yield."""
        rank = worker_rank(w)
        for ins in instrs:
            if type(ins) is Send:
                send(rank, ins)
            elif type(ins) is RunTask:
                ev = run_task(states[w], ins.task, local_event_id(rank, counter + 1))
                push(now + rng.expovariate(1.0 / mean_task), -rank, ev)
            elif type(ins) is WriteSnapshot:
                assert checkpoint is not None
                entries, error = save_part(checkpoint.directory, ins.snap, w, ins.arrays)
                push(now + rng.expovariate(1.0 / mean_task), -rank,
                     SnapshotSaved(local_event_id(rank, counter + 1), ins.snap, entries, error))
            elif type(ins) is ReadSnapshot:
                assert snap is not None
                push(now + rng.expovariate(1.0 / mean_task), -rank,
                     SnapshotLoaded(local_event_id(rank, counter + 1), load_part(snap, ins.keys)))
            else:  # Yield: the sends above are out; go on at once
                push(now, -rank, Resume(local_event_id(rank, counter + 1)))

    for w, st in enumerate(states):
        apply_worker(w, st.start(reports=reports is not None))
    # The clock that makes snapshots due (virtual time): one tick a unit, each pushing the next
    # while other events remain (chaos ticks, too, reach the controller, but start no clock).
    # The workers' report ticks (``reports``) go on likewise; ``periodic`` counts those clocks
    # in the heap, so that they do not keep one another going once nothing else is left.
    clock: Tick | None = None
    periodic = 0
    if checkpoint is not None:
        clock = Tick(local_event_id(CONTROLLER, 0), 1.0)
        push(1.0, CONTROLLER, clock)
        periodic += 1
    if reports is not None:
        for w in range(workers):
            push(reports, -worker_rank(w), Tick(local_event_id(worker_rank(w), 0), reports))
            periodic += 1
    while heap and not outcome:
        now, _, dest, item = heapq.heappop(heap)
        events += 1
        if events > max_events:
            raise RuntimeError(f"run_local: more than {max_events} events; raise max_events")
        if stop_after is not None and events > stop_after:
            raise JobStopped(f"run_local: stopped after event {stop_after} (stop_after)")
        if dest == CONTROLLER:
            if item is clock:
                periodic -= 1
                if len(heap) > periodic:
                    clock = Tick(local_event_id(CONTROLLER, counter + 1), now + 1.0)
                    push(now + 1.0, CONTROLLER, clock)
                    periodic += 1
            if isinstance(item, ReportPart):
                item.seconds = time.perf_counter() - t0  # wall time, as on MPI
            for ins in ctrl.handle(item):
                if isinstance(ins, Send):
                    if not isinstance(ins.message, Shutdown):
                        send(CONTROLLER, ins)
                elif isinstance(ins, Callback):
                    failed = run_callback(ins)
                    if failed is not None:  # the job fails, whatever else this event did
                        outcome[:0] = [i for i in ctrl.handle(Failed(
                            local_event_id(CONTROLLER, counter + 1), -1, failed))
                            if isinstance(i, Fail)]
                        break
                elif isinstance(ins, (Finish, Fail)):
                    outcome.append(ins)
                elif isinstance(ins, CommitSnapshot):
                    assert checkpoint is not None
                    error = commit(checkpoint.directory, checkpoint.keep, ins.snap, ins.manifest,
                                   ins.results)
                    push(now, CONTROLLER, SnapshotCommitted(local_event_id(CONTROLLER,
                                                                           counter + 1),
                                                            ins.snap, error))
                # Progress lines (a partition moved) are for a person: not printed here
            if validate:
                ctrl.validate_state()
            if chaos is not None and not isinstance(item, Tick) and rng.random() < 0.2:
                push(now + rng.expovariate(1.0 / mean_delay), CONTROLLER,
                     Tick(local_event_id(CONTROLLER, counter + 1), now))
        else:
            w = abs(dest) - 1  # dest < 0: the worker's own event (a task done, a resume)
            apply_worker(w, states[w].handle(item))
            if type(item) is Tick:  # a report tick (reports): the next one, if work is left
                assert reports is not None
                periodic -= 1
                if len(heap) > periodic:
                    push(now + reports, dest, Tick(local_event_id(abs(dest), counter + 1),
                                                   now + reports))
                    periodic += 1
            if validate:
                states[w].validate_state()
            if chaos is not None and rng.random() < 0.02:  # a move may start at any moment
                push(now, CONTROLLER, Tick(local_event_id(CONTROLLER, counter + 1), now))
        if validate:
            validate_cluster(ctrl, states)
        if inject is not None and ctrl.map is not None and not outcome:
            moves = tuple(inject(ctrl, states))
            if moves:
                push(now, CONTROLLER, MoveRequest(local_event_id(CONTROLLER, counter + 1), moves,
                                                  "injected"))
    if not outcome:
        stuck = "; ".join(
            f"worker {s.worker}: pc {s.pc}, seq {s.seq}, {len(s.tasks)} task(s), waiting for "
            f"signal {s.await_seq}, moves out {sorted(s.moves_out)}, in {sorted(s.moves_in)}, "
            f"cuts {s._cuts}, done {s.done_sent}" for s in states)
        raise RuntimeError(f"run_local: job stopped making progress (an engine bug): {stuck}; "
                           f"controller: moving {ctrl.in_flight}, done {sorted(ctrl.done)}")
    if isinstance(outcome[0], Fail):
        raise outcome[0].error(outcome[0].reason)
    worker_sent: dict[str, int] = {}
    for s in states:
        for k, v in s.sent.items():
            worker_sent[k] = worker_sent.get(k, 0) + v
    return JobResult(ctrl.results, ctrl.tasks_run, workers, time.perf_counter() - t0,
                     dict(ctrl.received), dict(ctrl.sent), 0.0, worker_sent, ctrl.migrations,
                     ctrl.bytes_migrated, ctrl.snapshots_committed,
                     None if snap is None else snap.id, events, ctrl.program.reported)
