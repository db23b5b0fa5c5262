"""A driver whose kernel raises on partition 2 at the third iteration."""

import numpy as np

import canary


def boom(x: np.ndarray) -> np.ndarray:
    if x[0] == 2.0 and x[1] >= 3.0:
        raise ZeroDivisionError("kernel blew up on purpose")
    return np.array([x[0], x[1] + 1.0])


p = canary.Program("failing")
a, s = p.dataset("a", 4), p.dataset("s", 1)
p.load([a], lambda i, n: np.array([float(i), 0.0]))
with p.loop(10):
    p.compute(boom, [a], [a], name="explode")
    p.reduce(a, s)
p.report(s)
canary.run(p)
