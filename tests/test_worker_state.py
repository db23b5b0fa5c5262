"""The worker state machine, driven event by event with no MPI and no kernels run."""

from __future__ import annotations

import numpy as np
import pytest

from canary.messages import Done, Hello, Piece, Placement, ReportPart, Send, Signal, TaskDone
from canary.partition_map import PartitionMap
from canary.program import Program
from worker.state import K_GATHER, K_LOAD, K_SCATTER, RunTask, WorkerState


def reduce_program() -> tuple[Program, int]:
    p = Program("reduce")
    x, s = p.dataset("x", 2), p.dataset("s", 1)
    p.load([x], lambda i, n: np.full(3, float(i + 1)))
    p.reduce(x, s)
    p.report(s)
    return p.finalize(), s.id


def placed(p: Program, worker: int, n_workers: int = 2) -> tuple[WorkerState, list]:
    st = WorkerState(p, worker, n_workers)
    hello = st.start()
    assert len(hello) == 1 and hello[0].dest == 0 and isinstance(hello[0].message, Hello)
    assert hello[0].message.digest == p.digest
    m = PartitionMap.initial([g[0].partitions for g in p.groups], n_workers)
    return st, st.handle(Placement(1, m))


def only_task(instrs: list) -> object:
    assert len(instrs) == 1 and isinstance(instrs[0], RunTask), instrs
    return instrs[0].task


def test_sender_side_of_a_reduce() -> None:
    p, s_id = reduce_program()
    st, out = placed(p, worker=1)
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
    st = WorkerState(p, 0, 2)
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


def test_run_ahead_window_bounds_live_instances() -> None:
    p = Program("chain")
    a = p.dataset("a", 1)
    p.load([a], lambda i, n: np.zeros(1))
    with p.loop(50):
        p.compute(lambda v: v + 1, [a], [a])
    st = WorkerState(p.finalize(), 0, 1, window=4)
    st.start()
    st.handle(Placement(1, PartitionMap.initial([1], 1)))
    assert len(st.live) == 4 and st.seq == 4
    st.validate_state()


def test_writes_wait_for_earlier_reads_and_reads_share() -> None:
    p = Program("rw")
    a, b, c = p.dataset("a", 1), p.dataset("b", 1), p.dataset("c", 1)
    p.load([a, b, c], lambda i, n: (np.zeros(1), np.zeros(1), np.zeros(1)))
    p.compute(lambda x: x, [a], [b], name="read1")
    p.compute(lambda x: x, [a], [c], name="read2")
    p.compute(lambda x: x + 1, [a], [a], name="write")
    st = WorkerState(p.finalize(), 0, 1)
    st.start()
    load = only_task(st.handle(Placement(1, PartitionMap.initial([1], 1))))
    out = st.handle(TaskDone(1, load, (np.zeros(1),) * 3))
    assert sorted(i.task.stage.name for i in out) == ["read1", "read2"]  # reads run together
    r1, r2 = (i.task for i in out)
    assert st.handle(TaskDone(2, r1, (np.zeros(1),))) == []  # write still waits for read2
    w = only_task(st.handle(TaskDone(3, r2, (np.zeros(1),))))
    assert w.stage.name == "write"
    st.validate_state()
