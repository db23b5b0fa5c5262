"""Idle waiting: hot polling only where every worker has a core, then sleeps to a cap."""

from __future__ import annotations

import ctypes
import sys

import pytest

import canary.idle as idle
from canary.idle import Backoff, tight_timer_slack, workers_fit_cores


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
