"""The failing kernel's job, with the controller's MPI_Abort lost as hydra sometimes loses it:
rank 0 prints MPICH's abort line, and nothing ends the other ranks (hydra's proxy neither
acted on the abort nor reaped rank 0 for seconds). The worker told to abort must end the job
itself, and ``canary run`` must still show the reason once."""

import runpy
import sys
import time
from pathlib import Path
from typing import Any

from mpi4py import MPI

import canary.mpi_runner


def lost_abort(comm: Any, code: int, linger: float) -> None:
    sys.stdout.flush()
    sys.stderr.write(f"Abort({code}) on node 0 (rank 0 in comm 496): application called "
                     f"MPI_Abort(comm=0x84000002, {code}) - process 0\n")
    sys.stderr.flush()
    time.sleep(600)  # as good as gone to hydra, which would end the job if it saw it exit


if MPI.COMM_WORLD.Get_rank() == 0:
    canary.mpi_runner.abort_job = lost_abort  # type: ignore[assignment]
runpy.run_path(str(Path(__file__).with_name("failing_kernel.py")), run_name="__main__")
