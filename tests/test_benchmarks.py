"""The benchmark programs compute the right answers and print the promised JSON (tiny sizes).

Speed is never asserted here: only shapes, keys and answers.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import ROOT


def run_bench(script: str, *args: str, timeout: int = 300) -> list[dict]:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    rows = [json.loads(ln) for ln in lines]  # every stdout line is JSON
    assert "summary" in rows[-1]
    return rows


def test_scheduler_quick_prints_rows_and_summary() -> None:
    rows = run_bench("scheduler.py", "--quick", "--no-peers", "--workers", "1,2")
    summary = rows[-1]
    assert summary["summary"] == "scheduler"
    assert summary["all_correct"] is True
    for key in ("sched_overhead_ns", "tasks_per_s_per_core", "task_us_at_10pct_from_median"):
        assert isinstance(summary[key], float) and summary[key] > 0
    assert set(summary["tasks_by_workers"] if "tasks_by_workers" in summary
               else summary["tasks_per_s_by_workers"]) == {"1", "2"}
    mpi = [r for r in rows if r.get("mode") == "mpi"]
    assert {(r["workers"], r["length_us"]) for r in mpi} == {(1, 0.0), (1, 10.0), (2, 0.0), (2, 10.0)}
    for r in mpi:
        assert r["correct"] is True
        assert len(r["sched_overhead_ns_per_worker"]) == r["workers"]
        assert r["controller_messages"] == 4 * r["workers"]  # Hello, Placement, Done, Shutdown
    assert any(r.get("mode") == "inproc" for r in rows)


def test_scheduler_expected_value_counts_iterations() -> None:
    sys.path.insert(0, str(ROOT))
    from benchmarks.scheduler import START, busy_kernel, expected_value

    a = np.array([7.0, START])
    for _ in range(3):
        busy_kernel(a)
    assert a[1] == expected_value(7, 3) != expected_value(7, 2)


def test_micropartition_quick_answers_are_right() -> None:
    rows = run_bench("micropartition.py", "--quick")
    points = [r for r in rows if "ppc" in r]
    assert {(r["mode"], r["ppc"]) for r in points} == {
        (m, c) for m in ("uniform", "random", "skewed") for c in (1, 2)}
    assert all(r["correct"] for r in points)
    summary = rows[-1]
    assert summary["summary"] == "micropartition" and summary["all_correct"] is True
    assert set(summary["iteration_ms"]) == {"uniform", "random", "skewed"}


def test_apps_bound_kernels_match_numpy() -> None:
    sys.path.insert(0, str(ROOT))
    from benchmarks.apps import km_step, lr_gradient, pagerank_csr, pr_step

    rng = np.random.default_rng(0)
    X, y, w = rng.standard_normal((101, 3)), rng.integers(0, 2, 101).astype(float), rng.standard_normal(4)
    z = X @ w[:3] + w[3]
    r = 1 / (1 + np.exp(-z)) - y
    g = lr_gradient(X, y, w, 4)
    np.testing.assert_allclose(g[:4], np.append(X.T @ r, r.sum()), rtol=1e-10)
    np.testing.assert_allclose(g[4], np.sum(np.logaddexp(0, z) - y * z), rtol=1e-10)
    assert g[5] == 101
    c = X[:3].copy()
    labels = np.full(101, -1, np.int64)
    out = km_step(X, labels, c, 3)
    sums, counts = out[:9].reshape(3, 3), out[9:12]
    lab = np.argmin(((X[:, None, :] - c[None]) ** 2).sum(-1), axis=1)
    np.testing.assert_array_equal(labels, lab)
    np.testing.assert_array_equal(counts, np.bincount(lab, minlength=3))
    np.testing.assert_allclose(sums, np.array([X[lab == k].sum(0) for k in range(3)]), rtol=1e-12)
    indptr, src, outdeg = pagerank_csr(64, 500)
    contrib = rng.random(64)
    out = np.empty(64)
    pr_step(indptr, src, contrib, out, 0.1, 0.85)
    from canary.generate import rmat_edges

    e = rmat_edges(64, 500, 0)
    want = 0.1 + 0.85 * np.bincount(e[:, 1], weights=contrib[e[:, 0]], minlength=64)
    np.testing.assert_allclose(out, want, rtol=1e-12)
    assert outdeg.sum() == 500


@pytest.mark.parametrize("app", ["logistic_regression", "kmeans", "pagerank"])
def test_apps_quick_row_shape(app: str) -> None:
    rows = run_bench("apps.py", "--quick", "--no-peers", "--apps", app, "--iters", "5")
    (row,) = [r for r in rows if r.get("app") == app and "canary_s" in r]
    if app != "kmeans":  # k-means may converge (no label changes) before --max-iter
        assert row["canary_iterations"] == 5
        assert row["canary_summary"]["iterations"] == 5
    assert row["canary_s"] > 0 and row["numba_s"] > 0 and row["canary_vs_numba"] > 0
    assert len(row["peak_rss_mb_by_worker"]) == 2 and row["baseline_rss_mb"] > 0
    summary = rows[-1]
    assert summary["summary"] == "apps" and f"{app}@{row['size']}" in summary["canary_vs_numba"]
