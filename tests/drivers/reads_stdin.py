"""A driver that reads its standard input on every rank, as a script run with plain python
might, and prints what each rank read."""

import sys

from mpi4py import MPI

print(f"rank {MPI.COMM_WORLD.Get_rank()} read {sys.stdin.read()!r}", flush=True)
