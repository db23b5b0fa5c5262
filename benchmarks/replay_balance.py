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
kept, with the figure; why no move could help), in order, then a summary (``reports``,
``workers``, ``rounds`` of moves, ``first_move_s``). Replaying a run made with balancing on
gives its pace checks' figures on the placements the run had.

    python benchmarks/replay_balance.py trace.json
    python benchmarks/replay_balance.py trace.json --set threshold=0.2 --set patience=6
"""

from __future__ import annotations

import argparse
import json
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


def parse_setting(text: str) -> tuple[str, float]:
    name, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"--set wants NAME=VALUE, got {text!r}")
    try:
        return name, (int(value) if value.isdigit() else float(value))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--set {name}: {value!r} is not a number") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", help="a trace file written with --trace")
    ap.add_argument("--set", dest="settings", action="append", default=[], type=parse_setting,
                    metavar="NAME=VALUE", help="a BalancePolicy argument (repeatable)")
    args = ap.parse_args(argv)
    try:
        reports = load_reports(load_events(args.trace))
    except (OSError, ValueError, KeyError, TypeError) as e:  # JSONDecodeError is a ValueError
        ap.error(f"{args.trace} is not a trace written by --trace ({type(e).__name__}: {e})")
    if not reports:
        ap.error(f"{args.trace} holds no load reports: was it written by canary run --trace "
                 "on a job of more than one worker?")
    n_workers = 1 + max(rep.worker for _, rep in reports)
    try:
        rounds = replay(reports, n_workers, **dict(args.settings))
    except (TypeError, ValueError) as e:
        ap.error(f"--set: {e}")
    for r in rounds:
        print(json.dumps(r), flush=True)
    moved = [r for r in rounds if "moves" in r]
    print(json.dumps({"summary": "replay_balance", "reports": len(reports),
                      "workers": n_workers, "rounds": len(moved),
                      "first_move_s": moved[0]["at_s"] if moved else None}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
