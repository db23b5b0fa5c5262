"""The controller state machine: program check, placement, reports, end and abort."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest

from canary.controller.state import ControllerState
from canary.errors import ProgramMismatchError, TaskError
from canary.messages import (
    Abort,
    Callback,
    Done,
    Fail,
    Failed,
    Finish,
    Hello,
    LoadReport,
    Placement,
    Progress,
    ReportPart,
    Send,
    Shutdown,
    Tick,
)
from canary.program import Program, ReportEvent
from tests.conftest import declared_at


def program(parts: int = 4, callback: object = None) -> Program:
    p = Program("c")
    x, s = p.dataset("x", parts), p.dataset("s", 1)
    p.load([x], lambda i, n: np.ones(1))
    p.reduce(x, s)
    p.report(s, callback=callback)  # type: ignore[arg-type]
    return p.finalize()


def hello(p: Program, w: int) -> Hello:
    return Hello(w, w, p.digest, p.statements(), p.statement_sites())


def test_placement_only_after_every_worker_said_hello() -> None:
    p = program()
    c = ControllerState(p, 2)
    assert c.handle(hello(p, 0)) == []
    out = c.handle(hello(p, 1))
    assert [(i.dest, type(i.message)) for i in out] == [(1, Placement), (2, Placement)]
    assert out[0].message.map.owners == [[0, 0, 1, 1], [0]]
    c.validate_state()


def test_program_mismatch_aborts_naming_rank_and_statement() -> None:
    p, other = program(4), program(5)
    c = ControllerState(p, 2)
    c.handle(hello(p, 0))
    out = c.handle(hello(other, 1))
    assert out == [Send(1, Abort.match(reason=out[-1].reason), 1),
                   Send(2, Abort.match(reason=out[-1].reason), 1),
                   Fail.match(error=ProgramMismatchError, cause=1)]
    fail = out[-1]
    assert "rank 2 declared a different program" in fail.reason
    assert "dataset x/4" in fail.reason and "dataset x/5" in fail.reason
    assert c.handle(Done(3, 0, 1)) == []  # nothing after a failure


def test_program_mismatch_names_the_driver_line_of_the_statement_on_each_side() -> None:
    # it named the statement only: a driver branching on the rank declares it on another line
    def declared(rank: int) -> Program:
        p = Program("c")
        x = p.dataset("x", 2)
        p.load([x], lambda i, n: np.ones(1))
        if rank == 0:
            p.report(x, name="shown")  # declared: rank 0's
        else:
            p.compute(lambda v: v, [x], [x], name="step")  # declared: the worker's
        return p.finalize()

    mine, theirs = declared(0), declared(1)
    rank0, worker = declared_at("# declared: rank 0's"), declared_at("# declared: the worker's")
    must = ("The driver must declare the same statements on every rank: do not branch on the "
            "rank, time or unseeded randomness while declaring")
    (a, b) = mine.statements()[2], theirs.statements()[2]
    c = ControllerState(mine, 2)
    assert c.handle(hello(theirs, 1))[-1].reason == (
        f"rank 2 declared a different program than rank 0 (statement 2: rank 0 has '{a}', "
        f"declared at {rank0}; rank 2 has '{b}', declared at {worker}). {must}")
    # a Hello without sites (not known there) names rank 0's line alone
    c = ControllerState(mine, 2)
    assert c.handle(Hello(1, 1, theirs.digest, theirs.statements()))[-1].reason == (
        f"rank 2 declared a different program than rank 0 (statement 2: rank 0 has '{a}', "
        f"declared at {rank0}; rank 2 has '{b}'). {must}")


def test_report_callback_gets_all_partitions_in_order_and_result_is_kept() -> None:
    seen: list[ReportEvent] = []
    p = program(1, seen.append)
    c = ControllerState(p, 1)
    c.handle(hello(p, 0))
    out = c.handle(ReportPart(1, 2, 2, (), 0, np.array([4.0]), tasks=3, seconds=0.5))
    assert len(out) == 1 and isinstance(out[0], Callback)
    out[0].fn(out[0].event)
    assert seen[0].value.tolist() == [4.0] and seen[0].tasks == 3 and seen[0].dataset == "s"
    assert c.results["s"][0].tolist() == [4.0]


def test_the_result_is_the_latest_report_even_when_an_earlier_one_completes_last() -> None:
    # A partition moved between two reports: its new worker's part of the later report
    # overtook its old worker's part of the earlier one (run_local(seed=248) with a move
    # injected mid-loop ended with the earlier report's value as the job's result)
    p = Program("r")
    x = p.dataset("x", 2)
    p.load([x], lambda i, n: np.zeros(1))
    with p.loop(2):
        p.compute(lambda v: v + 1.0, [x], [x])
        p.report(x)
    p.finalize()
    c = ControllerState(p, 2)
    c.handle(hello(p, 0))
    c.handle(hello(p, 1))
    rep = next(s for s in p.stages if s.kind == "report").id
    c.handle(ReportPart(3, 2, rep, (0,), 0, np.array([1.0]), 1))  # the first report, part 0
    c.handle(ReportPart(4, 4, rep, (1,), 0, np.array([2.0]), 1))  # the second, from worker 1
    c.handle(ReportPart(5, 4, rep, (1,), 1, np.array([2.0]), 1))  # the second is complete
    c.handle(ReportPart(6, 2, rep, (0,), 1, np.array([1.0]), 1))  # the first, late
    assert [v.tolist() for v in c.results["x"]] == [[2.0], [2.0]]


def test_done_from_every_worker_shuts_down_once() -> None:
    p = program()
    c = ControllerState(p, 2)
    c.handle(hello(p, 0))
    c.handle(hello(p, 1))
    assert c.handle(Done(1, 0, 5)) == []
    out = c.handle(Done(2, 1, 6))
    assert out == [Send(1, Shutdown(3), 2), Send(2, Shutdown(4), 2), Finish(2)]
    assert c.tasks_run == 11
    assert c.handle(Done(3, 1, 6)) == []


def test_failed_task_aborts_everyone_with_its_message() -> None:
    p = program()
    c = ControllerState(p, 2)
    reason = "rank 2 (worker 1): stage 'g' ... boom"
    out = c.handle(Failed(7, 1, reason))
    assert out == [Send(1, Abort(1, reason), 7), Send(2, Abort(2, reason), 7),
                   Fail(reason, TaskError, 7)]


def test_zero_workers_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="at least one worker"):
        ControllerState(program(), 0)


# ---------------------------------------------------------------- progress lines on long runs
def never_ending() -> tuple[Program, int, int]:
    """A program whose ``while_`` never ends, its loop head's op index and its line here."""
    import inspect

    p = Program("forever")
    x, s = p.dataset("x", 2), p.dataset("s", 1)
    p.load([x], lambda i, n: np.zeros(1))
    p.reduce(x, s)
    frame = inspect.currentframe()
    assert frame is not None
    line = frame.f_lineno + 1
    with p.while_(lambda v: True, on=s, name="never"):
        p.compute(lambda v: v + 1, [x], [x], name="step")
        p.reduce(x, s)
    p.finalize()
    head = next(pc for pc, op in enumerate(p.ops) if op[0] == "while")
    return p, head, line


