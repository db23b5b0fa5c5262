"""A driver that also talks on COMM_WORLD, with the tags canary's own transport uses, while the
job runs: canary must keep to its own communicator (a Dup of the one it is given)."""

import json
import sys

import numpy as np
from mpi4py import MPI

import canary
from canary.mpi_transport import TAG_BUF, TAG_CTRL


def main(argv: list[str] | None = None) -> int:
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    if rank != 0:  # in flight to rank 0 on COMM_WORLD for the whole job
        comm.send(("user", rank), dest=0, tag=TAG_CTRL)
        comm.Send(np.full(4, float(rank)), dest=0, tag=TAG_BUF)
    p = canary.Program("user_messages")
    a, s = p.dataset("a", 4), p.dataset("s", 1)
    p.load([a], lambda i, n: np.full(2, float(i)))
    with p.loop(5):
        p.compute(lambda v: v + 1.0, [a], [a], name="inc")
    p.reduce(a, s)
    p.report(s)
    result = canary.run(p, comm)
    if rank == 0:
        assert result is not None
        got = []
        for src in range(1, comm.Get_size()):
            head = comm.recv(source=src, tag=TAG_CTRL)
            buf = np.empty(4)
            comm.Recv(buf, source=src, tag=TAG_BUF)
            got.append([head[0], head[1], buf.tolist()])
        print(json.dumps({"s": result.value("s").tolist(), "user": got}))
    return 0


if __name__ == "__main__":
    from canary.script import run_main

    sys.exit(run_main(__file__))
