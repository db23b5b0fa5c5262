"""``canary.run``: run a declared program on the MPI job this process belongs to."""

from __future__ import annotations

import sys
import time
import traceback
from typing import Any

from canary.errors import JobAborted
from canary.harness import JobResult, run_local
from canary.program import Program
from canary.trace import Tracer, gather_and_write, trace_level, trace_path


def run(program: Program, comm: object | None = None, window: int = 64,
        trace: str | None = None) -> JobResult | None:
    """Run ``program``: rank 0 becomes the controller, ranks 1..N the workers.

    Returns the :class:`JobResult` on rank 0 and ``None`` on workers. With a single rank (a
    plain ``python driver.py``) the job runs in-process on one worker so a driver can be tried
    without MPI. If anything fails on any rank, the reason (rank, stage, partition, traceback)
    is printed once to stderr and the whole MPI job is aborted with exit code 1, so no rank is
    left hanging.

    ``trace=PATH`` (or the environment variable ``CANARY_TRACE=PATH``) writes a Chrome
    trace-event JSON of the job to PATH on rank 0: one track per rank, every task and message
    (see :mod:`canary.trace`; ``CANARY_TRACE_LEVEL=loop`` records the loop tests only). Not
    available for the in-process single-rank run.
    """
    from mpi4py import MPI

    comm = MPI.COMM_WORLD if comm is None else comm
    assert isinstance(comm, MPI.Comm)
    rank, size = comm.Get_rank(), comm.Get_size()
    if size == 1:
        print("canary: one MPI rank, so running in-process with one worker "
              "(use `canary run -n N` for N workers)", file=sys.stderr)
        if trace_path(trace):
            print("canary: --trace/CANARY_TRACE needs an MPI run; no trace written",
                  file=sys.stderr)
        return run_local(program, workers=1)
    path = trace_path(trace)
    try:
        tracer = (Tracer(rank, "controller" if rank == 0 else f"worker {rank - 1}",
                         loop_only=trace_level() == "loop") if path else None)
        result: JobResult | None = None
        if rank == 0:
            from controller.runtime import run_controller

            result = run_controller(program, comm, tracer=tracer)
        else:
            from worker.runtime import run_worker

            run_worker(program, comm, window, tracer=tracer)
        if tracer is not None and path:
            gather_and_write(comm, tracer, path, {"program": program.name,
                                                  "workers": size - 1})
            if rank == 0:
                print(f"canary: trace written to {path} (open it in https://ui.perfetto.dev)",
                      file=sys.stderr, flush=True)
        return result
    except JobAborted:
        # Rank 0 printed the reason when it decided to abort and now ends every rank. A worker
        # told to abort waits for that, and only ends the job itself if rank 0 never does.
        _abort(comm, linger=1.0 if rank == 0 else 60.0)
    except BaseException as exc:  # noqa: BLE001 - any failure must abort every rank
        print(f"canary: rank {rank} failed: {exc!r}\n{traceback.format_exc()}", file=sys.stderr,
              flush=True)
        _abort(comm, linger=1.0)
    return None  # pragma: no cover - Abort does not return


def _abort(comm: Any, linger: float) -> None:
    """MPI_Abort the job after ``linger`` seconds.

    Why wait: MPI_Abort makes the launcher kill every process at once, and output that a rank
    has written but the launcher has not yet forwarded is lost, so the reason just printed
    could vanish (seen: exit code 1 with empty stderr under load).
    """
    sys.stderr.flush()
    sys.stdout.flush()
    time.sleep(linger)
    comm.Abort(1)
