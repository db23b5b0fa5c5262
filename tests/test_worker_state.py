"""The worker state machine, driven event by event with no MPI.

Tests compare whole instruction lists (``Instruction.match(**fields)`` where a field does not
matter), and every state made in a test is checked with ``validate_state()`` after every event.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from canary.messages import (
    Done,
    Failed,
    Hello,
    LoadReport,
    Piece,
    PieceBatch,
    Placement,
    ReportPart,
    Resume,
    Send,
    Signal,
    TaskDone,
    TaskFailed,
    Tick,
    Yield,
)
from canary.partition_map import PartitionMap
from canary.program import Program
from canary.worker.config import WorkerConfig
from canary.worker.execute import run_task
from canary.worker.fusion import stretch_budget
from canary.worker.state import WorkerState
from canary.worker.tasks import (
    K_COMPUTE,
    K_FUSED,
    K_GATHER,
    K_LOAD,
    K_REPORT,
    K_SCATTER,
    K_SIGNAL,
    RunTask,
    Task,
    is_urgent,
)

SMALL = WorkerConfig().urgent_max_bytes


@pytest.fixture(autouse=True)
def validated(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Every WorkerState a test makes is validated after each event it handles and at the end."""
    made: list[WorkerState] = []
    init, handle = WorkerState.__init__, WorkerState.handle

    def tracking_init(self: WorkerState, *a: Any, **k: Any) -> None:
        init(self, *a, **k)
        made.append(self)

    def checked_handle(self: WorkerState, event: Any) -> list[Any]:
        out = handle(self, event)
        self.validate_state()
        return out

    monkeypatch.setattr(WorkerState, "__init__", tracking_init)
    monkeypatch.setattr(WorkerState, "handle", checked_handle)
    yield made
    for st in made:
        st.validate_state()


# ------------------------------------------------------------------ helpers
EIDS = iter(range(10_000, 10**9))


def done(task: Task, outputs: Any, seconds: float | None = None) -> TaskDone:
    return TaskDone(next(EIDS), task, outputs, seconds)


def placed(p: Program, worker: int, n_workers: int = 2, **config: Any) -> tuple[WorkerState, list]:
    """A started WorkerState (``config``: WorkerConfig fields) after the initial placement, and
    what that placement caused."""
    st = WorkerState(p, worker, n_workers, **config)
    assert st.start() == [Send(0, Hello(st.rank << 40 | 1, worker, p.digest, p.statements(),
                                        p.statement_sites()))]
    m = PartitionMap.initial([g[0].partitions for g in p.groups], n_workers)
    return st, st.handle(Placement(1, m))


def run_tasks(st: WorkerState, out: list, finish: Callable[[Task], Any] | None = None,
              until: str | None = None) -> list:
    """Carry out ``out`` as the runtime does (run the task handed out, resume after a yield),
    finishing each task with ``finish(task)`` (default: really running it), until nothing is
    left or a task of kind ``until`` has finished; return every instruction seen after ``out``.
    """
    seen: list = []
    pending = out
    while True:
        runs = [i for i in pending if isinstance(i, RunTask)]
        assert len(runs) <= 1, f"more than one task handed out at once: {pending}"
        if runs:
            t = runs[0].task
            ev = run_task(st, t, next(EIDS)) if finish is None else done(t, finish(t))
            pending = st.handle(ev)
            seen += pending
            if t.kind == until:
                return pending
        elif any(isinstance(i, Yield) for i in pending):
            pending = st.handle(Resume(next(EIDS)))
            seen += pending
        else:
            return seen


def sends(out: list) -> list[Send]:
    return [i for i in out if isinstance(i, Send)]


def reduce_program() -> tuple[Program, int]:
    p = Program("reduce")
    x, s = p.dataset("x", 2), p.dataset("s", 1)
    p.load([x], lambda i, n: np.full(3, float(i + 1)))
    p.reduce(x, s)
    p.report(s)
    return p.finalize(), s.id


def while_program(n: int = 3) -> Program:
    p = Program("w")
    c = p.dataset("c", 1)
    p.load([c], lambda i, k: np.zeros(1))
    with p.while_(lambda v: v[0] < n, on=c, max_iter=10):
        p.compute(lambda v: v + 1, [c], [c], name="inc")
    return p.finalize()


def compute_loop(parts: int, iters: int) -> Program:
    p = Program("loop")
    a, b = p.dataset("a", parts), p.dataset("b", parts)
    p.load([a, b], lambda i, n: (np.zeros(1), np.ones(1)))
    with p.loop(iters):
        p.compute(lambda x, y: x + y, [a, b], [a], name="add")
        p.compute(lambda y: y * 2, [b], [b], name="dbl")
    p.report(a)
    return p.finalize()


def broadcast_loop(parts: int) -> tuple[Program, Any]:
    """A loop whose body starts with a broadcast of w to ``parts`` partitions of a, then a
    compute on a, a reduce into s and s copied back to w; the loop tests w."""
    p = Program("bcast_loop")
    w, a, s = p.dataset("w", 1), p.dataset("a", parts), p.dataset("s", 1)
    p.load([w], lambda i, n: np.ones(1))
    p.load([a], lambda i, n: np.zeros(1))
    with p.while_(lambda v: v[0] < 5, on=w, max_iter=3):
        p.broadcast(w, a)
        p.compute(lambda x: x + 1, [a], [a], name="inc")
        p.reduce(a, s)
        p.compute(lambda x: x, [s], [w], name="back")
    return p.finalize(), w


# ------------------------------------------------------------------ contract
def test_sender_side_of_a_reduce_as_whole_instruction_lists() -> None:
    p, s_id = reduce_program()
    st, out = placed(p, worker=1, inline=False)  # the scatter as a task (see test_inline_*)
    assert out == [RunTask.match(kind=K_LOAD, part=1, seq=0, cause=1)]
    load = out[0].task
    arr = np.full(3, 2.0)
    ev = done(load, (arr,))
    out = st.handle(ev)
    assert out == [RunTask.match(kind=K_SCATTER, part=1, seq=1, cause=ev.eid)]
    ev = done(out[0].task, arr)
    out = st.handle(ev)
    assert out == [Send(1, Piece(st.rank << 40 | 2, 1, s_id, 1, (0,), (1,), arr), ev.eid),
                   Send(0, Done(st.rank << 40 | 3, 1, 2, {"Hello": 1, "Piece": 1}), ev.eid)]
    assert st.parts[(0, 1)].last_seq == 1  # metadata: last stage instance that touched x[1]


