"""The papers' experiments at small scale, plus the CLI.  Qualitative checks with margins."""

import functools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from canary.sim import cli
from canary.sim.experiments import (
    fairshare_experiment,
    hfsp_experiment,
    max_min_shares,
    placement_experiment,
    priority_experiment,
    zero_wait_experiment,
    zero_wait_probability,
)
from canary.sim.sizebased import SizeWorkload, simulate_size_based


def test_zero_wait_formulas_hand_computed() -> None:
    assert zero_wait_probability("random", 0.5, 2) == pytest.approx(0.25)
    assert zero_wait_probability("per-task", 0.5, 1, d=2) == pytest.approx(0.75)
    assert zero_wait_probability("batch", 0.5, 1, d=2) == pytest.approx(0.75)
    # 4 probes, need >= 2 idle: 1 - P(0 idle) - P(1 idle) = 1 - 1/16 - 4/16.
    assert zero_wait_probability("batch", 0.5, 2, d=2) == pytest.approx(11 / 16)
    with pytest.raises(ValueError, match="no zero-wait formula"):
        zero_wait_probability("batch-late", 0.5, 2)
    with pytest.raises(ValueError):
        zero_wait_probability("random", 1.5, 2)


def test_zero_wait_simulation_matches_analysis() -> None:
    rows = zero_wait_experiment(
        tasks=(10,),
        loads=(0.3, 0.6),
        policies=("random", "per-task", "batch"),
        workers=500,
        horizon=2.0,
    )
    assert len(rows) == 6
    for r in rows:
        assert abs(r["simulated"] - r["analytic"]) < 0.08, r
    by = {(r["policy"], r["load"]): r["simulated"] for r in rows}
    assert by[("batch", 0.6)] > by[("per-task", 0.6)] > by[("random", 0.6)]


def test_placement_experiment_orders_policies() -> None:
    rows = placement_experiment(loads=(0.8,), workers=500, tasks_per_job=50, jobs=250, seed=3)
    mean = {r["policy"]: r["mean_ms"] for r in rows}
    assert mean["batch-late"] < mean["batch"] < mean["random"]
    assert mean["per-task"] < mean["random"]
    assert rows[0]["mean_over_optimal"] > 1.0
    late = next(r for r in rows if r["policy"] == "batch-late")
    assert late["mean_over_optimal"] < 1.2
    assert {"mean_ms", "median_ms", "p95_ms", "optimal_ms"} <= set(late)


def test_open_loop_rejects_unstable_load_and_unknown_policy() -> None:
    with pytest.raises(ValueError, match="unstable"):
        placement_experiment(loads=(1.0,), workers=10, tasks_per_job=2, jobs=5)
    with pytest.raises(ValueError, match="unknown policy"):
        placement_experiment(policies=("greedy",), loads=(0.5,))
    with pytest.raises(ValueError, match="workers"):
        zero_wait_experiment(tasks=(100,), loads=(0.5,), workers=50)
    with pytest.raises(ValueError, match=">= 0"):
        priority_experiment(lp_loads=(-0.1,))


def test_high_priority_user_stays_near_unloaded() -> None:
    rows = priority_experiment(lp_loads=(0.0, 1.75), workers=50, slots=4, horizon=6.0)
    unloaded, loaded = rows
    assert unloaded["lp_jobs"] == 0 and unloaded["lp_median_ms"] is None
    assert loaded["hp_median_ms"] < 1.10 * unloaded["hp_median_ms"]
    assert loaded["lp_median_ms"] > 5 * loaded["hp_median_ms"]  # the overloaded user queues


def test_max_min_shares() -> None:
    assert max_min_shares([1.0, 0.25]) == [0.75, 0.25]
    assert max_min_shares([1.0, 0.5]) == [0.5, 0.5]
    assert max_min_shares([1.0, 2.0]) == [0.5, 0.5]
    assert max_min_shares([0.2, 0.3]) == [0.2, 0.3]
    assert max_min_shares([0.1, 1.0, 1.0]) == pytest.approx([0.1, 0.45, 0.45])


def test_fair_shares_track_max_min() -> None:
    rows = fairshare_experiment(demands=(0.0, 0.25, 0.5), phase=4.0, workers=40, slots=4)
    assert len(rows) == 12
    for r in rows:
        if r["t_s"] % 4.0 < 1.0:  # skip the bin where a phase starts
            continue
        assert abs(r["share1"] - r["fair1"]) < 0.07, r
        assert abs(r["share0"] - r["fair0"]) < 0.07, r


