"""A driver whose rank 2 stops before anything of its has started MPI (it imports canary, not
mpi4py, and its input is missing there): the other ranks waited in MPI_Init for ever."""

import os
import sys

import numpy as np

import canary

if os.environ.get("PMI_RANK") == "2":
    print("exits_before_mpi: error: data.svm not found on this host", file=sys.stderr)
    sys.exit(2)
p = canary.Program("exits_before_mpi")
a = p.dataset("a", 2)
p.load([a], lambda i, n: np.zeros(1))
p.report(a)
canary.run(p)
