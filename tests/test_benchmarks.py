"""The benchmark programs compute the right answers and print the promised JSON (tiny sizes).

Speed is never asserted here: only shapes, keys and answers.
"""

from __future__ import annotations

import gzip
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import ROOT, shm_left_behind, shm_segments


def run_bench(script: str, *args: str, timeout: int = 300,
              env: dict[str, str] | None = None) -> list[dict]:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    rows = [json.loads(ln) for ln in lines]  # every stdout line is JSON
    assert "summary" in rows[-1]
    return rows


def test_scheduler_quick_prints_rows_and_summary() -> None:
    rows = run_bench("scheduler.py", "--quick", "--no-peers", "--workers", "1,2")
    summary = rows[-1]
    assert summary["summary"] == "scheduler" and summary["workers"] == 2
    mpi = [r for r in rows if r.get("mode") == "mpi"]
    assert {(r["workers"], r["length_us"]) for r in mpi} == {(1, 0.0), (1, 10.0), (2, 0.0), (2, 10.0)}
    for r in mpi:
        assert r["correct"] is True
        assert len(r["sched_overhead_ns_per_worker"]) == r["workers"]
        assert r["controller_messages"] == 4 * r["workers"]  # Hello, Placement, Done, Shutdown
    inproc = [r for r in rows if r.get("mode") == "inproc"]
    assert {(r["variant"], r["length_us"]) for r in inproc} == {
        (v, n) for v in ("tasks", "fused_python", "fused_compiled") for n in (0.0, 10.0)}
    assert all(r["correct"] is True for r in inproc) and summary["all_correct"] is True
    # The summary is derived from the rows as its docstring says: the median cost over the
    # widest MPI run's points of at most 10 µs, the rate that implies, the best rate per run.
    widest = [r for r in mpi if r["workers"] == 2]
    over = statistics.median(r["sched_overhead_ns"] for r in widest)
    assert summary["sched_overhead_ns"] == pytest.approx(over, abs=0.1)
    assert summary["tasks_per_s_per_core"] == pytest.approx(1e9 / over, rel=1e-3)
    assert summary["task_us_at_10pct_from_median"] == pytest.approx(9 * over / 1e3, abs=0.01)
    shortest = next((r["length_us"] for r in widest
                     if r["length_us"] > 0 and r["sched_cpu_fraction"] <= 0.10), None)
    assert summary["shortest_task_us_at_10pct"] == shortest
    assert summary["tasks_per_s_by_workers"] == {
        str(w): max(r["tasks_per_s"] for r in mpi if r["workers"] == w) for w in (1, 2)}
    assert summary["inproc_sched_overhead_ns"] == {
        v: pytest.approx(statistics.median(r["sched_overhead_ns"] for r in inproc
                                           if r["variant"] == v), abs=0.1)
        for v in ("tasks", "fused_python", "fused_compiled")}
    assert not any(k.startswith("rate_vs_") for k in summary)  # no peer ran


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
    from benchmarks.apps import km_step, lr_gradient, pr_step
    from benchmarks.datasets import pagerank_csr

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


def test_bounds_that_call_app_kernels_are_cached_under_the_apps_source(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # numba keys a disk cache entry on the caller's file alone: a bound cached there would keep
    # running the app's kernel as first compiled, however the app changes since.
    import hashlib
    import importlib.util

    import numba
    from numba.core.caching import NullCache

    sys.path.insert(0, str(ROOT))
    import apps.kmeans as km_app
    import apps.logistic_regression as lr_app
    from benchmarks.apps import km_step, lr_gradient, njit_keyed_on

    for bound, app in ((lr_gradient, lr_app), (km_step, km_app)):
        digest = hashlib.sha256(Path(app.__file__).read_bytes()).hexdigest()[:16]
        assert f"bounds-{digest}" in bound._cache._cache_path, bound.py_func.__name__

    def bound_of(source: str) -> Any:
        """A bound decorated with ``njit_keyed_on`` a module whose source is ``source``."""
        path = tmp_path / "app_like.py"
        path.write_text(source)
        spec = importlib.util.spec_from_file_location("app_like", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        before = numba.config.CACHE_DIR
        bound = njit_keyed_on(module)(lambda x: x + 1)
        assert numba.config.CACHE_DIR == before  # set for the decoration only
        return bound

    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path / "numba"))  # NUMBA_CACHE_DIR
    one = bound_of("K = 1\n")._cache._cache_path
    assert one.startswith(str(tmp_path / "numba" / "bounds-"))
    assert bound_of("K = 1\n")._cache._cache_path == one
    assert bound_of("K = 2\n")._cache._cache_path != one
    # a cache folder that cannot be written: compiled afresh, never cached under another key
    monkeypatch.setattr(numba.config, "CACHE_DIR", "/proc/no-such-folder")
    assert isinstance(bound_of("K = 3\n")._cache, NullCache)


def check_apps_row_shape(rows: list[dict], app: str, repeats: int) -> None:
    """The row apps.py --quick --iters 5 --baselines 1 prints for ``app``, and its summary."""
    (row,) = [r for r in rows if r.get("app") == app and "canary_s" in r]
    assert len(row["canary_s_runs"]) == len(row["numba_s_runs"]) == repeats
    assert row["canary_s"] == min(row["canary_s_runs"])
    assert row["numba_s"] == min(row["numba_s_runs"])
    if app != "kmeans":  # k-means may converge (no label changes) before --max-iter
        assert row["canary_iterations"] == 5
        assert row["canary_summary"]["iterations"] == 5
    assert row["canary_s"] > 0 and row["numba_s"] > 0 and row["canary_vs_numba"] > 0
    # each round's own ratio, then their median: not the ratio of the fastest of each
    paired = statistics.median(c / b for c, b in zip(row["canary_s_runs"], row["numba_s_runs"]))
    assert row["canary_vs_numba_paired"] == pytest.approx(paired, abs=1e-3)
    assert len(row["peak_rss_mb_by_worker"]) == 2 and row["baseline_rss_mb"] > 0
    if app != "kmeans":  # the baseline runs as many (traced) iterations as the timed runs
        assert row["baseline_iterations"] == [5]
    assert row["measure_wall_s"] > 0
    summary = rows[-1]
    key = f"{app}@{row['size']}"
    assert summary["summary"] == "apps" and key in summary["canary_vs_numba"]
    assert summary["canary_vs_numba_paired"][key] == row["canary_vs_numba_paired"]
    assert summary["wall_s"] >= row["measure_wall_s"]


# logistic_regression's row (with the interleaved repeats) is checked by
# test_apps_names_a_peer_whose_answer_is_wrong, which runs the same app in-process
@pytest.mark.parametrize("app", ["kmeans", "pagerank"])
def test_apps_quick_row_shape(app: str) -> None:
    # one baseline run: the median of three is for figures, not for the rows' shape
    rows = run_bench("apps.py", "--quick", "--no-peers", "--apps", app, "--iters", "5",
                     "--repeats", "1", "--baselines", "1")
    check_apps_row_shape(rows, app, 1)


def test_apps_needs_a_baseline_run(capsys: pytest.CaptureFixture[str]) -> None:
    sys.path.insert(0, str(ROOT))
    import benchmarks.apps as bench_apps

    with pytest.raises(SystemExit) as stop:
        bench_apps.main(["--quick", "--baselines", "0"])
    assert stop.value.code == 2
    assert "--baselines 0: at least one run is needed" in capsys.readouterr().err


