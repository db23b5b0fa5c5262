"""The apps after `pip install -e .` alone: no scipy (only the test extra installs it).

numba compiles ``@``, ``np.dot`` and ``np.linalg`` to BLAS/LAPACK calls that it takes from
scipy, so a kernel using them fails on a plain install ("scipy 0.16+ is required for linear
algebra"), and a cached one can crash. The test environment has scipy, so this runs every app,
on generated data and on the text and binary formats the readers' kernels parse, in one
process where scipy cannot be imported.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.app_helpers import run_python

NO_SCIPY = "import sys; sys.modules['scipy'] = None  # as if scipy were not installed"

RUNS = """
import numpy as np
from canary.script import run_main
for app, argv in {runs!r}:
    assert run_main(f"apps/{{app}}.py", argv) == 0, app
    print("ran", app, flush=True)
import sys
assert sys.modules["scipy"] is None  # nothing imported it in the end
"""


def test_every_app_runs_without_scipy(tmp_path: Path) -> None:
    svm = tmp_path / "d.svm"
    svm.write_text("".join(f"{i % 2} 1:{i * 0.1:.1f} 3:{(i % 7) - 3}\n" for i in range(60)))
    edges = tmp_path / "g.txt"
    edges.write_text("# src dst\n" + "".join(f"{i} {(i * 7 + 3) % 40}\n" for i in range(120)))
    np.save(tmp_path / "g.npy", np.loadtxt(edges, dtype=np.int64))
    np.savez(tmp_path / "d.npz", X=np.arange(120.0).reshape(40, 3) % 11,
             y=(np.arange(40) % 2).astype(float))
    runs = [
        ("power_iteration", ["--partitions", "2"]),
        ("logistic_regression", ["--generate", "300,4", "--max-iter", "5"]),
        ("logistic_regression", ["--input", str(svm), "--max-iter", "5"]),
        ("logistic_regression", ["--input", str(tmp_path / "d.npz"), "--max-iter", "0"]),
        ("kmeans", ["--generate", "300,3,3", "--max-iter", "5"]),
        ("kmeans", ["--input", str(svm), "--k", "2", "--max-iter", "5"]),
        ("pagerank", ["--generate", "100,500", "--max-iter", "5"]),
        ("pagerank", ["--input", str(edges), "--max-iter", "5"]),
        ("pagerank", ["--input", str(tmp_path / "g.npy"), "--max-iter", "5"]),
    ]
    r = run_python("-c", NO_SCIPY + "\n" + RUNS.format(runs=runs), timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert [line.split()[1] for line in r.stdout.splitlines() if line.startswith("ran ")] == [
        app for app, _ in runs]
