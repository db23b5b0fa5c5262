"""Runs two small jobs; every rank writes, as JSON in FOLDER/rank-R.json, how many objects the
garbage collector had frozen before the first job, after it, and after the second. (A file
each: the ranks' printed lines can run into each other on mpiexec's stdout.)"""

import gc
import json
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

import canary

p = canary.Program("freezes_once")
a, s = p.dataset("a", 2), p.dataset("s", 1)
p.load([a], lambda i, n: np.ones(3))
p.load([s], lambda i, n: np.zeros(3))
with p.loop(3):
    p.broadcast(s, a)
    p.compute(lambda x: x + 1.0, [a], [a], name="add")
    p.reduce(a, s)
p.report(s)
counts = [gc.get_freeze_count()]
canary.run(p)
counts.append(gc.get_freeze_count())
canary.run(p)
counts.append(gc.get_freeze_count())
rank = MPI.COMM_WORLD.Get_rank()
(Path(sys.argv[1]) / f"rank-{rank}.json").write_text(json.dumps({"rank": rank, "frozen": counts}))