def test_lr_floor_quick_matches_numpy_and_reports_ratios(tmp_path: Path) -> None:
    # The hand-written MPI program (2 ranks, Allreduce) must end on the weights that plain
    # gradient descent in numpy reaches: a floor that computed something else would be no floor.
    from benchmarks.lr_floor import reference_weights

    trace = tmp_path / "floor_trace.json"
    rows = run_bench("lr_floor.py", "--quick", "--trace", str(trace))
    events = json.loads(trace.read_text())["traceEvents"]  # the canary run's Chrome trace
    assert any(e.get("name") == "gradient_kernel" for e in events)
    (row,) = [r for r in rows if "round" in r]
    assert row["rows"] == 4000 and row["workers"] == 2
    want = reference_weights(4000, 20, 5)
    np.testing.assert_allclose(row["floor_weights"], want, rtol=1e-9, atol=1e-12)
    assert min(row["numba_s"], row["mpi_floor_s"], row["canary_s"]) > 0
    summary = rows[-1]
    assert summary["summary"] == "lr_floor" and summary["rounds"] == 1
    assert summary["canary_vs_mpi_floor"] == pytest.approx(
        row["canary_s"] / row["mpi_floor_s"], rel=2e-3)
    assert summary["canary_vs_numba_paired"] == pytest.approx(
        row["canary_s"] / row["numba_s"], rel=2e-3)


def test_benchmark_data_is_made_once_and_cannot_be_changed_by_a_peer() -> None:
    # apps.py hands the same arrays to the bound and to every peer: one that wrote into them
    # would change what the next one times (and what its answer is checked against).
    sys.path.insert(0, str(ROOT))
    from benchmarks import datasets
    from canary.generate import logistic_data, rmat_edges

    X, y = datasets.lr_data(300, 4)
    assert datasets.lr_data(300, 4)[0] is X  # made once
    want_X, want_y = logistic_data(300, 4, 0)
    np.testing.assert_array_equal(X, want_X)
    np.testing.assert_array_equal(y, want_y)
    edges = datasets.rmat(64, 500)
    np.testing.assert_array_equal(edges, rmat_edges(64, 500, 0))
    indptr, src, outdeg = datasets.pagerank_csr(64, 500)
    for a in (X, y, edges, indptr, src, outdeg):
        with pytest.raises(ValueError, match="read-only"):
            a[0] = 1
    # the CSR lists, for each destination, its in-edges' sources in edge order
    for v in (0, 7, 63):
        np.testing.assert_array_equal(src[indptr[v]:indptr[v + 1]], edges[edges[:, 1] == v, 0])