def progress_run(c: ControllerState, p: Program, head: int, until: float,
                 behind: int = 0) -> list[tuple[float, str]]:
    """Feed ``c`` (two workers of ``p``) a tick every 0.1 s and each worker's load report every
    0.5 s up to ``until`` seconds, both workers going round the loop 10 times a second, worker
    1 ``behind`` iterations behind worker 0; return ``(now, line)`` of each progress line."""
    for w in range(2):
        c.handle(hello(p, w))
    eid = 100
    lines = []
    for k in range(1, int(round(until * 10)) + 1):
        now = k / 10
        if k % 5 == 0:
            for w in range(2):
                it = k - w * behind  # 10 iterations a second, 3 stage instances each
                eid += 1
                c.handle(LoadReport(eid, w, 0.5, (), 0.1, 20, 2 + 3 * it, False, pc=head + 1,
                                    counters=(it,)))
        eid += 1
        lines += [(now, i.line) for i in c.handle(Tick(eid, now)) if isinstance(i, Progress)]
    return lines


def test_a_long_run_says_how_long_where_and_how_fast_once_a_period_from_half_of_one() -> None:
    p, head, line = never_ending()
    c = ControllerState(p, 2, progress_s=60.0)
    lines = progress_run(c, p, head, 30.0)
    # nothing at the 299 ticks before: a run shorter than that prints nothing new
    assert [now for now, _ in lines] == [30.0]
    assert re.fullmatch(r"canary: 30 s: while_ 'never' at tests/test_controller_state\.py:"
                        rf"{line} iteration 300, stage instance 902; 2\.4K tasks, 80 tasks/s; "
                        r"workers 80% busy", lines[0][1]), lines[0][1]


def test_progress_lines_come_no_faster_than_the_period_and_count_the_iterations() -> None:
    p, head, line = never_ending()
    c = ControllerState(p, 2, progress_s=60.0)
    lines = progress_run(c, p, head, 200.0)
    times = [now for now, _ in lines]
    assert times == [30.0, 90.0, 150.0]
    assert all(b - a >= 60.0 for a, b in zip(times, times[1:]))
    iterations = [int(n.replace(",", "")) for _, text in lines
                  for n in re.findall(r" iteration ([\d,]+)", text)]
    assert iterations == [300, 900, 1500]
    assert "canary: 2 min 30 s: " in lines[2][1] and "10 iterations/s" in lines[1][1]
    assert "iterations/s" not in lines[0][1]  # no earlier line to count from


