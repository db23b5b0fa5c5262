"""A job whose worker 1 gets stuck in a kernel for a few seconds in the third iteration."""

import sys
import time

import numpy as np

import canary


def stall_once(v: np.ndarray) -> np.ndarray:
    if v[1] == 2.0 and v[0] == 3.0:  # partition 3 (on worker 1), third iteration
        time.sleep(float(sys.argv[1]))
    return v + np.array([0.0, 1.0])


def main(argv: list[str] | None = None) -> int:
    p = canary.Program("stalls")
    a, s = p.dataset("a", 4), p.dataset("s", 1)
    p.load([a], lambda i, n: np.array([float(i), 0.0]))
    with p.loop(4):
        p.compute(stall_once, [a], [a], name="step")
        p.reduce(a, s)
    p.report(s)
    r = canary.run(p)
    if r is not None:
        print(r.value("s").tolist())
    return 0


if __name__ == "__main__":
    from canary.script import run_main

    sys.exit(run_main(__file__))
