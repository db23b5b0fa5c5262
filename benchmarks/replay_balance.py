"""Replay a traced run's load reports through the balancing policy, offline.

A trace written with ``--trace`` (at either level) holds every load report the controller
received (``canary.trace.load_reports``). This feeds them, in order, to a fresh
:class:`canary.controller.balance.BalancePolicy` (with any constructor arguments given as
``--set NAME=VALUE``) and asks it for moves after each report, as the controller does on its
ticks, and prints each round of moves it would make: when, which partition, where to, and why.

The replay is open-loop: the moves are not carried out, so the reports after the first round
are those of the run as it went, not of the placement the moves would have made. It answers
"would this policy have moved in this run, when, and on what evidence?", for instance whether a
change to the policy keeps a balanced run still, on the reports of a run made elsewhere.

Prints JSON lines: one per round of moves and one per note of the policy (what its pace check
kept, with the figure; why no move could help), in order, then a summary (the ``trace``,
``reports``, ``workers``, ``rounds`` of moves, ``first_move_s``). Replaying a run made with
balancing on gives its pace checks' figures on the placements the run had.

With ``--spells FACTOR`` it prints instead the workers' slow spells: runs of two or more
consecutive rounds of reports in which a worker's speed, as the policy measures it from that
round alone, was under 1/FACTOR of the median worker's; per spell when it began and ended, how
much slower the worker was, what share of its time it spent waiting for a CPU (none: it had its
CPU, and its tasks themselves ran slower), and which other workers were in a spell at the same
time; then a summary (``spells``, ``longest_s``, ``slowest``, ``waited_max``, ``together``).
It answers "what noise did this machine have?" for a run that should have moved nothing. On 2
workers the median lies between the two: one 1.44x slower than the other is about 1.2x slower
than the median.

A bundle of runs' load reports as ``tests/data`` keeps them (``.json.gz``) replays run by run,
each row labelled with its ``run`` and ``round``; ``--only TEXT`` keeps the runs whose name
contains TEXT.

    python benchmarks/replay_balance.py trace.json
    python benchmarks/replay_balance.py trace.json --set threshold=0.2 --set patience=6
    python benchmarks/replay_balance.py trace.json --spells 1.2
    python benchmarks/replay_balance.py tests/data/load_reports_16c_steps.json.gz --spells 1.1 \\
        --only _equal
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# first the repository root, and not this folder: benchmarks/apps.py would shadow the apps package
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "benchmarks")]

from canary.controller.balance import BalancePolicy  # noqa: E402
from canary.trace import load_events, load_reports  # noqa: E402


class NoMoves:
    """What the policy reads of the controller, for a replay: nothing is ever moving."""

    in_flight: dict[int, Any] = {}
    snapshots_started = 0

    def moving(self, group: int, index: int) -> bool:
        return False


def replay(reports: list[tuple[float, Any]], n_workers: int,
           **policy_args: float) -> list[dict[str, Any]]:
    """The rounds of moves ``BalancePolicy(n_workers, **policy_args)`` makes on ``reports``
    (``(seconds, LoadReport)`` pairs in the order received), asked after each report, and its
    notes (``{"at_s", "note"}``: the lines of the job's progress output that are not moves)."""
    policy = BalancePolicy(n_workers, **policy_args)  # type: ignore[arg-type]
    ctrl = NoMoves()
    rounds: list[dict[str, Any]] = []
    for t, rep in reports:
        policy.report(rep, t)
        moves = policy.decide(t, ctrl)
        if moves:
            rounds.append({"at_s": round(t, 3),
                           "moves": [{"group": g, "index": i, "to": dst, "why": why}
                                     for g, i, dst, why in moves]})
        # its progress lines: what the pace check kept, and why nothing could move
        rounds += [{"at_s": round(t, 3), "note": note} for note in policy.notes]
        policy.notes.clear()
    return rounds


def spells(reports: list[tuple[float, Any]], n_workers: int, factor: float = 1.2,
           min_rounds: int = 2) -> list[dict[str, Any]]:
    """The workers' slow spells in ``reports`` (as :func:`replay` takes them): runs of at least
    ``min_rounds`` consecutive rounds (every worker reported since the last) in which a worker's
    speed, measured as :meth:`BalancePolicy.speeds` does from that round's reports alone, was
    under 1/``factor`` of the median worker's. Rounds that measured no speeds
    (:meth:`BalancePolicy.measured_speeds`), or in which a worker had finished, end any spell
    (they count nothing for the policy either).

    Each spell, in the order they began: ``worker``; ``from_s`` and ``to_s``, when the reports
    of its first round began to count and when its last round was complete; ``rounds``;
    ``slower``, the median of 1/speed over them; ``waited``, the share of the worker's time on
    or waiting for a CPU that it waited in those rounds (0: it had its CPU, and its tasks
    themselves ran slower); ``with``, the other workers in a spell in any of its rounds.

    Raises ValueError where ``factor`` is not above 1 or ``min_rounds`` not at least 1."""
    if not 1 < factor < math.inf or min_rounds < 1:
        raise ValueError(f"a spell needs a factor above 1 and at least 1 round, got {factor!r} "
                         f"and {min_rounds!r}")
    policy = BalancePolicy(n_workers, smoothing=1.0)  # each round's reports alone
    cpu = [(0.0, 0.0)] * n_workers  # this round's seconds on a CPU and waiting for one
    interval = 0.0  # the longest interval this round's reports cover
    # per round: when it began and ended, each worker's speed (nan: measured nothing), and
    # its CPU seconds
    rounds: list[tuple[float, float, list[float], list[tuple[float, float]]]] = []
    for t, rep in reports:
        policy.report(rep, t)
        interval = max(interval, rep.interval)
        on, wait = cpu[rep.worker]
        cpu[rep.worker] = (on + rep.cpu, wait + rep.cpu_wait)
        workers = policy.workers
        if not all(w.fresh for w in workers):
            continue
        measured = (policy.measured_speeds(policy.spread_groups())
                    and not any(w.done for w in workers))
        rounds.append((t - interval, t, policy.speeds() if measured else [math.nan] * n_workers,
                       cpu))
        for w in workers:
            w.fresh = False
        cpu = [(0.0, 0.0)] * n_workers
        interval = 0.0
    slow = [[s < 1 / factor for s in speeds] for _, _, speeds, _ in rounds]  # (nan: not slow)
    found: list[dict[str, Any]] = []
    for w in range(n_workers):
        k = 0
        while k < len(rounds):
            end = k
            while end < len(rounds) and slow[end][w]:
                end += 1
            if end - k >= min_rounds:
                span = rounds[k:end]
                on = sum(r[3][w][0] for r in span)
                wait = sum(r[3][w][1] for r in span)
                found.append({
                    "worker": w, "from_s": round(span[0][0], 3), "to_s": round(span[-1][1], 3),
                    "rounds": end - k,
                    "slower": round(statistics.median(1 / r[2][w] for r in span), 3),
                    "waited": round(wait / (on + wait), 4) if on + wait > 0 else 0.0,
                    "with": sorted({o for row in slow[k:end] for o, s in enumerate(row)
                                    if s and o != w})})
            k = max(end, k + 1)
    return sorted(found, key=lambda s: (s["from_s"], s["worker"]))


def parse_setting(text: str) -> tuple[str, float]:
    name, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"--set wants NAME=VALUE, got {text!r}")
    try:
        return name, (int(value) if value.isdigit() else float(value))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--set {name}: {value!r} is not a number") from None


