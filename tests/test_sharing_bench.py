"""``benchmarks/sharing.py --quick`` runs every experiment on real ranks and prints the promised
JSON (shapes and answers only, never speed)."""

from __future__ import annotations

from pathlib import Path

from tests.test_benchmarks import run_bench


def test_sharing_quick_prints_every_experiment_and_a_summary(tmp_path: Path) -> None:
    rows = run_bench("sharing.py", "--quick", "--plot", str(tmp_path), timeout=600)
    kinds = [r.get("experiment") for r in rows[:-1]]
    assert kinds.count("correctness") == 1 and kinds.count("priority") == 2
    assert kinds.count("hfsp") == 3 and kinds.count("placement") == 4
    assert kinds.count("fair") == 1 and kinds.count("overheads") == 1
    summary = rows[-1]
    assert summary["summary"] == "sharing" and summary["identical"] == {"sharing_job": True}
    assert all(r["all_done"] for r in rows if r.get("experiment") == "hfsp")
    over = next(r for r in rows if r.get("experiment") == "overheads")
    assert over["half_failed"] is True and over["jobs_per_s"] > 0
    assert set(over["worker_rss_mb_after_jobs"]) == {"10", "20"}
    for row in (r for r in rows if r.get("experiment") == "placement"):
        assert row["pool_job_worker_cpu_ms"] > 0 and row["pool_job_latency_ms"] > 0
        assert row["simulated_with_pool_cost_median_s"] > 0
    fair = next(r for r in rows if r.get("experiment") == "fair")
    assert set(fair["timeline"]) == {"t", "w1", "w2", "w1b"}
    for png in ("fair_share.png", "hfsp.png", "placement.png"):
        assert (tmp_path / png).stat().st_size > 0
