"""A driver that (wrongly) declares a report on rank 0 only, as a driver that reports from the
rank that prints might: the first statement that differs is declared at one line on rank 0 and
at another on the others."""

import numpy as np
from mpi4py import MPI

import canary

p = canary.Program("diverging")
a = p.dataset("a", 2)
p.load([a], lambda i, n: np.zeros(1))
if MPI.COMM_WORLD.Get_rank() == 0:
    p.report(a)  # declared: on rank 0 only
p.compute(lambda x: x + 1, [a], [a], name="step")  # declared: on every rank
canary.run(p)
