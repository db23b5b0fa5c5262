"""Rank 1 sends rank 0 a message while rank 0 runs a task (no MPI call); rank 0's first poll
after the task must find it. Prints how many polls it took, 5 times over.

The task lasts until rank 1 says, through a file in the folder given as the argument (not
through MPI), that its send has completed, so the message is there however the machine's
load delays rank 1. MPICH's ``Iprobe`` looks before it makes progress: with one probe a poll
found such a message only the second time, so a busy worker saw it a whole batch of tasks late.
"""

import json
import os
import sys
import time

from mpi4py import MPI

from canary.messages import Tick
from canary.mpi_transport import MpiTransport

folder = sys.argv[1]
comm = MPI.COMM_WORLD
tx = MpiTransport(comm)
polls = []
for k in range(5):
    sent = os.path.join(folder, f"sent-{k}")
    comm.Barrier()
    if comm.rank == 1:
        time.sleep(0.01)
        tx.send(0, Tick(k, 0.0))
        tx.flush()
        open(sent, "w").close()
    else:
        while not os.path.exists(sent):
            time.sleep(0.001)  # a task: no MPI call
        n = 1
        while tx.poll() is None:
            n += 1
        polls.append(n)
if comm.rank == 0:
    print(json.dumps({"polls": polls}), flush=True)
comm.Barrier()