def test_every_instruction_carries_the_id_of_the_event_that_caused_it() -> None:
    p = Program("ids")
    a, s = p.dataset("a", 4), p.dataset("s", 1)
    p.load([a], lambda i, n: np.ones(2) * i)
    with p.loop(3):
        p.compute(lambda v: v + 1, [a], [a], name="inc")
    p.reduce(a, s)
    p.report(s)
    st, out = placed(p.finalize(), worker=0, n_workers=2, max_fused=0)
    assert {i.cause for i in out} == {1}
    pending = out
    while pending:
        ins = next(i for i in pending if isinstance(i, RunTask))
        ev = run_task(st, ins.task, next(EIDS))
        pending = st.handle(ev)
        assert all(i.cause == ev.eid for i in pending), pending
        pending = [i for i in pending if isinstance(i, RunTask)]


def test_one_task_at_a_time_and_the_next_comes_with_the_last_ones_done() -> None:
    p = compute_loop(parts=3, iters=2)
    st, out = placed(p, worker=0, n_workers=1, max_fused=0)
    assert out == [RunTask.match(kind=K_LOAD, part=0)]  # three loads ready, one handed out
    assert [t.part for t in st.ready] == [1, 2] and st.running is out[0].task
    seen = run_tasks(st, out)
    assert sends(seen) == [Send.match(dest=0, message=ReportPart.match(index=k))
                           for k in range(3)] + [Send.match(dest=0, message=Done.match())]


def test_urgent_tasks_run_before_compute_tasks_that_were_ready_first() -> None:
    # a and b each get a compute; the small reduce of b is urgent: its scatter runs before the
    # compute on a, although that compute became ready first.
    p = Program("urgent")
    a, b, s = p.dataset("a", 1), p.dataset("b", 1), p.dataset("s", 1)
    p.load([a, b], lambda i, n: (np.ones(4), np.ones(4)))
    p.compute(lambda x: x + 1, [a], [a], name="slow")
    p.reduce(b, s, name="r")
    p.report(s)
    st, out = placed(p.finalize(), worker=0, n_workers=1, max_fused=0, inline=False)
    load = out[0].task
    out = st.handle(done(load, (np.ones(4), np.ones(4))))
    assert out == [RunTask.match(kind=K_SCATTER, stage="r")]
    assert [t.stage.name for t in st.ready] == ["slow"]


def test_a_seeded_random_order_is_reproducible_and_covers_other_orders() -> None:
    def order(seed: int | None) -> list[int]:
        st, out = placed(compute_loop(parts=6, iters=1), 0, 1, max_fused=0,
                         ready_order_seed=seed)
        got = [out[0].part]
        out = st.handle(done(out[0].task, (np.zeros(1), np.ones(1))))
        while out and isinstance(out[0], RunTask) and out[0].kind == K_LOAD:
            got.append(out[0].part)
            out = st.handle(done(out[0].task, (np.zeros(1), np.ones(1))))
        return got

    assert order(None) == list(range(6))
    assert order(3) == order(3)
    assert {tuple(order(s)) for s in range(8)} != {tuple(range(6))}


# ------------------------------------------------------------------ signals and yielding
def test_worker_without_the_partition_blocks_on_the_signal() -> None:
    p = while_program()
    st, out = placed(p, worker=1)  # c lives on worker 0
    assert out == [] and st.await_seq == 1 and not st.ended
    out = st.handle(Signal(5, 1, True))  # enter the body: its stage has no local task
    assert out == [] and st.await_seq == 3  # seq 2 was the body, seq 3 the next signal
    out = st.handle(Signal(6, 3, False))
    assert out == [Send(0, Done(st.rank << 40 | 2, 1, 0, {"Hello": 1}), 6)]
    assert st.ended


def test_a_load_report_says_which_loop_and_iteration_the_worker_stands_in() -> None:
    # the controller's progress line names the loop and iteration from these
    p = while_program()
    head = p.ops.index(next(op for op in p.ops if op[0] == "while"))
    st, _ = placed(p, worker=1)  # waits for the first signal, before iteration 0
    assert st.handle(Tick(50, 0.5)) == [
        Send(0, LoadReport.match(seq=2, pc=head, counters=(0,)), 50)]
    st.handle(Signal(5, 1, True))  # one pass of the body: now before iteration 1
    assert st.handle(Tick(51, 1.0)) == [
        Send(0, LoadReport.match(seq=4, pc=head, counters=(1,)), 51)]


def test_signal_holder_broadcasts_then_yields_before_emitting_the_body() -> None:
    p = while_program()
    st, out = placed(p, worker=0, n_workers=3)
    sig = st.handle(done(out[0].task, (np.zeros(1),)))
    assert sig == [RunTask.match(kind=K_SIGNAL, seq=1)]
    fn, args = st.task_call(sig[0].task)
    assert bool(fn(*args)) is True
    ev = done(sig[0].task, True)
    out = st.handle(ev)
    # the value leaves for workers 1 and 2 before the loop body exists
    assert out == [Send(2, Signal.match(seq=1, value=True), ev.eid),
                   Send(3, Signal.match(seq=1, value=True), ev.eid), Yield(ev.eid)]
    assert "inc" not in {t.stage.name for t in st.tasks.values()}
    out = st.handle(Resume(77))
    assert out == [RunTask(next(t for t in st.tasks.values() if t.stage.name == "inc"), 77)]


def test_a_loop_body_broadcast_leaves_before_the_rest_of_the_body_is_emitted() -> None:
    p, w = broadcast_loop(4)
    st, out = placed(p, worker=0, max_fused=0)
    assert st.map is not None and st.map.owner(p.group_of(w), 0) == 0  # w's holder sends
    out = run_tasks(st, out, lambda t: True if t.kind == K_SIGNAL else (np.zeros(1),),
                    until=K_SIGNAL)
    # the signal's value goes to worker 1, then the interpreter stops
    assert out == [Send.match(dest=2, message=Signal.match(value=True)), Yield.match()]
    out = st.handle(Resume(next(EIDS)))
    # the broadcast's scatter ran inline: its piece for worker 1 leaves before the rest of the
    # body is emitted
    assert out[0] == Send.match(dest=2, message=Piece.match(dataset=p.datasets[1].id))
    assert out[-1] == Yield.match()
    assert "inc" not in {t.stage.name for t in st.tasks.values()}
    out = st.handle(Resume(next(EIDS)))
    assert "inc" in {t.stage.name for t in st.tasks.values()}