def traced_runs(path: str, only: str = "") -> list[tuple[dict[str, Any], list[Any]]]:
    """The traced runs in ``path``, each as (label, trace events): a trace file written by
    ``--trace`` (one run, an empty label), or a bundle of runs' load-report events as
    ``tests/data`` keeps them (gzip'd JSON ``{"about", "runs": [{"run", "round", "workers",
    "traceEvents"}]}``), each labelled with its ``run`` and ``round``, those whose run's name
    contains ``only``.

    Raises OSError, ValueError, KeyError or TypeError where ``path`` is neither."""
    if not path.endswith(".gz"):
        return [({}, load_events(path))]
    with gzip.open(path, "rt") as f:
        runs = json.load(f)["runs"]
    return [({"run": r["run"], "round": r["round"]}, list(r["traceEvents"]))
            for r in runs if only in r["run"]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", help="a trace file written with --trace, or a .json.gz bundle of "
                                  "runs' load reports as tests/data keeps them")
    ap.add_argument("--set", dest="settings", action="append", default=[], type=parse_setting,
                    metavar="NAME=VALUE", help="a BalancePolicy argument (repeatable)")
    ap.add_argument("--spells", type=float, metavar="FACTOR",
                    help="print the workers' slow spells (under 1/FACTOR of the median worker's "
                         "speed, e.g. 1.2) instead of the policy's moves")
    ap.add_argument("--only", default="", metavar="TEXT",
                    help="of a bundle, only the runs whose name contains TEXT (e.g. _equal)")
    args = ap.parse_args(argv)
    if args.spells is not None and not 1 < args.spells < math.inf:
        ap.error(f"--spells: a factor above 1 (e.g. 1.2), got {args.spells!r}")
    try:
        runs = [(label, load_reports(events)) for label, events in
                traced_runs(args.trace, args.only)]
    except (OSError, ValueError, KeyError, TypeError) as e:  # JSONDecodeError is a ValueError
        ap.error(f"{args.trace} is not a trace written by --trace ({type(e).__name__}: {e})")
    if not runs or not all(reports for _, reports in runs):
        named = f" of a run whose name contains {args.only!r}" if args.only else ""
        ap.error(f"{args.trace} holds no load reports{named}: was it written by canary run "
                 "--trace on a job of more than one worker?")
    for label, reports in runs:
        n_workers = 1 + max(rep.worker for _, rep in reports)
        if args.spells is not None:
            found = spells(reports, n_workers, args.spells)
            for row in found:
                print(json.dumps({**label, **row}), flush=True)
            print(json.dumps({
                "summary": "replay_balance_spells", "trace": args.trace, **label,
                "reports": len(reports),
                "workers": n_workers, "factor": args.spells, "spells": len(found),
                "longest_s": max((round(s["to_s"] - s["from_s"], 3) for s in found),
                                 default=None),
                "slowest": max((s["slower"] for s in found), default=None),
                "waited_max": max((s["waited"] for s in found), default=None),
                "together": sum(1 for s in found if s["with"])}), flush=True)
            continue
        try:
            rounds = replay(reports, n_workers, **dict(args.settings))
        except (TypeError, ValueError) as e:
            ap.error(f"--set: {e}")
        for r in rounds:
            print(json.dumps({**label, **r}), flush=True)
        moved = [r for r in rounds if "moves" in r]
        print(json.dumps({"summary": "replay_balance", "trace": args.trace, **label,
                          "reports": len(reports), "workers": n_workers, "rounds": len(moved),
                          "first_move_s": moved[0]["at_s"] if moved else None}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
