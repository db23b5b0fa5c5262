"""A driver that fails while declaring on rank 2 only (its host cannot read the input, say)."""

import sys

import numpy as np
from mpi4py import MPI

import canary


def main(argv: list[str] | None = None) -> int:
    if MPI.COMM_WORLD.Get_rank() == 2:
        print("one_rank_fails: error: rank 2 cannot read its input", file=sys.stderr)
        return 2
    p = canary.Program("one_rank_fails")
    a = p.dataset("a", 2)
    p.load([a], lambda i, n: np.zeros(1))
    p.report(a)
    canary.run(p)
    return 0


if __name__ == "__main__":
    if "--raw" in sys.argv:  # a custom driver that just exits: only the controller's timeout helps
        sys.exit(main())
    from canary.script import run_main

    sys.exit(run_main(__file__))
