"""Idle waiting: hot polling only where every worker has a core, then sleeps to a cap."""

from __future__ import annotations

import ctypes
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import canary.idle as idle
from benchmarks.straggler import busy_loop
from canary.idle import (
    Backoff,
    CorePlacement,
    core_placement,
    has_own_core,
    tight_timer_slack,
)
from canary.trace import load_events, load_reports
from tests.conftest import ROOT, mpirun


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


def _free(n: int, cores: int, host: str = "a") -> list[CorePlacement]:
    return [(host, frozenset(range(cores)))] * n


def _polls_hot_after(b: Backoff, clock: FakeClock) -> bool:
    """Whether ``b``, just reset, polls hot: it sleeps on none of 20 polls within 1 ms."""
    b.reset()
    before = len(clock.slept)
    for _ in range(20):
        b.sleep()
        clock.now += 1e-5
    return len(clock.slept) == before


def test_backoff_stops_polling_hot_while_the_rank_waits_for_its_cpu(clock: FakeClock) -> None:
    b = Backoff(min_sleep=1e-5, max_sleep=1e-4, spins=2, spin_s=1e-3)
    assert _polls_hot_after(b, clock)
    assert b.note_cpu_wait(0.04, 0.5) is True  # 8%: between the two thresholds, as it was
    assert b.note_cpu_wait(0.2, 0.5) is False  # 40% of its time waiting: another process
    assert not _polls_hot_after(b, clock)
    assert b.note_cpu_wait(0.04, 0.5) is False  # 8%: not quiet enough
    assert b.note_cpu_wait(0.01, 0.5) is False  # 2%: quiet, once
    assert not _polls_hot_after(b, clock)
    assert b.note_cpu_wait(0.01, 0.5) is True  # twice in a row: the core is its own again
    assert _polls_hot_after(b, clock)
    assert b.note_cpu_wait(0.0, 0.0) is True  # no interval: nothing learnt
    # found again: it now waits 4 quiet periods, then 8, and never more than MAX_QUIET
    for needed in (4, 8, 16, 32, 64, 64):
        assert b.note_cpu_wait(0.3, 0.5) is False
        assert [b.note_cpu_wait(0.0, 0.5) for _ in range(needed)] == [False] * (needed - 1) + [True]
    b.note_cpu_wait(0.3, 0.5)
    assert b.note_cpu_wait(0.01, 0.5) is False
    assert b.note_cpu_wait(0.3, 0.5) is False  # a busy period starts the count again
    assert [b.note_cpu_wait(0.0, 0.5) for _ in range(64)][-2:] == [False, True]


def test_a_backoff_whose_wait_limit_is_1_never_stops_polling_hot(clock: FakeClock) -> None:
    b = Backoff(min_sleep=1e-5, max_sleep=1e-4, spins=2, spin_s=1e-3, stop_hot_at=1.0)
    assert b.note_cpu_wait(0.45, 0.5) is True  # 90% of the period waiting: still its own
    assert _polls_hot_after(b, clock)
    b = Backoff(min_sleep=1e-5, max_sleep=1e-4, spins=2, spin_s=1e-3, stop_hot_at=0.02)
    assert b.note_cpu_wait(0.015, 0.5) is False  # 3%: over a limit of 2%
    assert b.note_cpu_wait(0.004, 0.5) is False  # 0.8%: quiet (under 1%), once
    assert b.note_cpu_wait(0.004, 0.5) is True


def test_a_backoff_that_never_polls_hot_never_starts_to(clock: FakeClock) -> None:
    b = Backoff(min_sleep=1e-5, max_sleep=1e-4, spins=2)
    assert b.note_cpu_wait(0.0, 0.5) is False
    assert not _polls_hot_after(b, clock)


@pytest.mark.parametrize("placements,worker,own", [
    (_free(2, 2), 0, True),  # one node: 2 workers on 2 cores (the controller is not counted)
    (_free(3, 2), 2, False),  # 3 workers on 2 cores
    (_free(4, 16), 3, True),
    (_free(2, 2) + _free(3, 2, "b"), 0, True),  # two hosts: 2 here, 3 there
    (_free(2, 2) + _free(3, 2, "b"), 4, False),
    (_free(4, 2), 0, False),  # taskset -c 0,1 on a larger machine: 4 workers, 2 cores
    # bound a core each (mpiexec -bind-to core): each has its own, one mask of 1 core
    ([("a", frozenset({k})) for k in range(4)], 2, True),
    # bound, oversubscribed: the launcher put workers 0 and 2 on core 0
    ([("a", frozenset({0})), ("a", frozenset({1})), ("a", frozenset({0}))], 0, False),
    ([("a", frozenset({0})), ("a", frozenset({1})), ("a", frozenset({0}))], 1, True),
    # two workers bound to a socket's 4 cores each, one free over all 8: 3 on 8
    ([("a", frozenset(range(4))), ("a", frozenset(range(4, 8))), ("a", frozenset(range(8)))],
     0, True),
    # the same cores on another host are other cores
    ([("a", frozenset({0})), ("b", frozenset({0}))], 0, True),
])
def test_has_own_core_counts_the_workers_that_share_this_ones_cores(
        placements: list[CorePlacement], worker: int, own: bool) -> None:
    assert has_own_core(worker, placements) is own