def test_an_urgent_scatter_runs_before_the_rest_of_the_body_is_emitted() -> None:
    # Without inline moves the broadcast's scatter is a task: it is handed out at once and the
    # emission goes on when it is done.
    p, w = broadcast_loop(2)
    st, out = placed(p, worker=0, n_workers=1, max_fused=0, inline=False)
    out = run_tasks(st, out, lambda t: True if t.kind == K_SIGNAL else (np.ones(1),),
                    until=K_SIGNAL)
    assert out == [RunTask.match(kind=K_SCATTER, stage="broadcast_w")]
    assert "inc" not in {t.stage.name for t in st.tasks.values()}
    out = st.handle(done(out[0].task, np.ones(1)))
    assert "inc" in {t.stage.name for t in st.tasks.values()}


def chain_program(iterations: int) -> Program:
    """One partition, a loop of one compute stage on it: a stage instance a task."""
    p = Program("chain")
    a = p.dataset("a", 1)
    p.load([a], lambda i, n: np.zeros(1))
    with p.loop(iterations):
        p.compute(lambda v: v + 1, [a], [a])
    return p


def test_run_ahead_window_bounds_live_instances() -> None:
    p = chain_program(50)
    st = WorkerState(p.finalize(), 0, 1, window=4, max_fused=0)
    st.start()
    st.handle(Placement(1, PartitionMap.initial([1], 1)))
    assert len(st.live) == 4 and st.seq == 4


def test_the_window_follows_the_pace_shrinks_by_halves_and_grows_at_once() -> None:
    """Each load report sizes the window to ``window_s`` seconds of the instances emitted since
    the last one, between ``window_min`` and ``window``."""
    p = chain_program(500)
    st = WorkerState(p.finalize(), 0, 1, window=64, window_s=0.5, window_min=8, max_fused=0)
    st.start()
    out = st.handle(Placement(1, PartitionMap.initial([1], 1)))
    assert len(st.live) == 64

    def tick(now: float) -> None:
        out = st.handle(Tick(next(EIDS), now))
        assert [type(i.message) for i in out] == [LoadReport]  # a report, and nothing emitted
        st.validate_state()

    tick(1.0)  # 64 instances in a second: half a second of them is 32
    assert st.window == 32
    tick(2.0)  # nothing emitted (no task ran): down to the floor, by halves
    assert st.window == 16
    tick(3.0)
    assert st.window == 8
    most_live = 0  # once emission went on past the first 64

    def finish(task: Task) -> Any:
        nonlocal most_live
        if st.seq > 64:
            most_live = max(most_live, len(st.live))
        return run_task(st, task, next(EIDS)).outputs

    run_tasks(st, out, finish)
    assert st.seq == 501 and not st.live  # the whole loop ran, after the first 64 ...
    assert most_live == 8  # ... 8 live at a time
    tick(3.1)  # 437 instances in 0.1 s: the whole window at once
    assert st.window == 64


def test_a_worker_that_will_get_reports_starts_at_the_floor_and_the_first_report_sizes_it(
        ) -> None:
    # started at its most, a worker that only waits for others emitted 64 instances at once
    st = WorkerState(chain_program(500).finalize(), 0, 1, window=64, window_min=8, max_fused=0)
    st.start(reports=True)
    st.handle(Placement(1, PartitionMap.initial([1], 1)))
    assert len(st.live) == 8 and st.window == 8
    st.handle(Tick(next(EIDS), 0.001))  # 8 instances in 1 ms: the pace of a fast loop
    assert st.window == 64 and len(st.live) == 64
    fixed = WorkerState(chain_program(500).finalize(), 0, 1, window=64, window_s=0.0,
                        max_fused=0)
    fixed.start(reports=True)  # window_s 0: the reports size nothing
    fixed.handle(Placement(1, PartitionMap.initial([1], 1)))
    assert len(fixed.live) == 64


def test_a_window_s_of_0_keeps_the_window_fixed() -> None:
    p = chain_program(500)
    st = WorkerState(p.finalize(), 0, 1, window=64, window_s=0.0, max_fused=0)
    st.start()
    st.handle(Placement(1, PartitionMap.initial([1], 1)))
    for now in (1.0, 2.0, 3.0):
        st.handle(Tick(next(EIDS), now))
    assert st.window == 64


def test_writes_wait_for_earlier_reads_and_reads_share() -> None:
    p = Program("rw")
    a, b, c = p.dataset("a", 1), p.dataset("b", 1), p.dataset("c", 1)
    p.load([a, b, c], lambda i, n: (np.zeros(1), np.zeros(1), np.zeros(1)))
    p.compute(lambda x: x, [a], [b], name="read1")
    p.compute(lambda x: x, [a], [c], name="read2")
    p.compute(lambda x: x + 1, [a], [a], name="write")
    st = WorkerState(p.finalize(), 0, 1, max_fused=0)  # ordinary tasks (fusion would merge them)
    st.start()
    out = st.handle(Placement(1, PartitionMap.initial([1], 1)))
    out = st.handle(done(out[0].task, (np.zeros(1),) * 3))
    assert out == [RunTask.match(stage="read1")]  # both reads granted, one handed out
    assert [t.stage.name for t in st.ready] == ["read2"]
    out = st.handle(done(out[0].task, (np.zeros(1),)))
    assert out == [RunTask.match(stage="read2")]  # the write still waits for read2
    out = st.handle(done(out[0].task, (np.zeros(1),)))
    assert out == [RunTask.match(stage="write")]


def test_a_failed_task_is_reported_once_and_nothing_runs_after_it() -> None:
    st, out = placed(compute_loop(parts=2, iters=1), 0, 1, max_fused=0)
    ev = TaskFailed(next(EIDS), out[0].task, "rank 1: boom")
    out = st.handle(ev)
    assert out == [Send(0, Failed(st.rank << 40 | 2, 0, "rank 1: boom"), ev.eid)]
    assert st.handle(Resume(next(EIDS))) == []


