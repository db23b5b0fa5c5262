"""A job that never ends: a ``while_`` with no ``max_iter`` whose condition stays true.

What a researcher's mistaken convergence test looks like; ``canary run --timeout`` ends it, and
the controller's progress lines (``CANARY_PROGRESS_S``) are all that shows it going round.
"""

import sys
import time

import numpy as np

import canary


def step(v: np.ndarray) -> np.ndarray:
    time.sleep(0.002)  # a few hundred iterations a second: the count grows, the cores rest
    return v + 1.0


def main(argv: list[str] | None = None) -> int:
    p = canary.Program("forever")
    a, s = p.dataset("a", 2), p.dataset("s", 1)
    p.load([a], lambda i, n: np.zeros(1))
    p.reduce(a, s)
    with p.while_(lambda v: bool(v[0] >= 0), on=s, name="never_converges"):  # always true
        p.compute(step, [a], [a], name="step")
        p.reduce(a, s)
    p.report(s)
    canary.run(p)
    return 0


if __name__ == "__main__":
    from canary.script import run_main

    sys.exit(run_main(__file__))