def test_core_placement_is_this_process_host_and_affinity() -> None:
    host, cores = core_placement()
    assert host == socket.gethostname()
    assert cores and cores <= set(range(os.cpu_count() or 1))
    if hasattr(os, "sched_getaffinity"):
        assert cores == os.sched_getaffinity(0)


def _pinned_job(tmp_path: Path, cores: list[int], **env: str
                ) -> tuple[dict[int, bool], dict[int, list[bool]], str]:
    """Run ``tests/drivers/pinned.py`` with rank ``r`` bound to ``cores[r]``, a load report
    every 100 ms and ``env`` added: whether each worker was found to have a core of its own
    (its trace track's label), each worker's reports, in order, as whether it polled hot
    then, and the job's stderr."""
    trace = tmp_path / "t.json"
    r = mpirun(len(cores), "tests/drivers/pinned.py", str(trace), ",".join(map(str, cores)),
               env_extra={"CANARY_REPORT_MS": "100", "CANARY_TRACE_LEVEL": "loop",
                          "CANARY_BALANCE": "off", **env})
    assert r.returncode == 0, r.stderr[-3000:]
    assert float(r.stdout.split()[-1]) > 0  # the job ran to its end
    events = load_events(str(trace))
    labels = {e["pid"] - 1: e["args"] for e in events if e.get("name") == "process_labels"}
    assert sorted(labels) == list(range(len(cores) - 1))
    for w, label in labels.items():  # the label names the cores the worker was bound to
        assert label["cores"] == [cores[w + 1]] and label["labels"].startswith(label["host"])
    hot: dict[int, list[bool]] = {}
    for _, rep in load_reports(events):
        hot.setdefault(rep.worker, []).append(rep.polls_hot)
    assert sorted(hot) == list(range(len(cores) - 1)) and all(hot.values()), hot
    return {w: label["own_core"] for w, label in labels.items()}, hot, r.stderr


@pytest.fixture
def two_cores() -> list[int]:
    cores = sorted(os.sched_getaffinity(0))
    assert len(cores) >= 2, "these runs bind ranks to two cores; this machine gives us one"
    return cores[:2]


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_workers_bound_a_core_each_have_one_unless_two_share_it(
        ranks: int, two_cores: list[int], tmp_path: Path) -> None:
    # as mpiexec -bind-to core binds them: rank r on core r mod 2, so with 3 workers, workers
    # 0 and 2 share a core and never poll hot; the others have a core each and poll hot all
    # through (each worker's mask of one core said "oversubscribed" before, and none polled
    # hot). Other work on this machine must not stop them here: CANARY_HOT_WAIT_PCT=100
    a, b = two_cores
    cores = [a, b, a, b][:ranks]
    own, hot, said = _pinned_job(tmp_path, cores, CANARY_HOT_WAIT_PCT="100")
    shared = {0, 2} if ranks == 4 else set()
    assert own == {w: w not in shared for w in range(ranks - 1)}
    assert {w: set(reports) for w, reports in hot.items()} == {
        w: {w not in shared} for w in range(ranks - 1)}, hot
    # workers that share a core by placement wait for each other: not said as news
    for w in shared:
        assert f"worker {w} (rank {w + 1}) has a core of its own" not in said


def test_a_worker_whose_core_another_process_takes_stops_polling_hot(
        two_cores: list[int], tmp_path: Path) -> None:
    a, b = two_cores
    hog = busy_loop(b)
    try:
        own, hot, said = _pinned_job(tmp_path, [a, a, b])
    finally:
        hog.kill()
        hog.wait()
    # worker 1 was given a core of its own, where the busy loop runs: it stops polling hot at
    # its first report (it polled hot until then), and polls hot in fewer than half of them
    # after (it tries again after 2 quiet reports in a row, then 4, ...; a machine busy with
    # other work slows worker 0, and worker 1 then sits idle, asleep, and waits little)
    assert own == {0: True, 1: True}
    assert hot[1][0] is False and sum(hot[1]) < len(hot[1]) / 2, hot
    # and the controller said so, once, with what it costs and the remedy (balancing is off)
    assert said.count("canary: worker 1 (rank 2) has a core of its own but waited for it ") == 1
    assert "another process runs on its core" in said and "--balance on would move" in said


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
