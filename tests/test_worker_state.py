"""The worker state machine, driven event by event with no MPI and no kernels run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from canary.worker.execute import run_task
from canary.worker.state import (
    FUSE_MAX,
    FUSE_MIN_INSTANCES,
    FUSE_TARGET,
    K_COMPUTE,
    K_FUSED,
    K_GATHER,
    K_LOAD,
    K_REPORT,
    K_SCATTER,
    LONE_TASK_S,
    MAX_FUSED,
    URGENT_MAX_BYTES,
    RunTask,
    WorkerState,
    is_urgent,
    stretch_budget,
)

from canary.messages import (
    Done,
    Hello,
    Piece,
    PieceBatch,
    Placement,
    ReportPart,
    Send,
    Signal,
    TaskDone,
)
from canary.partition_map import PartitionMap
from canary.program import Program


def reduce_program() -> tuple[Program, int]:
    p = Program("reduce")
    x, s = p.dataset("x", 2), p.dataset("s", 1)
    p.load([x], lambda i, n: np.full(3, float(i + 1)))
    p.reduce(x, s)
    p.report(s)
    return p.finalize(), s.id


def placed(p: Program, worker: int, n_workers: int = 2, **state: Any) -> tuple[WorkerState, list]:
    """A started WorkerState (``state``: its window, max_fused, inline) after the initial placement,
    and what that placement caused."""
    st = WorkerState(p, worker, n_workers, **state)
    hello = st.start()
    assert len(hello) == 1 and hello[0].dest == 0 and isinstance(hello[0].message, Hello)
    assert hello[0].message.digest == p.digest
    m = PartitionMap.initial([g[0].partitions for g in p.groups], n_workers)
    return st, st.handle(Placement(1, m))


def fused_tasks(st: WorkerState) -> list:
    return [t for t in st.tasks.values() if t.kind == K_FUSED]


def only_task(instrs: list) -> object:
    assert len(instrs) == 1 and isinstance(instrs[0], RunTask), instrs
    return instrs[0].task


def finish_until(st: WorkerState, instrs: list, kind: str,
                 finish: Callable[[Any], TaskDone]) -> list:
    """Finish the runnable tasks in order (``finish(task)`` is each one's TaskDone) until a
    task of ``kind`` has finished; return what that caused."""
    todo = [i.task for i in instrs if isinstance(i, RunTask)]
    while todo:
        t = todo.pop(0)
        got = st.handle(finish(t))
        if t.kind == kind:
            return got
        todo += [i.task for i in got if isinstance(i, RunTask)]
    raise AssertionError(f"no {kind} task ran")


def test_sender_side_of_a_reduce() -> None:
    p, s_id = reduce_program()
    st, out = placed(p, worker=1, inline=False)  # the scatter as a task (see test_inline_*)
    load = only_task(out)  # the scatter waits behind the load's write on x[1]
    assert (load.kind, load.part, load.seq) == (K_LOAD, 1, 0)
    arr = np.full(3, 2.0)
    scatter = only_task(st.handle(TaskDone(2, load, (arr,))))
    assert (scatter.kind, scatter.part, scatter.seq) == (K_SCATTER, 1, 1)
    out = st.handle(TaskDone(3, scatter, arr))
    assert [type(i.message) for i in out] == [Piece, Done]
    piece = out[0].message
    assert out[0].dest == 1  # worker 0 is rank 1
    assert (piece.seq, piece.dataset, piece.src, piece.dsts, piece.versions) == (1, s_id, 1, (0,), (1,))
    assert out[1].dest == 0 and out[1].message.tasks_run == 2
    st.validate_state()
    assert st.parts[(0, 1)].last_seq == 1  # metadata: last stage instance that touched x[1]


def test_receiver_gathers_in_source_order_even_when_pieces_come_early() -> None:
    p, s_id = reduce_program()
    st = WorkerState(p, 0, 2, inline=False)
    st.start()
    # The remote piece overtakes the placement (different senders): it must be held, not lost.
    assert st.handle(Piece(7, 1, s_id, 1, (0,), (1,), np.full(3, 2.0))) == []
    m = PartitionMap.initial([g[0].partitions for g in p.groups], 2)
    load = only_task(st.handle(Placement(1, m)))
    scatter = only_task(st.handle(TaskDone(2, load, (np.full(3, 1.0),))))
    gather = only_task(st.handle(TaskDone(3, scatter, np.full(3, 1.0))))
    assert gather.kind == K_GATHER and gather.part == 0
    fn, (pieces,) = st.task_call(gather)
    assert [pc[0] for pc in pieces] == [1.0, 2.0]  # ordered by source partition
    total = fn(pieces)
    report = only_task(st.handle(TaskDone(4, gather, total)))
    out = st.handle(TaskDone(5, report, np.array(total)))
    assert [type(i.message) for i in out] == [ReportPart, Done]
    assert out[0].message.array.tolist() == [3.0, 3.0, 3.0]
    st.validate_state()


def test_piece_from_newer_map_is_held_then_accepted_and_stale_is_forwarded() -> None:
    p, s_id = reduce_program()
    g = p.group_of(p.datasets[s_id])
    st, _ = placed(p, worker=1)  # s[0] belongs to worker 0 at version 1
    held = st.handle(Piece(9, 1, s_id, 0, (0,), (2,), np.zeros(3)))
    assert held == [] and len(st.held) == 1
    newer = PartitionMap.initial([gr[0].partitions for gr in p.groups], 2)
    newer.move(g, 0, 1)  # s[0] moved to worker 1, version 2
    st.handle(Placement(2, newer))
    assert st.held == [] and st.early[(1, 0)] == {0: pytest.approx(np.zeros(3))}
    # A stale sender (version 1) routes to worker 1, but worker 1's map now says... itself: accept.
    # Make worker 0 see the same update and receive a stale piece: it forwards to worker 1.
    st0, _ = placed(p, worker=0)
    st0.handle(Placement(3, newer))
    out = st0.handle(Piece(10, 1, s_id, 1, (0,), (1,), np.ones(3)))
    assert len(out) == 1 and isinstance(out[0], Send) and out[0].dest == 2
    assert out[0].message.versions == (2,) and out[0].message.src == 1


def while_program(n: int = 3) -> Program:
    p = Program("w")
    c = p.dataset("c", 1)
    p.load([c], lambda i, k: np.zeros(1))
    with p.while_(lambda v: v[0] < n, on=c, max_iter=10):
        p.compute(lambda v: v + 1, [c], [c], name="inc")
    return p.finalize()


def test_worker_without_the_partition_blocks_on_the_signal() -> None:
    p = while_program()
    st, out = placed(p, worker=1)  # c lives on worker 0
    assert out == [] and st.await_seq == 1 and not st.ended
    out = st.handle(Signal(1, 1, True))  # enter the body: its stage has no local task
    assert out == [] and st.await_seq == 3  # seq 2 was the body, seq 3 the next signal
    out = st.handle(Signal(2, 3, False))
    assert [type(i.message) for i in out] == [Done]
    assert st.ended


def test_signal_holder_broadcasts_the_value() -> None:
    p = while_program()
    st, out = placed(p, worker=0, n_workers=3)
    load = only_task(out)
    sig = only_task(st.handle(TaskDone(1, load, (np.zeros(1),))))
    fn, args = st.task_call(sig)
    assert fn(*args) is np.True_ or fn(*args) is True
    out = st.handle(TaskDone(2, sig, True))
    sends = [i for i in out if isinstance(i, Send)]
    assert sorted(s.dest for s in sends) == [2, 3]
    assert all(isinstance(s.message, Signal) and s.message.value for s in sends)
    assert any(isinstance(i, RunTask) and i.task.stage.name == "inc" for i in out)


def test_send_now_hands_signals_out_before_the_next_iteration_is_emitted() -> None:
    p = while_program()
    st, out = placed(p, worker=0, n_workers=3)
    load = only_task(out)
    sig = only_task(st.handle(TaskDone(1, load, (np.zeros(1),))))
    emitted_when_sent: list[list[str]] = []
    sent: list[Send] = []

    def send_now(ins: Send) -> None:
        sent.append(ins)
        emitted_when_sent.append([t.stage.name for t in st.tasks.values()])

    st.send_now = send_now
    out = st.handle(TaskDone(2, sig, True))
    # the same broadcast as without send_now, handed over before the loop body's task existed
    assert sorted(s.dest for s in sent) == [2, 3]
    assert all(isinstance(s.message, Signal) and s.message.value for s in sent)
    assert all("inc" not in names for names in emitted_when_sent)
    assert not any(isinstance(i, Send) for i in out)
    assert any(isinstance(i, RunTask) and i.task.stage.name == "inc" for i in out)


def test_run_ahead_window_bounds_live_instances() -> None:
    p = Program("chain")
    a = p.dataset("a", 1)
    p.load([a], lambda i, n: np.zeros(1))
    with p.loop(50):
        p.compute(lambda v: v + 1, [a], [a])
    st = WorkerState(p.finalize(), 0, 1, window=4, max_fused=0)
    st.start()
    st.handle(Placement(1, PartitionMap.initial([1], 1)))
    assert len(st.live) == 4 and st.seq == 4
    st.validate_state()


def compute_loop(parts: int, iters: int) -> Program:
    p = Program("loop")
    a, b = p.dataset("a", parts), p.dataset("b", parts)
    p.load([a, b], lambda i, n: (np.zeros(1), np.ones(1)))
    with p.loop(iters):
        p.compute(lambda x, y: x + y, [a, b], [a], name="add")
        p.compute(lambda y: y * 2, [b], [b], name="dbl")
    p.report(a)
    return p.finalize()


def test_compute_only_loop_runs_as_one_fused_stretch() -> None:
    p = compute_loop(parts=3, iters=10)
    st = WorkerState(p, 0, 1, max_fused=1000, inline=False)
    st.start()
    load = only_task(st.handle(Placement(1, PartitionMap.initial([3], 1)))[:1])
    # One fused task stands for all 20 instances on the 3 partitions, queued behind the loads.
    fused = fused_tasks(st)
    assert len(fused) == 1 and fused[0].waiting > 0
    stretch = fused[0].stretch
    assert [(s.name, seq, it) for s, seq, it in stretch.instances[:3]] == [
        ("add", 1, (0,)), ("dbl", 2, (0,)), ("add", 3, (1,))]
    assert stretch.idxs == [0, 1, 2] and stretch.tasks == 60
    assert st.seq == 22 and st.live == {0: 3, 20: 1, 21: 3}  # loads, the stretch, the report
    st.validate_state()
    out = []
    for i, t in enumerate([load] + [t for t in st.tasks.values() if t.kind == K_LOAD and t is not load]):
        out += st.handle(TaskDone(i, t, (np.zeros(1), np.ones(1))))
    task = only_task([i for i in out if isinstance(i, RunTask)])
    assert task is fused[0]
    ev = run_task(st, task)
    assert isinstance(ev, TaskDone)
    st.handle(ev)
    # a = sum of b's doublings 1 + 2 + ... + 2^9; b = 2^10; the report's reads are now granted
    assert [float(st.parts[(0, i)].value[0]) for i in range(3)] == [1023.0] * 3
    assert [float(st.parts[(1, i)].value[0]) for i in range(3)] == [1024.0] * 3
    assert st.tasks_run == 3 + 60 and st.stretches_run == 1
    assert all(st.parts[(d, i)].last_seq == 20 for d in (0, 1) for i in range(3))
    st.validate_state()


def test_fused_stretches_respect_max_fused_and_wait_for_each_other() -> None:
    st, _ = placed(compute_loop(parts=2, iters=10), 0, 1, max_fused=8)
    fused = fused_tasks(st)
    # 8 tasks = 4 instances on 2 partitions; the next instance waits for that stretch instead
    # of being emitted as ordinary tasks.
    assert len(fused) == 1 and fused[0].stretch.tasks == 8
    assert st.seq == 5 and all(t.kind in (K_LOAD, K_FUSED) for t in st.tasks.values())


def test_stretch_budget_amortises_rows_and_bounds_message_latency() -> None:
    # short tasks: about FUSE_TARGET seconds of them
    assert stretch_budget(1e-6, 10) == round(FUSE_TARGET / 1e-6)
    # 100 µs tasks on 10 rows: FUSE_TARGET would be a single stage; at least 8 stages instead
    assert stretch_budget(1e-4, 10) == FUSE_MIN_INSTANCES * 10
    # ... but never longer than FUSE_MAX seconds, and never fewer than 2 tasks
    assert stretch_budget(1e-3, 10) == round(FUSE_MAX / 1e-3)
    assert stretch_budget(1.0, 10) == 2
    assert stretch_budget(0.0, 1) == MAX_FUSED


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


def test_writes_wait_for_earlier_reads_and_reads_share() -> None:
    p = Program("rw")
    a, b, c = p.dataset("a", 1), p.dataset("b", 1), p.dataset("c", 1)
    p.load([a, b, c], lambda i, n: (np.zeros(1), np.zeros(1), np.zeros(1)))
    p.compute(lambda x: x, [a], [b], name="read1")
    p.compute(lambda x: x, [a], [c], name="read2")
    p.compute(lambda x: x + 1, [a], [a], name="write")
    st = WorkerState(p.finalize(), 0, 1, max_fused=0)  # ordinary tasks (fusion would merge them)
    st.start()
    load = only_task(st.handle(Placement(1, PartitionMap.initial([1], 1))))
    out = st.handle(TaskDone(1, load, (np.zeros(1),) * 3))
    assert sorted(i.task.stage.name for i in out) == ["read1", "read2"]  # reads run together
    r1, r2 = (i.task for i in out)
    assert st.handle(TaskDone(2, r1, (np.zeros(1),))) == []  # write still waits for read2
    w = only_task(st.handle(TaskDone(3, r2, (np.zeros(1),))))
    assert w.stage.name == "write"
    st.validate_state()


def test_long_one_instance_stretches_become_ordinary_tasks() -> None:
    # inc sits between a broadcast and a reduce: a stretch of it is one instance.
    p = Program("between")
    a, w, s = p.dataset("a", 3), p.dataset("w", 1), p.dataset("s", 1)
    p.load([a], lambda i, n: np.ones(1))
    p.load([w], lambda i, n: np.ones(1))
    with p.loop(3):
        p.broadcast(w, a)
        p.compute(lambda x: x + 1, [a], [a], name="inc")
        p.reduce(a, s)
    st, _ = placed(p.finalize(), 0, 1, window=1000)
    fused = fused_tasks(st)
    # the next iterations' stretches wait for this one (fused_live)
    assert len(fused) == 1 and len(fused[0].stretch.instances) == 1
    inc = fused[0].stretch.instances[0][0].id
    st.stretch_timed(fused[0], 3 * 1e-5)  # 10 µs tasks: fusing them is worth it
    assert inc not in st.lone_stages
    st.stretch_timed(fused[0], 3 * LONE_TASK_S)
    assert st.lone_stages == {inc}
    first = WorkerState(p.finalize(), 0, 1, window=1000)
    first.stretch_timed(fused[0], 3 * LONE_TASK_S)  # a first stretch includes compiling
    assert not first.lone_stages
    # A fresh interpreter that has learnt the same emits every iteration's inc as ordinary
    # tasks, without waiting for anything.
    st2 = WorkerState(p.finalize(), 0, 1, window=1000)
    st2.lone_stages.add(inc)  # before the placement, which emits the loop
    st2.start()
    st2.handle(Placement(1, PartitionMap.initial([3, 1, 1], 1)))
    kinds = [t.kind for t in st2.tasks.values() if t.stage.name == "inc"]
    assert kinds == [K_COMPUTE] * 9
    st2.validate_state()


def test_stretch_timed_keeps_fusing_multi_instance_stretches_of_long_tasks() -> None:
    st, _ = placed(compute_loop(parts=2, iters=10), 0, 1, max_fused=1000)
    fused = fused_tasks(st)
    st.stretch_timed(fused[0], 40 * 1e-3)  # 1 ms tasks, but no communication between them
    assert not st.lone_stages
    assert st.max_fused == stretch_budget(1e-3, 2)


def broadcast_loop(parts: int) -> tuple[Program, Any]:
    """A loop whose body starts with a broadcast of w to ``parts`` partitions of a, then a
    compute on a, a reduce into s and s copied back to w; the loop tests w. Returns the
    finalized program and w."""
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


def test_pause_for_sends_runs_a_loop_body_broadcast_before_emitting_the_rest() -> None:
    def at_signal(pause: bool) -> tuple[WorkerState, list]:
        """Run the loads and the first loop test; return the state and what the test's
        TaskDone caused."""
        st = WorkerState(broadcast_loop(2)[0], 0, 1, max_fused=0, inline=False)
        st.pause_for_sends = pause
        st.start()
        placed_out = st.handle(Placement(1, PartitionMap.initial([1, 2, 1], 1)))
        return st, finish_until(st, placed_out, "signal", lambda t: TaskDone(
            0, t, True if t.kind == "signal" else (np.ones(1),)))

    plain, _ = at_signal(pause=False)
    assert not plain.paused and "inc" in {t.stage.name for t in plain.tasks.values()}
    st, out = at_signal(pause=True)
    # the broadcast's scatter is runnable and nothing of the body after it exists yet
    assert [i.task.kind for i in out if isinstance(i, RunTask)] == [K_SCATTER]
    assert st.paused and "inc" not in {t.stage.name for t in st.tasks.values()}
    st.validate_state()
    st.resume()
    assert not st.paused
    assert {t.stage.name for t in st.tasks.values()} == {t.stage.name for t in plain.tasks.values()}
    assert st.seq == plain.seq
    st.validate_state()


def test_signals_and_small_scatters_are_urgent_large_scatters_and_compute_are_not() -> None:
    p = Program("sizes")
    small, big, s = p.dataset("small", 1), p.dataset("big", 1), p.dataset("s", 1)
    p.load([small, big], lambda i, n: (np.zeros(8), np.zeros(URGENT_MAX_BYTES // 8 + 1)))
    p.reduce(small, s, name="r_small")
    p.reduce(big, s, name="r_big")
    p.compute(lambda x: x, [small], [small], name="c")
    st = WorkerState(p.finalize(), 0, 1, max_fused=0, inline=False)
    st.start()
    load = only_task(st.handle(Placement(1, PartitionMap.initial([1, 1, 1], 1))))
    st.handle(TaskDone(0, load, (np.zeros(8), np.zeros(URGENT_MAX_BYTES // 8 + 1))))
    by_name = {(t.stage.name, t.kind): t for t in st.tasks.values()}
    assert is_urgent(by_name[("r_small", K_SCATTER)])
    assert not is_urgent(by_name[("r_big", K_SCATTER)])  # 64 KB + 8 bytes
    assert not is_urgent(by_name[("c", K_COMPUTE)])
    assert not is_urgent(by_name[("r_small", K_GATHER)])
    sig = while_program()
    st2, out = placed(sig, worker=0)
    sig_task = only_task(st2.handle(TaskDone(1, only_task(out), (np.zeros(1),))))
    assert sig_task.kind == "signal" and is_urgent(sig_task)


def test_a_scatter_sends_remote_pieces_before_delivering_local_ones() -> None:
    # The other worker waits on the remote piece; a local delivery only makes a gather runnable.
    p = Program("bcast")
    w, a = p.dataset("w", 1), p.dataset("a", 4)
    p.load([w], lambda i, n: np.ones(2))
    p.load([a], lambda i, n: np.zeros(2))
    p.broadcast(w, a)
    p.report(a)
    p.finalize()
    st, out = placed(p, worker=0, inline=False)
    got = finish_until(st, out, K_SCATTER, lambda t: run_task(st, t))
    kinds = ["send" if isinstance(i, Send) else i.task.kind for i in got]
    assert "send" in kinds and K_GATHER in kinds, kinds
    assert kinds.index(K_GATHER) > max(k for k, v in enumerate(kinds) if v == "send")
    piece = next(i.message for i in got if isinstance(i, Send))
    assert isinstance(piece, Piece) and all(st.map.owner(p.group_of(a), j) == 1 for j in piece.dsts)


def scatter_program(P: int, Q: int, nbytes: int, targets: Any = None) -> tuple[Program, int]:
    """P partitions of x, each of ``nbytes``, scattered (each source's partition as its one
    piece) to Q partitions of s, summed; s reported."""
    p = Program("scatter")
    x, s = p.dataset("x", P), p.dataset("s", Q)
    p.load([x], lambda i, n: np.full(nbytes // 8, float(i + 1)))
    p.scatter_gather(x, s, lambda a: a, "sum", targets=targets, one_piece=True)
    p.report(s)
    return p.finalize(), s.id


def scatter_sends(st: WorkerState, instrs: list) -> list[list[Any]]:
    """Run every runnable task in order; for each scatter task, the messages its completion
    sent."""
    got: list[list[Any]] = []
    todo = [i.task for i in instrs if isinstance(i, RunTask)]
    while todo:
        t = todo.pop(0)
        out = st.handle(run_task(st, t))
        if t.kind == K_SCATTER:
            got.append([i.message for i in out if isinstance(i, Send)
                        and not isinstance(i.message, (Done, ReportPart))])
        todo += [i.task for i in out if isinstance(i, RunTask)]
    return got


def test_a_workers_small_reduce_pieces_leave_together_after_its_last_scatter() -> None:
    # Worker 1 holds x[2] and x[3]; the gather of s[0] (worker 0) needs both anyway, so the
    # first piece waits for the second and both leave in one message, in source order.
    p, s_id = scatter_program(4, 1, 24)
    st1, out = placed(p, worker=1)
    sends = scatter_sends(st1, out)
    assert sends[0] == [] and len(sends[1]) == 1
    batch = sends[1][0]
    assert isinstance(batch, PieceBatch)
    assert [(q.seq, q.dataset, q.src, q.dsts) for q in batch.pieces] == [(1, s_id, 2, (0,)),
                                                                         (1, s_id, 3, (0,))]
    assert [q.array[0] for q in batch.pieces] == [3.0, 4.0]
    assert st1.sent.get("Piece", 0) == 0 and st1.sent["PieceBatch"] == 1
    assert not st1._batches and not st1._scatters_left  # nothing kept once the batch left
    st1.validate_state()
    # The receiver gathers from a batch exactly as from single pieces: 1+2+3+4 per element.
    st0, out0 = placed(p, worker=0)
    out0 = out0 + st0.handle(batch)
    todo = [i.task for i in out0 if isinstance(i, RunTask)]
    reports = []
    while todo:
        t = todo.pop(0)
        got = st0.handle(run_task(st0, t))
        reports += [i.message for i in got if isinstance(i, Send)
                    and isinstance(i.message, ReportPart)]
        todo += [i.task for i in got if isinstance(i, RunTask)]
    assert [r.array.tolist() for r in reports] == [[10.0, 10.0, 10.0]]
    st0.validate_state()


def test_pieces_leave_at_once_when_batching_could_delay_a_gather() -> None:
    # Large pieces are not kept (moving them is bandwidth-bound, and keeping them holds memory).
    p, _ = scatter_program(4, 1, URGENT_MAX_BYTES + 8)
    st1, out = placed(p, worker=1)
    sends = scatter_sends(st1, out)
    assert [[type(m) for m in s] for s in sends] == [[Piece], [Piece]]
    # s[0] (on worker 0) needs only x[2]; worker 1 also holds x[3], whose piece goes to s[1]
    # (its own): x[2]'s piece must not wait for x[3]'s scatter.
    p, _ = scatter_program(4, 2, 24, targets=lambda i: (0,) if i < 3 else (1,))
    st1, out = placed(p, worker=1)
    sends = scatter_sends(st1, out)
    assert [[(type(m), m.src) for m in s] for s in sends] == [[(Piece, 2)], []]


# ---------------------------------------------------------------- small moves run inline
def test_inline_a_reduce_runs_its_small_moves_inside_the_state_machine() -> None:
    p, s_id = reduce_program()
    # Worker 1 (x[1]): the load's TaskDone sends the piece at once; no scatter task is made.
    st1, out = placed(p, worker=1)
    arr = np.full(3, 2.0)
    got = st1.handle(TaskDone(2, only_task(out), (arr,)))
    assert [type(i.message) for i in got] == [Piece, Done]
    piece = got[0].message
    arr[:] = -1.0  # an in-place update of x[1] after the scatter must not reach the piece
    assert piece.array.tolist() == [2.0, 2.0, 2.0] and piece.dsts == (0,)
    assert (st1.tasks_run, st1.inline_run, got[1].message.tasks_run) == (2, 1, 2)
    st1.validate_state()
    # Worker 0 (x[0], s): its own piece waits in the gather; the remote one completes the sum.
    # The report of s stays a task (the runtime runs it after urgent ones, a loop's signal).
    st0, out = placed(p, worker=0)
    assert st0.handle(TaskDone(2, only_task(out), (np.full(3, 1.0),))) == []
    report = only_task(st0.handle(piece))
    assert report.kind == K_REPORT and st0.parts[(s_id, 0)].value.tolist() == [3.0, 3.0, 3.0]
    assert (st0.tasks_run, st0.inline_run) == (3, 2)  # load, scatter, gather
    got = st0.handle(run_task(st0, report))
    assert [type(i.message) for i in got] == [ReportPart, Done]
    assert got[0].message.array.tolist() == [3.0, 3.0, 3.0]
    st0.validate_state()


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
    p.load([big, small], lambda i, n: (np.zeros(URGENT_MAX_BYTES // 8 + 1), np.ones(2)))
    p.reduce(big, s1, name="r_big")  # 64 KB + 8 bytes: copying it is work, not bookkeeping
    p.reduce(small, s2, op=DoublingGather(), name="r_user")  # user code, not even hashable
    st = WorkerState(p.finalize(), 0, 1, max_fused=0)
    st.start()
    load = only_task(st.handle(Placement(1, PartitionMap.initial([1, 1, 1, 1], 1))))
    out = st.handle(TaskDone(0, load, (np.zeros(URGENT_MAX_BYTES // 8 + 1), np.ones(2))))
    ran = sorted((i.task.stage.name, i.task.kind) for i in out if isinstance(i, RunTask))
    # the small scatter of r_user ran inline and made its (user) gather runnable
    assert ran == [("r_big", K_SCATTER), ("r_user", K_GATHER)]
    assert st.inline_run == 1


def test_inline_broadcast_gives_each_local_partition_its_own_array() -> None:
    p = Program("bcast")
    w, a = p.dataset("w", 1), p.dataset("a", 3)
    p.load([w], lambda i, n: np.arange(4.0))
    p.broadcast(w, a)
    p.compute(lambda x: x, [a], [a], name="keep")
    st = WorkerState(p.finalize(), 0, 1, max_fused=0)
    st.start()
    loads = [i.task for i in st.handle(Placement(1, PartitionMap.initial([1, 3], 1)))]
    w0 = np.arange(4.0)
    st.handle(TaskDone(0, loads[0], (w0,)))
    values = [st.parts[(a.id, j)].value for j in range(3)]
    assert all(v.tolist() == [0.0, 1.0, 2.0, 3.0] for v in values)
    arrays = [w0, *values]
    assert not any(np.shares_memory(x, y) for k, x in enumerate(arrays) for y in arrays[k + 1:])
    assert st.inline_run == 4  # the scatter and three gathers
    st.validate_state()


def test_inline_loop_body_broadcast_leaves_before_the_rest_of_the_body_is_emitted() -> None:
    p, w = broadcast_loop(4)
    st, out = placed(p, worker=0, max_fused=0)
    assert st.map is not None and st.map.owner(p.group_of(w), 0) == 0  # w's holder sends
    seen: list[tuple[str, set[str]]] = []
    st.send_now = lambda ins: seen.append(
        (type(ins.message).__name__, {t.stage.name for t in st.tasks.values()}))
    finish_until(st, out, "signal", lambda t: TaskDone(
        0, t, True if t.kind == "signal" else (np.zeros(1),)))
    first_piece = next(names for kind, names in seen if kind == "Piece")
    assert "inc" not in first_piece  # sent while emitting the broadcast, before the body
    assert "inc" in {t.stage.name for t in st.tasks.values()}
    st.validate_state()
