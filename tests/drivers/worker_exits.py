"""Kernels that print on the workers; with ``exit``, the kernel on partition 2 (worker 1 of 2)
calls ``os._exit(0)`` at the third iteration, as a library that ends the process might."""

import os
import sys

import numpy as np

import canary


def step(x: np.ndarray) -> np.ndarray:
    part, iteration = int(x[0]), int(x[1])
    if iteration == 0:
        print(f"kernel on partition {part} says hello", flush=True)
    if part == 2 and iteration == 3 and EXIT:
        os._exit(0)
    return np.array([x[0], x[1] + 1.0])


EXIT = sys.argv[1:] == ["exit"]
p = canary.Program("worker_exits")
a, s = p.dataset("a", 4), p.dataset("s", 1)
p.load([a], lambda i, n: np.array([float(i), 0.0]))
with p.loop(6):
    p.compute(step, [a], [a], name="step")
    p.reduce(a, s)
p.report(s)
result = canary.run(p)
if result is not None:
    print("sum", result.value("s").tolist(), flush=True)
