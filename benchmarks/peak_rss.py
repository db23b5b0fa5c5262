"""Run a driver script and record this rank's peak RSS: ``python -m mpi4py benchmarks/peak_rss.py
OUT_DIR SCRIPT ARGS...`` writes ``OUT_DIR/rank<r>.json`` = {"rank": r, "peak_rss_mb": ...} when
the script exits (used by benchmarks/apps.py: each rank's own peak, not the process tree's)."""

from __future__ import annotations

import json
import os
import resource
import runpy
import sys


def main() -> None:
    out_dir, script, *args = sys.argv[1:]
    from mpi4py import MPI

    rank = MPI.COMM_WORLD.Get_rank()
    sys.argv = [script, *args]
    # This folder holds benchmarks/apps.py, which would shadow the ``apps`` package.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump({"rank": rank, "peak_rss_mb": round(peak, 1)}, f)


if __name__ == "__main__":
    main()
