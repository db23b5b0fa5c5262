"""A worker whose next poll after sending Done finds Shutdown must still report ``t_done``.

The folder given as the argument carries a file that the controller writes once it has sent
Shutdown (not through MPI); each worker waits for it right after its Done has gone out, so
Shutdown is already there when the worker polls next. Prints the stats keys of each worker.
"""

import json
import os
import sys
import time

import numpy as np
from mpi4py import MPI

import canary
from canary.controller.runtime import run_controller
from canary.messages import Done, Shutdown
from canary.mpi_transport import MpiTransport
from canary.worker.runtime import run_worker

shut = os.path.join(sys.argv[1], "shutdown-sent")
plain_send = MpiTransport.send


def send(self: MpiTransport, dest: int, msg: object) -> None:
    plain_send(self, dest, msg)
    if type(msg) is Shutdown:
        self.flush()
        open(shut, "w").close()
    elif type(msg) is Done:
        self.flush()
        while not os.path.exists(shut):
            time.sleep(0.001)


MpiTransport.send = send  # type: ignore[method-assign]

p = canary.Program("done_then_shutdown")
a, s = p.dataset("a", 4), p.dataset("s", 1)
p.load([a], lambda i, n: np.ones(3))
with p.loop(3):
    p.compute(lambda x: x + 1.0, [a], [a], name="add")
    p.reduce(a, s)
p.report(s)
comm = MPI.COMM_WORLD
stats: dict[str, float] = {}
if comm.rank == 0:
    run_controller(p, comm)
else:
    run_worker(p, comm, stats=stats)
rows = comm.gather(sorted(stats), root=0)
if comm.rank == 0:
    print(json.dumps({"stats": rows[1:]}), flush=True)
