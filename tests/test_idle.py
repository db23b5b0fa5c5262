"""Idle waiting: hot polling only where every worker has a core, then sleeps to a cap."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys

import pytest

import canary.idle as idle
from canary.idle import Backoff, tight_timer_slack, workers_fit_cores
from tests.conftest import ROOT


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    c = FakeClock()
    monkeypatch.setattr(idle.time, "perf_counter", c.perf_counter)
    monkeypatch.setattr(idle.time, "sleep", c.sleep)
    return c


def test_backoff_spins_then_sleeps_doubling_to_the_cap(clock: FakeClock) -> None:
    b = Backoff(min_sleep=1e-5, max_sleep=4e-5, spins=3)
    for _ in range(8):
        b.sleep()
    assert clock.slept == [1e-5, 2e-5, 4e-5, 4e-5, 4e-5]
    b.reset()
    b.sleep()
    b.sleep()
    assert len(clock.slept) == 5  # quick polls again after work


def test_backoff_polls_hot_for_spin_s_after_each_reset(clock: FakeClock) -> None:
    b = Backoff(min_sleep=1e-5, max_sleep=1e-4, spins=2, spin_s=1e-3)
    for _ in range(50):  # within the spin window: no sleep, however many polls
        b.sleep()
        clock.now += 1e-5
    assert clock.slept == []
    clock.now += 1e-3
    b.sleep()
    assert clock.slept == [1e-5]
    b.reset()  # new work: a new spin window
    for _ in range(10):
        b.sleep()
    assert clock.slept == [1e-5]


@pytest.mark.parametrize("env,size,cores,fits", [
    ({"MPI_LOCALNRANKS": "3"}, 3, 2, True),  # one node: controller + 2 workers on 2 cores
    ({"MPI_LOCALNRANKS": "4"}, 4, 2, False),  # 3 workers on 2 cores
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, 5, 2, True),  # 2 of 5 ranks here (maybe the controller)
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "3"}, 5, 2, False),
    ({}, 3, 2, True),  # no launcher variables: all ranks taken to be here
    ({}, 9, 4, False),
])
def test_workers_fit_cores_counts_the_workers_on_this_node(env: dict, size: int, cores: int,
                                                           fits: bool) -> None:
    assert workers_fit_cores(size, env, cores) is fits


def test_tight_timer_slack_sets_the_process_slack() -> None:
    if not sys.platform.startswith("linux"):  # no prctl: says so and changes nothing
        assert tight_timer_slack(2000) is False
        return
    assert tight_timer_slack(2000) is True
    libc = ctypes.CDLL(None)
    assert libc.prctl(30, 0, 0, 0, 0) == 2000  # PR_GET_TIMERSLACK


def test_hop_latency_benchmark_delivers_every_message_in_order() -> None:
    # the benchmark's MPI child (2 ranks, hard timeouts): every variant sees all its messages,
    # in order; the figures themselves are never asserted
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "hop_latency.py"),
                           "--quick", "--apps", "--timeout", "120"],
                          cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    variants = [r for r in rows if "variant" in r and "app" not in r]
    codecs = [r for r in rows if "codec" in r]
    assert [r["codec"] for r in codecs] == ["piece_23_float64", "piece_1000_float64", "signal"]
    assert all(r["pickled_dataclass_us"] > 0 and r["wire_tuple_us"] > 0 for r in codecs)
    assert [r["variant"] for r in variants] == ["sleep_only", "tight_slack", "spin_1ms",
                                                 "spin_always"]
    assert all(r["received_in_order"] and r["messages"] == 20 for r in variants)
    assert rows[-1]["summary"] == "hop_latency" and rows[-1]["all_in_order"] is True
    # the app runs: both apps, hot polling off and on, each with a measured iteration time
    runs = [r for r in rows if "app" in r]
    assert {(r["app"], r["variant"]) for r in runs} == {
        (a, v) for a in ("logistic_regression", "pagerank")
        for v in ("spin_off", "spin_1ms", "spin_50ms")}
    assert all(r["iterations"] == 8 and r["iteration_ms"] > 0 for r in runs)
    assert set(rows[-1]["app_iteration_ms"]) == {"logistic_regression@2000,8",
                                                 "pagerank@1024,8000"}


def test_start_up_objects_are_frozen_once_per_process() -> None:
    # in a child: freezing pytest's own objects would outlast this test
    code = ("import gc, json; from canary.idle import freeze_startup_objects as f; "
            "a = f(); n = gc.get_freeze_count(); x = [[] for _ in range(1000)]; b = f(); "
            "print(json.dumps([a, n, b, gc.get_freeze_count()]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    first, frozen, again, after = json.loads(out)
    assert first is True and frozen > 1000
    assert again is False and after == frozen  # the later objects stay collectable
