"""The scaling benchmark's smoke run, and the central scheduler's model it compares against."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from canary.sim.central import (
    central_iteration_seconds,
    crossover_workers,
    strong_scaling_stages,
)
from tests.conftest import ROOT


def test_crossover_is_where_dispatching_takes_as_long_as_the_work() -> None:
    w = crossover_workers(rate=1000.0, work_s=4.0, tasks_per_worker=10)
    assert w == pytest.approx(20.0)
    assert 10 * w / 1000.0 == pytest.approx(4.0 / w)  # k W / rate == C / W there
    with pytest.raises(ValueError, match="must be positive"):
        crossover_workers(0.0, 1.0, 1.0)


def test_a_central_scheduler_speeds_up_until_the_crossover_then_slows_down() -> None:
    rate, work, k = 1000.0, 4.0, 10  # crossover at 20 workers
    times = {w: central_iteration_seconds(strong_scaling_stages(work, k, w), w, rate)
             for w in (1, 5, 20, 80, 320)}
    assert times[1] > times[5] > times[20] and times[20] < times[80] < times[320]
    # far past the crossover an iteration is the dispatching: k W / rate, and its work done
    assert times[320] == pytest.approx(k * 320 / rate, rel=0.01)
    # well below it, the work: C / W plus one dispatch gap
    assert times[1] == pytest.approx(work + 1 / rate)


def test_each_stage_waits_for_the_last_task_of_the_one_before() -> None:
    # two stages of 2 tasks of 1 s on 2 workers, a task dispatched every 0.5 s, 0.1 s hops
    t = central_iteration_seconds([[1.0, 1.0], [1.0, 1.0]], 2, rate=2.0, latency_s=0.1)
    stage = 1.0 + 0.1 + 1.0 + 0.1  # the second task: dispatched at 1.0, runs, is heard of
    assert t == pytest.approx(2 * stage)
    with pytest.raises(ValueError, match="positive rate"):
        central_iteration_seconds([[1.0]], 1, 0.0)


def test_the_benchmark_runs_every_section_at_tiny_sizes(tmp_path: object) -> None:
    # one worker count: each section's rows and summary, at 6 MPI jobs of the apps, not 9
    r = subprocess.run([sys.executable, "benchmarks/scaling.py", "--quick", "--workers", "2",
                        "--virtual-workers", "2,4", "--timeout", "120",
                        "--agreement-reps", "1"],
                       cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    sections = {row.get("section") for row in rows}
    assert {"network", "real", "task_rate", "agreement", "virtual", "central"} <= sections
    real = [x for x in rows if x.get("section") == "real"]
    assert {(x["mode"], x["app"], x["workers"]) for x in real} == {
        (m, a, w) for m in ("strong", "weak")
        for a in ("logistic_regression", "kmeans", "pagerank") for w in (2,)}
    assert all(x["iterations"] == 4 and x["iteration_ms"] > 0 for x in real)
    assert all(x["correct"] for x in rows if x.get("section") == "task_rate")
    virtual = [x for x in rows if x.get("section") == "virtual"]
    assert {(x["app"], x["workers"], x["network"]) for x in virtual} == {
        (a, w, n) for a in ("logistic_regression", "pagerank") for w in (2, 4)
        for n in ("this_machine", "cloud_10gbe")}
    # the controller's traffic: Hello, Placement, Done, Shutdown-free end, and the reports
    assert all(x["controller_messages"] > 0 for x in virtual)
    summary = rows[-1]
    assert summary["summary"] == "scaling" and len(summary["virtual_over_real"]) == 3
    assert all(v > 0 and math.isfinite(v) for v in summary["virtual_over_real"].values())
