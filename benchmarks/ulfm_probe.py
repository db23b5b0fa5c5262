"""Whether this MPI lets the surviving ranks of a job go on after one dies (ULFM).

Three ranks; rank 2 kills itself with SIGKILL after a barrier. The survivors then receive from
it (rank 0) or enter a barrier (rank 1) with errors returned rather than fatal, revoke the
communicator, shrink it to the survivors and sum over them. The probe runs that under three
settings and prints a JSON line for each (what the survivors printed, how mpiexec ended):

* ``plain``: ``mpiexec -n 3`` (MPICH's default: every rank is killed when one dies);
* ``no_cleanup``: ``mpiexec -disable-auto-cleanup -n 3`` (hydra leaves the survivors running);
* ``ft``: the same with ``MPIR_CVAR_ENABLE_FT=1`` (MPICH's fault-tolerance switch).

ULFM works when a setting's line says ``"recovered": true`` (both survivors shrank to 2 ranks
and summed over them). Each run is bounded by ``--timeout`` seconds (``MPIEXEC_TIMEOUT``).
docs/fault-tolerance.md says what it found for the ``mpich`` wheel canary installs.

    python benchmarks/ulfm_probe.py            # about 1 minute
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

RANK_PROGRAM = r'''
import os, signal, sys
from mpi4py import MPI
comm = MPI.COMM_WORLD
comm.Set_errhandler(MPI.ERRORS_RETURN)
rank = comm.Get_rank()
comm.Barrier()
if rank == 2:
    os.kill(os.getpid(), signal.SIGKILL)
try:
    if rank == 0:
        comm.recv(source=2, tag=1)
    else:
        comm.Barrier()
    print(f"rank {rank}: no error from the dead rank", flush=True)
except MPI.Exception as e:
    print(f"rank {rank}: error class {e.Get_error_class()}", flush=True)
try:
    comm.Revoke()
    survivors = comm.Shrink()
    total = survivors.allreduce(1)
    print(f"rank {rank}: SHRUNK to {survivors.Get_size()}, sum {total}", flush=True)
except MPI.Exception as e:
    print(f"rank {rank}: shrink failed: {e}", flush=True)
'''

SETTINGS = {
    "plain": ([], {}),
    "no_cleanup": (["-disable-auto-cleanup"], {}),
    "ft": (["-disable-auto-cleanup"], {"MPIR_CVAR_ENABLE_FT": "1"}),
}


def probe(name: str, timeout: int, script: str) -> dict[str, object]:
    from canary.cli import find_mpiexec
    from canary.mpich_shm import remove_orphans

    flags, extra = SETTINGS[name]
    env = dict(os.environ, MPIEXEC_TIMEOUT=str(timeout), **extra)
    started = time.time()
    try:
        r = subprocess.run([find_mpiexec(), *flags, "-n", "3", sys.executable, script], env=env,
                           capture_output=True, text=True, timeout=timeout + 30)
        out, code = r.stdout + r.stderr, r.returncode
    except subprocess.TimeoutExpired as exc:
        out, code = str(exc.stdout or "") + str(exc.stderr or ""), None
    remove_orphans(started, wait=2.0)  # the killed rank's shared memory, which MPI leaves
    lines = [ln for ln in out.splitlines() if ln.startswith("rank ")]
    assertion = next((ln.strip() for ln in out.splitlines() if "Assertion failed" in ln), None)
    return {"setting": name, "flags": flags, "env": extra, "survivors_said": lines,
            "mpiexec_status": code, "timed_out": "TIMED OUT" in out or code is None,
            "assertion": assertion,
            "recovered": sum("SHRUNK to 2, sum 2" in ln for ln in lines) == 2}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--timeout", type=int, default=20)
    args = ap.parse_args(argv)
    from mpi4py import MPI

    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "ranks.py")
        with open(script, "w") as f:
            f.write(RANK_PROGRAM)
        rows = [probe(name, args.timeout, script) for name in SETTINGS]
    for row in rows:
        print(json.dumps(row), flush=True)
    print(json.dumps({"summary": "ulfm_probe", "mpi": MPI.Get_library_version().splitlines()[0],
                      "ulfm_works": any(r["recovered"] for r in rows)}), flush=True)
    return 0


if __name__ == "__main__":
    from canary.script import end_script

    end_script(main())