def least_total_sojourn(arrival: list[int], size: list[int]) -> int:
    """The smallest sum of sojourn times of any schedule of unit tasks on one slot (exhaustive
    search over which waiting job the slot serves at each step): the reference SRPT must meet."""

    @functools.cache
    def best(t: int, left: tuple[int, ...]) -> int:
        if not any(left):
            return 0
        ready = [j for j, n in enumerate(left) if n and arrival[j] <= t]
        if not ready:  # idle until the next arrival
            return best(min(arrival[j] for j, n in enumerate(left) if n), left)
        out = []
        for j in ready:
            rest = left[:j] + (left[j] - 1,) + left[j + 1:]
            done = t + 1 - arrival[j] if rest[j] == 0 else 0
            out.append(done + best(t + 1, rest))
        return min(out)

    return best(0, tuple(size))


def test_srpt_with_exact_sizes_is_optimal_on_one_slot() -> None:
    # What the HFSP study normalises to must be the optimum it claims to be: on one slot with
    # unit tasks, SRPT with exact sizes reaches the least total sojourn of any schedule, and FIFO,
    # the same code with another policy, does not.
    rng = np.random.default_rng(4)
    fifo_worse = 0
    for _ in range(25):
        n = int(rng.integers(2, 6))
        arrival = np.sort(rng.integers(0, 6, n)).astype(float)
        size = rng.integers(1, 4, n).astype(float)
        work = SizeWorkload(arrival, size)
        want = least_total_sojourn([int(a) for a in arrival], [int(x) for x in size])
        srpt = simulate_size_based(work, size, "srpt", slots=1, task_size=1.0)
        assert srpt.sum() == pytest.approx(want), (arrival, size)
        fifo = simulate_size_based(work, size, "fifo", slots=1, task_size=1.0)
        assert fifo.sum() >= want - 1e-9
        fifo_worse += fifo.sum() > want + 1e-9
    assert fifo_worse > 0  # the reference tells policies apart


def test_aging_is_robust_to_estimation_error() -> None:
    rows = hfsp_experiment(sigmas=(0.0, 1.0), jobs=3000, seed=2)
    v = {(r["sigma"], r["policy"]): r["normalized"] for r in rows}
    # exact sizes: SRPT is the best of the policies (the optimum the rows are normalised to)
    assert v[(0.0, "srpt")] < v[(0.0, "hfsp")] < v[(0.0, "ps")]
    assert v[(0.0, "ps")] > 1.3 * v[(0.0, "srpt")]  # size-based scheduling pays off on heavy tails
    assert v[(1.0, "srpt")] > 1.5 * v[(0.0, "srpt")]  # SRPT degrades with error
    assert v[(1.0, "hfsp")] < v[(1.0, "srpt")]
    assert v[(1.0, "hfsp")] < v[(1.0, "ps")]  # aging still beats fair sharing


def test_cli_prints_one_json_line_per_point(capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(
        [
            "placement",
            "--policy",
            "batch-late",
            "random",
            "--workers",
            "200",
            "--tasks-per-job",
            "20",
            "--load",
            "0.5",
            "--jobs",
            "60",
            "--seed",
            "4",
            "--no-plot",
        ]
    )
    assert rc == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [r["policy"] for r in lines] == ["batch-late", "random"]
    assert all(r["load"] == 0.5 and r["workers"] == 200 for r in lines)


def test_cli_bad_load_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["placement", "--load", "1.2", "--no-plot"]) == 2
    assert "unstable" in capsys.readouterr().err


def test_cli_writes_png(tmp_path: Path) -> None:
    out = tmp_path / "fair.png"
    rc = cli.main(
        ["fairshare", "--demands", "0,0.5", "--phase", "2", "--workers", "20", "--plot", str(out)]
    )
    assert rc == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_python_dash_m_entry_point() -> None:
    root = Path(__file__).resolve().parents[1]
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "canary.sim",
            "hfsp",
            "--jobs",
            "300",
            "--sigma",
            "0,0.5",
            "--no-plot",
        ],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    rows = [json.loads(x) for x in p.stdout.splitlines()]
    assert len(rows) == 6 and {r["policy"] for r in rows} == {"ps", "srpt", "hfsp"}
