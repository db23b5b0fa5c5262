"""Run a driver script and record this rank's memory: ``python -m mpi4py benchmarks/peak_rss.py
OUT_DIR SCRIPT ARGS...`` writes ``OUT_DIR/rank<r>.json`` when the script exits (used by
benchmarks/apps.py: each rank's own figures, not the process tree's):

* ``peak_rss_mb``: this rank's peak resident set (``ru_maxrss``);
* ``end_rss_mb``: its resident set at the end (``/proc/self/statm``);
* ``partition_mb`` (worker ranks): the bytes of the arrays the worker holds in its partitions
  when the job ends, each underlying buffer counted once and in full (a view counts its base's
  bytes). That is what a worker must keep to iterate; ``peak - baseline`` over it is how much
  more than its data a worker needed at its worst moment (loading, shuffling, building).
"""

from __future__ import annotations

import json
import os
import resource
import runpy
import sys
from typing import Any


def partition_bytes(state: Any) -> int:
    """Bytes of the distinct buffers behind the values of a WorkerState's partitions."""
    import numpy as np

    seen: dict[int, int] = {}
    for part in state.parts.values():
        v = part.value
        if not isinstance(v, np.ndarray):
            continue
        base = v
        while isinstance(base.base, np.ndarray):
            base = base.base
        seen[id(base)] = base.nbytes
    return sum(seen.values())


def current_rss_mb() -> float | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:  # not Linux
        return None


def main() -> None:
    out_dir, script, *args = sys.argv[1:]
    from mpi4py import MPI

    rank = MPI.COMM_WORLD.Get_rank()
    sys.argv = [script, *args]
    # This folder holds benchmarks/apps.py, which would shadow the ``apps`` package.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    held: dict[str, int] = {}
    if rank > 0:
        # canary.run imports run_worker when it starts the worker: wrap it to see the state it
        # returns (the worker's partitions as they are when the job ends).
        import canary.worker.runtime as wr

        run_worker = wr.run_worker

        def counting_run_worker(*a: Any, **kw: Any) -> Any:
            state = run_worker(*a, **kw)
            held["bytes"] = partition_bytes(state)
            return state

        wr.run_worker = counting_run_worker  # type: ignore[assignment]
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        row: dict[str, Any] = {"rank": rank, "peak_rss_mb": round(peak, 1)}
        end = current_rss_mb()
        if end is not None:
            row["end_rss_mb"] = round(end, 1)
        if "bytes" in held:
            row["partition_mb"] = round(held["bytes"] / 2**20, 2)
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(row, f)


if __name__ == "__main__":
    main()
