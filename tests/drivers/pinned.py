"""A small job whose ranks are bound a core each before canary starts, as ``mpiexec -bind-to
core`` or Slurm would bind them.

Arguments: the trace file rank 0 writes, then the core of each rank (rank 0, the controller,
first): rank ``r`` binds itself to the ``r``-th core listed. The job's load reports (every
``CANARY_REPORT_MS``) say whether each worker polled hot when idle.
"""

import os
import sys

import numpy as np
from mpi4py import MPI

import canary

trace, cores = sys.argv[1], [int(c) for c in sys.argv[2].split(",")]
comm = MPI.COMM_WORLD
assert len(cores) == comm.size, f"{len(cores)} cores given for {comm.size} ranks"
os.sched_setaffinity(0, {cores[comm.rank]})

p = canary.Program("pinned")
a, s = p.dataset("a", 8), p.dataset("s", 1)
p.load([a], lambda i, n: np.ones(1000))
with p.loop(4000):  # about two seconds: a few load reports from each worker
    p.compute(lambda x: x * 0.5 + 0.5, [a], [a], name="step")
    p.reduce(a, s)
p.report(s)
res = canary.run(p, comm, trace=trace)
if comm.rank == 0:
    assert res is not None
    print(float(res.value("s").ravel()[0]), flush=True)
