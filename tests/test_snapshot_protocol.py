"""The snapshot protocol on the pure state machines, event by event (no MPI, no files): each rule
of ``canary.worker.snapshots`` and ``canary.controller.snapshots`` as exact instruction lists."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from canary.controller.state import ControllerState
from canary.messages import (
    CommitSnapshot,
    Hello,
    MigrateAccept,
    MigrateArray,
    MigrateData,
    MigrateOffer,
    MigrateOut,
    MoveRequest,
    Placement,
    Progress,
    ReadSnapshot,
    ReportPart,
    Send,
    SnapshotAsk,
    SnapshotAt,
    SnapshotCommitted,
    SnapshotLoaded,
    SnapshotPosition,
    SnapshotSaved,
    SnapshotWritten,
    Tick,
    WriteSnapshot,
)
from canary.partition_map import PartitionMap
from canary.program import Program
from canary.snapshot import SnapshotConfig
from canary.worker.state import WorkerState
from tests.test_worker_state import EIDS, placed, run_tasks, validated  # noqa: F401


def counting_program(iters: int = 4) -> Program:
    """a (2 partitions) += 1, ``iters`` times, then reported."""
    p = Program("count")
    a = p.dataset("a", 2)
    p.load([a], lambda i, n: np.full(2, 10.0 * i))
    with p.loop(iters):
        p.compute(lambda v: v + 1.0, [a], [a], name="inc")
    p.report(a)
    return p.finalize()


def test_a_worker_asked_stops_where_it_is_and_says_so() -> None:
    st, out = placed(counting_program(), 0, n_workers=1, max_fused=0, window=1)
    at = st.seq
    ask = st.handle(SnapshotAsk(next(EIDS), 7))
    assert ask == [Send.match(dest=0, message=SnapshotPosition.match(snap=7, worker=0, seq=at,
                                                                     ended=False))]
    seen = run_tasks(st, out)
    assert st.seq == at and not st.live  # its tasks ran; it emitted nothing past where it was
    assert not [i for i in seen if isinstance(i, WriteSnapshot)]  # no barrier named yet


def test_at_the_barrier_a_quiet_worker_writes_then_goes_on() -> None:
    p = counting_program()
    st, out = placed(p, 0, n_workers=1, max_fused=0, window=1)
    st.handle(SnapshotAsk(next(EIDS), 1))
    run_tasks(st, out)
    barrier = st.seq + 3  # further than this worker stood (another worker was ahead)
    out = st.handle(SnapshotAt(next(EIDS), 1, barrier))
    seen = out + run_tasks(st, out)
    writes = [i for i in seen if isinstance(i, WriteSnapshot)]
    assert st.seq == barrier and not st.live
    assert len(writes) == 1 and writes[0].snap == 1 and writes[0].seq == barrier
    # its partitions as they stand after every instance before the barrier
    assert [(n, i) for n, i, _, _ in writes[0].arrays] == [("a", 0), ("a", 1)]
    done_incs = barrier - 1  # the load is instance 0, then one instance per increment
    assert [v.tolist() for _, _, v, _ in writes[0].arrays] == [[done_incs] * 2,
                                                               [10.0 + done_incs] * 2]
    assert all(last == barrier - 1 for _, _, _, last in writes[0].arrays)
    out = st.handle(SnapshotSaved(next(EIDS), 1, [{"dataset": "a"}]))
    written = [i.message for i in out if isinstance(i, Send)]
    assert written == [SnapshotWritten.match(snap=1, worker=0, error=None,
                                             entries=[{"dataset": "a"}], tasks_run=2 * barrier)]
    assert written[0].position["seq"] == barrier and written[0].position["counters"] == [barrier - 1]
    run_tasks(st, out)
    assert st.ended and st.done_sent  # went on to the end


def test_an_abandoned_snapshot_lets_the_worker_go_on() -> None:
    st, out = placed(counting_program(), 0, n_workers=1, max_fused=0, window=1)
    st.handle(SnapshotAsk(next(EIDS), 1))
    run_tasks(st, out)
    at = st.seq
    out = st.handle(SnapshotAt(next(EIDS), 1, None))
    seen = out + run_tasks(st, out)
    assert st.seq > at and st.done_sent
    assert not [i for i in seen if isinstance(i, WriteSnapshot)]


def test_a_resumed_worker_reads_what_it_owns_before_it_emits_anything() -> None:
    p = counting_program()
    # the position after the load and two increments, found by running a worker to it
    ref, out = placed(p, 0, n_workers=1, max_fused=0, window=1)
    ref.handle(SnapshotAsk(next(EIDS), 1))
    run_tasks(ref, out)
    out = ref.handle(SnapshotAt(next(EIDS), 1, 3))
    run_tasks(ref, out)
    position = ref.position()
    assert position["seq"] == 3
    st = WorkerState(p, 1, 2, restore=position, max_fused=0)
    st.start()
    out = st.handle(Placement(next(EIDS), PartitionMap.initial([2], 2)))
    assert out == [ReadSnapshot([("a", 1)], out[0].cause)]  # worker 1 owns partition 1
    assert st.seq == 3 and not st.tasks
    out = st.handle(SnapshotLoaded(next(EIDS), {("a", 1): (np.full(2, 12.0), 2)}))
    seen = out + run_tasks(st, out)
    parts = [i.message for i in seen if isinstance(i, Send)
             and isinstance(i.message, ReportPart)]
    assert [m.array.tolist() for m in parts] == [[14.0, 14.0]]  # 12 + the two increments left


def test_a_position_at_a_loop_or_branch_test_names_its_signal_stage() -> None:
    # snapshots taken there were said to be "at op 3": an index into canary's own op list
    p = Program("tests")
    s = p.dataset("s", 1)
    p.load([s], lambda i, n: np.zeros(1))
    with p.while_(lambda v: bool(v[0] < 3), on=s, name="more"):
        p.compute(lambda v: v + 1, [s], [s], name="inc")
    with p.if_(lambda v: bool(v[0] > 9), on=s, name="big"):
        p.compute(lambda v: v + 1, [s], [s], name="inc2")
    p.finalize()
    where = {}
    for pc, op in enumerate(p.ops):
        if op[0] in ("while", "if"):
            st = WorkerState(p, 1, 1, restore={"pc": pc, "counters": [2] if op[0] == "while"
                                               else [], "seq": 0, "program_tasks": 0})
            where[op[0]] = st.position()["where"]
    assert where == {"while": "before stage 'more' (id 1, iteration (2,))",
                     "if": "before stage 'big' (id 3)"}


def test_a_resumed_worker_moves_a_partition_only_once_the_snapshots_values_are_in() -> None:
    # run_local found it (seed 189 of a fuzz run): a move reached a resumed worker between its
    # ReadSnapshot and the SnapshotLoaded the runtime answers later. The partition left with
    # no value, and the loaded value then named a partition the worker no longer held.
    p = counting_program()
    ref, out = placed(p, 0, n_workers=1, max_fused=0, window=1)
    ref.handle(SnapshotAsk(next(EIDS), 1))
    run_tasks(ref, out)
    run_tasks(ref, ref.handle(SnapshotAt(next(EIDS), 1, 3)))
    st = WorkerState(p, 1, 2, restore=ref.position(), max_fused=0)
    st.start()
    st.handle(Placement(next(EIDS), PartitionMap.initial([2], 2)))  # asks for ("a", 1)
    out = st.handle(MigrateOut(next(EIDS), 1, 0, 1, 0, 2))
    assert out == [Send.match(dest=1, message=MigrateOffer.match(move=1, seq=3))]
    assert st.handle(MigrateAccept(next(EIDS), 1, 3)) == []  # the cut has passed: no task left
    out = st.handle(SnapshotLoaded(next(EIDS), {("a", 1): (np.full(2, 12.0), 2)}))
    sent = [i.message for i in out if isinstance(i, Send)]
    assert sent[0] == MigrateData.match(move=1, cut=3, last_seqs=(2,), valued=(0,))
    assert [type(m) for m in sent[:2]] == [MigrateData, MigrateArray]
    assert sent[1].array.tolist() == [12.0, 12.0]  # what the snapshot held, not nothing
    assert not st.parts


# ------------------------------------------------------------------ the controller
def placed_controller(tmp: str, every: float = 10.0, workers: int = 2) -> ControllerState:
    p = counting_program()
    c = ControllerState(p, workers, stall_s=float("inf"), checkpoint=SnapshotConfig(tmp, every_s=every,
                                                               script="s.py", args=("-x",)))
    for w in range(workers):
        c.handle(Hello(next(EIDS), w, p.digest, p.statements()))
    return c


def every_worker(message: Any) -> list[Any]:
    return [Send.match(dest=1, message=message), Send.match(dest=2, message=message)]


def written(snap: int, worker: int, seq: int, error: str | None = None) -> SnapshotWritten:
    pos = {"seq": seq, "pc": 3, "counters": [1], "program_tasks": 9, "where": "here"}
    return SnapshotWritten(next(EIDS), snap, worker, error,
                           [] if error else [{"dataset": "a", "index": worker, "nbytes": 16}],
                           pos, 5, 0)


def test_the_controller_asks_when_due_names_the_furthest_position_and_commits(
        tmp_path: Any) -> None:
    c = placed_controller(str(tmp_path))
    assert c.handle(Tick(next(EIDS), 9.9)) == []
    out = c.handle(Tick(next(EIDS), 10.0))
    assert out == every_worker(SnapshotAsk.match(snap=1))
    assert c.handle(SnapshotPosition(next(EIDS), 1, 0, 5, False)) == []
    out = c.handle(SnapshotPosition(next(EIDS), 1, 1, 8, False))
    assert out == every_worker(SnapshotAt.match(snap=1, seq=8))
    assert c.handle(written(1, 1, 8)) == []
    out = c.handle(written(1, 0, 8))
    assert out == [CommitSnapshot.match(snap=1, results=[])]
    m = out[0].manifest
    assert (m["id"], m["workers"], m["script"], m["args"], m["tasks_run"], m["bytes"]) == (
        1, 2, "s.py", ["-x"], 10, 32)
    assert m["position"]["seq"] == 8 and m["digest"] == c.program.digest
    assert [e["index"] for e in m["arrays"]] == [0, 1]
    assert c.handle(SnapshotCommitted(next(EIDS), 1)) == [Progress.match()]
    assert c.snapshots_committed == 1
    assert c.handle(Tick(next(EIDS), 19.9)) == []  # the next one is due every_s later
    assert c.handle(Tick(next(EIDS), 20.0)) == every_worker(SnapshotAsk.match(snap=2))


def test_a_part_that_cannot_be_written_abandons_the_snapshot_not_the_job(tmp_path: Any) -> None:
    c = placed_controller(str(tmp_path))
    c.handle(Tick(next(EIDS), 10.0))
    c.handle(SnapshotPosition(next(EIDS), 1, 0, 5, False))
    c.handle(SnapshotPosition(next(EIDS), 1, 1, 5, False))
    out = c.handle(written(1, 1, 5, error="[Errno 28] No space left on device"))
    assert out == every_worker(SnapshotAt.match(snap=1, seq=None)) + [Progress.match()]
    assert "No space left on device" in out[2].line and "previous snapshot" in out[2].line
    assert c.handle(written(1, 0, 5)) == []  # the other part, late: nothing to commit
    assert c.failed is None and c.snapshot is None


def test_a_snapshot_asked_for_at_the_end_of_the_program_is_abandoned_quietly(
        tmp_path: Any) -> None:
    c = placed_controller(str(tmp_path))
    c.handle(Tick(next(EIDS), 10.0))
    c.handle(SnapshotPosition(next(EIDS), 1, 0, 9, True))
    out = c.handle(SnapshotPosition(next(EIDS), 1, 1, 9, False))
    assert out == every_worker(SnapshotAt.match(snap=1, seq=None))


def test_no_partition_moves_during_a_snapshot_and_none_starts_during_a_move(
        tmp_path: Any) -> None:
    c = placed_controller(str(tmp_path))
    c.handle(Tick(next(EIDS), 10.0))
    assert c.handle(MoveRequest(next(EIDS), ((0, 0, 1),))) == []
    c = placed_controller(str(tmp_path))
    out = c.handle(MoveRequest(next(EIDS), ((0, 0, 1),)))
    assert Send.match(dest=1, message=MigrateOut.match(index=0, dest=1)) in out
    assert [i for i in c.handle(Tick(next(EIDS), 10.0)) if isinstance(i, Send)] == []


def test_a_report_past_the_barrier_does_not_change_the_snapshot(tmp_path: Any) -> None:
    c = placed_controller(str(tmp_path))
    stage = next(s for s in c.program.stages if s.kind == "report").id

    def report(seq: int, value: float) -> None:
        for i in range(2):
            c.handle(ReportPart(next(EIDS), seq, stage, (), i, np.full(2, value), 1))

    report(4, 1.0)
    c.handle(Tick(next(EIDS), 10.0))
    c.handle(SnapshotPosition(next(EIDS), 1, 0, 6, False))
    c.handle(SnapshotPosition(next(EIDS), 1, 1, 6, False))
    report(7, 2.0)  # past the barrier: a worker that wrote its part went on
    c.handle(written(1, 0, 6))
    out = c.handle(written(1, 1, 6))
    assert [(n, k, v.tolist()) for n, k, v in out[0].results] == [("a", 0, [1.0, 1.0]),
                                                                  ("a", 1, [1.0, 1.0])]
    assert c.results["a"][0].tolist() == [2.0, 2.0]


def test_a_report_before_the_barrier_completing_after_one_past_it_is_in_the_snapshot(
        tmp_path: Any) -> None:
    # a partition that moved before the snapshot: its old worker's part of an earlier report
    # came after its new worker's part of a later one
    c = placed_controller(str(tmp_path))
    stage = next(s for s in c.program.stages if s.kind == "report").id
    c.handle(Tick(next(EIDS), 10.0))
    c.handle(SnapshotPosition(next(EIDS), 1, 0, 6, False))
    c.handle(SnapshotPosition(next(EIDS), 1, 1, 6, False))
    c.handle(ReportPart(next(EIDS), 4, stage, (), 0, np.full(2, 1.0), 1))
    for i in range(2):  # past the barrier, complete
        c.handle(ReportPart(next(EIDS), 7, stage, (), i, np.full(2, 2.0), 1))
    c.handle(ReportPart(next(EIDS), 4, stage, (), 1, np.full(2, 1.0), 1))  # before it, late
    c.handle(written(1, 0, 6))
    out = c.handle(written(1, 1, 6))
    assert [(n, k, v.tolist()) for n, k, v in out[0].results] == [("a", 0, [1.0, 1.0]),
                                                                  ("a", 1, [1.0, 1.0])]
    assert c.results["a"][0].tolist() == [2.0, 2.0]


def test_bad_settings_are_clear() -> None:
    with pytest.raises(ValueError, match="--keep must be at least 1"):
        SnapshotConfig("d", keep=0)
    with pytest.raises(ValueError, match="--checkpoint-every must be >= 0"):
        SnapshotConfig("d", every_s=-1)


def test_a_snapshot_names_the_worker_it_waits_for_and_not_those_that_answered(
        tmp_path: Any) -> None:
    # every worker's clock was reset while a snapshot was under way: a stopped worker, which
    # never answers, went unnamed for as long as the job waited for it
    p = counting_program()
    c = ControllerState(p, 2, stall_s=5.0, checkpoint=SnapshotConfig(str(tmp_path), every_s=10))
    for w in range(2):
        c.handle(Hello(next(EIDS), w, p.digest, p.statements()))

    def said(at: float) -> list[str]:
        return [i.line for i in c.handle(Tick(next(EIDS), at)) if isinstance(i, Progress)]

    said(10.0)  # the snapshot starts; no load report comes meanwhile
    assert said(14.9) == []  # counted from its start, not from the job's
    c.handle(SnapshotPosition(next(EIDS), 1, 0, 5, False))
    assert said(15.5) == ["canary: waiting for worker 1 (rank 2): it has not answered snapshot "
                          "1 for 6 s (stopped, swapping, stuck in a kernel, in a long fused "
                          "stretch, or writing to a slow disk?)"]
    c.handle(SnapshotPosition(next(EIDS), 1, 1, 5, False))
    c.handle(written(1, 0, 5))
    late = said(21.0)
    assert len(late) == 1 and late[0].startswith(
        "canary: waiting for worker 1 (rank 2): it has not written its part of snapshot 1 for ")
    c.handle(written(1, 1, 5))
    c.handle(SnapshotCommitted(next(EIDS), 1))
    assert said(25.9) == []  # worker 0 waited for the others until the last tick
    # the next snapshot started at that tick: neither answers it
    late = said(31.5)
    assert len(late) == 2 and all("it has not answered snapshot 2 for 6 s" in x for x in late)
    # a kernel numba compiles on its first call looks like a stuck one: said as a possibility
    c = ControllerState(p, 1, stall_s=5.0)
    c.handle(Hello(next(EIDS), 0, p.digest, p.statements()))
    assert [i.line for i in c.handle(Tick(next(EIDS), 6.0)) if isinstance(i, Progress)] == [
        "canary: waiting for worker 0 (rank 1): no task finished for 6 s (stopped, swapping, "
        "stuck in a kernel, compiling one on a first run, or in a long fused stretch: "
        "CANARY_MAX_FUSED=0 runs every task alone?)"]
