"""Random programs: out-of-order, multi-worker execution must equal sequential execution.

Programs mix nested fixed loops, while loops, if/else, compute stages, random-target
scatter-gathers, broadcasts and reduces. Values are small integers in float64 (kept below 2^53
by a modulus), so every result is exact and any ordering bug shows up as a mismatch. The
reference is ``tests/sequential.py``, an interpreter written from the documented semantics that
shares no code with the engine's execution, so a bug the engine has in every configuration
still shows up. The engine runs vary workers, run-ahead window, interleaving and how many tasks
a fused compute stretch may stand for; the first run is the engine's own strictest setting (one
worker, window 1, no fusion), so a mismatch there is not a scheduling bug.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np
import pytest

import canary
from canary import Program
from tests.sequential import run_sequential

MOD = 1009.0


def _affine(k: float, in_place: bool) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """x <- (k x + y + 1) mod MOD, as a new array or written over ``x`` (the engine must then
    never let ``x`` share memory with another partition, or the update would leak into it)."""
    def kernel(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return (x * k + y + 1.0) % MOD

    def kernel_in_place(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        x *= k
        x += y + 1.0
        np.mod(x, MOD, out=x)
        return x
    return kernel_in_place if in_place else kernel


def _bump(x: np.ndarray) -> np.ndarray:
    return (x + 1.0) % MOD


def random_program(seed: int) -> Program:
    rng = random.Random(seed)
    P, Q = rng.randint(2, 5), rng.randint(1, 4)
    p = Program(f"random{seed}")
    a1, a2 = p.dataset("a1", P), p.dataset("a2", P)
    b1, b2 = p.dataset("b1", Q), p.dataset("b2", Q)
    c = p.dataset("c", 1)
    p.load([a1, a2], lambda i, n: (np.full(3, float(i + 1)), np.arange(3.0) + i))
    p.load([b1, b2], lambda i, n: (np.full(3, float(2 * i + 1)), np.ones(3)))
    p.load([c], lambda i, n: np.zeros(3))
    counter = [0]

    def name(kind: str) -> str:
        counter[0] += 1
        return f"{kind}{counter[0]}"

    def statement(depth: int) -> None:
        r = rng.random()
        if r < 0.22:
            x, y = rng.sample([a1, a2], 2)
            p.compute(_affine(float(rng.randint(1, 5)), rng.random() < 0.5), [x, y], [x],
                      name=name("ca"))
        elif r < 0.36:
            x, y = rng.sample([b1, b2], 2)
            p.compute(_affine(float(rng.randint(1, 5)), rng.random() < 0.5), [x, y], [x],
                      name=name("cb"))
        elif r < 0.50:
            targets = [sorted(rng.sample(range(Q), rng.randint(1, Q))) for _ in range(P)]
            for j in range(Q):  # every destination gets at least one piece
                if not any(j in t for t in targets):
                    targets[rng.randrange(P)].append(j)
            targets = [sorted(t) for t in targets]
            src = rng.choice([a1, a2])
            # no scatter function: each source partition itself goes to its targets, summed there
            p.scatter_gather(src, rng.choice([b1, b2]), None, "sum", targets=targets,
                             one_piece=True, name=name("sg"))
        elif r < 0.60:
            p.reduce(rng.choice([a1, a2, b1, b2]), c, name=name("red"))
            p.compute(lambda v: v % MOD, [c], [c], name=name("modc"))
        elif r < 0.70:
            p.broadcast(c, rng.choice([a1, a2, b1, b2]), name=name("bc"))
        elif r < 0.80 and depth < 3:
            with p.loop(rng.randint(0, 3)):
                for _ in range(rng.randint(1, 3)):
                    statement(depth + 1)
        elif r < 0.90 and depth < 3:
            limit = float(rng.randint(1, 4))

            def below(v: np.ndarray, lim: float = limit) -> bool:
                return bool(v[2] < lim)

            with p.while_(below, on=c, max_iter=rng.randint(1, 5), name=name("wh")):
                p.compute(lambda v: v + np.array([0.0, 0.0, 1.0]), [c], [c], name=name("inc"))
                for _ in range(rng.randint(0, 2)):
                    statement(depth + 1)
            p.compute(lambda v: v * np.array([1.0, 1.0, 0.0]), [c], [c], name=name("reset"))
        elif depth < 3:
            parity = rng.randint(0, 1)

            def has_parity(v: np.ndarray, par: int = parity) -> bool:
                return int(v[0]) % 2 == par

            with p.if_(has_parity, on=c, name=name("if")):
                statement(depth + 1)
            if rng.random() < 0.5:
                with p.else_():
                    statement(depth + 1)
        else:
            p.compute(_bump, [c], [c], name=name("bump"))

    for _ in range(rng.randint(6, 14)):
        statement(0)
    for d in (a1, a2, b1, b2, c):
        p.report(d)
    return p


def outcome(results: dict[str, list[np.ndarray]]) -> dict[str, list[list[float]]]:
    return {k: [v.tolist() for v in vs] for k, vs in results.items()}


@pytest.mark.parametrize("prog_seed", range(20))
def test_random_program_matches_sequential_execution(prog_seed: int) -> None:
    reference = outcome(run_sequential(random_program(prog_seed)))
    assert sorted(reference) == ["a1", "a2", "b1", "b2", "c"]
    rng = random.Random(1000 + prog_seed)
    runs = [(1, 1, 0)] + [(rng.randint(1, 4), rng.choice([1, 2, 4, 64]),
                           rng.choice([0, 2, 5, 1024])) for _ in range(5)]
    for run, (workers, window, fused) in enumerate(runs):
        # odd runs: each worker picks its next ready task in a seeded random order, not by the
        # engine's policy, so that orders the policy would not choose are covered too
        got = canary.run_local(random_program(prog_seed), workers=workers, seed=run,
                               window=window, validate=True, max_fused=fused,
                               shuffle_ready=run % 2 == 1)
        assert outcome(got.results) == reference, (prog_seed, workers, window, fused, run)


@pytest.mark.parametrize("prog_seed", range(20))
def test_random_programs_match_while_the_window_follows_the_pace(prog_seed: int) -> None:
    """Load reports resize every worker's run-ahead window as the job runs (between
    ``window_min`` and ``window``, from the pace since the last report): emission stops and
    starts again at other points than with a fixed window, in half the runs while partitions
    move, and the answer must not change."""
    from canary.worker.config import WorkerConfig

    reference = outcome(run_sequential(random_program(prog_seed)))
    rng = random.Random(3000 + prog_seed)
    sizes = []
    for run in range(4):
        workers = rng.randint(1, 4)
        config = WorkerConfig(window=rng.choice([4, 16, 64]), window_min=rng.choice([1, 2, 8]),
                              window_s=rng.choice([0.5, 2.0, 8.0]), max_fused=rng.choice([0, 5]))
        seen: list[int] = []

        def watch(ctrl: object, states: list, seen: list[int] = seen) -> list:
            seen.extend(s.window for s in states)
            return []

        got = canary.run_local(random_program(prog_seed), workers=workers, seed=run,
                               config=config, validate=True, reports=rng.choice([1.0, 3.0]),
                               shuffle_ready=run % 2 == 1, inject=watch,
                               chaos=None if run < 2 else 100 * prog_seed + run)  # and moves
        assert outcome(got.results) == reference, (prog_seed, workers, config, run)
        sizes.append(len(set(seen)))
    assert max(sizes) > 1  # the windows did change during some run
