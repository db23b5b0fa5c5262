"""A driver that (wrongly) declares a partition count that depends on the rank."""

import numpy as np
from mpi4py import MPI

import canary

p = canary.Program("nondeterministic")
a = p.dataset("a", 2 + MPI.COMM_WORLD.Get_rank() % 2)  # declared: a
p.load([a], lambda i, n: np.zeros(1))
canary.run(p)
