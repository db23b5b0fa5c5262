"""``benchmarks/plot.py`` renders benchmark JSON lines into PNG files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import benchmarks.plot as plot
from benchmarks.plot import main


def write(path: Path, rows: list[dict]) -> str:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path)


def drawn(fig: Any) -> list[dict[str, list[float]]]:
    """Per axes of ``fig``: each labelled line's y values and each labelled bar series' heights."""
    out = []
    for ax in fig.axes:
        series: dict[str, list[float]] = {}
        for line in ax.get_lines():
            series[str(line.get_label())] = [float(v) for v in line.get_ydata()]
        for bars in ax.containers:
            series[str(bars.get_label())] = [float(b.get_height()) for b in bars]
        out.append(series)
    return out


def test_plots_every_benchmark_kind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    charts: dict[str, list[dict[str, list[float]]]] = {}
    save = plot._save

    def record(fig: Any, out: str, name: str) -> str:
        charts[name] = drawn(fig)
        return save(fig, out, name)

    monkeypatch.setattr(plot, "_save", record)
    sched = write(tmp_path / "s.jsonl", [
        {"machine": {}},
        {"mode": "inproc", "length_us": 0.0, "sched_overhead_ns": 4000.0, "tasks_per_s_per_core": 2e5},
        {"mode": "mpi", "workers": 2, "length_us": 0.0, "sched_overhead_ns": 5000.0, "tasks_per_s": 3e5},
        {"mode": "mpi", "workers": 2, "length_us": 10.0, "sched_overhead_ns": 5500.0, "tasks_per_s": 1e5},
        {"peer": "dask_distributed", "tasks_per_s": 600.0, "cores": 2},
        {"summary": "scheduler"}])
    apps = write(tmp_path / "a.jsonl", [
        {"app": "logistic_regression", "size": "400000,20", "canary_s": 0.01, "numba_s": 0.006,
         "peers": {"dask_threaded": 0.2}},
        {"summary": "apps"}])
    micro = write(tmp_path / "m.jsonl", [
        {"mode": "random", "ppc": 1, "iteration_ms": 30.0, "tasks_per_s": 1e3},
        {"mode": "random", "ppc": 4, "iteration_ms": 24.0, "tasks_per_s": 4e3},
        {"summary": "micropartition"}])
    hop = write(tmp_path / "h.jsonl", [
        {"variant": v, "latency_median_us": m, "latency_p90_us": 2 * m, "cpu_fraction": c}
        for v, m, c in (("sleep_only", 500.0, 0.25), ("spin_always", 40.0, 1.0))
    ] + [{"app": "pagerank", "size": "1024,8000", "variant": "spin_off", "iteration_ms": 2.0},
         {"summary": "hop_latency", "latency_median_us": {"sleep_only": 500.0},
          "app_iteration_ms": {
             "pagerank@1024,8000": {"spin_off": 2.0, "spin_1ms": 1.5}}}])
    floor = write(tmp_path / "f.jsonl", [
        {"round": r, "rows": 400000, "features": 20, "workers": 2, "numba_s": 0.0045,
         "mpi_floor_s": 0.004, "canary_s": 0.0055} for r in range(2)] + [{"summary": "lr_floor"}])
    out = tmp_path / "img"
    assert main([sched, apps, micro, hop, floor, "--out", str(out)]) == 0
    for name in ("scheduler.png", "apps.png", "micropartition.png", "hop_latency.png",
                 "lr_floor.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    # Each chart draws the rows' figures, not just axes: per-task cost in µs by series,
    # the empty kernel's task rate, bars in ms per system, latencies and CPU share per variant.
    rate, cost = charts["scheduler.png"]
    assert cost["MPI, 2 worker(s)"] == [5.0, 5.5] and cost["in-process, tasks"] == [4.0]
    assert rate["MPI, 2 worker(s)"] == [3e5, 1e5] and [600.0, 600.0] in rate.values()
    (bars,) = charts["apps.png"]
    assert bars["canary"] == pytest.approx([10.0]) and bars["numba bound"] == pytest.approx([6.0])
    assert bars["dask_threaded"] == pytest.approx([200.0])
    iteration, tasks = charts["micropartition.png"]
    assert iteration["random"] == [30.0, 24.0] and tasks["random"] == [1e3, 4e3]
    latency, cpu, app_runs = charts["hop_latency.png"]
    assert latency["median"] == [500.0, 40.0] and latency["p90"] == [1000.0, 80.0]
    assert list(cpu.values()) == [[25.0, 100.0]]
    assert app_runs["spin_off"] == [2.0] and app_runs["spin_1ms"] == [1.5]
    (rounds,) = charts["lr_floor.png"]
    assert rounds["canary"] == pytest.approx([5.5, 5.5])
    assert rounds["hand-written MPI"] == pytest.approx([4.0, 4.0])
    assert rounds["numba bound (threads)"] == pytest.approx([4.5, 4.5])


def test_rejects_missing_or_foreign_files(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main([str(tmp_path / "nope.jsonl")]) == 2
    other = write(tmp_path / "x.jsonl", [{"a": 1}])
    assert main([other, "--out", str(tmp_path)]) == 2
    assert "no benchmark summary" in capsys.readouterr().err
