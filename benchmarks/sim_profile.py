"""Profile one Sparrow Figure 3 data point of the cluster simulator.

    python benchmarks/sim_profile.py [--policy batch-late] [--load 0.9] [--jobs 200]

Prints simulated tasks, events, wall time, events/s and the top functions
by own time (cProfile), so optimisations can start from measurements.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
# first the repository root, and not this folder: benchmarks/apps.py would shadow the apps package
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "benchmarks")]

from canary.sched.placement import PLACEMENT_POLICIES, make_placement  # noqa: E402
from canary.sim.cluster import poisson_jobs, simulate_cluster  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", choices=PLACEMENT_POLICIES, default="batch-late")
    ap.add_argument("--load", type=float, default=0.9)
    ap.add_argument("--workers", type=int, default=10_000)
    ap.add_argument("--tasks-per-job", type=int, default=500)
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    rng = np.random.default_rng(1)
    rate = args.load * args.workers / (args.tasks_per_job * 0.1)
    jobs = poisson_jobs(rng, rate, args.tasks_per_job, 0.1, num_jobs=args.jobs)
    placement = make_placement(args.policy)
    t0 = time.perf_counter()
    res = simulate_cluster(jobs, placement, args.workers, 1, 0.001, rng)
    wall = time.perf_counter() - t0
    tasks = args.jobs * args.tasks_per_job
    print(
        f"{args.policy} load {args.load}: {tasks} tasks, {res.events} events, {wall:.2f} s, "
        f"{res.events / wall:,.0f} events/s, {wall / tasks * 1e6:.1f} us/task"
    )
    prof = cProfile.Profile()
    prof.enable()
    simulate_cluster(jobs, placement, args.workers, 1, 0.001, np.random.default_rng(1))
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