def test_spark_jvm_sources_hash_and_skip_without_javac(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    import shutil

    from benchmarks import spark_jvm

    names = {p.name for p in spark_jvm.sources()}
    assert {"Io.java", "LogisticRegression.java", "KMeans.java", "PageRankJoin.java",
            "GraphXPageRank.java"} <= names
    # The cache key: the same sources give the same key, an edit or another toolchain a new one.
    shutil.copytree(spark_jvm.JVM_DIR, tmp_path / "jvm", ignore=shutil.ignore_patterns("build"))
    copy = spark_jvm.sources(tmp_path / "jvm")
    key = spark_jvm.source_hash(copy, tmp_path / "jvm", "pyspark 1")
    assert key == spark_jvm.source_hash(spark_jvm.sources(), extra="pyspark 1")
    assert key != spark_jvm.source_hash(copy, tmp_path / "jvm", "pyspark 2")
    copy[0].write_text(copy[0].read_text() + "\n// edited\n")
    assert key != spark_jvm.source_hash(copy, tmp_path / "jvm", "pyspark 1")
    # No javac (nor java): every JVM peer says why and what to install, and starts no Spark.
    monkeypatch.setattr(shutil, "which", lambda name: None)
    why = spark_jvm.unavailable()
    assert why is not None and "javac" in why
    with pytest.raises(RuntimeError, match="javac"):
        spark_jvm.build_jar(tmp_path / "cache")

    def no_spark(threads: int, jar: str | None) -> None:
        raise AssertionError("no SparkContext may start without javac")

    for name, run in [
        ("spark_jvm_mappartitions", lambda: spark_jvm.peer_lr(100, 3, 2, 3, no_spark)),
        ("spark_jvm_mappartitions",
         lambda: spark_jvm.peer_kmeans(str(tmp_path / "x.npy"), 3, 2, 3, no_spark)),
        ("spark_jvm_rdd_join", lambda: spark_jvm.peer_pagerank_join(64, 500, 2, 3, no_spark)),
        ("spark_graphx", lambda: spark_jvm.peer_graphx(64, 500, 2, 3, no_spark)),
    ]:
        assert run() == {"peer": name, "skipped": why}


def test_spark_jvm_references_match_plain_loops() -> None:
    """The numpy computations that decide a JVM peer's ``correct`` match the algorithms written
    out one vertex / point at a time, and a wrong answer is told apart."""
    from benchmarks import spark_jvm
    from canary.generate import rmat_edges

    v, iters = 64, 4
    edges = rmat_edges(v, 400, 0)
    # Classic RDD-join PageRank with dicts, as the PySpark and JVM peers hold their RDDs.
    links: dict[int, list[int]] = {}
    for s, t in edges.tolist():
        links.setdefault(s, []).append(t)
    ranks = {s: 1.0 / v for s in links}
    for _ in range(iters):
        acc: dict[int, float] = {}
        for s, nbrs in links.items():
            if s in ranks:
                for t in nbrs:
                    acc[t] = acc.get(t, 0.0) + ranks[s] / len(nbrs)
        ranks = {t: 0.15 / v + 0.85 * x for t, x in acc.items()}
    want = np.full(v, np.nan)
    want[list(ranks)] = list(ranks.values())
    got = spark_jvm.pagerank_join_reference(v, edges, iters)
    assert spark_jvm.rel_err(got, want) < 1e-13
    # GraphX: every vertex of an edge starts at 1.0, reset 0.15, normalised at the end.
    verts = set(edges.ravel().tolist())
    gx = dict.fromkeys(verts, 1.0)
    for _ in range(iters):
        msg = dict.fromkeys(verts, 0.0)
        for s, t in edges.tolist():
            msg[t] += gx[s] / len(links[s])
        gx = {u: 0.15 + 0.85 * m for u, m in msg.items()}
    want = np.full(v, np.nan)
    want[list(gx)] = np.array(list(gx.values())) / sum(gx.values())
    got = spark_jvm.pagerank_graphx_reference(v, edges, iters)
    assert spark_jvm.rel_err(got, want) < 1e-13 and abs(np.nansum(got) - 1) < 1e-12
    # k-means: nearest centre by squared distance, empty centres stay.
    rng = np.random.default_rng(1)
    X = rng.random((300, 3))
    c = X[:4].copy()
    for _ in range(iters):
        lab = [int(np.argmin([((x - cc) ** 2).sum() for cc in c])) for x in X]
        c = np.array([X[np.array(lab) == j].mean(0) if j in lab else c[j] for j in range(4)])
    assert spark_jvm.rel_err(spark_jvm.kmeans_reference(X, 4, iters, chunk=7), c) < 1e-12
    # Logistic regression: one step from w = 0 is -0.1 * X.T @ (0.5 - y) / n.
    y = (rng.random(300) < 0.5).astype(float)
    np.testing.assert_allclose(spark_jvm.lr_reference(X, y, 1), -0.1 * X.T @ (0.5 - y) / 300,
                               rtol=1e-14)
    # A wrong answer, a missing or extra vertex, or a wrong shape is not "correct".
    assert spark_jvm.rel_err(c * (1 + 1e-6), c) > spark_jvm.RTOL
    assert spark_jvm.rel_err(np.where(np.isnan(got), 0.0, got), got) == float("inf")
    assert spark_jvm.rel_err(c[:3], c) == float("inf")
    assert spark_jvm.inner_mean([9.0, 1.0, 3.0, 9.0]) == 2.0
    assert spark_jvm.inner_mean([4.0, 2.0]) == 3.0


def test_ab_runs_both_checkouts_interleaved_and_compares_answers(tmp_path: Path) -> None:
    # side B's ranks get --env-b, side A's do not: B records the loop tests only (no message
    # slices), A every task and message
    trace = tmp_path / "ab"
    rows = run_bench("ab.py", str(ROOT), "--quick", "--trace", str(trace),
                     "--env-b", "CANARY_TRACE_LEVEL=loop")
    (row,), summary = rows[:-1], rows[-1]
    assert row["a_s"] > 0 and row["b_s"] > 0 and row["first"] == "a"
    # one checkout against itself: the same answer, and it is the app's real answer
    assert row["same_answer"] is True and row["answer_a"] == row["answer_b"]
    assert row["answer_a"]["iterations"] == 5 and 0 < row["answer_a"]["objective"] < np.log(2)
    assert summary["summary"] == "ab" and summary["rounds"] == 1
    assert summary["median_diff_ms"] == pytest.approx((row["b_s"] - row["a_s"]) * 1e3, abs=1e-3)
    assert summary["b_faster_rounds"] == int(row["b_s"] < row["a_s"])
    sent = {}
    for side in ("a", "b"):  # each side's first run traced
        events = json.loads((tmp_path / f"ab.{side}.json").read_text())["traceEvents"]
        assert events
        sent[side] = sum(str(e.get("name", "")).startswith("send ") for e in events)
    assert sent["a"] > 0 and sent["b"] == 0, sent


def test_ab_sets_each_sides_environment_and_flags(tmp_path: Path) -> None:
    # one checkout, two settings: side A's app gets --args-a (here a value the app rejects,
    # which only a run that sees it can report); a pair without '=' is a usage error. That side
    # B's ranks get --env-b (and A's do not) is checked by the traces of
    # test_ab_runs_both_checkouts_interleaved_and_compares_answers: a rejected value there cost
    # a whole run of side A first
    ab = [sys.executable, str(ROOT / "benchmarks" / "ab.py"), str(ROOT), "--quick"]
    proc = subprocess.run([*ab, "--args-a", "--partitions 0"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "--partitions must be positive, got 0" in proc.stderr
    proc = subprocess.run([*ab, "--env-a", "CANARY_TRACE_LEVEL"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and "expect NAME=VALUE" in proc.stderr
    # --bind-to reaches mpiexec: a level hydra does not know is hydra's error, named
    proc = subprocess.run([*ab, "--bind-to", "bogus"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode != 0 and 'unrecognized directive "bogus"' in proc.stderr


def test_ab_names_a_base_that_is_neither_a_checkout_nor_a_revision(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ab.py"), str(tmp_path),
                           "--quick"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and str(tmp_path) in proc.stderr
    assert "neither a canary checkout nor a git revision" in proc.stderr


def test_a_peers_answer_is_checked_against_numpys() -> None:
    # every peer's row says whether it computed the app (apps.checked): a peer that timed a
    # different computation would make its speedup meaningless
    sys.path.insert(0, str(ROOT))
    from benchmarks.apps import checked
    from benchmarks.datasets import lr_data
    from benchmarks.spark_jvm import lr_reference

    X, y = lr_data(200, 3)
    want = lr_reference(X, y, 4)
    ok = checked("peer", 0.5, want * (1 + 1e-13), want)
    assert ok == {"peer": "peer", "seconds": 0.5, "correct": True,
                  "max_rel_err": pytest.approx(1e-13, rel=0.1)}
    assert not checked("peer", 0.5, lr_reference(X, y, 3), want)["correct"]  # one step short
    assert not checked("peer", 0.5, np.append(want[:-1], np.nan), want)["correct"]


def test_apps_names_a_peer_whose_answer_is_wrong(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    # A peer that computed something else must not hide among the speedups: the summary (the
    # line people read) lists it, and stderr says so while the run goes on.
    sys.path.insert(0, str(ROOT))
    import benchmarks.apps as bench_apps

    def peer(right: bool) -> Any:
        def run(*args: Any, **kwargs: Any) -> dict[str, Any]:
            return {"peer": "dask_threaded" if right else "pyspark_mappartitions",
                    "seconds": 1.0, "correct": right, "max_rel_err": 0.0 if right else 0.5}
        return run

    monkeypatch.setattr(bench_apps, "peer_dask_lr", peer(True))
    monkeypatch.setattr(bench_apps, "peer_spark_lr", peer(False))
    monkeypatch.setattr(bench_apps.spark_jvm, "peer_lr",
                        lambda *a, **k: {"peer": "spark_jvm_mappartitions", "skipped": "test"})
    # two interleaved repeats: this run also stands for test_apps_quick_row_shape's
    # logistic_regression case (one apps.py run of the app fewer)
    assert bench_apps.main(["--quick", "--apps", "logistic_regression", "--iters", "5",
                            "--repeats", "2", "--baselines", "1"]) == 0
    out, err = capsys.readouterr()
    rows = [json.loads(line) for line in out.splitlines()]  # every stdout line is JSON
    assert "summary" in rows[-1]
    check_apps_row_shape(rows, "logistic_regression", 2)
    (row,) = [r for r in rows if "canary_s" in r]
    assert row["peers_correct"] == {"dask_threaded": True, "pyspark_mappartitions": False}
    assert rows[-1]["peers_wrong"] == ["logistic_regression@20000,8:pyspark_mappartitions"]
    assert "pyspark_mappartitions's answer differs from numpy's" in err


def test_core_share_quick_measures_a_burst_beside_a_busy_loop() -> None:
    rows = run_bench("core_share.py", "--quick", "--slices", "20", "--alone")
    cases, summary = rows[:-1], rows[-1]
    assert [(r["burst_ms"], r["duty"], r["slice_ms"], r.get("alone", False)) for r in cases] \
        == [(1.0, 0.3, 0.0, True), (1.0, 0.3, 0.0, False), (1.0, 0.3, 20.0, False)]
    for r in cases:  # a burst's wall time is never shorter than its CPU time
        assert r["bursts"] == 40 and 0.99 <= r["median"] <= r["p90"] <= r["p99"]
        assert r["mean"] >= 0.99
        # a wait ends at or after its deadline
        assert 0 <= r["late_ms_median"] <= r["late_ms_p90"] and r["late_ms_mean"] >= 0
    assert summary["summary"] == "core_share" and summary["cases"] == 3
    assert summary["core"] in os.sched_getaffinity(0)
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "core_share.py"),
                           "--slices", "500"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "within 0.1 to 100 ms" in proc.stderr
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "core_share.py"),
                           "--duties", "1.5"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--duties within (0, 1)" in proc.stderr


def test_straggler_quick_prints_each_run_and_a_summary(tmp_path: Path) -> None:
    from benchmarks.straggler import controller_core, ideal_ms, worker_core
    from canary.trace import iteration_seconds, load_events

    rows = run_bench("straggler.py", "--quick", "--apps", "logistic_regression",
                     "--scenarios", "competing", "--keep-traces", str(tmp_path))
    kept = {p.name: p for p in tmp_path.iterdir()}
    assert set(kept) == {f"logistic_regression_{n}_w2.json"
                         for n in ("equal", "equal_pinned", "competing_off", "competing_on")}
    assert len(iteration_seconds(load_events(str(kept["logistic_regression_equal_w2.json"])))) \
        == rows[0]["iterations"]
    runs = rows[:-1]
    assert [(r["scenario"], r["balance"]) for r in runs] == [
        ("equal", True), ("equal_pinned", True), ("competing", False), ("competing", True)]
    for r in runs:
        assert r["iterations"] == len(r["series_ms"]) == len(r["series_at_s"]) > 0
        assert r["steady_ms"] > 0
        assert r["controller_cpu_percent"] >= 0
    for r in runs:  # each worker's load, from the reports it sent (a quick run may send none)
        assert [w["worker"] for w in r["worker_load"]] in ([], [0], [1], [0, 1])
        assert all(0 <= w[k] <= 1 for w in r["worker_load"]
                   for k in ("busy", "cpu_wait", "polls_hot"))
    # the competed runs are measured against the run pinned the same way
    pinned, off = runs[1]["steady_ms"], runs[2]["steady_ms"]
    assert runs[3]["ideal_ms"] == pytest.approx(ideal_ms(2, pinned, max(off / pinned, 1.0)),
                                                abs=1e-3)
    # ... by medians, and by means, over the same last 40% of the series
    for r in runs:
        tail = r["series_ms"][int(len(r["series_ms"]) * 0.6):]
        assert r["steady_ms"] == pytest.approx(statistics.median(tail), abs=1e-3)
    for r in runs[2:]:
        tail = r["series_ms"][int(len(r["series_ms"]) * 0.6):]
        assert r["mean_ms"] == pytest.approx(statistics.fmean(tail), abs=1e-3)
    means = [statistics.fmean(r["series_ms"][int(len(r["series_ms"]) * 0.6):]) for r in runs]
    ideal = ideal_ms(2, means[1], max(means[2] / means[1], 1.0))
    assert runs[3]["over_ideal_mean"] == pytest.approx(means[3] / ideal, abs=2e-3)
    summary = rows[-1]
    assert summary["summary"] == "straggler"
    # where the pinned ranks ran, and how many physical cores they had among them
    assert summary["pinned_cpus"] == {"workers": [worker_core(0), worker_core(1)],
                                      "controller": controller_core(2)}
    assert 1 <= summary["physical_cores"] <= summary["cpus"]
    assert summary["balanced_run_moves"] == {"logistic_regression": runs[0]["migrations"],
                                             "logistic_regression/pinned": runs[1]["migrations"]}
    assert set(summary["over_ideal"]) == {"logistic_regression/competing"}
    assert summary["over_ideal_mean"] == {"logistic_regression/competing":
                                          runs[3]["over_ideal_mean"]}
    assert summary["settled_mean_s"] == {"logistic_regression/competing":
                                         runs[3]["settled_mean_s"]}
    assert runs[2]["settled_mean_s"] is None  # an off run does not settle


def test_straggler_settles_by_the_mean_where_a_busy_process_slows_one_iteration_in_a_few() -> None:
    from benchmarks.straggler import SETTLE_WINDOW, TARGET, settled_at

    # 2 ms iterations with every fourth a 4 ms turn late until iteration 100: every window's
    # median is 2 ms, within TARGET of a 2.5 ms ideal from the start; a window's mean (2.96 ms
    # with 6 late ones, 2.8 with 5) is within it from the first window with at most 5 late
    # ones on (k = 80: 83, 87, ..., 99)
    times = [6.0 if k % 4 == 3 and k < 100 else 2.0 for k in range(300)]
    at = [0.01 * k for k in range(300)]
    assert SETTLE_WINDOW == 25 and 2.8 <= TARGET * 2.5 < 2.96
    assert settled_at(times, at, 2.5) == at[0]
    assert settled_at(times, at, 2.5, statistics.fmean) == at[80]
    assert settled_at(times[:100], at[:100], 2.5, statistics.fmean) is None


def test_straggler_virtual_prints_a_row_per_worker_count() -> None:
    from benchmarks.straggler import best_split

    # with PYTHONPATH naming the checkout, as a user may set it: the script's own folder came
    # first on sys.path then, and benchmarks/apps.py hid the apps package it imports
    rows = run_bench("straggler.py", "--quick", "--apps", "", "--virtual", "3",
                     "--ppw", "2", env={**os.environ, "PYTHONPATH": str(ROOT)})
    (row,) = rows[:-1]
    assert (row["scenario"], row["workers"], row["ppw"], row["factor"]) == ("virtual", 3, 2, 3.0)
    # unbalanced, each iteration waits for the slow worker's 2 gradients at 3 x 1 ms
    assert row["off_ms"] == pytest.approx(6.0, rel=0.02)
    assert row["best_split_ms"] == pytest.approx(6 * best_split(3, 2, 3.0))
    assert row["over_best_split"] == pytest.approx(row["steady_ms"] / row["best_split_ms"],
                                                   abs=1e-3)
    assert rows[-1]["virtual_over_ideal"] == {"3": row["over_ideal"]}


def test_straggler_spells_prints_the_moves_of_each_seeded_run() -> None:
    rows = run_bench("straggler.py", "--quick", "--apps", "", "--spells", "3", "--ppw", "2",
                     "--spell-seeds", "2", "--spell-rate", "5")
    (row,) = rows[:-1]
    assert (row["scenario"], row["workers"], row["ppw"]) == ("spells", 3, 2)
    assert len(row["moves"]) == 2 and row["runs_with_moves"] == sum(m > 0 for m in row["moves"])
    assert rows[-1]["spells_runs_with_moves"] == {"3": row["runs_with_moves"]}
    # each run's time beside the same run with balancing off
    assert len(row["on_over_off"]) == 2 and all(r > 0 for r in row["on_over_off"])
    assert (row["spell_s"], row["spell_factors"]) == ([1.5, 5.0], [1.2, 1.6])


def test_straggler_spells_of_a_given_length_and_factor_cost_what_their_moves_cost() -> None:
    from benchmarks.straggler import spells_run

    # spells that slow nothing (a factor of 1, however long) move nothing, and on and off
    # take the same time; long spells of 3x slower tasks (8 virtual seconds, spells of 10-20,
    # seldom two at once) move partitions, and then the times differ
    still = spells_run(3, 4, 0.1, 1, 2000, lasting_s=(10.0, 20.0), factors=(1.0, 1.0))
    assert still["moves"] == [0] and still["on_over_off"] == [1.0]
    moved = spells_run(3, 4, 0.1, 1, 2000, lasting_s=(10.0, 20.0), factors=(3.0, 3.0))
    assert moved["moves"][0] > 0 and moved["on_over_off"][0] != 1.0


def test_spell_noise_slows_each_worker_in_its_own_seeded_spells() -> None:
    from benchmarks.straggler import spell_noise

    noise = spell_noise(3, rate=0.5, seed=1, horizon_s=200)
    ts = [k * 0.05 for k in range(4000)]
    for w in range(3):
        factors = [noise(w, t) for t in ts]
        slow = [f for f in factors if f != 1.0]
        assert slow and all(1.2 <= f <= 1.6 for f in slow)
        # spells 1.5-5 s long, a mean gap of 2 s after each: slow about 60% of the time
        assert 0.3 < len(slow) / len(factors) < 0.85
    assert [noise(0, t) for t in ts] != [noise(1, t) for t in ts]  # each worker its own
    assert [noise(0, t) for t in ts] == [spell_noise(3, 0.5, 1, 200)(0, t) for t in ts]


def test_straggler_puts_a_competing_busy_loop_on_its_workers_core() -> None:
    # the pinned child and the busy loop use one mapping, which wraps round the cores this
    # process may use (more workers than cores, or an affinity narrower than the machine)
    from benchmarks.straggler import core_order, worker_core

    cores = core_order(sorted(os.sched_getaffinity(0)))
    assert sorted(cores) == sorted(os.sched_getaffinity(0))
    assert [worker_core(w) for w in range(2 * len(cores) + 1)] == \
        [cores[w % len(cores)] for w in range(2 * len(cores) + 1)]


def test_pinned_ranks_take_a_physical_core_each_before_any_sibling() -> None:
    # two hardware threads of one core share it: 4 workers pinned to CPUs 0-3 of a machine
    # numbering siblings together would get 2 cores' worth
    from benchmarks.straggler import core_order, physical_core
    from canary.hosts import _expand_range

    together = {c: c // 2 for c in range(8)}  # (0, 1), (2, 3), ... share a core
    apart = {c: c % 4 for c in range(8)}  # (0, 4), (1, 5), ...
    assert core_order(list(range(8)), together.__getitem__) == [0, 2, 4, 6, 1, 3, 5, 7]
    assert core_order(list(range(8)), apart.__getitem__) == list(range(8))
    assert core_order([5, 1, 3], lambda c: c) == [1, 3, 5]  # no SMT: CPU order
    # an affinity that holds one thread of a core and both of another
    assert core_order([1, 2, 3], together.__getitem__) == [1, 2, 3]
    assert core_order([0, 1, 2], together.__getitem__) == [0, 2, 1]
    # read from sysfs on Linux: hardware threads of one core (the kernel's sibling lists) share
    # a name and no others do; the CPU's own number where there is no topology
    cpus = sorted(os.sched_getaffinity(0))
    for cpu in cpus:
        listed = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
        if listed.exists():  # "0-1" or "0,8": ranges as Slurm's node lists write them
            text = listed.read_text().strip()
            siblings = {int(c) for c in _expand_range(text, text)}
            assert {c for c in cpus if physical_core(c) == physical_core(cpu)} == \
                siblings & set(cpus)
    assert physical_core(10**6) == 10**6


def test_straggler_competing_process_spins_only_its_duty_and_sleeps_the_rest() -> None:
    from benchmarks.straggler import busy_loop

    core = sorted(os.sched_getaffinity(0))[-1]

    def state(pid: int) -> tuple[str, str]:
        """Its state as the kernel sees it (R running or runnable, S asleep), and the cores
        it may run on."""
        with open(f"/proc/{pid}/stat") as f:
            run = f.read().rsplit(")", 1)[1].split()[0]
        with open(f"/proc/{pid}/status") as f:
            cores = next(line for line in f if line.startswith("Cpus_allowed_list")).split()[1]
        return run, cores

    for duty, sleeps in ((1.0, False), (0.2, True)):
        hog = busy_loop(core, duty)
        try:
            for _ in range(3000):  # its loop begins once it is on its core
                if state(hog.pid)[1] == str(core) or hog.poll() is not None:
                    break
                time.sleep(0.01)
            assert hog.poll() is None and state(hog.pid)[1] == str(core)
            states = set()
            for _ in range(300):
                states.add(state(hog.pid)[0])
                if sleeps and states >= {"R", "S"}:
                    break
                time.sleep(0.002)
        finally:
            hog.kill()
            hog.wait()
        assert states == ({"R", "S"} if sleeps else {"R"})


def test_straggler_gives_the_controller_a_core_of_its_own_where_there_is_one() -> None:
    from benchmarks.straggler import controller_core, core_order

    cores = core_order(sorted(os.sched_getaffinity(0)))
    assert controller_core(len(cores)) == cores[0]  # no spare core: the first worker's
    if len(cores) > 1:
        assert controller_core(len(cores) - 1) == cores[-1]  # the one the workers leave
    assert controller_core(1) == cores[1 % len(cores)]


def test_straggler_inputs_grow_with_the_workers() -> None:
    from benchmarks.straggler import APPS, per_worker

    data = APPS["kmeans"][0]
    assert per_worker(data, 2) == data  # the rows given are for 2 workers
    scaled = per_worker(data, 8)
    k = data.index("--generate") + 1
    assert scaled[k] == "1200000,20,2" and scaled[:k] + scaled[k + 1:] == data[:k] + data[k + 1:]


@pytest.mark.parametrize("workers,factor", [(2, 2.0), (2, 3.0), (3, 3.0), (3, 1.5)])
def test_straggler_best_split_is_the_best_of_every_placement(workers: int, factor: float) -> None:
    import itertools

    sys.path.insert(0, str(ROOT))
    from benchmarks.straggler import best_split

    speeds = [1.0] * (workers - 1) + [1.0 / factor]
    for ppw in (1, 2, 4):
        total = workers * ppw
        brute = min(max(n / s for n, s in zip(counts, speeds)) / total
                    for counts in itertools.product(range(total + 1), repeat=workers)
                    if sum(counts) == total)
        assert best_split(workers, ppw, factor) == pytest.approx(brute)
    # finer partitions never split worse
    got = [best_split(workers, p, factor) for p in (1, 2, 4, 8, 16)]
    assert all(b <= a + 1e-12 for a, b in zip(got, got[1:]))


def test_straggler_micro_runs_the_partitions_per_worker_asked_for() -> None:
    from benchmarks.straggler import best_split

    rows = run_bench("straggler.py", "--quick", "--apps", "", "--micro", "--micro-ppws", "3")
    (row,) = rows[:-1]
    assert (row["scenario"], row["ppw"], row["factor"]) == ("micropartition", 3, 2.0)
    assert row["best_split_ms"] == pytest.approx(row["equal_ms"] * 2 * best_split(2, 3, 2.0),
                                                 rel=1e-3)
    assert row["over_best_split"] == pytest.approx(row["steady_ms"] / row["best_split_ms"],
                                                   abs=1e-3)
    assert rows[-1]["micro_steady_ms"] == {"3": row["steady_ms"]}


def test_straggler_micro_sweep_alternates_its_order_and_takes_medians_over_rounds() -> None:
    from benchmarks.straggler import micro_summary, sweep_order

    assert sweep_order([1, 4, 16], 3) == [(0, 1), (0, 4), (0, 16), (1, 16), (1, 4), (1, 1),
                                          (2, 1), (2, 4), (2, 16)]
    assert sweep_order([2], 1) == [(0, 2)]
    # made-up rounds: a drift that the medians must leave out
    rows = [{"ppw": p, "steady_ms": s, "equal_ms": e, "best_split_ms": b, "over_best_split": s / b}
            for p, s, e, b in [(1, 20.0, 10.0, 20.0), (1, 30.0, 15.0, 30.0), (1, 21.0, 10.0, 20.0),
                               (8, 11.0, 10.0, 10.3), (8, 16.0, 15.0, 15.5), (8, 10.0, 9.0, 9.9)]]
    got = micro_summary(rows)
    assert got["micro_steady_ms"] == {"1": 21.0, "8": 11.0}
    assert got["micro_equal_ms"] == {"1": 10.0, "8": 10.0}
    assert got["micro_best_split_ms"] == {"1": 20.0, "8": 10.3}
    # each round's own ratio, then their median: not the ratio of the medians
    assert got["micro_over_best_split"] == {"1": 1.0, "8": round(16.0 / 15.5, 3)}
    assert got["micro_rounds"] == 3


def test_straggler_draws_both_charts_from_rows_of_several_rounds(tmp_path: Path) -> None:
    from benchmarks.straggler import plot

    series = {"series_at_s": [0.1, 0.2, 0.3], "series_ms": [3.0, 2.0, 2.1]}
    rows: list[dict[str, Any]] = [
        {"app": "logistic_regression", "scenario": "equal", "balance": True, **series,
         "moves_s": []},
        {"app": "logistic_regression", "scenario": "slowdown", "balance": False, **series,
         "moves_s": []},
        {"app": "logistic_regression", "scenario": "slowdown", "balance": True, **series,
         "moves_s": [0.15], "ideal_ms": 2.0}]
    for rnd, ppw, ms in [(0, 1, 10.0), (0, 8, 8.0), (1, 8, 9.0), (1, 1, 11.0)]:
        rows.append({"app": "logistic_regression", "scenario": "micropartition", "balance": True,
                     "ppw": ppw, "round": rnd, "factor": 2.0, "steady_ms": ms, "equal_ms": 5.0,
                     "best_split_ms": 10.0 if ppw == 1 else 8.5, "over_best_split": ms / 10.0})
    plot(rows, str(tmp_path))
    for name in ("straggler.png", "micropartition_balance.png"):
        assert (tmp_path / name).stat().st_size > 0


def test_straggler_virtual_competing_prints_a_row_per_worker_count() -> None:
    from benchmarks.straggler import ideal_ms

    rows = run_bench("straggler.py", "--quick", "--apps", "", "--virtual-competing", "2",
                     "--ppw", "4", "--partition-ms", "1")
    (row,) = rows[:-1]
    assert (row["scenario"], row["workers"], row["ppw"], row["partition_ms"]) == \
        ("virtual_competing", 2, 4, 1.0)
    # alone, an iteration is the 4 gradients at 1 ms each; beside the busy process worker 1's
    # 4 ms burst waits for the busy process's turns (benchmarks/core_share.py: about 2x)
    assert row["equal_ms"] == pytest.approx(4.0, rel=0.02)
    assert 1.5 < row["off_ms"] / row["equal_ms"] < 3.0
    assert row["slow_worker_factor"] == pytest.approx(row["off_ms"] / row["equal_ms"], abs=2e-3)
    assert row["ideal_ms"] == pytest.approx(
        ideal_ms(2, row["equal_ms"], row["slow_worker_factor"]), abs=1e-3)
    assert row["over_ideal"] == pytest.approx(row["steady_ms"] / row["ideal_ms"], abs=2e-3)
    assert set(row["median_ms"]) == {"equal", "off", "on"}
    assert rows[-1]["virtual_competing_over_ideal"] == {"2": row["over_ideal"]}


def test_straggler_prices_a_partition_from_the_load_reports_of_the_runs_last_part() -> None:
    from benchmarks.straggler import partition_ms

    def report(t: float, worker: int, busy: list[list[float]]) -> dict[str, Any]:
        return {"ph": "i", "cat": "load", "name": "LoadReport", "ts": t * 1e6,
                "args": {"eid": int(t * 10) * 2 + worker, "worker": worker, "interval": 0.5,
                         "busy": busy, "idle": 0.1, "tasks": 10, "seq": 1, "done": False,
                         "cpu": 0.4, "cpu_wait": 0.0}}

    # 5 reports a worker; the first 3 (start-up: 0.3 s of a partition's tasks) are left out;
    # then each training partition's tasks take 0.1 or 0.12 s of the 0.5, at 2 ms an iteration
    # (250 iterations): 0.4 and 0.48 ms an iteration; the model's partition (group 1) is not one
    events = [report(0.5 * k, w, [[0, 2 * w, 0.3 if k < 3 else 0.1, 8],
                                  [0, 2 * w + 1, 0.3 if k < 3 else 0.12, 8], [1, 0, 0.3, 8]])
              for k in range(5) for w in range(2)]
    assert partition_ms(events, [2.0] * 100) == pytest.approx(0.44)
    assert partition_ms([], [2.0]) is None


def test_competed_share_leaves_the_competed_worker_each_share_asked_for(tmp_path: Path) -> None:
    # the script moves 8 - k partitions at the first tick, over MPI and in virtual time (the
    # benchmark stops with an error if a count differs); the model's rows come from the same
    # placements, so its iteration grows with what the competed worker keeps once its burst
    # outlasts the kernel's turn
    rows = run_bench("competed_share.py", "--keep", "8,4,0", "--rounds", "1", "--quick",
                     "--plot", str(tmp_path))
    assert (tmp_path / "competed_share.png").stat().st_size > 0
    runs = [r for r in rows if "run" in r]
    assert [(r["run"], r.get("keep")) for r in runs] == [
        ("alone", None), ("competed", 8), ("competed", 4), ("competed", 0)]
    assert [r["migrations"] for r in runs[1:]] == [0, 4, 8]
    per_keep = [r for r in rows if "run" not in r and "summary" not in r]
    assert [r["keep"] for r in per_keep] == [8, 4, 0]
    for r in runs + per_keep:
        assert 0 < r["median_ms"] and 0 < r["mean_ms"]
    summary = rows[-1]
    assert summary["summary"] == "competed_share" and summary["rounds"] == 1
    if summary["partition_priced_from"] == "iteration over partitions":
        assert summary["partition_ms"] == pytest.approx(summary["alone_ms"] / 8, abs=1e-4)
    else:  # a gradient, without the iteration's reduce, broadcast and loop test
        assert summary["partition_priced_from"] == "load reports"
        assert 0 < summary["partition_ms"] < summary["alone_ms"] / 8
    assert summary["model_alone_ms"] > 0
    assert set(summary["best_keep"]) == {"machine", "model"}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "competed_share.py"),
                           "--keep", "9"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--keep takes counts from 0 to 8" in proc.stderr


def test_competed_share_runs_a_partial_process_and_gives_each_share_over_the_ideal(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        tmp_path: Path) -> None:
    # the runs faked (each placement's iteration times): what is checked is that the process
    # runs at the duty asked for beside every placement, and each share's figure against the
    # ideal the reference and the runs keeping 8 give, with no busy-loop model beside them
    sys.path.insert(0, str(ROOT))
    from benchmarks import competed_share as cs
    from benchmarks.straggler import ideal_ms

    hogs: list[tuple[int, float]] = []

    class Hog:
        def kill(self) -> None:
            pass

        def wait(self) -> int:
            return 0

    def busy_loop(core: int, duty: float = 1.0) -> Hog:
        hogs.append((core, duty))
        return Hog()

    mean_ms = {8: 3.0, 4: 2.4, 0: 3.6}  # keeping k: iterations of this length, then alone 2.0

    def run(app: str, argv: list[str], iters: int, workers: int, balance: bool,
            env: dict[str, str], pinned: bool, timeout: int) -> dict[str, Any]:
        k = cs.PPW - len(json.loads(env[cs.SCRIPT_ENV])) if env else None
        return {"iteration_ms": [mean_ms[k] if k is not None else 2.0] * 10,
                "partition_ms": None, "migrations": 0 if k is None else cs.PPW - k}

    monkeypatch.setattr(cs, "busy_loop", busy_loop)
    monkeypatch.setattr(cs, "run", run)
    assert cs.main(["--keep", "8,4,0", "--rounds", "1", "--hog-duty", "0.35",
                    "--plot", str(tmp_path)]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert os.listdir(tmp_path) == ["competed_share_hog_duty.png"]
    assert hogs == [(cs.worker_core(1), 0.35)] * 3
    summary = rows[-1]
    ideal = ideal_ms(2, 2.0, 3.0 / 2.0)  # 2.4: the work over a worker 1.5x slower
    assert summary["hog_duty"] == 0.35 and summary["ideal_mean_ms"] == pytest.approx(ideal)
    assert "model_alone_ms" not in summary and list(summary["best_keep"]) == ["machine"]
    per_keep = {r["keep"]: r for r in rows if "keep" in r and "run" not in r}
    assert {k: r["over_ideal_mean"] for k, r in per_keep.items()} == {8: 1.25, 4: 1.0, 0: 1.5}
    assert summary["best_keep"]["machine"] == 4
    # without the runs keeping 8 there is no factor for the ideal: no such figure
    hogs.clear()
    assert cs.main(["--app", "kmeans", "--keep", "4", "--rounds", "1"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert hogs == [(cs.worker_core(1), 1.0)]
    assert "ideal_mean_ms" not in rows[-1] and "hog_duty" not in rows[-1]
    assert "over_ideal_mean" not in rows[-2]
    with pytest.raises(SystemExit):
        cs.main(["--hog-duty", "0"])
    assert "--hog-duty in (0, 1]" in capsys.readouterr().err


def test_competed_share_runs_kmeans_placements_on_the_machine_only(tmp_path: Path) -> None:
    # the model prices logistic regression's gradients: k-means' rows are the machine's
    rows = run_bench("competed_share.py", "--app", "kmeans", "--keep", "8,5", "--rounds", "1",
                     "--quick", "--plot", str(tmp_path))
    assert (tmp_path / "competed_share_kmeans.png").stat().st_size > 0
    runs = [r for r in rows if r.get("run") == "competed"]
    assert [(r["app"], r["keep"], r["migrations"]) for r in runs] == [
        ("kmeans", 8, 0), ("kmeans", 5, 3)]
    per_keep = [r for r in rows if "run" not in r and "summary" not in r]
    assert [r["keep"] for r in per_keep] == [8, 5]
    assert all(r["mean_ms"] > 0 and not any(k.startswith("model_") for k in r) for r in per_keep)
    summary = rows[-1]
    assert summary["app"] == "kmeans" and "model_alone_ms" not in summary
    assert list(summary["best_keep"]) == ["machine"]


@pytest.mark.parametrize("bad", [["--micro-factor", "0.5"], ["--factor", "0"],
                                 ["--workers", "1"], ["--ppw", "0"], ["--virtual", "3,1"],
                                 ["--virtual-competing", "1"], ["--partition-ms", "0"],
                                 ["--virtual", "eight"], ["--micro-ppws", "4,0"],
                                 ["--micro-ppws", "eight"], ["--micro-ppws", ""],
                                 ["--micro-rounds", "0"], ["--spell-s", "5,1.5"],
                                 ["--spell-s", "0,5"], ["--spell-s", "5"],
                                 ["--spell-factors", "0.8,1.6"], ["--spell-factors", "a,b"],
                                 ["--spell-virtual-s", "0"], ["--hog-duty", "0"],
                                 ["--hog-duty", "1.5"]])
def test_straggler_rejects_settings_it_cannot_model(
        bad: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    # in-process, as test_apps_needs_a_baseline_run: the check is main()'s; that the script
    # exits with it is checked once, below
    from benchmarks.straggler import main

    with pytest.raises(SystemExit) as stop:
        main([*bad, "--apps", "", "--quick"])  # a setting let through runs nothing
    assert stop.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and "--factor and --micro-factor must be >= 1" in err


def test_straggler_run_as_a_script_rejects_a_setting_in_one_message() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "straggler.py"),
                           "--virtual", "3,1"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "--factor and --micro-factor must be >= 1" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_migration_quick_moves_a_partition_there_and_back_and_times_each_move() -> None:
    rows = run_bench("migration.py", "--quick")
    warm, new, *moves, summary = rows
    assert (warm["probe"], new["probe"]) == ("mpi_send", "mpi_send_new_memory")
    assert warm["bytes"] == new["bytes"] == 4 * 2**20 and warm["gbps"] > 0 and new["gbps"] > 0
    assert len(moves) == 3 and len({m["move"] for m in moves}) == 3
    for move in moves:  # + a tiny partition of the same group (the moved group's other dataset)
        assert 4 * 2**20 <= move["bytes"] < 4 * 2**20 + 1024 and move["transfer_s"] > 0
        assert move["slowest_ms"] >= move["iteration_median_ms"]
    # each worker's first partition arrives in new pages; the third move lands where the first
    # did, after the second took that array away again: in the pages it left (the source let
    # go of a moved partition's value, and the destination's transport kept its pages)
    assert [m["recycled_bytes"] for m in moves] == [0, 0, 4 * 2**20]
    assert summary["migrations"] == summary["moves"] == 3
    assert (summary["new_pages_moves"], summary["kept_pages_moves"]) == (2, 1)
    assert summary["move_gbps"] == max(m["gbps"] for m in moves)
    assert summary["move_over_mpi_bandwidth"] > 0
    assert summary["kept_pages_move_over_mpi_bandwidth"] == pytest.approx(
        moves[2]["gbps"] / warm["gbps"], rel=1e-2)


def test_snapshot_quick_prints_write_overhead_recovery_lateness_and_summary() -> None:
    rows = run_bench("snapshot.py", "--quick")
    kinds = [r.get("kind") for r in rows[:-1]]
    assert kinds == ["write", "overhead", "recovery", "lateness", "lateness"]
    write, over, rec, fixed, paced, summary = rows
    assert write["snapshot_over_plain_throughput"] == pytest.approx(
        write["snapshot_gbps"] / write["plain_gbps"], rel=0.02)
    assert over["snapshots"] >= 1 and len(over["seconds_per_snapshot_each"]) == over["snapshots"]
    assert over["overhead_at_60s"] == pytest.approx(over["seconds_per_snapshot"] / 60, abs=1e-5)
    assert rec["kill_to_running_s"] == pytest.approx(
        rec["kill_to_restart_s"] + rec["restart_to_running_s"], abs=0.002)
    assert summary["summary"] == "snapshot"
    assert summary["write_over_plain"] == write["snapshot_over_plain_throughput"]
    assert summary["write_target_met"] == (write["snapshot_over_plain_throughput"] >= 0.7)
    assert (fixed["window"], paced["window"]) == ("fixed", "pace")
    for row in (fixed, paced):  # how many snapshots a 1 s run commits is the machine's speed
        assert row["run_s"] > 0 and row["snapshots"] >= 0
        assert (row["median_gap_s"] is None) == (row["snapshots"] < 2)
    assert summary["median_gap_fixed_window_s"] == fixed["median_gap_s"]
    assert summary["median_gap_paced_window_s"] == paced["median_gap_s"]


def test_ulfm_probe_reports_each_setting_and_whether_any_recovered() -> None:
    before = shm_segments()
    # the ranks import only mpi4py and start in well under a second; the setting whose
    # survivors hang costs the whole timeout
    rows = run_bench("ulfm_probe.py", "--timeout", "6")
    assert shm_left_behind(before) == set()  # the killed ranks' shared memory is not left behind
    assert [r["setting"] for r in rows[:-1]] == ["plain", "no_cleanup", "ft"]
    assert rows[-1]["ulfm_works"] == any(r["recovered"] for r in rows[:-1])
    # what docs/fault-tolerance.md says of the mpich wheel: no setting recovers
    assert rows[-1]["ulfm_works"] is False


def _slow_worker_trace(path: Path, rounds: int) -> None:
    """A trace holding the load reports of 2 workers, the second 3x slower, 8 partitions each,
    one report each per 0.5 s round."""
    from canary.messages import LoadReport
    from canary.trace import Tracer, write_trace

    tr = Tracer(0, "controller")
    period = 8 * 3 * 0.01
    for r in range(rounds):
        for w, cost in ((0, 0.01), (1, 0.03)):
            busy = tuple((0, 8 * w + k, cost, 1 << 20) for k in range(8))
            tr.load_report(LoadReport(1 + 2 * r + w, w, period, busy, period - 8 * cost, 8,
                                      10 * r, False), 100.0 + 0.5 * r + 0.01 * w)
    write_trace(str(path), [tr.events])


def test_replay_balance_makes_the_policys_moves_on_a_traced_runs_reports(tmp_path: Path) -> None:
    from benchmarks.replay_balance import NoMoves
    from canary.controller.balance import BalancePolicy
    from canary.trace import load_events, load_reports

    trace = tmp_path / "t.json"
    _slow_worker_trace(trace, 12)
    rows = run_bench("replay_balance.py", str(trace))
    summary = rows[-1]
    assert (summary["reports"], summary["workers"]) == (24, 2)
    first = rows[0]
    # the same policy fed the same reports directly makes the same first round
    policy = BalancePolicy(2)
    direct: list = []
    for t, rep in load_reports(load_events(str(trace))):
        policy.report(rep, t)
        direct = direct or [(g, i, d) for g, i, d, _ in policy.decide(t, NoMoves())]
    assert [(m["group"], m["index"], m["to"]) for m in first["moves"]] == direct
    assert direct and all(d == 0 for _, _, d in direct)  # off the slow worker
    assert summary["first_move_s"] == first["at_s"]
    # the pace check's verdict, a note: the reports (made without the moves) kept their pace
    notes = [r for r in rows[:-1] if "note" in r]
    assert [r["note"] for r in notes] == [
        f"the job kept its pace after the last {len(direct)} moves: they stay"]
    assert notes[0]["at_s"] > first["at_s"]
    assert summary["rounds"] == len(rows) - 1 - len(notes)
    # a policy setting changes what it would do: more patience, a later first move
    later = run_bench("replay_balance.py", str(trace), "--set", "patience=6")[-1]
    assert later["first_move_s"] > summary["first_move_s"]


def _spells_reports() -> list[tuple[float, Any]]:
    """Load reports of 5 workers, 8 partitions each, one report each per 0.5 s round for 20
    rounds: worker 2's tasks 1.5x as long in rounds 4-9 (it had its CPU), worker 1 waiting a
    fifth of its time for a CPU between tasks in rounds 7-11, worker 0's tasks 1.5x as long in
    round 15 only; the median worker is one of the others throughout."""
    from canary.messages import LoadReport

    out = []
    for r in range(20):
        for w in range(5):
            slow = (w == 2 and 4 <= r <= 9) or (w == 0 and r == 15)
            cost = 0.015 if slow else 0.01
            wait = 0.1 if w == 1 and 7 <= r <= 11 else 0.0
            busy = tuple((0, 8 * w + k, cost, 1 << 20) for k in range(8))
            cpu = 8 * cost + 0.05
            out.append((100.0 + 0.5 * r + 0.01 * w,
                        LoadReport(1 + 5 * r + w, w, 0.5, busy, 0.5 - cpu - wait, 8, 10 * r,
                                   False, cpu, wait)))
    return out


def test_replay_balance_spells_finds_each_workers_slow_rounds_and_its_waits() -> None:
    from benchmarks.replay_balance import spells

    found = spells(_spells_reports(), 5, 1.2)
    # worker 0's one slow round is no spell; worker 2's tasks were slower, worker 1 lost time
    # to waits for a CPU (the policy's speeds count both)
    assert [(s["worker"], s["rounds"]) for s in found] == [(2, 6), (1, 5)]
    tasks, waits = found
    # rounds 4-9, each complete with the last worker's report and covering the 0.5 s before it
    assert (tasks["from_s"], tasks["to_s"]) == (101.54, 104.54)
    assert tasks["slower"] == 1.5 and tasks["waited"] == 0.0
    assert tasks["with"] == [1] and waits["with"] == [2]  # they overlap in rounds 7-9
    cpu = 8 * 0.01 + 0.05
    assert waits["waited"] == round(0.1 / (cpu + 0.1), 4) and waits["slower"] > 1.2
    # a higher bar leaves the 1.5x spell out, a spell of one round keeps worker 0's
    assert [s["worker"] for s in spells(_spells_reports(), 5, 1.6)] == [1]
    assert (0, 1) in [(s["worker"], s["rounds"]) for s in spells(_spells_reports(), 5, 1.2, 1)]
    with pytest.raises(ValueError, match="factor above 1"):
        spells(_spells_reports(), 5, 1.0)


def _spells_bundle(path: Path, runs: list[tuple[str, int]]) -> None:
    """A bundle of runs' load reports as tests/data keeps them, each run (name, round) holding
    :func:`_spells_reports`."""
    from canary.trace import Tracer

    out = []
    for name, rnd in runs:
        tr = Tracer(0, "controller")
        for t, rep in _spells_reports():
            tr.load_report(rep, t)
        out.append({"run": name, "round": rnd, "workers": 5, "traceEvents": tr.events})
    with gzip.open(path, "wt") as f:
        json.dump({"about": "test", "runs": out}, f)


def test_replay_balance_reads_a_bundle_of_runs_and_labels_each(tmp_path: Path) -> None:
    runs = [("kmeans_equal_w5", 1), ("kmeans_competing_w5", 1), ("kmeans_equal_w5", 2)]
    bundle = tmp_path / "reports.json.gz"
    _spells_bundle(bundle, runs)
    rows = run_bench("replay_balance.py", str(bundle), "--spells", "1.2", "--only", "_equal")
    summaries = [r for r in rows if r.get("summary") == "replay_balance_spells"]
    assert [(r["run"], r["round"]) for r in summaries] == [("kmeans_equal_w5", 1),
                                                          ("kmeans_equal_w5", 2)]
    assert all(r["spells"] == 2 and r["longest_s"] == 3.0 and r["together"] == 2
               for r in summaries)
    assert summaries[0]["waited_max"] > 0
    spell_rows = [r for r in rows if "summary" not in r]
    assert [(r["round"], r["worker"]) for r in spell_rows] == [(1, 2), (1, 1), (2, 2), (2, 1)]
    # the moves, run by run, the same way
    moved = run_bench("replay_balance.py", str(bundle))
    assert [r["run"] for r in moved if "summary" in r] == [name for name, _ in runs]


@pytest.mark.parametrize("bad", [["--set", "patience"], ["--set", "no_such=1"],
                                 ["--set", "patience=soon"], ["--set", "patience=1.5"]])
def test_replay_balance_rejects_a_bad_setting(tmp_path: Path, bad: list[str],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    # in-process (main() makes the check; an exception other than argparse's exit fails the
    # test); the script itself is run on a bad file below
    from benchmarks.replay_balance import main

    trace = tmp_path / "t.json"
    _slow_worker_trace(trace, 2)
    with pytest.raises(SystemExit) as stop:
        main([str(trace), *bad])
    assert stop.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and "--set" in err and "Traceback" not in err


def test_replay_balance_rejects_a_spell_factor_of_1_and_a_bundle_without_the_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.replay_balance import main

    bundle = tmp_path / "reports.json.gz"
    _spells_bundle(bundle, [("lr_equal_w5", 1)])
    for bad, said in ((["--spells", "1"], "--spells: a factor above 1"),
                      (["--only", "kmeans"], "no load reports of a run whose name contains "
                                             "'kmeans'")):
        with pytest.raises(SystemExit) as stop:
            main([str(bundle), *bad])
        out, err = capsys.readouterr()
        assert stop.value.code == 2 and out == "" and said in err


def test_replay_balance_names_a_file_that_is_not_a_trace(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("not json\n")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "replay_balance.py"),
                           str(notes)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"{notes} is not a trace written by --trace (JSONDecodeError" in proc.stderr