def test_the_slowest_workers_position_is_said_and_the_fastest_beside_it() -> None:
    p, head, _ = never_ending()
    c = ControllerState(p, 2, progress_s=60.0)
    ((_, text),) = progress_run(c, p, head, 30.0, behind=40)
    assert "iteration 260, stage instance 782 (worker 1; worker 0 at 300);" in text, text
    # 2 iterations apart, less than a worker goes on by between two reports (5): reports taken
    # at different moments, not a worker behind, so nothing more is said
    c = ControllerState(p, 2, progress_s=60.0)
    ((_, text),) = progress_run(c, p, head, 30.0, behind=2)
    assert "iteration 298, stage instance 896;" in text and "worker 0" not in text, text


def test_no_progress_line_when_the_period_is_0_the_default() -> None:
    p, head, _ = never_ending()
    for c in (ControllerState(p, 2), ControllerState(p, 2, progress_s=0.0)):
        assert progress_run(c, p, head, 200.0) == []


def test_a_position_in_nested_loops_names_each_loop_outermost_first() -> None:
    from canary.controller.progress import ProgressMeter

    p = Program("nested")
    x = p.dataset("x", 1)
    p.load([x], lambda i, n: np.zeros(1), name="start")
    with p.loop(10):
        with p.while_(lambda v: True, on=x, max_iter=50, name="inner"):
            p.compute(lambda v: v, [x], [x], name="step")
    p.finalize()
    site = {op[0]: p.site(pc) for pc, op in enumerate(p.ops) if p.site(pc)}
    body = next(pc for pc, op in enumerate(p.ops) if op[0] == "stage" and op[1] == 2)
    meter = ProgressMeter(p, 1, 1.0)
    meter.report(LoadReport(1, 0, 0.5, (), 0.25, 8, 40, False, pc=body, counters=(3, 7)))
    assert meter.due(0.4) is None
    assert meter.due(0.5) == (
        f"canary: 0.5 s: loop(10) at {site['for']} iteration 3 > while_ 'inner' (max_iter 50) "
        f"at {site['while']} iteration 7, stage instance 40; 8 tasks, 16 tasks/s; "
        "workers 50% busy")
    meter.report(LoadReport(2, 0, 0.5, (), 0.0, 1, 41, False, pc=0, counters=()))
    assert f"stage 'start' at {p.site(0)}, stage instance 41;" in (meter.due(1.5) or "")
    meter.report(LoadReport(3, 0, 0.5, (), 0.0, 0, 99, True, pc=len(p.ops) - 1, counters=()))
    assert meter.due(2.5) is None  # every worker is done: the job is ending


@pytest.mark.parametrize("policy", [None, "balancing"])
def test_a_worker_with_a_core_of_its_own_that_keeps_waiting_for_it_is_named_once(
        policy: object) -> None:
    p = program()
    # with any move policy the line says it is at work
    c = ControllerState(p, 3, policy=_NoMoves() if policy else None,
                        own_cores=[True, True, False])
    for w in range(3):
        c.handle(hello(p, w))
    eids = itertools.count(100)

    def report(w: int, wait: float) -> list[str]:
        out = c.handle(LoadReport(next(eids), w, 0.5, (), 0.1, 20, 5, False, 0.3, wait))
        return [i.line for i in out if isinstance(i, Progress)]

    # worker 0: two reports over 25%, one under, then three in a row: named at the third, with
    # their mean wait (40%, 40%, 47%)
    assert report(0, 0.2) == report(0, 0.2) == report(0, 0.05) == []
    assert report(0, 0.2) == report(0, 0.2) == []
    (line,) = report(0, 0.235)
    remedy = ("balancing moves work off it where that makes the job faster" if policy else
              "canary run --balance on would move work off it where that makes the job faster")
    assert line == ("canary: worker 0 (rank 1) has a core of its own but waited for it 42% of "
                    "the time in its last 3 load reports: another process runs on its core, "
                    f"and the job runs slower than it would alone ({remedy})")
    assert [report(0, 0.3) for _ in range(5)] == [[]] * 5  # once
    # worker 1 waits 20% (under 25%); worker 2 shares its cores by placement: it waits for
    # the job's own ranks, which is not news
    assert [report(1, 0.1) for _ in range(5)] == [[]] * 5
    assert [report(2, 0.4) for _ in range(5)] == [[]] * 5


class _NoMoves:
    notes: list[str] = []

    def report(self, rep: LoadReport, now: float) -> None:
        pass

    def decide(self, now: float, ctrl: object) -> list[tuple[int, int, int, str]]:
        return []
