"""``python benchmarks/plot.py``: render the benchmarks' JSON lines into PNG charts (matplotlib).

    python benchmarks/scheduler.py > sched.jsonl
    python benchmarks/apps.py > apps.jsonl
    python benchmarks/micropartition.py > micro.jsonl
    python benchmarks/hop_latency.py > hop.jsonl
    python benchmarks/lr_floor.py > floor.jsonl
    python benchmarks/plot.py sched.jsonl apps.jsonl micro.jsonl hop.jsonl floor.jsonl --out docs/img

Each file's kind is read from its summary line (``"summary": "scheduler" | "apps" |
"micropartition" | "hop_latency" | "lr_floor"``); the charts written are

* ``scheduler.png``: task rate per core and scheduling cost per task vs task length;
* ``apps.png``: time per iteration of canary, the numba bound and the peers, per app and size;
* ``micropartition.png``: iteration time and task rate vs partitions per core, per variance mode;
* ``hop_latency.png``: how late an idle worker sees a message, and its CPU share, per back-off
  (and small apps' iteration time per back-off, when run with ``--apps``);
* ``lr_floor.png``: logistic regression's time per iteration per round: the numba bound, the
  hand-written MPI floor and canary.

Returns 0, or 2 with a message for a file that is missing or not a benchmark's output.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any


def _save(fig: Any, out: str, name: str) -> str:
    """Lay out ``fig``, write it as ``out/name`` and close it; return the path."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path = os.path.join(out, name)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def read_lines(path: str) -> list[dict[str, Any]]:
    """The JSON objects of a benchmark's output (non-JSON lines, e.g. logs, are skipped)."""
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    return rows


def kind_of(rows: list[dict[str, Any]]) -> str | None:
    for r in reversed(rows):
        if "summary" in r:
            return str(r["summary"])
    return None


def plot_scheduler(rows: list[dict[str, Any]], out: str) -> str:
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    series: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r.get("mode") == "inproc":
            series.setdefault(f"in-process, {r.get('variant', 'tasks')}", []).append(r)
        elif r.get("mode") == "mpi":
            series.setdefault(f"MPI, {r['workers']} worker(s)", []).append(r)
    for label, rs in series.items():
        rs = sorted(rs, key=lambda r: r["length_us"])
        x = [max(r["length_us"], 0.3) for r in rs]  # 0 (empty kernel) drawn at 0.3 µs
        rate = [r.get("tasks_per_s", r.get("tasks_per_s_per_core")) for r in rs]
        a1.plot(x, rate, marker="o", label=label)
        a2.plot(x, [r["sched_overhead_ns"] / 1e3 for r in rs], marker="o", label=label)
    peers = [r for r in rows if "peer" in r and "tasks_per_s" in r]
    for k, r in enumerate(peers):  # labels staggered: peers often sit at the same rate
        a1.axhline(r["tasks_per_s"], ls="--", lw=1, color="grey")
        a1.text(0.35 * 4 ** k, r["tasks_per_s"] * 1.15, f"{r['peer']} ({r['cores']} cores)",
                fontsize=7)
    a1.set(xscale="log", yscale="log", xlabel="task length (µs; empty kernel at 0.3)",
           ylabel="tasks / s (all workers)", title="Task rate")
    a2.set(xscale="log", xlabel="task length (µs)", ylabel="scheduling cost per task (µs)",
           title="Worker CPU per task outside the kernel")
    a2.axhline(2.0, ls=":", color="red", lw=1)
    a2.text(0.35, 2.1, "target 2 µs", color="red", fontsize=7)
    for a in (a1, a2):
        a.grid(True, which="both", alpha=0.3)
        a.legend(fontsize=8)
    return _save(fig, out, "scheduler.png")


def plot_apps(rows: list[dict[str, Any]], out: str) -> str:
    import matplotlib.pyplot as plt

    apps = [r for r in rows if "app" in r and "canary_s" in r]
    labels = [f"{r['app']}\n{r['size']}" for r in apps]
    systems = ["canary", "numba bound"]
    for r in apps:
        for p in r.get("peers", {}):
            if p not in systems:
                systems.append(p)
    fig, ax = plt.subplots(figsize=(max(6.0, 2.2 * len(apps)), 4.5))
    width = 0.8 / len(systems)
    for k, sysname in enumerate(systems):
        xs, ys = [], []
        for i, r in enumerate(apps):
            v = (r["canary_s"] if sysname == "canary" else r["numba_s"] if sysname == "numba bound"
                 else r.get("peers", {}).get(sysname))
            if v:
                xs.append(i + (k - (len(systems) - 1) / 2) * width)
                ys.append(v * 1e3)
        ax.bar(xs, ys, width=width, label=sysname)
    ax.set_xticks(range(len(apps)), labels, fontsize=8)
    ax.set(yscale="log", ylabel="time per iteration (ms, log)",
           title="Per-iteration time (first and last excluded)")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=4)
    return _save(fig, out, "apps.png")


