"""Prints the controller's message counts for ITERATIONS iterations over PARTITIONS partitions."""

import json
import sys

import numpy as np

import canary

iterations, partitions = int(sys.argv[1]), int(sys.argv[2])
p = canary.Program("counting")
a, s = p.dataset("a", partitions), p.dataset("s", 1)
p.load([a], lambda i, n: np.ones(3))
p.load([s], lambda i, n: np.zeros(3))
with p.loop(iterations):
    p.broadcast(s, a)
    p.compute(lambda x: x + 1.0, [a], [a], name="add")
    p.reduce(a, s)
p.report(s)
r = canary.run(p)
if r is not None:
    print(json.dumps({"received": r.controller_received, "sent": r.controller_sent,
                      "s": r.value("s").tolist(), "tasks": r.tasks_run, "seconds": r.seconds}))
