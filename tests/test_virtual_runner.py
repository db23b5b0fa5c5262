"""The virtual-time runner: the real roles' answers, bit for bit, and a network model whose
times follow from its parameters."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import canary
from apps import kmeans, logistic_regression, pagerank
from canary.virtual_runner import Links, Network, TaskCost, VirtualResult, run_virtual, wire_bytes
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
                       cost=fixed(), handle_s=0.0, load_reports=False, **kw)


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
                      cost=lambda task, m: 2e-3 if task.kind == K_SIGNAL else 1e-3)
    loop = [k for k in got.signal_ends if k.startswith("while_")]
    assert len(loop) == 1 and len(got.signal_ends[loop[0]]) == 8
    # worker 0 holds the loop's test: its 8 signal tasks cost 1 ms more each
    w0, w1 = got.workers
    assert w0.task_s == pytest.approx(w0.tasks * 1e-3 + 8e-3) and w1.task_s == pytest.approx(
        w1.tasks * 1e-3)
    doubled = run_virtual(build(logistic_regression, LR_ARGS, 1), 1, NET, handle_s=0.0,
                          cost=TaskCost(2.0))
    # the controller hears Hello, 8 progress reports, the 2 final reports and Done
    assert doubled.controller.events == 1 + 8 + 2 + 1 and doubled.controller.sent == 1
    assert TaskCost(2.0)(doubled_task(), 0.25) == 0.5
    with pytest.raises(ValueError, match="bandwidth > 0"):
        Network(1e-6, 0.0)
