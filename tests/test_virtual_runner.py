"""The virtual-time runner: the real roles' answers, bit for bit, and a network model whose
times follow from its parameters."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import canary
from apps import kmeans, logistic_regression, pagerank
from canary.virtual_runner import (
    IDEAL,
    Links,
    Network,
    PollClock,
    Runtime,
    SharedCore,
    TaskCost,
    VirtualResult,
    next_batch,
    run_virtual,
    wire_bytes,
)
from canary.worker.config import WorkerConfig
from canary.worker.tasks import K_SIGNAL
from tests.conftest import mpirun

NET = Network(5e-6, 1e9, "test")
LR_ARGS = ["--generate", "3000,6", "--max-iter", "8", "--tol", "1e-30", "--print-every", "0"]


def same_results(a: dict[str, list[np.ndarray]], b: dict[str, list[np.ndarray]]) -> bool:
    return a.keys() == b.keys() and all(
        len(a[k]) == len(b[k]) and all(np.array_equal(x, y) for x, y in zip(a[k], b[k]))
        for k in a)


def build(app: Any, argv: list[str], workers: int) -> canary.Program:
    return app.build(app.parse_args(argv), workers)[0]


@pytest.mark.parametrize("app, argv", [
    (logistic_regression, LR_ARGS),
    (kmeans, ["--generate", "2000,4,3", "--max-iter", "5", "--print-every", "0"]),
    (pagerank, ["--generate", "512,4000", "--max-iter", "6", "--print-every", "0"]),
])
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_answers_and_counts_are_run_locals_bit_for_bit(app: Any, argv: list[str],
                                                       workers: int) -> None:
    ref = canary.run_local(build(app, argv, workers), workers=workers)
    got = run_virtual(build(app, argv, workers), workers, NET, validate=True)
    assert same_results(got.job.results, ref.results)
    assert got.job.tasks_run == ref.tasks_run
    assert got.job.scheduling_messages == ref.scheduling_messages
    assert got.job.worker_sent == ref.worker_sent


@pytest.mark.parametrize("workers", [1, 2])
def test_answers_and_counts_are_a_real_mpi_runs_bit_for_bit(tmp_path: Path, workers: int) -> None:
    out = tmp_path / "coef.npz"
    r = mpirun(workers + 1, "apps/logistic_regression.py", *LR_ARGS, "--output", str(out))
    assert r.returncode == 0, r.stderr
    real = json.loads(r.stdout.strip().splitlines()[-1])
    got = run_virtual(build(logistic_regression, LR_ARGS, workers), workers, NET)
    res = got.job.value("result")
    d = real["features"]
    with np.load(out) as f:
        assert np.array_equal(f["coef"], res[3:3 + d]) and float(f["intercept"]) == res[3 + d]
    assert (real["objective"], real["gradient_norm"]) == (float(res[1]), float(res[2]))
    assert real["tasks"] == got.job.tasks_run
    assert real["controller_messages"] == got.job.scheduling_messages


def fixed(seconds: float = 1e-3) -> Any:
    """A cost model that ignores the measured time: every task takes ``seconds``."""
    return lambda task, measured: seconds


def lr_virtual(workers: int, net: Network, **kw: Any) -> VirtualResult:
    return run_virtual(build(logistic_regression, LR_ARGS, workers), workers, net,
                       cost=fixed(), handle_s=0.0, load_reports=False, **{"runtime": IDEAL, **kw})


def test_with_fixed_costs_virtual_times_repeat_exactly_and_follow_latency_in_whole_hops() -> None:
    a, b = lr_virtual(2, NET), lr_virtual(2, NET)
    assert a.seconds == b.seconds and a.iteration_seconds() == b.iteration_seconds()
    iters = a.iteration_seconds()
    assert len(iters) == 7 and len(set(round(t, 12) for t in iters[1:])) == 1  # steady state
    # Once latency dominates the tasks, each second more of it adds whole hops to a loop: the
    # weight's broadcast to the other worker and its gradient piece back, 2 hops
    loops = [lr_virtual(2, Network(lat, 1e9)).iteration_seconds()[-1] for lat in (1.0, 2.0)]
    assert loops[1] - loops[0] == pytest.approx(2.0, abs=1e-9)
    # on one worker no message is on an iteration's path: latency changes nothing, and a loop
    # is a whole number of (1 ms) tasks
    one = [lr_virtual(1, Network(lat, 1e9)).iteration_seconds() for lat in (0.0, 1.0)]
    assert one[0] == pytest.approx(one[1], abs=1e-9) and one[0][-1] / 1e-3 == pytest.approx(round(one[0][-1] / 1e-3))


def test_bandwidth_charges_a_message_its_bytes_at_both_interfaces() -> None:
    links = Links(Network(1.0, 100.0), 3)
    assert links.arrival(1, 0, 0.0, 100) == 2.0  # 1 s on the wire + 1 s latency
    assert links.arrival(1, 0, 0.0, 100) == 3.0  # queued behind the first at the sender
    assert links.arrival(2, 0, 0.0, 100) == 4.0  # in at the receiver after the first two
    assert links.arrival(2, 1, 10.0, 0) == 11.0


def test_wire_bytes_count_a_pieces_array_and_its_header() -> None:
    from canary.messages import Piece, Signal

    big = Piece(1, 5, 2, 3, (0,), (1,), np.zeros(1000))
    assert 8000 < wire_bytes(big) < 8000 + 300
    assert wire_bytes(Signal(1, 2, True)) < 100


def doubled_task() -> Any:
    return None  # TaskCost reads only the measured time


def test_the_loop_signal_ends_give_one_time_per_iteration_and_scaled_costs_scale_them() -> None:
    got = run_virtual(build(logistic_regression, LR_ARGS, 2), 2, NET, handle_s=0.0,
                      cost=lambda task, m: 2e-3 if task.kind == K_SIGNAL else 1e-3, runtime=IDEAL)
    loop = [k for k in got.signal_ends if k.startswith("while_")]
    assert len(loop) == 1 and len(got.signal_ends[loop[0]]) == 8
    # worker 0 holds the loop's test: its 8 signal tasks cost 1 ms more each
    w0, w1 = got.workers
    assert w0.task_s == pytest.approx(w0.tasks * 1e-3 + 8e-3) and w1.task_s == pytest.approx(
        w1.tasks * 1e-3)
    doubled = run_virtual(build(logistic_regression, LR_ARGS, 1), 1, NET, handle_s=0.0,
                          cost=TaskCost(2.0), runtime=IDEAL)
    # the controller hears Hello, the 2 final reports and Done (--print-every 0: the loop
    # sends no progress report)
    assert doubled.controller.events == 1 + 2 + 1 and doubled.controller.sent == 1
    assert TaskCost(2.0)(doubled_task(), 0.25) == 0.5
    with pytest.raises(ValueError, match="bandwidth > 0"):
        Network(1e-6, 0.0)


def test_each_message_on_the_loops_path_costs_its_sender_and_receiver_their_runtime_costs() -> None:
    base = lr_virtual(2, Network(1.0, 1e9)).iteration_seconds()
    # A loop's path: worker 0 sends the loop's signal and then the weights to worker 1 (which
    # takes in both), and worker 1 sends its gradient piece back (which worker 0 takes in):
    # 3 sends and 3 receives, every iteration alike
    for send_s, recv_s, extra in ((0.25, 0.0, 0.75), (0.0, 0.25, 0.75)):
        rt = replace(IDEAL, send_s=send_s, recv_s=recv_s)
        loops = lr_virtual(2, Network(1.0, 1e9), runtime=rt).iteration_seconds()
        assert [t - b for t, b in zip(loops, base)] == pytest.approx([extra] * 7, abs=1e-6)


def test_an_idle_rank_sees_a_message_at_its_next_poll_of_the_back_off() -> None:
    c = PollClock(max_sleep=1e-4, oversleep=1e-5, poll=0.0)
    c.reset(1.0, hot_s=0.5)
    assert c.next_poll(1.2) == 1.2  # polling hot
    # then sleeps of 20, 40, 80 and 100 µs (the cap), each 10 µs longer than asked
    first = 1.5 + 30e-6
    assert c.next_poll(1.5 + 1e-6) == pytest.approx(first)
    assert c.next_poll(first + 1e-6) == pytest.approx(first + 50e-6)
    at = 1.5 + 30e-6 + 50e-6 + 90e-6
    assert c.next_poll(at - 1e-6) == pytest.approx(at)
    # at the cap, whole periods of 110 µs
    assert c.next_poll(at + 1.0) == pytest.approx(at + math.ceil(1.0 / 110e-6) * 110e-6)
    c.idle_from(at + 2.0)  # polled and found nothing: goes on at the cap
    assert c.next_poll(at + 2.0 + 1e-6) == pytest.approx(at + 2.0 + 110e-6)


def test_sleeping_ranks_delay_the_loop_and_spinning_ones_do_not() -> None:
    slow = Network(0.2, 1e9)  # each hop outlasts the hot poll, so the receiver sleeps
    ideal = lr_virtual(2, slow).iteration_seconds()[-1]
    hot = lr_virtual(2, slow, runtime=replace(IDEAL, sleeps=True, workers_spin=True),
                     config=WorkerConfig(spin_s=1.0)).iteration_seconds()[-1]
    asleep = lr_virtual(2, slow, runtime=replace(IDEAL, sleeps=True, oversleep_s=1e-3),
                        config=WorkerConfig(spin_s=0.0)).iteration_seconds()[-1]
    assert hot == pytest.approx(ideal, abs=1e-12)
    # each of the 2 hops is seen up to one sleep (the cap plus the oversleep) late
    assert ideal < asleep <= ideal + 2 * (WorkerConfig().max_sleep_s + 1e-3) + 1e-9


def test_a_batch_of_tasks_doubles_while_short_and_halves_while_long() -> None:
    assert next_batch(4, 4, 1e-5, 5e-5, 64) == 8
    assert next_batch(64, 64, 1e-5, 5e-5, 64) == 64
    assert next_batch(4, 4, 1e-4, 5e-5, 64) == 2
    assert next_batch(4, 3, 1e-5, 5e-5, 64) == 4  # ran out of tasks: says nothing
    assert next_batch(4, 4, 3e-5, 5e-5, 64) == 4
    with pytest.raises(ValueError, match="oversleep_s must be >= 0"):
        Runtime(oversleep_s=-1.0)


@pytest.mark.parametrize("workers", [3, 8])
def test_the_balancing_policy_in_virtual_time_reaches_the_best_split_around_a_slowed_worker(
        workers: int) -> None:
    # More workers than this machine has cores: the real policy and migration protocol, in
    # virtual time. Worker 1's tasks take 3x as long; 8 partitions per worker; a gradient task
    # costs 1 ms (benchmarks/straggler.py --virtual prints the same runs' figures).
    from benchmarks.straggler import best_split, gradient_cost
    from canary.controller.balance import BalancePolicy

    args = logistic_regression.parse_args(
        ["--generate", "2000,6", "--max-iter", "400", "--tol", "1e-300", "--print-every", "0",
         "--partitions", str(8 * workers)])
    want = canary.run_local(logistic_regression.build(args, workers)[0], workers=workers).results
    runs = {}
    for policy in (None, BalancePolicy(workers)):
        runs[policy is not None] = run_virtual(
            logistic_regression.build(args, workers)[0], workers, NET, cost=gradient_cost,
            handle_s=2e-6, runtime=IDEAL, slowdown={1: 3.0}, policy=policy,
            validate=policy is not None)  # every state's invariants while partitions move
    off, on = runs[False], runs[True]
    assert same_results(off.job.results, want) and same_results(on.job.results, want)
    assert off.job.migrations == 0 and on.job.migrations >= 4 and on.job.bytes_migrated > 0
    # off: every iteration waits for the slow worker's 8 partitions at 3 ms
    assert statistics.median(off.iteration_seconds()) == pytest.approx(24e-3, rel=0.01)
    # on: settled at the best split whole partitions allow, plus the runtime's few µs
    best = best_split(workers, 8, 3.0) * 8 * workers * 1e-3
    late = statistics.median(on.iteration_seconds()[-50:])
    assert best <= late <= best * 1.02, (late, best)


def test_noise_slows_a_worker_while_it_lasts() -> None:
    # worker 1's tasks take twice as long from 0.1 virtual s on: each iteration then waits for
    # its 2 partitions' gradients at 2 ms, against 1 ms before (a gradient costs 1 ms)
    from benchmarks.straggler import gradient_cost

    args = logistic_regression.parse_args(
        ["--generate", "2000,6", "--max-iter", "100", "--tol", "1e-300", "--print-every", "0",
         "--partitions", "4"])
    run = run_virtual(logistic_regression.build(args, 2)[0], 2, NET, cost=gradient_cost,
                      handle_s=2e-6, runtime=IDEAL,
                      noise=lambda w, t: 2.0 if w == 1 and t >= 0.1 else 1.0)
    times = run.iteration_seconds()
    assert statistics.median(times[:20]) == pytest.approx(2e-3, rel=0.05)
    assert statistics.median(times[-20:]) == pytest.approx(4e-3, rel=0.05)


def test_a_slowdown_names_a_worker_and_a_factor_of_at_least_one() -> None:
    prog = logistic_regression.build(logistic_regression.parse_args(LR_ARGS), 2)[0]
    with pytest.raises(ValueError, match=r"slowdown \{2: 3.0\}: worker indices must be below 2"):
        run_virtual(prog, 2, NET, slowdown={2: 3.0})
    with pytest.raises(ValueError, match="WorkerConfig.slowdown must be a number >= 1, got 0.5"):
        run_virtual(prog, 2, NET, slowdown={0: 0.5})


def bursts(core: SharedCore, burst_s: float, duty: float,
           n: int = 300) -> tuple[list[float], list[float]]:
    """``n`` bursts, each followed by a sleep until a deadline that keeps the worker wanting
    the core ``duty`` of the time (as benchmarks/core_share.py runs them): each burst's wall
    time over its CPU time, and how late after each deadline the worker got the CPU."""
    t, stretch, late = 0.0, [], []
    for _ in range(n):
        wall = core.run(t, burst_s)
        stretch.append(wall / burst_s)
        deadline = t + wall + burst_s * (1 - duty) / duty
        t = core.wake(deadline)
        late.append(t - deadline)
    return stretch, late


def test_a_shared_core_runs_short_bursts_at_full_speed_and_stretches_long_ones() -> None:
    # what benchmarks/core_share.py measured beside a pinned busy loop (Linux 6.18): bursts of
    # 1.25 ms or less run at full speed, 1.5-3 ms ones take 1.6-2.3 times as long
    for burst_s in (0.5e-3, 1e-3, 1.25e-3):
        for duty in (0.2, 0.3, 0.5):
            assert max(bursts(SharedCore(), burst_s, duty)[0]) == pytest.approx(1.0)
    for burst_s in (1.5e-3, 2e-3, 3e-3):
        assert 1.6 <= statistics.fmean(bursts(SharedCore(), burst_s, 0.3)[0]) <= 2.3


def test_a_worker_beside_a_busy_process_wakes_a_whole_turn_late_now_and_then() -> None:
    # core_share.py: at 20% of the time busy, bursts of 0.5-1 ms see the deadline on time
    # (0.1% or 5-8% of the waits late); at 30%, 21-28% of the waits end about 2 ms (a whole
    # turn of the busy process) late, 0.35-0.5 ms on average
    core = SharedCore()
    for burst_s in (0.5e-3, 1e-3):
        assert max(bursts(SharedCore(), burst_s, 0.2)[1]) == 0.0
        late = bursts(SharedCore(), burst_s, 0.3)[1]
        turns = [x for x in late if x > 0]
        assert 0.15 <= len(turns) / len(late) <= 0.35
        assert min(turns) >= core.slice_s * 0.999  # never a part of a turn
        assert 0.2e-3 <= statistics.fmean(late) <= 0.5e-3


def test_a_worker_that_always_wants_its_shared_core_gets_half_of_it() -> None:
    # a worker that sleeps a few µs between bursts (every other worker waits for it): a fair
    # kernel gives it half the core, in turns of the busy process
    core, t, cpu = SharedCore(), 0.0, 0.0
    for _ in range(2000):
        t += core.run(t, 8e-4) + 3e-5
        cpu += 8e-4
    assert cpu / t == pytest.approx(0.5, abs=0.05)


def test_a_worker_woken_when_the_kernel_owes_it_no_time_waits_for_the_busy_processs_turn() -> None:
    # 1.5 ms of work spends its credit and more (0.3 - 0.75 ms of lag), within its turn (down
    # to half a slice); woken 30 µs later it waits for a whole turn of the busy process: until
    # it is owed half a slice; woken 10 ms later (the sleep has earned its credit back) it
    # runs at once, and at full speed
    core = SharedCore()
    half = core.slice_s / 2
    assert core.run(0.0, 1.5e-3) == pytest.approx(1.5e-3)
    lag = core.credit_s - 1.5e-3 / 2 + core.earn * 3e-5
    woken = 1.5e-3 + 3e-5
    assert core.wake(woken) == pytest.approx(woken + 2 * (half - lag))
    rested = SharedCore()
    rested.run(0.0, 1.5e-3)
    assert rested.wake(11.5e-3) == 11.5e-3
    assert rested.run(11.5e-3, 1e-3) == pytest.approx(1e-3)


def test_a_shared_core_is_checked() -> None:
    for bad in ({"slice_s": 0.0}, {"credit_s": -1.0}, {"earn": math.inf}, {"awake_s": -1.0}):
        with pytest.raises(ValueError, match="SharedCore: "):
            SharedCore(**bad)
    prog = logistic_regression.build(logistic_regression.parse_args(LR_ARGS), 2)[0]
    with pytest.raises(ValueError, match=r"shared_cores \{2: .*worker indices must be below 2"):
        run_virtual(prog, 2, NET, shared_cores={2: SharedCore()})


def test_a_busy_process_on_a_workers_core_shows_in_its_load_reports() -> None:
    # 8 partitions of 0.4 ms on worker 1, whose core a busy process shares: its 3.2 ms burst
    # waits a turn of the busy process each iteration. The answer is the job's own; worker 1's
    # reports say it waited for a CPU, worker 0's that it never did.
    from benchmarks.straggler import gradient_cost

    args = logistic_regression.parse_args(
        ["--generate", "2000,6", "--max-iter", "400", "--tol", "1e-300", "--print-every", "0",
         "--partitions", "16"])
    want = canary.run_local(logistic_regression.build(args, 2)[0], workers=2).results
    reports: list[Any] = []

    class Recorder:  # a move policy that only keeps the reports
        notes: list[str] = []

        def report(self, rep: Any, now: float) -> None:
            reports.append(rep)

        def decide(self, now: float, ctrl: Any) -> list[Any]:
            return []

    def cost(task: Any, measured_s: float) -> float:
        return gradient_cost(task, measured_s, 4e-4)

    runs = {shared: run_virtual(logistic_regression.build(args, 2)[0], 2, NET, cost=cost,
                                handle_s=2e-6, runtime=IDEAL, policy=Recorder() if shared else None,
                                shared_cores={1: SharedCore()} if shared else None)
            for shared in (False, True)}
    assert same_results(runs[True].job.results, want)
    alone, shared = (statistics.fmean(runs[k].iteration_seconds()[50:]) for k in (False, True))
    assert alone == pytest.approx(3.2e-3, rel=0.02)
    assert 1.5 < shared / alone < 2.5
    waits = {w: [r.cpu_wait / max(r.cpu + r.cpu_wait, 1e-12) for r in reports if r.worker == w]
             for w in (0, 1)}
    assert len(waits[1]) >= 2 and min(waits[1]) > 0.2 and max(waits[0]) == 0.0
    assert all(r.cpu > 0 for r in reports)


def slow_step_program(steps: int) -> canary.Program:
    """One slow model update a step on the worker holding ``w``; the other worker's tasks only
    wait for it, so that worker could run far ahead."""
    p = canary.Program("slow_step")
    x, lw, w, g = p.dataset("x", 4), p.dataset("lw", 4), p.dataset("w", 1), p.dataset("g", 1)
    p.load([x], lambda i, n: np.full(4, float(i)))
    p.load([w], lambda i, n: np.zeros(4))
    p.load([g], lambda i, n: np.zeros(4))
    with p.loop(steps):
        p.broadcast(w, lw)
        p.compute(lambda xv, wv: xv * 0.5 + wv, [x, lw], [x], name="grad")
        p.reduce(x, g)
        p.compute(lambda wv, gv: wv - 0.01 * gv, [w, g], [w], name="update")
    p.report(w)
    return p


class SeqRecorder:
    """A move policy that moves nothing and keeps every load report's (time, worker, seq)."""

    def __init__(self) -> None:
        self.notes: list[str] = []
        self.seqs: list[tuple[float, int, int]] = []

    def report(self, rep: Any, now: float) -> None:
        self.seqs.append((now, rep.worker, rep.seq))

    def decide(self, now: float, ctrl: Any) -> list[Any]:
        return []