# ------------------------------------------------------------------ pieces and the map
def test_receiver_gathers_in_source_order_even_when_pieces_come_early() -> None:
    p, s_id = reduce_program()
    st = WorkerState(p, 0, 2, inline=False)
    st.start()
    # The remote piece overtakes the placement (different senders): it must be held, not lost.
    assert st.handle(Piece(7, 1, s_id, 1, (0,), (1,), np.full(3, 2.0))) == []
    m = PartitionMap.initial([g[0].partitions for g in p.groups], 2)
    out = st.handle(Placement(1, m))
    assert out == [RunTask.match(kind=K_LOAD, part=0)]
    out = st.handle(done(out[0].task, (np.full(3, 1.0),)))
    assert out == [RunTask.match(kind=K_SCATTER, part=0)]
    out = st.handle(done(out[0].task, np.full(3, 1.0)))
    assert out == [RunTask.match(kind=K_GATHER, part=0)]
    fn, args = st.task_call(out[0].task)
    pieces = args[0]  # a built-in gather also gets the stage and place, to name them
    assert [pc[0] for pc in pieces] == [1.0, 2.0]  # ordered by source partition
    total = fn(*args)
    out = st.handle(done(out[0].task, total))
    assert out == [RunTask.match(kind=K_REPORT)]
    ev = done(out[0].task, np.array(total))
    out = st.handle(ev)
    assert out == [Send(0, ReportPart.match(array=np.full(3, 3.0)), ev.eid),
                   Send(0, Done.match(worker=0, tasks_run=4), ev.eid)]


def test_a_piece_from_a_newer_map_is_held_until_the_worker_knows_that_map() -> None:
    # What exists of the map-update path until partitions migrate: a receiver holds a piece
    # whose sender knows a newer placement than it does (worker 1 is told s[0] will be its own;
    # the move itself is the migration protocol's). Forwarding a piece whose sender's map is
    # older happens only at a partition's former owner, after a migration.
    p, s_id = reduce_program()
    st1, _ = placed(p, worker=1)  # s[0] belongs to worker 0 at version 1
    piece = Piece(9, 1, s_id, 0, (0,), (2,), np.zeros(3))
    assert st1.handle(piece) == []
    assert st1.held == [piece] and not st1.early


def test_a_scatter_sends_remote_pieces_before_delivering_local_ones() -> None:
    p = Program("bcast")
    w, a = p.dataset("w", 1), p.dataset("a", 4)
    p.load([a], lambda i, n: np.zeros(2))  # a's loads run first: its gathers can run at once
    p.load([w], lambda i, n: np.ones(2))
    p.broadcast(w, a)
    p.report(a)
    p.finalize()
    st, out = placed(p, worker=0, inline=False, max_fused=0)
    got = run_tasks(st, out, until=K_SCATTER)
    # the piece for worker 1 (a[2], a[3]) leaves first; the local gathers are ready after it
    assert got[0] == Send.match(dest=2, message=Piece.match(dsts=(2, 3)))
    steps = [(r.what, r.part) for r in st.story(2) if r.what in ("send", "ready")]
    assert steps == [("ready", 0), ("send", 2), ("ready", 0), ("ready", 1)]  # the scatter,
    # its piece to rank 2, then the gathers of a[0] and a[1]


