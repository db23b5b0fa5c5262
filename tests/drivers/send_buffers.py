"""Rank 0 sends N pieces of 64 KB to rank 1 and never idles; prints the sends it still holds.

Rank 1 receives them all before a barrier, so afterwards every one of those sends is complete
as far as MPI is concerned; rank 0 then sends once more, and ``send`` must have released the
completed buffers (a worker that never runs out of tasks never reaches its idle ``progress``).
"""

import json
import sys

import numpy as np
from mpi4py import MPI

from canary.messages import Piece
from canary.mpi_transport import MpiTransport

n = int(sys.argv[1])
comm = MPI.COMM_WORLD
tx = MpiTransport(comm)
if comm.rank == 0:
    for i in range(n + 1):
        if i == n:
            comm.Barrier()
        tx.send(1, Piece(i, i, 0, 0, (0,), (0,), np.full(8192, float(i))))
    print(json.dumps({"in_flight": tx.in_flight, "sent": n + 1}), flush=True)
    tx.flush()
else:
    got = []
    while len(got) < n + 1:
        m = tx.poll()
        if m is not None:
            got.append(float(m[1].array[0]))
            if len(got) == n:
                comm.Barrier()
    assert got == [float(i) for i in range(n + 1)], got
comm.Barrier()
