"""How much of its share a worker that shares its core with a busy process should keep.

Logistic regression (or ``--app kmeans``) on 2 workers (``benchmarks/straggler.py``'s input, 8
partitions per worker), every rank pinned as in that benchmark's ``competing`` scenario, and a
busy loop on worker 1's core. Balancing off; instead, at the controller's first tick a scripted round of
moves leaves worker 1 ``k`` of its 8 partitions (the others go to worker 0), for each ``k`` of ``--keep``;
the runs of each round go through the ``k`` in turn, beside a reference run without the busy
loop, and ``--rounds`` rounds alternate. Each row gives the run's median and mean iteration
over its last 40% (``steady`` and ``steady_mean`` of ``straggler.py``). ``--hog-duty D`` makes the
busy process spin ``D`` of every 10 ms and sleep the rest (``straggler.py``'s option). Where
``--keep`` includes 8 (no move: balancing off), each ``k``'s row gives ``over_ideal_mean``,
its mean iteration over ``straggler.py``'s ideal from the means (the reference runs, slowed by
the factor the runs keeping 8 show): what the policy's target asks of that share.

Then the same runs in virtual time (``canary.virtual_runner.SharedCore`` on worker 1, each
partition's gradient priced at what it took in the reference runs, from their load reports,
this machine's runtime costs and the state machines' handling as measured here): the
model's account of the same placements, beside the machine's, and of the run without the busy
loop (``model_alone_ms``). The model prices logistic regression's gradients beside a busy loop:
with ``--app kmeans`` or a ``--hog-duty`` below 1 the rows give the machine's figures only.

Prints JSON lines (one per run, then one per ``k`` with the medians over the rounds and the
model's figures, then a summary with the best ``k`` by mean on each side); ``--plot DIR``
draws ``competed_share.png`` (``competed_share_kmeans.png`` for k-means; ``_hog_duty`` before
the ``.png`` beside a partial process): the mean iteration against the partitions kept, each
round's runs, their median and the model's, beside the run without the process.
:func:`plot` draws the same from the rows of a results file.

    python benchmarks/competed_share.py --plot DIR       # ~8 min
    python benchmarks/competed_share.py --keep 8,4,0 --rounds 1 --quick
    python benchmarks/competed_share.py --app kmeans --keep 6,5,4,3      # ~5 min
    python benchmarks/competed_share.py --hog-duty 0.35 --plot DIR       # ~6 min
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# first the repository root, and not this folder: benchmarks/apps.py would shadow the apps package
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "benchmarks")]

from benchmarks.straggler import (  # noqa: E402
    APPS,
    SCRIPT_ENV,
    TARGET,
    busy_loop,
    ideal_ms,
    run,
    steady,
    steady_mean,
    virtual_lr,
    worker_core,
)

WORKERS, PPW = 2, 8
KEEP = (8, 6, 5, 4, 3, 2, 0)
GROUP = 0  # the training data (logistic regression) or points (k-means): the first group
# the moves come at the first tick, so straggler.py's input with fewer iterations than its
# runs (which wait out the policy's trials) measures the steady state alike
ITERS = {"logistic_regression": 5000, "kmeans": 600}


def script(keep: int) -> list[tuple[float, int, int, int]]:
    """The moves that leave worker 1 ``keep`` of its partitions (``PPW .. 2 PPW - 1``), at the
    controller's first tick: its first ``PPW - keep`` to worker 0."""
    return [(0.0, GROUP, PPW + j, 0) for j in range(PPW - keep)]


def figures(times: list[float]) -> dict[str, float]:
    return {"median_ms": round(steady(times), 4), "mean_ms": round(steady_mean(times), 4)}