def scatter_program(P: int, Q: int, nbytes: int, targets: Any = None) -> tuple[Program, int]:
    """P partitions of x, each of ``nbytes``, scattered (each source's partition as its one
    piece) to Q partitions of s, summed; s reported."""
    p = Program("scatter")
    x, s = p.dataset("x", P), p.dataset("s", Q)
    p.load([x], lambda i, n: np.full(nbytes // 8, float(i + 1)))
    p.scatter_gather(x, s, lambda a: a, "sum", targets=targets, one_piece=True)
    p.report(s)
    return p.finalize(), s.id


def scatter_sends(st: WorkerState, out: list) -> list[list[Any]]:
    """Run every task; for each scatter task, the pieces its completion sent."""
    got: list[list[Any]] = []
    pending = out
    while pending:
        run = [i for i in pending if isinstance(i, RunTask)]
        if not run:
            break
        t = run[0].task
        pending = st.handle(run_task(st, t, next(EIDS)))
        if t.kind == K_SCATTER:
            got.append([i.message for i in sends(pending)
                        if isinstance(i.message, (Piece, PieceBatch))])
    return got


def test_a_workers_small_reduce_pieces_leave_together_after_its_last_scatter() -> None:
    # Worker 1 holds x[2] and x[3]; the gather of s[0] (worker 0) needs both anyway, so the
    # first piece waits for the second and both leave in one message, in source order.
    p, s_id = scatter_program(4, 1, 24)
    st1, out = placed(p, worker=1)
    assert scatter_sends(st1, out) == [[], [PieceBatch.match()]]
    assert st1.sent.get("Piece", 0) == 0 and st1.sent["PieceBatch"] == 1
    assert not st1._batches and not st1._scatters_left  # nothing kept once the batch left


def test_pieces_in_a_batch_are_gathered_as_if_each_had_come_alone() -> None:
    p, s_id = scatter_program(4, 1, 24)
    st1, out = placed(p, worker=1)
    pending = out
    batch = None
    while pending:
        run = [i for i in pending if isinstance(i, RunTask)]
        if not run:
            break
        pending = st1.handle(run_task(st1, run[0].task, next(EIDS)))
        batch = batch or next((i.message for i in sends(pending)
                               if isinstance(i.message, PieceBatch)), None)
    assert batch is not None
    assert [(q.seq, q.dataset, q.src, q.dsts) for q in batch.pieces] == [
        (1, s_id, 2, (0,)), (1, s_id, 3, (0,))]
    st0, out0 = placed(p, worker=0)
    seen = run_tasks(st0, out0 + st0.handle(batch))
    reports = [i.message for i in sends(seen) if isinstance(i.message, ReportPart)]
    assert [r.array.tolist() for r in reports] == [[10.0, 10.0, 10.0]]  # 1+2+3+4


def test_pieces_leave_at_once_when_batching_could_delay_a_gather() -> None:
    # Large pieces are not kept (moving them is bandwidth-bound, and keeping them holds memory).
    p, _ = scatter_program(4, 1, SMALL + 8)
    st1, out = placed(p, worker=1)
    assert scatter_sends(st1, out) == [[Piece.match(src=2)], [Piece.match(src=3)]]
    # s[0] (on worker 0) needs only x[2]; worker 1 also holds x[3], whose piece goes to s[1]
    # (its own): x[2]'s piece must not wait for x[3]'s scatter.
    p, _ = scatter_program(4, 2, 24, targets=lambda i: (0,) if i < 3 else (1,))
    st1, out = placed(p, worker=1)
    assert scatter_sends(st1, out) == [[Piece.match(src=2)], []]


# ------------------------------------------------------------------ small moves run inline
def test_inline_a_reduce_runs_its_small_moves_inside_the_state_machine() -> None:
    p, s_id = reduce_program()
    # Worker 1 (x[1]): the load's TaskDone sends the piece at once; no scatter task is made.
    st1, out = placed(p, worker=1)
    arr = np.full(3, 2.0)
    ev = done(out[0].task, (arr,))
    got = st1.handle(ev)
    assert got == [Send(1, Piece.match(seq=1, src=1, dsts=(0,), array=np.full(3, 2.0)), ev.eid),
                   Send(0, Done.match(tasks_run=2), ev.eid)]
    piece = got[0].message
    arr[:] = -1.0  # an in-place update of x[1] after the scatter must not reach the piece
    assert piece.array.tolist() == [2.0, 2.0, 2.0]
    assert (st1.tasks_run, st1.inline_run) == (2, 1)
    # Worker 0 (x[0], s): its own piece waits in the gather; the remote one completes the sum.
    # The report of s stays a task (it runs after urgent ones, a loop's signal).
    st0, out = placed(p, worker=0)
    assert st0.handle(done(out[0].task, (np.full(3, 1.0),))) == []
    out = st0.handle(piece)
    assert out == [RunTask.match(kind=K_REPORT)]
    assert st0.parts[(s_id, 0)].value.tolist() == [3.0, 3.0, 3.0]
    assert (st0.tasks_run, st0.inline_run) == (3, 2)  # load, scatter, gather


class DoublingGather:
    """A user's gather as a callable object; defining ``__eq__`` makes it unhashable."""

    def __call__(self, pieces: list[np.ndarray]) -> np.ndarray:
        return pieces[0] * 2

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DoublingGather)

    __hash__ = None  # type: ignore[assignment]


def test_inline_leaves_large_pieces_and_user_gathers_to_tasks() -> None:
    p = Program("moves")
    big, small = p.dataset("big", 1), p.dataset("small", 1)
    s1, s2 = p.dataset("s1", 1), p.dataset("s2", 1)
    p.load([big, small], lambda i, n: (np.zeros(SMALL // 8 + 1), np.ones(2)))
    p.reduce(big, s1, name="r_big")  # 64 KB + 8 bytes: copying it is work, not bookkeeping
    p.reduce(small, s2, op=DoublingGather(), name="r_user")  # user code, not even hashable
    st = WorkerState(p.finalize(), 0, 1, max_fused=0)
    st.start()
    out = st.handle(Placement(1, PartitionMap.initial([1, 1, 1, 1], 1)))
    out = st.handle(done(out[0].task, (np.zeros(SMALL // 8 + 1), np.ones(2))))
    # the small scatter of r_user ran inline and made its (user) gather ready; the large
    # scatter is urgent-sized no more, so the gather (ready second) waits behind it
    assert out == [RunTask.match(stage="r_big", kind=K_SCATTER)]
    assert [(t.stage.name, t.kind) for t in st.ready] == [("r_user", K_GATHER)]
    assert st.inline_run == 1


def test_inline_broadcast_gives_each_local_partition_its_own_array() -> None:
    p = Program("bcast")
    w, a = p.dataset("w", 1), p.dataset("a", 3)
    p.load([w], lambda i, n: np.arange(4.0))
    p.broadcast(w, a)
    p.compute(lambda x: x, [a], [a], name="keep")
    st = WorkerState(p.finalize(), 0, 1, max_fused=0)
    st.start()
    out = st.handle(Placement(1, PartitionMap.initial([1, 3], 1)))
    w0 = np.arange(4.0)
    st.handle(done(out[0].task, (w0,)))
    values = [st.parts[(a.id, j)].value for j in range(3)]
    assert all(v.tolist() == [0.0, 1.0, 2.0, 3.0] for v in values)
    arrays = [w0, *values]
    assert not any(np.shares_memory(x, y) for k, x in enumerate(arrays) for y in arrays[k + 1:])
    assert st.inline_run == 4  # the scatter and three gathers


# ------------------------------------------------------------------ fused stretches
def test_compute_only_loop_runs_as_one_fused_stretch() -> None:
    p = compute_loop(parts=3, iters=10)
    st = WorkerState(p, 0, 1, max_fused=1000, inline=False)
    st.start()
    out = st.handle(Placement(1, PartitionMap.initial([3], 1)))
    assert out == [RunTask.match(kind=K_LOAD, part=0)]
    # One fused task stands for all 20 instances on the 3 partitions, queued behind the loads.
    fused = [t for t in st.tasks.values() if t.kind == K_FUSED]
    assert len(fused) == 1 and fused[0].waiting > 0
    stretch = fused[0].stretch
    assert [(s.name, seq, it) for s, seq, it in stretch.instances[:3]] == [
        ("add", 1, (0,)), ("dbl", 2, (0,)), ("add", 3, (1,))]
    assert stretch.idxs == [0, 1, 2] and stretch.tasks == 60
    assert st.seq == 22 and st.live == {0: 3, 20: 1, 21: 3}  # loads, the stretch, the report
    for part in range(3):
        out = st.handle(done(out[0].task, (np.zeros(1), np.ones(1))))
        if part < 2:
            assert out == [RunTask.match(kind=K_LOAD, part=part + 1)]
    assert out == [RunTask(fused[0], out[0].cause)]
    st.handle(run_task(st, out[0].task, next(EIDS)))
    # a = sum of b's doublings 1 + 2 + ... + 2^9; b = 2^10; the report's reads are now granted
    assert [float(st.parts[(0, i)].value[0]) for i in range(3)] == [1023.0] * 3
    assert [float(st.parts[(1, i)].value[0]) for i in range(3)] == [1024.0] * 3
    assert st.tasks_run == 3 + 60 and st.stretches_run == 1
    assert all(st.parts[(d, i)].last_seq == 20 for d in (0, 1) for i in range(3))


def test_a_traced_stretch_reports_the_seconds_it_took() -> None:
    # Tracing times each task inside a stretch; the stretch's own seconds (what the load reports
    # and the balancer read) must still be its duration, not a time stamp's negative.
    st, out = placed(compute_loop(parts=3, iters=10), 0, 1, max_fused=1000, inline=False)
    while out[0].task.kind == K_LOAD:
        out = st.handle(done(out[0].task, (np.zeros(1), np.ones(1))))
    (run,) = out
    assert run.task.kind == K_FUSED
    spans: list[tuple[float, float]] = []
    began = time.perf_counter()
    ev = run_task(st, run.task, next(EIDS), on_task=lambda *a: spans.append(a[-2:]))
    took = time.perf_counter() - began
    assert isinstance(ev, TaskDone) and 0 <= ev.seconds <= took
    # every task timed once; their time.time() stamps are the trace's, not compared with the
    # clock here (a wall clock may be stepped)
    assert len(spans) == 60


def test_fused_stretches_respect_max_fused_and_wait_for_each_other() -> None:
    st, _ = placed(compute_loop(parts=2, iters=10), 0, 1, max_fused=8)
    fused = [t for t in st.tasks.values() if t.kind == K_FUSED]
    # 8 tasks = 4 instances on 2 partitions; the next instance waits for that stretch instead
    # of being emitted as ordinary tasks.
    assert len(fused) == 1 and fused[0].stretch.tasks == 8
    assert st.seq == 5 and all(t.kind in (K_LOAD, K_FUSED) for t in st.tasks.values())


def test_stretch_budget_amortises_rows_and_bounds_message_latency() -> None:
    c = WorkerConfig()
    # short tasks: about fuse_target_s seconds of them
    assert stretch_budget(1e-6, 10, c) == round(c.fuse_target_s / 1e-6)
    # 100 µs tasks on 10 rows: the target would be a single stage; at least 8 stages instead
    assert stretch_budget(1e-4, 10, c) == c.fuse_min_instances * 10
    # ... but never longer than fuse_max_s, and never fewer than 2 tasks
    assert stretch_budget(1e-3, 10, c) == round(c.fuse_max_s / 1e-3)
    assert stretch_budget(1.0, 10, c) == 2
    assert stretch_budget(0.0, 1, c) == c.max_fused_cap


def test_no_fusion_below_two_tasks_or_across_communication() -> None:
    p = Program("mixed")
    a, s = p.dataset("a", 2), p.dataset("s", 1)
    p.load([a], lambda i, n: np.ones(1))
    p.compute(lambda x: x + 1, [a], [a], name="inc")
    p.reduce(a, s)
    p.compute(lambda x: x * 2, [s], [s], name="one_task")
    p.report(s)
    st = WorkerState(p.finalize(), 0, 1)
    st.start()
    st.handle(Placement(1, PartitionMap.initial([2, 1], 1)))
    kinds = {(t.stage.name, t.kind) for t in st.tasks.values()}
    assert ("inc", K_FUSED) in kinds  # 1 instance x 2 partitions
    assert ("one_task", K_COMPUTE) in kinds  # a lone task is not fused


def test_a_stretch_sizes_the_next_from_its_measured_time() -> None:
    st, out = placed(compute_loop(parts=2, iters=40), 0, 1, max_fused=8)
    for _ in range(2):
        out = st.handle(done(out[0].task, (np.zeros(1), np.ones(1))))
    fused = out[0].task
    assert fused.kind == K_FUSED
    st.handle(done(fused, [(p, p.value) for row in fused.stretch.parts for p in row.values()],
                   seconds=8 * 1e-3))  # 1 ms tasks, no communication between them
    assert st.max_fused == stretch_budget(1e-3, 2, st.config) and not st.lone_stages
    fixed, out = placed(compute_loop(parts=2, iters=40), 0, 1, max_fused=8, adapt_fused=False)
    for _ in range(2):
        out = fixed.handle(done(out[0].task, (np.zeros(1), np.ones(1))))
    fixed.handle(done(out[0].task, [(p, p.value) for row in out[0].task.stretch.parts
                                    for p in row.values()], seconds=8 * 1e-3))
    assert fixed.max_fused == 8


def finish_stretch(st: WorkerState, task: Task, seconds: float) -> list:
    """Finish fused ``task`` as if it took ``seconds``, its partitions' values unchanged."""
    assert task.stretch is not None
    return st.handle(done(task, [(p, p.value) for row in task.stretch.parts
                                 for p in row.values()], seconds=seconds))


def test_the_first_stretch_is_small_until_one_has_been_timed() -> None:
    # Nothing bounds a stretch in seconds before one has been timed, and no message is read
    # while one runs: slow kernels in a long compute-only loop must not make the first stretch
    # hold messages for the whole loop.
    st, out = placed(compute_loop(parts=2, iters=4000), 0, 1)
    for _ in range(2):
        out = st.handle(done(out[0].task, (np.zeros(1), np.ones(1))))
    first = out[0].task
    assert first.kind == K_FUSED and first.stretch.tasks == 2  # one instance on 2 partitions
    assert [s.name for s, _, _ in first.stretch.instances] == ["add"]
    out = finish_stretch(st, first, seconds=2 * 1e-6)  # 1 µs kernels ...
    second = out[0].task  # ... but 'dbl' has not been timed: it may take anything
    assert [s.name for s, _, _ in second.stretch.instances] == ["dbl"]
    out = finish_stretch(st, second, seconds=2 * 1e-6)
    third = out[0].task  # both known: a long stretch
    assert third.kind == K_FUSED
    assert third.stretch.tasks == stretch_budget(1e-6, 2, st.config) == 5000
    assert not st.lone_stages and not st.slow_stages


def test_a_first_instance_on_more_partitions_than_a_first_stretch_runs_as_timed_tasks() -> None:
    # one instance on each of 32 partitions of 0.5 s kernels ran as one 16 s stretch
    st, out = placed(compute_loop(parts=4, iters=100), 0, 1, window=4)
    while out[0].task.kind == K_LOAD:
        out = st.handle(done(out[0].task, (np.zeros(1), np.ones(1))))
    assert {t.kind for t in st.tasks.values()} == {K_COMPUTE}  # nothing fused: not timed
    seconds = {"add": 0.5, "dbl": 1e-6}  # a slow plain-Python stage and a fast one
    while not any(t.kind == K_FUSED for t in st.tasks.values()):
        task = out[0].task
        out = st.handle(done(task, (np.zeros(1),), seconds=seconds[task.stage.name]))
    # 'dbl' is timed, and fuses; 'add' is slow, and its tasks run alone from now on
    assert [s.name for s in st.program.stages if s.id in st.slow_stages] == ["add"]
    fused = [t for t in st.tasks.values() if t.kind == K_FUSED]
    assert all(s.name == "dbl" for t in fused for s, _, _ in t.stretch.instances)


def test_a_stage_never_timed_joins_only_a_first_size_stretch() -> None:
    # A fast loop sized stretches of thousands of tasks; the next loop's slow stage then ran
    # as one such stretch, holding every message for as long as thousands of its tasks took.
    p = Program("two_loops")
    a = p.dataset("a", 2)
    p.load([a], lambda i, n: np.zeros(1))
    with p.loop(3000):
        p.compute(lambda x: x + 1.0, [a], [a], name="fast")
    with p.loop(3000):
        p.compute(lambda x: x * 1.0, [a], [a], name="slow")
    p.report(a)
    st, out = placed(p.finalize(), 0, 1)
    out = st.handle(done(out[0].task, (np.zeros(1),)))
    out = st.handle(done(out[0].task, (np.zeros(1),)))
    while True:  # the fast loop, at 1 µs a task
        task = out[0].task
        names = {s.name for s, _, _ in task.stretch.instances}
        if "slow" in names:
            break
        out = finish_stretch(st, task, seconds=task.stretch.tasks * 1e-6)
    assert task.stretch.tasks <= 2  # not the 5,000 the fast loop's time allowed


def test_stages_too_slow_to_fuse_run_as_ordinary_tasks() -> None:
    # A stretch covers every local partition and is sized from the last one's time: one of
    # 0.5 s tasks held every message for seconds (minutes, after fast ones). Such stages run
    # as ordinary tasks, so that a message waits at most one task.
    st, out = placed(compute_loop(parts=2, iters=40), 0, 1)
    for _ in range(2):
        out = st.handle(done(out[0].task, (np.zeros(1), np.ones(1))))
    first = out[0].task
    assert first.kind == K_FUSED and first.stretch.instances[0][0].name == "add"
    out = finish_stretch(st, first, seconds=2 * 0.5)  # plain Python: nothing was compiled
    assert st.slow_stages == {first.stretch.instances[0][0].id}
    # the next stretch stops before 'add', which then runs as ordinary tasks, one instance at
    # a time (a snapshot's barrier comes after everything emitted)
    (dbl,) = st.tasks.values()
    assert dbl.kind == K_FUSED and [s.name for s, _, _ in dbl.stretch.instances] == ["dbl"]
    finish_stretch(st, dbl, seconds=2 * 1e-6)
    assert [(t.stage.name, t.kind, t.part) for t in st.tasks.values()] == [
        ("add", K_COMPUTE, 0), ("add", K_COMPUTE, 1), ("dbl", K_FUSED, 0)]
    # a numba kernel's first timed stretch may include compiling it: not yet slow
    import numba

    p = Program("jit")
    a = p.dataset("a", 2)
    p.load([a], lambda i, n: np.zeros(1))
    with p.loop(40):
        p.compute(numba.njit(lambda x: x + 1.0), [a], [a], name="jit_inc")
    p.report(a)
    jit, out = placed(p.finalize(), 0, 1)
    for _ in range(2):
        out = jit.handle(done(out[0].task, (np.zeros(1),)))
    task = out[0].task
    jit._tune_fusion(task, 2 * 0.5)
    assert not jit.slow_stages
    jit._tune_fusion(task, 2 * 0.5)
    assert jit.slow_stages == {task.stretch.instances[0][0].id}


def test_a_stretch_cut_by_the_size_limit_does_not_make_its_stage_lone() -> None:
    # Stretches of one instance because the budget allowed no more say nothing about the
    # program: the stage has no communication around it, so fusing it stays worth it.
    st, out = placed(compute_loop(parts=2, iters=40), 0, 1)
    for _ in range(2):
        out = st.handle(done(out[0].task, (np.zeros(1), np.ones(1))))
    first = out[0].task
    assert first.kind == K_FUSED and len(first.stretch.instances) == 1
    assert first.stretch.limited
    for _ in range(2):  # 1 ms tasks: lone after the second such stretch, had the program cut it
        st._tune_fusion(first, 2 * 1e-3)
    assert not st.lone_stages


def test_long_one_instance_stretches_become_ordinary_tasks() -> None:
    # inc sits between a broadcast and a reduce: a stretch of it is one instance.
    import numba

    p = Program("between")
    a, w, s = p.dataset("a", 3), p.dataset("w", 1), p.dataset("s", 1)
    p.load([a], lambda i, n: np.ones(1))
    p.load([w], lambda i, n: np.ones(1))
    with p.loop(3):
        p.broadcast(w, a)
        p.compute(numba.njit(lambda x: x + 1), [a], [a], name="inc")  # compiled when first run
        p.reduce(a, s)
    p = p.finalize()
    lone = st_lone = None
    for seconds, expect in ((3 * 1e-5, False), (3 * 5e-5, False), (3 * 5e-5, True)):
        # 10 µs tasks: fusing them is worth it; 50 µs: not, but a stage's first timed
        # stretch includes compiling, so only the second makes the stage lone
        if lone is None or not expect:
            st_lone, out = placed(p, 0, 1, window=1000, max_fused=3)  # 3 partitions
        assert st_lone is not None
        fused = next(t for t in st_lone.tasks.values() if t.kind == K_FUSED)
        assert len(fused.stretch.instances) == 1
        inc = fused.stretch.instances[0][0].id
        st_lone._tune_fusion(fused, seconds)
        lone = st_lone.lone_stages
        assert (inc in lone) is expect, (seconds, lone)
    # A fresh interpreter that has learnt the same emits every iteration's inc as ordinary
    # tasks, without waiting for anything.
    st2 = WorkerState(p, 0, 1, window=1000, max_fused=3)
    st2.lone_stages.add(inc)  # before the placement, which emits the loop
    st2.start()
    st2.handle(Placement(1, PartitionMap.initial([3, 1, 1], 1)))
    kinds = [t.kind for t in st2.tasks.values() if t.stage.name == "inc"]
    assert kinds == [K_COMPUTE] * 9


# ------------------------------------------------------------------ urgency, story, config
def test_signals_and_small_scatters_are_urgent_large_scatters_and_compute_are_not() -> None:
    p = Program("sizes")
    small, big, s = p.dataset("small", 1), p.dataset("big", 1), p.dataset("s", 1)
    p.load([small, big], lambda i, n: (np.zeros(8), np.zeros(SMALL // 8 + 1)))
    p.reduce(small, s, name="r_small")
    p.reduce(big, s, name="r_big")
    p.compute(lambda x: x, [small], [small], name="c")
    st = WorkerState(p.finalize(), 0, 1, max_fused=0, inline=False)
    st.start()
    out = st.handle(Placement(1, PartitionMap.initial([1, 1, 1], 1)))
    st.handle(done(out[0].task, (np.zeros(8), np.zeros(SMALL // 8 + 1))))
    by_name = {(t.stage.name, t.kind): t for t in st.tasks.values()}
    assert is_urgent(by_name[("r_small", K_SCATTER)], SMALL)
    assert not is_urgent(by_name[("r_big", K_SCATTER)], SMALL)  # 64 KB + 8 bytes
    assert not is_urgent(by_name[("c", K_COMPUTE)], SMALL)
    assert not is_urgent(by_name[("r_small", K_GATHER)], SMALL)
    st2, out = placed(while_program(), worker=0)
    sig = st2.handle(done(out[0].task, (np.zeros(1),)))[0].task
    assert sig.kind == K_SIGNAL and is_urgent(sig, SMALL)


def test_story_tells_why_a_stage_instances_tasks_ran() -> None:
    p, s_id = reduce_program()
    st0, out = placed(p, worker=0, inline=False)
    load_done = done(out[0].task, (np.full(3, 1.0),))
    out = st0.handle(load_done)
    scatter_done = done(out[0].task, np.full(3, 1.0))
    st0.handle(scatter_done)  # s[0]'s gather waits for worker 1's piece
    piece = Piece(1 << 41 | 5, 1, s_id, 1, (0,), (1,), np.full(3, 2.0))
    out = st0.handle(piece)
    gather = out[0].task
    story = [(r.what, r.tid, r.cause) for r in st0.story(1)]
    assert story == [
        ("emit", -1, 1),  # the reduce (seq 1) was emitted when the placement came (eid 1)
        ("ready", story[1][1], load_done.eid),  # its scatter: ready once the load was done
        ("run", story[1][1], load_done.eid),
        ("done", story[1][1], scatter_done.eid),
        ("recv", -1, piece.eid),  # the piece from worker 1 ...
        ("ready", gather.tid, piece.eid),  # ... made the gather ready, and it ran
        ("run", gather.tid, piece.eid),
    ]
    assert [r.what for r in st0.story_of_event(piece.eid)] == ["recv"]
    assert WorkerState(p, 0, 2, story_size=0).story(1) == []


def test_config_reads_the_environment_once_with_clear_errors() -> None:
    c = WorkerConfig.from_env({"CANARY_MAX_FUSED": "0", "CANARY_SPIN_US": "250",
                               "CANARY_COMPILE_AFTER": "10"}, window=8)
    assert (c.max_fused, c.spin_s, c.compile_after, c.window) == (0, 250e-6, 10, 8)
    assert WorkerConfig.from_env({}) == WorkerConfig()
    with pytest.raises(ValueError, match=r"CANARY_MAX_FUSED='lots' is not an integer"):
        WorkerConfig.from_env({"CANARY_MAX_FUSED": "lots"})
    with pytest.raises(ValueError, match=r"WorkerConfig.window must be an integer >= 1"):
        WorkerConfig(window=0)
    with pytest.raises(TypeError, match=r"no field\(s\) \['windw'\]"):
        WorkerConfig.from_env({}, windw=3)


def test_a_dropped_worker_state_frees_its_partitions_without_waiting_for_a_collection(
        validated: list[WorkerState]) -> None:
    # its handlers were bound methods in a dict of its own: a cycle, so a pool worker kept an
    # ended job's partitions (300 MB) until Python's next full collection
    import gc
    import weakref

    p, _ = reduce_program()
    st = WorkerState(p, 0, 2, inline=False)
    st.start()
    out = st.handle(Placement(1, PartitionMap.initial([g[0].partitions for g in p.groups], 2)))
    big = np.full(1000, 1.0)
    st.handle(done(out[0].task, (big,)))
    freed, held = weakref.ref(st), weakref.finalize(big, lambda: None)
    st.validate_state()
    validated.remove(st)  # the fixture's own reference
    del st, out, big
    gc.disable()
    try:
        assert freed() is None and not held.alive
    finally:
        gc.enable()


def test_report_marks_stay_bounded_on_a_worker_that_holds_no_reported_partition() -> None:
    # A worker holding no partition of a reported dataset (every worker but one, for a model
    # reported each iteration) kept the report's mark for every instance: one entry an
    # iteration, for the whole job (MBs an hour on a long run).
    p = Program("reported")
    c = p.dataset("c", 1)
    p.load([c], lambda i, n: np.zeros(1))
    with p.loop(300):
        p.compute(lambda v: v + 1, [c], [c], name="inc")
        p.report(c)
    prog = p.finalize()
    idle, out = placed(prog, worker=1)  # c lives on worker 0
    assert out == [Send.match(message=Done.match())] and idle.ended and idle.seq > 600
    assert idle.report_marks == {}
    holder, out = placed(prog, worker=0, max_fused=0)
    run_tasks(holder, out)
    assert holder.ended and holder.report_marks == {}


def test_report_marks_stay_bounded_over_a_long_job_with_moves() -> None:
    # the same over the whole job, every worker, with partitions moving between them
    import canary

    p = Program("reported_loop")
    x, s = p.dataset("x", 4), p.dataset("s", 1)
    p.load([x], lambda i, n: np.full(2, float(i)))
    p.load([s], lambda i, n: np.zeros(2))
    with p.while_(lambda v: v[0] < 1e18, on=s, max_iter=400):
        p.compute(lambda v: v + 1, [x], [x], name="inc")
        p.reduce(x, s)
        p.report(s)
    most = [0]

    def watch(ctrl: Any, states: list[WorkerState]) -> list[Any]:
        most[0] = max(most[0], *(len(st.report_marks) for st in states))
        return []

    r = canary.run_local(p, workers=2, seed=3, chaos=3, inject=watch)
    assert r.value("s")[0] == 4 * 400 + 6  # 400 passes over x = 0..3
    assert most[0] <= WorkerConfig().window, most[0]
