"""Reader and generator speed: ``python benchmarks/io_bench.py [DIR]``.

Writes its inputs under DIR (default: a fresh temporary directory, kept so
repeated runs can reuse it if passed back), then prints the best of 3 runs of
each reader with the numba cache warm.  Needs scikit-learn (to write svmlight
and time its reader as a reference).  Prints figures as text, not JSON (see
docs/formats.md for the latest); asserts only that the edge list read back
equals what was written.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
# first the repository root, and not this folder: benchmarks/apps.py would shadow the apps package
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "benchmarks")]

from canary.generate import logistic_data, rmat_edges  # noqa: E402
from canary.io import (  # noqa: E402
    count_edges,
    count_rows,
    partition_rows,
    read_edges_range,
    read_rows,
    split_byte_ranges,
)


def _best(f: Callable[[], Any], runs: int = 3) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(runs):
        t = time.perf_counter()
        out = f()
        best = min(best, time.perf_counter() - t)
    return best, out


def main(argv: list[str]) -> None:
    """Run the benchmark; argv[0], if given, is the directory for the inputs."""
    from sklearn.datasets import dump_svmlight_file, load_svmlight_file

    d = argv[0] if argv else tempfile.mkdtemp(prefix="canary-io-bench-")
    os.makedirs(d, exist_ok=True)
    n, nf = 100_000, 20
    p = os.path.join(d, "bench.svm")
    if not os.path.exists(p):
        X, y = logistic_data(n, nf, seed=0)
        dump_svmlight_file(X, y, p, zero_based=False)
    print(f"inputs in {d}")
    print(f"svmlight {n} x {nf}: {os.path.getsize(p) / 1e6:.1f} MB")
    read_rows(p, 0, 10, n_features=nf)  # compile / load the numba cache
    s, _ = _best(lambda: count_rows(p))
    print(f"  count_rows               {s:.3f} s")
    s, _ = _best(lambda: read_rows(p, 0, None, n_features=nf))
    print(f"  read_rows all            {s:.3f} s")
    a, b = partition_rows(n, 4)[3]
    s, _ = _best(lambda: read_rows(p, a, b, n_features=nf))
    print(f"  read_rows last quarter   {s:.3f} s")
    s, _ = _best(lambda: load_svmlight_file(p, n_features=nf, zero_based=False))
    print(f"  sklearn load_svmlight    {s:.3f} s")

    nv, m = 1_000_000, 10_000_000
    s, E = _best(lambda: rmat_edges(nv, m, seed=0))
    print(f"rmat_edges({nv}, {m})  {s:.2f} s")
    e = os.path.join(d, "bench_edges.txt")
    if not os.path.exists(e):
        np.savetxt(e, E, fmt="%d", delimiter="\t", header="rmat")
    size = os.path.getsize(e)
    print(f"edge list {m} edges: {size / 1e6:.0f} MB")
    s, cnt = _best(lambda: count_edges(e))
    print(f"  count_edges              {s:.2f} s")
    s, got = _best(lambda: read_edges_range(e, 0, size))
    print(f"  read_edges_range whole   {s:.2f} s = {cnt / s / 1e6:.1f} M edges/s")
    assert np.array_equal(got, E)
    a, b = split_byte_ranges(e, 4)[2]
    s, got = _best(lambda: read_edges_range(e, a, b))
    print(
        f"  one of 4 byte ranges     {s:.2f} s ({got.shape[0]} edges, {got.shape[0] / s / 1e6:.1f} M edges/s)"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