def model_ms(result: Any) -> list[float]:
    """A virtual run's iteration times in ms."""
    return [t * 1e3 for t in result.iteration_seconds()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--app", default="logistic_regression", choices=sorted(ITERS))
    ap.add_argument("--keep", default=",".join(map(str, KEEP)), metavar="K,K,...",
                    help="partitions worker 1 keeps, each 0 to 8 (default %(default)s)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--hog-duty", type=float, default=1.0,
                    help="the busy process spins this fraction of every 10 ms and sleeps the "
                         "rest (default 1.0: a busy loop)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (tests)")
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--plot", default=None, metavar="DIR", help="write the chart here")
    args = ap.parse_args(argv)
    try:
        keeps = [int(k) for k in args.keep.split(",") if k]
    except ValueError:
        keeps = []
    if (not keeps or any(not 0 <= k <= PPW for k in keeps) or args.rounds < 1
            or not 0 < args.hog_duty <= 1):
        ap.error(f"--keep takes counts from 0 to {PPW} (comma-separated), --rounds >= 1, "
                 "--hog-duty in (0, 1]")
    app = args.app
    data, _, qdata, qiters = APPS[app]
    iters = ITERS[app]
    if args.quick:  # well past the controller's first tick (0.1 s): 0.6 s of iterations here
        data, iters = qdata, 30 * qiters
    argv_app = [*data, "--partitions", str(WORKERS * PPW)]
    core = worker_core(WORKERS - 1)
    rows: list[dict[str, Any]] = []

    def emit(row: dict[str, Any]) -> None:
        rows.append(row)
        print(json.dumps(row), flush=True)

    refs: list[float] = []
    refs_mean: list[float] = []
    measured: list[float] = []  # a partition's gradient an iteration, from the load reports
    runs: dict[int, list[dict[str, float]]] = {k: [] for k in keeps}
    for r in range(args.rounds):
        ref = run(app, argv_app, iters, WORKERS, False, {}, True, args.timeout)
        refs.append(steady(ref["iteration_ms"]))
        refs_mean.append(steady_mean(ref["iteration_ms"]))
        if ref["partition_ms"] is not None:
            measured.append(ref["partition_ms"])
        emit({"round": r, "run": "alone", **figures(ref["iteration_ms"])})
        for k in keeps:
            env = {SCRIPT_ENV: json.dumps(script(k))}
            hog = busy_loop(core, args.hog_duty)
            try:
                got = run(app, argv_app, iters, WORKERS, False, env, True, args.timeout)
            finally:
                hog.kill()
                hog.wait()
            row = figures(got["iteration_ms"])
            runs[k].append(row)
            emit({"round": r, "run": "competed", "app": app, "keep": k, **row,
                  "migrations": got["migrations"]})
            if got["migrations"] != PPW - k:
                raise RuntimeError(f"keep {k}: {got['migrations']} moves made, not {PPW - k}")
    alone = statistics.median(refs)
    summary: dict[str, Any] = {"summary": "competed_share", "app": app,
                               "alone_ms": round(alone, 4)}
    if args.hog_duty < 1:
        summary["hog_duty"] = args.hog_duty
    model_rows: dict[int, dict[str, float]] = {}
    if app == "logistic_regression" and args.hog_duty >= 1:
        fields, model_rows = model_lr(keeps, measured, alone, args.quick)
        summary.update(fields)
    ideal = None
    if PPW in runs:  # keeping all 8 is balancing off: the factor the ideal divides the work by
        alone_mean = statistics.median(refs_mean)
        off = statistics.median(x["mean_ms"] for x in runs[PPW])
        ideal = ideal_ms(WORKERS, alone_mean, max(off / alone_mean, 1.0))
        summary["ideal_mean_ms"] = round(ideal, 4)
    best: dict[str, tuple[float, int]] = {}
    for k in keeps:
        row = {"keep": k, "median_ms": round(statistics.median(x["median_ms"] for x in runs[k]), 4),
               "mean_ms": round(statistics.median(x["mean_ms"] for x in runs[k]), 4),
               **model_rows.get(k, {})}
        if ideal is not None:
            row["over_ideal_mean"] = round(row["mean_ms"] / ideal, 3)
        emit(row)
        for side, key in (("machine", "mean_ms"), ("model", "model_mean_ms")):
            if key in row and (side not in best or row[key] < best[side][0]):
                best[side] = (row[key], k)
    emit({**summary, "rounds": args.rounds,
          "best_keep": {side: k for side, (_, k) in best.items()},
          "cpus": len(os.sched_getaffinity(0))})
    if args.plot:
        plot(rows, args.plot)
    return 0


def model_lr(keeps: list[int], measured: list[float], alone: float, quick: bool
             ) -> tuple[dict[str, Any], dict[int, dict[str, float]]]:
    """Logistic regression's placements in virtual time: the summary's fields of the model
    (``model_alone_ms``, and what a partition's gradient was priced at and from), and each
    ``k``'s figures (``model_median_ms`` and ``model_mean_ms``). ``measured``:
    a partition's gradient an iteration in the reference runs, from their load reports;
    ``alone``: their median iteration (ms). Raises RuntimeError if a placement's moves
    differ from the script's."""
    # a run too short for load reports in its last 40% (--quick) prices a partition at the
    # iteration over the partitions, which counts the iteration's fixed part in it
    priced_from = "load reports" if measured else "iteration over partitions"
    partition_s = (statistics.median(measured) if measured else alone / PPW) * 1e-3
    from canary.controller.balance import ScriptedPolicy
    from canary.virtual_runner import Runtime, SharedCore

    # About 20 virtual seconds. --quick: 0.3, counted in the machine's whole iterations, since
    # its tiny partitions' gradients are a small part of an iteration (priced at them, the model
    # would run thousands of iterations, tens of seconds of a test, for 0.3 virtual seconds).
    v_iters = max(int(20.0 / (PPW * partition_s)) if not quick else int(0.3 / (alone * 1e-3)),
                  10)
    here = {"runtime": Runtime(), "handle_s": None}  # this machine's costs, not an ideal's
    model_alone = virtual_lr(WORKERS, PPW, v_iters, False, partition_s, **here)
    out: dict[int, dict[str, float]] = {}
    for k in keeps:
        model = virtual_lr(WORKERS, PPW, v_iters, False, partition_s, **here,
                           shared_cores={1: SharedCore()}, policy=ScriptedPolicy(script(k)))
        if model.job.migrations != PPW - k:
            raise RuntimeError(f"keep {k}, in virtual time: {model.job.migrations} moves made")
        out[k] = {f"model_{name}": v for name, v in figures(model_ms(model)).items()}
    return {"model_alone_ms": figures(model_ms(model_alone))["mean_ms"],
            "partition_ms": round(partition_s * 1e3, 4), "partition_priced_from": priced_from}, out


def plot(rows: list[dict[str, Any]], out: str) -> str:
    """Draw ``competed_share.png`` (``competed_share_kmeans.png`` for k-means) in ``out`` from
    the benchmark's rows; return its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    os.makedirs(out, exist_ok=True)
    runs = [r for r in rows if r.get("run") == "competed"]
    per_keep = sorted((r for r in rows if "run" not in r and "summary" not in r),
                      key=lambda r: r["keep"])
    alone = [r["mean_ms"] for r in rows if r.get("run") == "alone"]
    app = next((r["app"] for r in runs if "app" in r), "logistic_regression")
    duty = next((r["hog_duty"] for r in rows if "hog_duty" in r), 1.0)
    process = "a busy loop" if duty >= 1 else f"a process spinning {duty:.0%} of"
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.scatter([r["keep"] for r in runs], [r["mean_ms"] for r in runs], s=12, alpha=0.5,
               label="each run")
    ax.plot([r["keep"] for r in per_keep], [r["mean_ms"] for r in per_keep], marker="o",
            label="the machine (median of the rounds)")
    modeled = [r for r in per_keep if "model_mean_ms" in r]
    if modeled:
        ax.plot([r["keep"] for r in modeled], [r["model_mean_ms"] for r in modeled], marker="s",
                ls="--", label="the model (SharedCore)")
    if alone:
        ax.axhline(statistics.median(alone), color="k", lw=0.8, ls=":",
                   label="without the process")
    ideal = next((r["ideal_mean_ms"] for r in rows if "ideal_mean_ms" in r), None)
    if ideal is not None:  # the balancing target's yardstick, where the runs keeping 8 gave it
        ax.axhline(ideal, color="k", lw=0.8, ls="--", label="ideal (work over measured speed)")
        ax.axhline(TARGET * ideal, color="k", lw=0.8, ls="-.", label=f"{TARGET}x the ideal")
    ax.set_xlabel(f"partitions worker 1 keeps (of {PPW}; the rest on worker 0)")
    ax.set_ylabel("mean iteration (ms)")
    name = {"logistic_regression": "logistic regression", "kmeans": "k-means"}[app]
    ax.set_title(f"{name}, 2 workers, {process} worker 1's core", fontsize=9)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(fontsize=7)
    fig.tight_layout()
    stem = "competed_share" + ("" if app == "logistic_regression" else f"_{app}")
    path = os.path.join(out, stem + ("" if duty >= 1 else "_hog_duty") + ".png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


if __name__ == "__main__":
    sys.exit(main())