def test_workers_emit_about_half_a_second_ahead_of_the_work_not_the_whole_window() -> None:
    """A snapshot's barrier is the furthest position any worker has emitted, and everything
    before it must run first: with 64 slow stage instances emitted ahead of the work, every
    snapshot waits for as long. Sized from the pace, the window keeps emission about
    ``window_s`` ahead once the first reports have measured the pace."""
    def lead_seconds(config: WorkerConfig) -> float:
        rec = SeqRecorder()
        updates: list[float] = []

        def on_task(worker: int, task: Any, start: float, end: float) -> None:
            if task.stage.name == "update":
                updates.append(end)

        got = run_virtual(slow_step_program(60), 2, NET, handle_s=0.0, runtime=IDEAL,
                          policy=rec, config=config, on_task=on_task,
                          cost=lambda task, m: 0.25 if task.stage.name == "update" else 1e-4)
        steps_emitted: dict[int, float] = {}
        leads = []
        for now, w, seq in rec.seqs:
            steps_emitted[w] = seq / 4  # a step is 4 stage instances (and 3 loads come first)
            if now > got.seconds / 2 and len(steps_emitted) == 2:  # after the start's burst
                done = sum(end <= now for end in updates)
                leads.append((max(steps_emitted.values()) - done) * 0.25)
        assert len(updates) == 60 and leads
        return max(leads)

    fixed_lead = lead_seconds(WorkerConfig(window_s=0.0, max_fused=0))
    paced_lead = lead_seconds(WorkerConfig(max_fused=0))
    # (fusion off: a fused stretch waits for the one before it, which hides the run-ahead)
    assert fixed_lead > 3.0, fixed_lead  # 64 live instances: over 16 steps of 0.25 s
    # the window's floor, 8 live instances: the waiting worker has 3 of a step's 4, so under
    # 3 steps, plus up to a step for reports falling between two updates
    assert paced_lead <= 1.5, paced_lead
