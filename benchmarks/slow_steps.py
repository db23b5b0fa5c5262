"""A driver whose steps are slow on one worker and only waited for on the others: each step, the
worker holding the model spends STEP_MS in its update (a sleep), and every other worker's tasks
wait for the model's broadcast. Without a bound in time, those workers emit up to 64 stage
instances ahead of the work, and a snapshot, whose barrier is the furthest position emitted,
waits for all of them (``benchmarks/snapshot.py``'s lateness runs).

    canary run -n 2 benchmarks/slow_steps.py STEPS STEP_MS
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

import canary


def build(steps: int, step_s: float) -> canary.Program:
    p = canary.Program("slow_steps")
    x, lw = p.dataset("x", 4), p.dataset("lw", 4)
    w, g = p.dataset("w", 1), p.dataset("g", 1)
    p.load([x], lambda i, n: np.full(8, float(i)))
    p.load([w], lambda i, n: np.zeros(8))
    p.load([g], lambda i, n: np.zeros(8))

    def update(wv: np.ndarray, gv: np.ndarray) -> np.ndarray:
        time.sleep(step_s)
        return wv - 0.01 * gv

    with p.loop(steps):
        p.broadcast(w, lw)
        p.compute(lambda xv, wv: xv * 0.5 + wv, [x, lw], [x], name="grad")
        p.reduce(x, g)
        p.compute(update, [w, g], [w], name="update")
    p.report(w)
    return p


if __name__ == "__main__":
    steps, step_ms = int(sys.argv[1]), float(sys.argv[2])
    result = canary.run(build(steps, step_ms / 1e3))
    if result is not None:
        print(json.dumps({"w": float(result.value("w").sum()), "seconds": result.seconds}))
