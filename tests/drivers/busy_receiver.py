"""Rank 1 sends rank 0 a message while rank 0 runs a task (no MPI calls for 50 ms); rank 0's
first poll after the task must find it. Prints how many polls it took, N times over.

MPICH's ``Iprobe`` looks before it makes progress: with one probe a poll found such a message
only the second time, so a busy worker saw it a whole batch of tasks late.
"""

import json
import time

from mpi4py import MPI

from canary.messages import Tick
from canary.mpi_transport import MpiTransport

comm = MPI.COMM_WORLD
tx = MpiTransport(comm)
polls = []
for k in range(5):
    comm.Barrier()
    if comm.rank == 1:
        time.sleep(0.01)
        tx.send(0, Tick(k, 0.0))
        tx.flush()
    else:
        t = time.perf_counter()
        while time.perf_counter() - t < 0.05:
            pass  # a task: no MPI call
        n = 1
        while tx.poll() is None:
            n += 1
        polls.append(n)
if comm.rank == 0:
    print(json.dumps({"polls": polls}), flush=True)
comm.Barrier()
