"""Two checkouts of canary side by side: the same app from each, interleaved, on one machine.

A change to the engine moves an iteration by a few hundred µs, while this shared VM's load moves
it by more from one minute to the next: two separate runs cannot tell them apart. Here each
round runs the app once from each checkout, back to back, in alternating order (A then B, then
B then A), so that a burst of load hits both; per-iteration times come from the workers' traces
(``benchmarks/apps.py``'s ``run_canary``: mean over iterations, first and last excluded).

``BASE`` (and ``CHANGED``, default: this checkout) is a checkout's folder or a git revision of
this repository, which is checked out into a temporary ``git worktree`` for the run.
``--env-a`` / ``--env-b NAME=VALUE`` set environment variables for one side's ranks, and
``--args-a`` / ``--args-b "FLAGS"`` add flags to one side's app command line, so one
checkout can be compared with itself under two settings. ``--bind-to LEVEL`` binds both sides'
ranks (``mpiexec -bind-to LEVEL``), as clusters usually launch them. Each row
also says whether both sides ended with the same answer (the app's summary: objective,
inertia or rank sum, and iterations): a change meant only to be faster should keep it.

Every line is JSON; the last is the summary: each side's median, the median of the paired
differences B - A (one per round), and how many rounds B was faster.

    python benchmarks/ab.py HEAD~1                        # LR 400K x 20, 10 rounds, ~1.5 min
    python benchmarks/ab.py HEAD~1 --size 20000,20 --iters 100
    python benchmarks/ab.py HEAD~1 --app pagerank --size 131072,1310720 --rounds 6
    python benchmarks/ab.py PATH/TO/OTHER/CHECKOUT --quick   # tiny (tests)
    python benchmarks/ab.py HEAD HEAD --env-a CANARY_TRACE_LEVEL=full   # one checkout, two settings
    python benchmarks/ab.py . . --args-a="--partitions 8" --args-b="--partitions 2"
    python benchmarks/ab.py HEAD~1 --bind-to core --size 200000,20 --iters 2000  # ranks bound
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# first the repository root, and not this folder: benchmarks/apps.py would shadow the apps package
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "benchmarks")]

from benchmarks.apps import QUICK_SIZES, SIZES, _data, _extra, run_canary  # noqa: E402

ANSWER_KEYS = ("iterations", "objective", "inertia", "rank_sum")


def checkout(spec: str, tmp: str) -> Path:
    """The folder of checkout ``spec``: a folder holding ``apps/`` and ``canary/`` as it is,
    else a git revision of this repository checked out (detached) under ``tmp``.
    Raises SystemExit naming ``spec`` if it is neither."""
    path = Path(spec)
    if (path / "canary").is_dir() and (path / "apps").is_dir():
        return path.resolve()
    dest = Path(tmp) / f"rev-{len(list(Path(tmp).iterdir()))}"
    proc = subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(dest), spec],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"ab.py: {spec!r} is neither a canary checkout nor a git revision of "
                         f"{ROOT}: {proc.stderr.strip()}")
    return dest


def env_pairs(ap: argparse.ArgumentParser, pairs: list[str]) -> dict[str, str]:
    """``NAME=VALUE`` strings as a dict; an entry without ``=`` is a usage error."""
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            ap.error(f"--env-a/--env-b expect NAME=VALUE, got {pair!r}")
        out[name] = value
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base", help="checkout folder or git revision (side A)")
    ap.add_argument("changed", nargs="?", default=str(ROOT),
                    help="checkout folder or git revision (side B; default: this checkout)")
    ap.add_argument("--app", default="logistic_regression",
                    choices=["logistic_regression", "kmeans", "pagerank"])
    ap.add_argument("--size", default=None, help="N,D (LR), N,D,K (k-means), V,E (PageRank)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--trace", default=None,
                    help="Chrome trace of each side's first run (PATH.a.json, PATH.b.json)")
    ap.add_argument("--env-a", action="append", default=[], metavar="NAME=VALUE",
                    help="environment variable for side A's ranks (repeatable)")
    ap.add_argument("--env-b", action="append", default=[], metavar="NAME=VALUE",
                    help="environment variable for side B's ranks (repeatable)")
    ap.add_argument("--args-a", default="", metavar="FLAGS",
                    help="flags added to side A's app command line, e.g. \"--partitions 8\"")
    ap.add_argument("--args-b", default="", metavar="FLAGS",
                    help="flags added to side B's app command line")
    ap.add_argument("--bind-to", default=None, metavar="LEVEL",
                    help="bind the ranks of both sides: mpiexec -bind-to LEVEL (MPICH's "
                         "hydra: core, socket, ...)")
    ap.add_argument("--quick", action="store_true", help="tiny size, 1 round of 5 iterations")
    args = ap.parse_args(argv)
    bind = ["-bind-to", args.bind_to] if args.bind_to else []
    envs = {"a": env_pairs(ap, args.env_a), "b": env_pairs(ap, args.env_b)}
    flags = {"a": shlex.split(args.args_a), "b": shlex.split(args.args_b)}
    if args.quick:
        args.rounds, args.iters = 1, 5
    # apps.py's first (smallest) size of the app by default
    default = (QUICK_SIZES if args.quick else SIZES)[args.app][0]
    size = tuple(int(v) for v in args.size.split(",")) if args.size else default
    with tempfile.TemporaryDirectory() as tmp:
        roots = {"a": checkout(args.base, tmp), "b": checkout(args.changed, tmp)}
        try:
            times: dict[str, list[float]] = {"a": [], "b": []}
            for r in range(args.rounds):
                row: dict[str, Any] = {"round": r}
                answers = {}
                for side in ("a", "b") if r % 2 == 0 else ("b", "a"):
                    trace = f"{args.trace}.{side}.json" if args.trace and r == 0 else None
                    got = run_canary(args.app, _data(args.app, size, tmp), args.workers,
                                     args.iters, _extra(args.app) + flags[side], args.timeout,
                                     trace, env_extra=envs[side], root=roots[side],
                                     mpiexec_flags=bind)
                    times[side].append(got["seconds"])
                    row[f"{side}_s"] = got["seconds"]
                    answers[side] = {k: got["summary"].get(k) for k in ANSWER_KEYS
                                     if k in got["summary"]}
                row["first"] = "a" if r % 2 == 0 else "b"
                row["same_answer"] = answers["a"] == answers["b"]
                row["answer_a"], row["answer_b"] = answers["a"], answers["b"]
                print(json.dumps(row), flush=True)
        finally:
            for root in roots.values():
                if Path(tmp) in root.parents:
                    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                                    str(root)], capture_output=True)
    diffs = [b - a for a, b in zip(times["a"], times["b"])]
    print(json.dumps({
        "summary": "ab", "app": args.app, "size": ",".join(map(str, size)),
        "iters": args.iters, "rounds": args.rounds, "base": args.base, "changed": args.changed,
        "env_a": envs["a"], "env_b": envs["b"], "args_a": flags["a"], "args_b": flags["b"],
        "bind_to": args.bind_to,
        "median_ms": {s: round(statistics.median(v) * 1e3, 3) for s, v in times.items()},
        "median_diff_ms": round(statistics.median(diffs) * 1e3, 3),
        "b_faster_rounds": sum(d < 0 for d in diffs),
        "b_over_a": round(statistics.median(times["b"]) / statistics.median(times["a"]), 3),
    }), flush=True)
    return 0


if __name__ == "__main__":
    from canary.script import end_script

    end_script(main())
