"""Move policies: pure, seeded objects that decide which partitions move (reports in, moves out).

The controller asks its policy on every :class:`canary.messages.Tick` (``decide``); a policy
returns moves ``(group, index, dest, reason)`` and never sends anything itself. One migration
protocol carries out the moves of every policy (see ``canary.worker.migration``).

* :class:`ChaosPolicy` (``CANARY_CHAOS_MIGRATE=SEED``) moves random partitions to random
  workers, for tests and experiments: answers must not change.
"""

from __future__ import annotations

import random
from typing import Any, Protocol


class MovePolicy(Protocol):
    def decide(self, now: float, ctrl: Any) -> list[tuple[int, int, int, str]]:
        """Moves to start now: ``(group, index, dest, reason)``."""
        ...


class ChaosPolicy:
    """Moves ``moves`` random partitions (whole co-location group entries, one-partition
    groups included) to random other workers on every ``every`` seconds of ticks, seeded.
    Partitions already moving are left alone; with one worker nothing moves."""

    def __init__(self, seed: int, every: float = 0.0, moves: int = 1) -> None:
        self.rng = random.Random(seed)
        self.every = every
        self.moves = moves
        self._last: float | None = None

    def decide(self, now: float, ctrl: Any) -> list[tuple[int, int, int, str]]:
        if ctrl.n_workers < 2 or (self._last is not None and now - self._last < self.every):
            return []
        self._last = now
        out: list[tuple[int, int, int, str]] = []
        owners = ctrl.map.owners
        for _ in range(self.rng.randint(0, self.moves)):
            g = self.rng.randrange(len(owners))
            i = self.rng.randrange(len(owners[g]))
            if ctrl.moving(g, i) or any(m[0] == g and m[1] == i for m in out):
                continue
            dest = self.rng.choice([w for w in range(ctrl.n_workers) if w != owners[g][i]])
            out.append((g, i, dest, "chaos (CANARY_CHAOS_MIGRATE)"))
        return out
