"""PNG charts for the experiments (matplotlib is an optional dependency).

Each function takes the rows an experiment returned and writes ``path``.
They raise RuntimeError with an install hint when matplotlib is missing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Row = dict[str, Any]


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")  # headless: never needs a display
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise RuntimeError(
            "plotting needs matplotlib: pip install 'canary-dataflow[plot]' (or pass --no-plot)"
        ) from exc
    return plt


def plot_placement(rows: Sequence[Row], path: str) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    labels = {
        "random": "Random",
        "per-task": "Per-task sampling",
        "batch": "Batch sampling",
        "batch-late": "Batch + late binding",
    }
    for p in policies:
        rs = [r for r in rows if r["policy"] == p]
        ax.plot(
            [r["load"] for r in rs], [r["mean_ms"] for r in rs], marker="o", label=labels.get(p, p)
        )
    opt = sum(r["optimal_ms"] for r in rows) / len(rows)
    ax.axhline(opt, color="k", ls="--", lw=1, label=f"Optimal ({opt:.0f} ms)")
    ax.set_ylim(0, 3 * opt)
    r0 = rows[0]
    ax.set_title(
        f"Job response time, {r0['workers']} workers, {r0['tasks_per_job']}-task jobs\n"
        "(cf. Sparrow Fig. 3; curves above 3x optimal are clipped)",
        fontsize=10,
    )
    ax.set_xlabel("Load")
    ax.set_ylabel("Mean job response time (ms)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_zero_wait(rows: Sequence[Row], path: str) -> None:
    plt = _pyplot()
    ms = list(dict.fromkeys(r["tasks_per_job"] for r in rows))
    fig, axes = plt.subplots(1, len(ms), figsize=(5.2 * len(ms), 4), squeeze=False)
    for ax, m in zip(axes[0], ms):
        for i, p in enumerate(dict.fromkeys(r["policy"] for r in rows)):
            rs = [r for r in rows if r["tasks_per_job"] == m and r["policy"] == p]
            c = f"C{i}"
            ax.plot(
                [r["load"] for r in rs],
                [r["analytic"] for r in rs],
                color=c,
                label=f"{p} (analytic)",
            )
            ax.plot(
                [r["load"] for r in rs],
                [r["simulated"] for r in rs],
                "o",
                color=c,
                label=f"{p} (simulated)",
            )
        ax.set_title(f"{m}-task jobs (cf. Sparrow Fig. 4)", fontsize=10)
        ax.set_xlabel("Load")
        ax.set_ylabel("P(job sees zero wait)")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_priority(rows: Sequence[Row], path: str) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    x = [r["lp_load"] for r in rows]
    ax.plot(x, [r["hp_median_ms"] for r in rows], marker="o", label="High-priority user (25% load)")
    lp = [(r["lp_load"], r["lp_median_ms"]) for r in rows if r["lp_jobs"]]
    ax.plot([a for a, _ in lp], [b for _, b in lp], marker="s", label="Low-priority user")
    ax.set_yscale("log")
    ax.set_xlabel("Low-priority user's load")
    ax.set_ylabel("Median job response time (ms)")
    ax.set_title("Strict priorities at the workers (cf. Sparrow Table 3)", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_fairshare(rows: Sequence[Row], path: str) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    t = [r["t_s"] for r in rows]
    ax.plot(t, [r["share0"] for r in rows], color="C0", label="User 0 share")
    ax.plot(t, [r["share1"] for r in rows], color="C1", label="User 1 share")
    ax.step(
        t,
        [r["fair0"] for r in rows],
        where="mid",
        color="C0",
        ls="--",
        lw=1,
        label="User 0 fair share",
    )
    ax.step(
        t,
        [r["fair1"] for r in rows],
        where="mid",
        color="C1",
        ls="--",
        lw=1,
        label="User 1 fair share",
    )
    ax.set_xlabel("Time (s)")
    ax.set_ylabel("Share of cluster slots")
    ax.set_ylim(0, 1.05)
    ax.set_title("Weighted fair sharing, two equal-weight users (cf. Sparrow Fig. 11)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="center right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_hfsp(rows: Sequence[Row], path: str) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    names = {"ps": "PS (fair)", "srpt": "SRPT", "hfsp": "SRPT + aging (HFSP)", "fifo": "FIFO"}
    for p in dict.fromkeys(r["policy"] for r in rows):
        rs = [r for r in rows if r["policy"] == p]
        ax.plot(
            [r["sigma"] for r in rs],
            [r["normalized"] for r in rs],
            marker="o",
            label=names.get(p, p),
        )
    r0 = rows[0]
    ax.set_yscale("log")  # PS sits far above; log keeps the SRPT/aging gap visible
    ax.set_xlabel("Size-estimation error sigma (log-normal)")
    ax.set_ylabel("Mean sojourn time / optimal (SRPT, exact sizes)")
    ax.set_title(
        f"Weibull shape {r0['shape']} sizes, load {r0['load']} (cf. HFSP Fig. 2)", fontsize=10
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
