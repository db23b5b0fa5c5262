"""``canary simulate EXPERIMENT ...``: run one of the papers' experiments.

Each sub-command prints one JSON object per data point on stdout and writes a
PNG chart (``--plot PATH``, default ``sim_<experiment>.png`` in the current
directory; ``--no-plot`` skips it).  ``--full`` switches to the paper's
scale.  Exit status 0 on success, 2 on bad arguments (argparse) or a
ValueError from the experiment, 3 when the chart cannot be drawn.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from canary.sched.placement import PLACEMENT_POLICIES
from canary.sim import experiments as ex

Row = dict[str, Any]


def _floats(s: str) -> list[float]:
    return [float(x) for x in s.split(",") if x]


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", type=int, default=1, help="seed of every random stream (default 1)")
    p.add_argument("--full", action="store_true", help="run at the paper's scale (slow)")
    p.add_argument(
        "--plot", metavar="PATH", help="PNG chart to write (default sim_<experiment>.png)"
    )
    p.add_argument("--no-plot", action="store_true", help="do not draw a chart")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="canary simulate",
        description="Discrete-event simulations reproducing Sparrow (SOSP'13) and HFSP results.",
    )
    sub = ap.add_subparsers(dest="experiment", required=True)

    p = sub.add_parser(
        "placement", help="Sparrow Fig. 3: response time per placement policy and load"
    )
    p.add_argument(
        "--policy", nargs="+", choices=PLACEMENT_POLICIES, default=list(PLACEMENT_POLICIES)
    )
    p.add_argument("--load", nargs="+", type=float, help="loads in (0,1) (default 0.1..0.95)")
    p.add_argument("--workers", type=int, default=10_000)
    p.add_argument("--slots", type=int, default=1)
    p.add_argument("--tasks-per-job", type=int, default=500)
    p.add_argument("--jobs", type=int, help="jobs per data point (default 600; --full 2000)")
    p.add_argument("--probe-ratio", "-d", type=float, default=2.0, dest="d")
    p.add_argument("--rtt-ms", type=float, default=1.0, help="network round trip (ms)")
    p.add_argument("--mean-task-ms", type=float, default=100.0)
    _common(p)

    p = sub.add_parser(
        "zero-wait", help="Sparrow Table 2 / Fig. 4: P(zero wait), analytic vs simulated"
    )
    p.add_argument(
        "--tasks-per-job", type=_ints, default=[10, 100], help="comma list (default 10,100)"
    )
    p.add_argument("--load", nargs="+", type=float, help="loads in (0,1) (default 0.1..0.9)")
    p.add_argument("--workers", type=int, help="single-slot workers (default 1000; --full 10000)")
    p.add_argument("--probe-ratio", "-d", type=int, default=2, dest="d")
    p.add_argument("--horizon", type=float, help="seconds of arrivals (default 5; --full 10)")
    p.add_argument(
        "--rtt-ms", type=float, default=1.0, help="network round trip (ms); 0 removes the race"
    )
    _common(p)

    p = sub.add_parser("priority", help="Sparrow Table 3: high- vs low-priority user")
    p.add_argument("--lp-load", type=_floats, default=[0.0, 0.25, 0.5, 0.75, 1.75])
    p.add_argument("--hp-load", type=float, default=0.25)
    p.add_argument("--workers", type=int, default=100)
    p.add_argument("--slots", type=int, default=4)
    p.add_argument("--tasks-per-job", type=int, default=10)
    p.add_argument("--horizon", type=float, help="seconds of arrivals (default 20; --full 60)")
    _common(p)

    p = sub.add_parser("fairshare", help="Sparrow Fig. 11: two users' shares vs max-min fair share")
    p.add_argument(
        "--demands",
        type=_floats,
        default=[0.0, 0.25, 0.5, 0.25, 0.0],
        help="user 1's offered load per phase (comma list)",
    )
    p.add_argument("--phase", type=float, default=10.0, help="phase length in seconds")
    p.add_argument("--user0-load", type=float, default=1.0)
    p.add_argument("--workers", type=int, default=100)
    p.add_argument("--slots", type=int, default=4)
    p.add_argument("--bin", type=float, help="share sampling bin, s (default 1; --full 0.5)")
    _common(p)

    p = sub.add_parser("hfsp", help="HFSP Fig. 2: PS vs SRPT vs aging under estimation error")
    p.add_argument("--sigma", type=_floats, default=[0.0, 0.125, 0.25, 0.5, 1.0])
    p.add_argument(
        "--policy",
        nargs="+",
        choices=["fifo", "ps", "srpt", "hfsp"],
        default=["ps", "srpt", "hfsp"],
    )
    p.add_argument("--jobs", type=int, help="jobs per run (default 10000; --full 50000)")
    p.add_argument("--reps", type=int, help="independent workloads averaged (default 1; --full 3)")
    p.add_argument("--shape", type=float, default=0.25, help="Weibull shape of job sizes")
    p.add_argument("--load", type=float, default=0.9)
    p.add_argument("--slots", type=int, default=10)
    _common(p)
    return ap


def _print_row(row: Row) -> None:
    print(json.dumps(row), flush=True)


def _run(args: argparse.Namespace) -> tuple[list[Row], Callable[[Sequence[Row], str], None]]:
    from canary.sim import plots

    full = args.full
    out = _print_row
    if args.experiment == "placement":
        loads = args.load or (
            [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95]
            if full
            else [0.1, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95]
        )
        rows = ex.placement_experiment(
            args.policy,
            loads,
            args.workers,
            args.slots,
            args.tasks_per_job,
            args.jobs or (2000 if full else 600),
            args.seed,
            args.d,
            args.rtt_ms / 1000.0,
            args.mean_task_ms / 1000.0,
            on_row=out,
        )
        return rows, plots.plot_placement
    if args.experiment == "zero-wait":
        loads = args.load or [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
        rows = ex.zero_wait_experiment(
            args.tasks_per_job,
            loads,
            workers=args.workers or (10_000 if full else 1000),
            horizon=args.horizon or (10.0 if full else 5.0),
            seed=args.seed,
            d=args.d,
            rtt=args.rtt_ms / 1000.0,
            on_row=out,
        )
        return rows, plots.plot_zero_wait
    if args.experiment == "priority":
        rows = ex.priority_experiment(
            args.lp_load,
            args.hp_load,
            args.workers,
            args.slots,
            args.tasks_per_job,
            args.horizon or (60.0 if full else 20.0),
            args.seed,
            on_row=out,
        )
        return rows, plots.plot_priority
    if args.experiment == "fairshare":
        rows = ex.fairshare_experiment(
            args.demands,
            args.phase,
            args.user0_load,
            args.workers,
            args.slots,
            bin_s=args.bin or (0.5 if full else 1.0),
            seed=args.seed,
            on_row=out,
        )
        return rows, plots.plot_fairshare
    rows = ex.hfsp_experiment(
        args.sigma,
        args.policy,
        args.jobs or (50_000 if full else 10_000),
        args.shape,
        args.load,
        args.slots,
        reps=args.reps or (3 if full else 1),
        seed=args.seed,
        on_row=out,
    )
    return rows, plots.plot_hfsp


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``canary simulate``; ``argv`` excludes the word "simulate"."""
    parser = build_parser()
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    try:
        rows, plot = _run(args)
    except ValueError as exc:
        print(f"canary simulate {args.experiment}: error: {exc}", file=sys.stderr)
        return 2
    elapsed = time.perf_counter() - t0
    if not args.no_plot:
        path = args.plot or f"sim_{args.experiment.replace('-', '_')}.png"
        try:
            plot(rows, path)
        except RuntimeError as exc:
            print(f"canary simulate: {exc}", file=sys.stderr)
            return 3
        print(f"wrote {path}", file=sys.stderr)
    print(f"{args.experiment}: {len(rows)} points in {elapsed:.1f} s", file=sys.stderr)
    return 0