def plot_micropartition(rows: list[dict[str, Any]], out: str) -> str:
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    modes: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if "ppc" in r and "iteration_ms" in r:
            modes.setdefault(r["mode"], []).append(r)
    for mode, rs in modes.items():
        rs = sorted(rs, key=lambda r: r["ppc"])
        a1.plot([r["ppc"] for r in rs], [r["iteration_ms"] for r in rs], marker="o", label=mode)
        a2.plot([r["ppc"] for r in rs], [r["tasks_per_s"] for r in rs], marker="o", label=mode)
    a1.set(xscale="log", xlabel="partitions per core", ylabel="iteration time (ms)",
           title="Iteration time")
    a2.set(xscale="log", yscale="log", xlabel="partitions per core", ylabel="tasks / s",
           title="Task rate")
    for a in (a1, a2):
        a.grid(True, which="both", alpha=0.3)
        a.legend(fontsize=8)
    return _save(fig, out, "micropartition.png")


def plot_hop_latency(rows: list[dict[str, Any]], out: str) -> str:
    import matplotlib.pyplot as plt

    rs = [r for r in rows if "latency_median_us" in r and "variant" in r]
    names = [r["variant"] for r in rs]
    xs = range(len(rs))
    apps = next((r["app_iteration_ms"] for r in rows if "app_iteration_ms" in r), None)
    fig, axes = plt.subplots(1, 3 if apps else 2, figsize=(16 if apps else 11, 4.2))
    a1, a2 = axes[0], axes[1]
    if apps:  # median iteration time of each small app run, per hot-polling variant
        a3 = axes[2]
        variants = sorted({v for per in apps.values() for v in per})
        width = 0.8 / max(len(variants), 1)
        for k, v in enumerate(variants):
            a3.bar([i + (k - (len(variants) - 1) / 2) * width for i in range(len(apps))],
                   [per.get(v, 0) for per in apps.values()], width, label=v)
        a3.set_xticks(list(range(len(apps))), list(apps), rotation=10, fontsize=8)
        a3.set(ylabel="ms per iteration (median)", title="App runs, 2 workers")
        a3.grid(True, axis="y", alpha=0.3)
        a3.legend(fontsize=8)
    a1.bar([x - 0.2 for x in xs], [r["latency_median_us"] for r in rs], 0.4, label="median")
    a1.bar([x + 0.2 for x in xs], [r["latency_p90_us"] for r in rs], 0.4, label="p90")
    a1.set(yscale="log", ylabel="µs from send to seen", title="Message latency at an idle rank")
    a2.bar(list(xs), [100 * r["cpu_fraction"] for r in rs], 0.5)
    a2.set(ylabel="% of a core", ylim=(0, 105), title="CPU of the waiting rank")
    for a in (a1, a2):
        a.set_xticks(list(xs), names, rotation=15)
        a.grid(True, axis="y", which="both", alpha=0.3)
    a1.legend(fontsize=8)
    return _save(fig, out, "hop_latency.png")


def plot_lr_floor(rows: list[dict[str, Any]], out: str) -> str:
    import matplotlib.pyplot as plt

    rs = [r for r in rows if "round" in r]
    series = (("numba_s", "numba bound (threads)"), ("mpi_floor_s", "hand-written MPI"),
              ("canary_s", "canary"))
    fig, ax = plt.subplots(figsize=(8, 4.2))
    width = 0.8 / len(series)
    for k, (key, label) in enumerate(series):
        ax.bar([i + (k - (len(series) - 1) / 2) * width for i in range(len(rs))],
               [1e3 * r[key] for r in rs], width, label=label)
    ax.set_xticks(list(range(len(rs))), [f"round {r['round']}" for r in rs])
    size = f"{rs[0]['rows']:,} x {rs[0]['features']}, {rs[0]['workers']} workers" if rs else ""
    ax.set(ylabel="ms per iteration", title=f"Logistic regression {size}: the floor")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, out, "lr_floor.png")


PLOTTERS = {"scheduler": plot_scheduler, "apps": plot_apps, "micropartition": plot_micropartition,
            "hop_latency": plot_hop_latency, "lr_floor": plot_lr_floor}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="benchmarks/plot.py",
                                 description="Render benchmark JSON lines into PNG charts.")
    ap.add_argument("files", nargs="+", help="outputs of benchmarks/*.py (JSON lines)")
    ap.add_argument("--out", default=".", help="folder for the PNG files (created)")
    args = ap.parse_args(argv)
    try:
        import matplotlib

        matplotlib.use("Agg")
    except ImportError:
        print("plot.py: matplotlib is not installed (pip install -e .[plot])", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    for path in args.files:
        if not os.path.exists(path):
            print(f"plot.py: no such file: {path}", file=sys.stderr)
            return 2
        rows = read_lines(path)
        kind = kind_of(rows)
        if kind not in PLOTTERS:
            print(f"plot.py: {path} has no benchmark summary line (expected the output of "
                  f"benchmarks/scheduler.py, apps.py, micropartition.py, hop_latency.py or "
                  f"lr_floor.py)",
                  file=sys.stderr)
            return 2
        print(PLOTTERS[kind](rows, args.out))
    return 0


if __name__ == "__main__":
    from canary.script import end_script

    end_script(main())
