"""A driver that raises its own exception on rank 2 only, before declaring (a file its host
lacks): the traceback alone did not say which rank it came from."""

import numpy as np
from mpi4py import MPI

import canary

if MPI.COMM_WORLD.Get_rank() == 2:
    open("/nonexistent/canary-test-input.csv")
p = canary.Program("rank_raises")
a = p.dataset("a", 2)
p.load([a], lambda i, n: np.zeros(1))
p.report(a)
canary.run(p)
