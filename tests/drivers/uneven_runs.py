"""A driver whose ranks call canary.run a different number of times, by branching on a
result (None on every rank but 0): ``rank0`` runs a second program on rank 0 only, ``workers``
loops on the workers until a result that only rank 0 gets says it is done."""

import sys

import numpy as np

import canary


def total(name: str) -> canary.JobResult | None:
    p = canary.Program(name)
    a, s = p.dataset("a", 3), p.dataset("s", 1)
    p.load([a], lambda i, n: np.full(2, float(i)))
    p.reduce(a, s)
    p.report(s)
    return canary.run(p)


first = total("first")
if sys.argv[1] == "rank0":
    if first is not None:
        total("second")
else:
    done = first is not None
    while not done:  # the workers never learn that rank 0 is done
        done = total("again") is not None
